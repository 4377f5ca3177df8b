"""pg_upgrade from the PostgreSQL version under test (15 and 18 in CI) to itself (pg_upgrade's
binary-upgrade dump and restore of the extension) and to each newer supported version that is
installed here (16, 17, 18: scripts/common.sh): a cluster that preloads outbox_ext, with
messages in every state, subscriptions with secrets, deliveries and their attempts, a role with
grants on the extension's objects and per-database and per-role settings, comes out of
pg_upgrade with every row (timestamps included), sequence, setting and grant as it was, and its
delivery worker delivers the old pending messages and a new one.

Delivery is paused (outbox.worker_enabled = off) in both clusters until everything has been
compared, as docs/versions.md suggests for an upgrade; the new cluster then turns it on.
"""

import functools
import os
import pathlib
import shutil
import subprocess
import tempfile

import psycopg
import pytest
from standardwebhooks.webhooks import Webhook

from support import CURRENT_VERSION, EVERY_STATE, eventually
from support.cluster import ScratchCluster, as_server_user
from support.receiver import Receiver

ROOT = pathlib.Path(__file__).resolve().parents[2]
SOURCE = int(os.environ.get("OUTBOX_PG", "15"))
TARGETS = [15, 16, 17, 18]
CURRENT = CURRENT_VERSION
OLD_PORT, NEW_PORT = 25343, 25344
DATABASE = "outbox_pg_upgrade"
# One pytest-xdist worker runs them all (scripts/test.sh): each installs the extension into the
# target version once per process, which must not replace a library another's server has loaded.
pytestmark = pytest.mark.xdist_group("pg_upgrade")
CONF = "outbox.worker_enabled = off"


def pg_config_of(version: int) -> str:
    """The pg_config scripts/common.sh uses for `version` (empty if it has none)."""
    return subprocess.run(["bash", "-c", 'source scripts/common.sh && echo "$PG_CONFIG"'], cwd=ROOT,
                          env=dict(os.environ, PG=str(version)), check=True, capture_output=True,
                          text=True).stdout.strip()


def installed(pg_config: str) -> bool:
    if not pg_config or not os.access(pg_config, os.X_OK):
        return False
    return subprocess.run([pg_config, "--version"], capture_output=True).returncode == 0


def bindir(pg_config: str) -> str:
    return subprocess.run([pg_config, "--bindir"], check=True, capture_output=True, text=True).stdout.strip()


class VersionCluster(ScratchCluster):
    """A ScratchCluster of PostgreSQL `pg` (scripts/cluster.sh with PG=pg), initdb'd with
    `initdb_options`; `pg15_config`, another PostgreSQL 15 than the installed one."""

    def __init__(self, port, pg, conf="", initdb_options="", pg15_config=None):
        super().__init__(port, conf)
        self.pg = pg
        self.initdb_options = initdb_options
        self.env = dict(os.environ, PG=str(pg))
        self.env.pop("OUTBOX_WORKER_DATABASES", None)
        if pg15_config:
            self.env["OUTBOX_PG15_CONFIG"] = pg15_config
        self.pg_config = pg15_config or pg_config_of(pg)

    def start(self):
        env = dict(self.env, OUTBOX_CLUSTER_CONF=self.conf, OUTBOX_INITDB_OPTIONS=self.initdb_options)
        subprocess.run([ROOT / "scripts/cluster.sh", "start", self.dir, str(self.port)], check=True, env=env)
        return self

    def stop(self):
        subprocess.run([ROOT / "scripts/cluster.sh", "stop", self.dir], check=False, env=self.env)

    @property
    def version(self) -> str:
        return subprocess.run([self.pg_config, "--version"], check=True, capture_output=True, text=True).stdout.strip()

    @property
    def data(self) -> str:
        return f"{self.dir}/data"


_installed_for = set()


def install_extension_for(version: int, pg_config: str):
    """`cargo pgrx install --release` into `version`'s server, once per test session (the
    version under test already has it from scripts/test.sh)."""
    if version in _installed_for or version == SOURCE:
        return
    result = subprocess.run(["cargo", "pgrx", "install", "--release", "--pg-config", pg_config], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, f"cargo pgrx install for PostgreSQL {version} failed:\n{result.stdout}\n{result.stderr}"
    _installed_for.add(version)


# Everything that pg_upgrade must keep, as rows to compare before and after.
SNAPSHOT = {
    "messages": "SELECT * FROM outbox ORDER BY id",
    "subscriptions": "SELECT * FROM outbox_subscription ORDER BY id",
    "deliveries": "SELECT * FROM outbox_delivery ORDER BY message_id, subscription_id",
    "attempts": "SELECT * FROM outbox_delivery_attempt ORDER BY message_id, subscription_id, attempt",
    "sequences": """SELECT sequencename, data_type::text, start_value, increment_by, last_value
                      FROM pg_sequences WHERE sequencename LIKE 'outbox%' ORDER BY 1""",
    "extension": "SELECT extname, extversion, extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'outbox_ext'",
    # Grants: tables, views, sequences, functions of the extension and who holds what.
    # (An ACL equal to the owner's default may come out as NULL, the same privileges: each is
    # compared as what it grants. MAINTAIN (m), new in 17, which the owner has by default there,
    # is left out.)
    "relation acls": """SELECT c.relname, c.relkind::text,
                               ARRAY(SELECT regexp_replace(a::text, '=([^/]*)m\\*?', '=\\1')
                                       FROM unnest(coalesce(c.relacl, acldefault(CASE c.relkind WHEN 'S' THEN 's' ELSE 'r' END::"char",
                                                                                 c.relowner))) a ORDER BY 1)
                          FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'outbox%' ORDER BY 1""",
    "function acls": """SELECT p.oid::regprocedure::text,
                               ARRAY(SELECT a::text FROM unnest(coalesce(p.proacl, acldefault('f'::"char", p.proowner))) a ORDER BY 1)
                          FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'outbox%' ORDER BY 1""",
    "roles": """SELECT rolname, rolsuper, rolinherit, rolcreaterole, rolcreatedb, rolcanlogin, rolbypassrls, rolconnlimit
                  FROM pg_roles WHERE rolname LIKE 'outbox%' ORDER BY 1""",
    "memberships": """SELECT r.rolname, m.rolname, a.admin_option FROM pg_auth_members a
                        JOIN pg_roles r ON r.oid = a.roleid JOIN pg_roles m ON m.oid = a.member
                       WHERE r.rolname LIKE 'outbox%' OR m.rolname LIKE 'outbox%' ORDER BY 1, 2""",
    "settings": """SELECT coalesce(d.datname, ''), coalesce(r.rolname, ''), s.setconfig FROM pg_db_role_setting s
                     LEFT JOIN pg_database d ON d.oid = s.setdatabase LEFT JOIN pg_roles r ON r.oid = s.setrole
                    WHERE d.datname = current_database() OR r.rolname LIKE 'outbox%' ORDER BY 1, 2""",
    "privileges": """SELECT has_table_privilege('outbox_pgu_monitor', 'outbox_monitoring', 'SELECT'),
                            has_table_privilege('outbox_pgu_monitor', 'outbox_dead_letters', 'SELECT'),
                            has_table_privilege('outbox_pgu_monitor', 'outbox', 'SELECT'),
                            has_function_privilege('outbox_pgu_app', 'outbox_enqueue(text, jsonb, interval, text, text, jsonb)', 'EXECUTE'),
                            has_function_privilege('outbox_pgu_app', 'outbox_claim(integer, text[], interval)', 'EXECUTE'),
                            has_function_privilege('outbox_pgu_monitor', 'outbox_claim(integer, text[], interval)', 'EXECUTE')""",
}


# The extension's members. On PostgreSQL 18 (not on 15) the row and array types of its tables,
# views and types are members too: after pg_upgrade they must be what the new version's own
# CREATE EXTENSION makes.
MEMBERS = """SELECT pg_describe_object(d.classid, d.objid, 0) FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
              WHERE e.extname = 'outbox_ext' AND d.deptype = 'e' ORDER BY 1"""


def snapshot(conn) -> dict:
    return {name: conn.execute(query).fetchall() for name, query in SNAPSHOT.items()}


def populate(conn, receiver_url: str) -> dict:
    """Messages in every state, subscriptions, deliveries, roles, grants and settings; returns
    what the checks after the upgrade need."""
    conn.execute(EVERY_STATE)
    # More, through the API: ready ones with dedupe keys, a delayed one, a DEAD one (out of
    # attempts, with its last error) and a DONE one that failed once.
    conn.execute("SELECT outbox_enqueue('booking.created', jsonb_build_object('n', n), dedupe_key => 'ready-' || n) "
                 "FROM generate_series(1, 3) n")
    conn.execute("SELECT outbox_enqueue('reminder.due', '{\"in\": \"2 days\"}', interval '2 days', 'delayed-1')")
    conn.execute("SELECT outbox_enqueue('audit.logged', '{\"n\": \"dead\"}')")
    conn.execute("SET outbox.max_attempts = 1")
    assert conn.execute("SELECT outbox_fail(id, 'HTTP 410: gone', lease_token) FROM outbox_claim(1, ARRAY['audit.logged'])"
                        ).fetchone()[0] == "DEAD"
    conn.execute("RESET outbox.max_attempts")
    conn.execute("SELECT outbox_enqueue('audit.logged', '{\"n\": \"done\"}')")
    conn.execute("SELECT outbox_fail(id, 'HTTP 502: bad gateway', lease_token, retry_in => interval '0') "
                 "FROM outbox_claim(1, ARRAY['audit.logged'])")
    conn.execute("SELECT outbox_complete(id, lease_token) FROM outbox_claim(1, ARRAY['audit.logged'])")
    conn.execute("""INSERT INTO outbox (topic, payload, status, attempts, available_at, processed_at, last_error, dedupe_key)
                    VALUES ('audit.logged', '{"n": "done after an error"}', 'DONE', 2, clock_timestamp(),
                            clock_timestamp(), 'HTTP 504: timeout', 'done-with-error')""")

    # Subscriptions with secrets: disabled ones (of topics with no pending message: a disabled
    # endpoint's deliveries are parked), and one enabled to the receiver (delivery is paused
    # until the end of the test).
    secret = conn.execute("SELECT outbox_generate_secret()").fetchone()[0]
    conn.execute("SELECT outbox_subscribe('archive.exported', 'https://hooks.example.test/a', outbox_generate_secret(), "
                 "'{\"X-Team\": \"7\"}', interval '5 seconds', enabled => false)")
    disabled = conn.execute("SELECT outbox_subscribe('audit.logged', 'https://hooks.example.test/b', outbox_generate_secret(), "
                            "enabled => false)").fetchone()[0]
    conn.execute("SELECT outbox_subscribe('booking.created', %s, %s)", (receiver_url, secret))
    # Deliveries of the ended messages to the disabled subscription, and their attempts.
    conn.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, last_error, processed_at)
                    SELECT id, %s, status, attempts, last_error, processed_at FROM outbox
                     WHERE status <> 'PENDING' AND topic = 'audit.logged'""", (disabled,))
    conn.execute("""INSERT INTO outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration, http_status, error)
                    SELECT message_id, subscription_id, 1, clock_timestamp(), interval '12 milliseconds',
                           CASE status WHEN 'DONE' THEN 200 ELSE 410 END, last_error
                      FROM outbox_delivery""")

    # A role with grants on the extension's objects, an application role in an extension role,
    # and settings for the database and for a role.
    for role in ("outbox_pgu_monitor", "outbox_pgu_app"):
        conn.execute(f"DROP ROLE IF EXISTS {role}")
    conn.execute("CREATE ROLE outbox_pgu_monitor NOLOGIN")
    conn.execute("GRANT SELECT ON outbox_monitoring, outbox_dead_letters TO outbox_pgu_monitor")
    conn.execute("CREATE ROLE outbox_pgu_app LOGIN")
    conn.execute("GRANT outbox_producer, outbox_consumer TO outbox_pgu_app")
    conn.execute(f"ALTER DATABASE {DATABASE} SET outbox.max_attempts = 5")
    conn.execute("ALTER ROLE outbox_pgu_app SET outbox.backoff_base = '2s'")
    conn.execute(f"ALTER ROLE outbox_pgu_app IN DATABASE {DATABASE} SET outbox.max_attempts = 6")
    return {"secret": secret}


def settings_seen(cluster, role=None) -> tuple:
    """What a new session sees of the per-database settings, or of `role`'s own."""
    if role:
        with psycopg.connect(host="127.0.0.1", port=cluster.port, user=role, dbname=DATABASE) as own:
            return own.execute("SELECT current_setting('outbox.max_attempts'), current_setting('outbox.backoff_base')").fetchone()
    with cluster.connect(DATABASE) as conn:
        return conn.execute("SELECT current_setting('outbox.max_attempts'), outbox_max_attempts()").fetchone()


# Debian 12's PostgreSQL 15.20 (a security release of November 2026) records a version of
# every table column in its options (pg_attver); a PostgreSQL 18 release older than it (18.6,
# the newest source package Debian's registry has here) does not know that option, and
# pg_upgrade stops restoring the first table of any database (docs/versions.md).
ATTVER_ERROR = 'unrecognized parameter "pg_attver"'
ATTVER_REASON = ("pg_upgrade from {old} to {new} fails for any table, not only outbox_ext's: the old server marks "
                 "columns with the option pg_attver, which the new one does not know (" + ATTVER_ERROR + "); "
                 "it needs a minor release of the new version as recent as the old one's")


def marks_attver(pg_config: str) -> bool:
    """Whether that server knows the column option pg_attver (its binary names it)."""
    return b"pg_attver" in (pathlib.Path(bindir(pg_config)) / "postgres").read_bytes()


def dpkg_older(a: str, b: str) -> bool:
    return subprocess.run(["dpkg", "--compare-versions", a, "lt", b]).returncode == 0


def previous_release_of_15():
    """Debian 12's release of postgresql-15 before the installed one, unpacked (not installed:
    `dpkg-deb -x`, its paths relocate) into /opt/outbox_ext/postgresql-15-VERSION, with
    outbox_ext's files copied from the installed 15 (a minor release keeps the ABI). Its
    pg_config, or a reason why there is none."""
    installed_version = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "postgresql-15"], capture_output=True,
                                       text=True).stdout.strip()
    listed = subprocess.run(["apt-cache", "madison", "postgresql-15"], capture_output=True, text=True).stdout
    older = [v for v in {line.split("|")[1].strip() for line in listed.splitlines() if line.count("|") >= 2}
             if dpkg_older(v, installed_version)]
    if not older:
        return None, f"Debian's registry lists no postgresql-15 older than {installed_version}"
    version = functools.reduce(lambda a, b: b if dpkg_older(a, b) else a, older)
    root = pathlib.Path(f"/opt/outbox_ext/postgresql-15-{version}")
    pg15_config = root / "usr/lib/postgresql/15/bin/pg_config"
    if not (root / ".unpacked").exists():
        shutil.rmtree(root, ignore_errors=True)
        with tempfile.TemporaryDirectory() as debs:
            packages = [f"{name}={version}" for name in ("postgresql-15", "postgresql-client-15")]
            fetched = subprocess.run(["apt-get", "download", *packages], cwd=debs, capture_output=True, text=True)
            if fetched.returncode != 0:
                return None, f"apt-get download {' '.join(packages)} failed: {fetched.stderr.strip()[-300:]}"
            for deb in pathlib.Path(debs).glob("*.deb"):
                subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
        (root / ".unpacked").write_text(version)
    if marks_attver(str(pg15_config)):
        return None, f"Debian's previous postgresql-15 ({version}) marks columns with pg_attver too"
    # outbox_ext for it: the installed 15's files.
    installed_15 = pg_config_of(15)
    for source, target in (("--pkglibdir", "--pkglibdir"), ("--sharedir", "--sharedir")):
        src = pathlib.Path(subprocess.run([installed_15, source], check=True, capture_output=True, text=True).stdout.strip())
        dst = pathlib.Path(subprocess.run([str(pg15_config), target], check=True, capture_output=True, text=True).stdout.strip())
        if source == "--sharedir":
            src, dst = src / "extension", dst / "extension"
        for file in src.glob("outbox_ext*"):
            shutil.copy2(file, dst / file.name)
    return str(pg15_config), None


def pg_upgrade(old, new, work):
    """pg_upgrade --check, then pg_upgrade, as the server's user in a directory it can write."""
    command = as_server_user([os.path.join(bindir(new.pg_config), "pg_upgrade"), "-b", bindir(old.pg_config), "-B", bindir(new.pg_config),
                              "-d", old.data, "-D", new.data, "-p", str(old.port), "-P", str(new.port), "-U", "postgres"])
    for extra in (["--check"], []):
        result = subprocess.run(command + extra, cwd=work, capture_output=True, text=True, timeout=600)
        if result.returncode != 0:
            logs = {log: log.read_text() for log in sorted(pathlib.Path(new.data).glob("pg_upgrade_output.d/**/*.log"))}
            if any(ATTVER_ERROR in text for text in logs.values()):
                pytest.xfail(ATTVER_REASON.format(old=old.version, new=new.version))
            report = "".join(f"\n--- {log}\n{text[-3000:]}" for log, text in logs.items())
            pytest.fail(f"pg_upgrade {' '.join(extra)} failed:\n{result.stdout}\n{result.stderr}{report}")


def target_pg_config(target: int) -> str:
    """The target's pg_config with outbox_ext installed, or a skip."""
    pg_config = pg_config_of(target)
    if not installed(pg_config):
        pytest.skip(f"PostgreSQL {target} is not installed here ({pg_config or 'no pg_config'}): "
                    f"`PG={target} scripts/setup.sh` installs it (docs/versions.md)")
    install_extension_for(target, pg_config)
    return pg_config


@pytest.mark.parametrize("target", TARGETS)
def test_pg_upgrade_keeps_everything_and_the_worker_delivers(target):
    if target < SOURCE:
        pytest.skip(f"pg_upgrade goes from the version under test, PostgreSQL {SOURCE}, to it or newer ones")
    target_pg_config(target)
    upgrade_and_check(VersionCluster(OLD_PORT, SOURCE, CONF), target)


@pytest.mark.parametrize("target", [16, 17, 18])
def test_pg_upgrade_from_the_previous_release_of_15(target):
    """Where the installed 15 marks columns with pg_attver and the target does not know it
    (test above: an expected failure), the same from Debian's release of 15 before it."""
    if SOURCE != 15:
        pytest.skip("runs in PostgreSQL 15's test run")
    pg_config = target_pg_config(target)
    if not marks_attver(pg_config_of(15)) or marks_attver(pg_config):
        pytest.skip(f"PostgreSQL {target} restores what the installed 15 marks: the test above covers it")
    pg15_config, reason = previous_release_of_15()
    if not pg15_config:
        pytest.skip(reason)
    upgrade_and_check(VersionCluster(OLD_PORT, 15, CONF, pg15_config=pg15_config), target)


def upgrade_and_check(old, target):
    """Fills `old`, upgrades it to PostgreSQL `target` and checks everything came through."""
    receiver = Receiver().start()
    work = tempfile.mkdtemp(prefix="outbox_ext-pg_upgrade.")
    if os.geteuid() == 0:
        shutil.chown(work, "postgres")
    # PostgreSQL 18's initdb turns data checksums on by default, earlier ones off: pg_upgrade
    # needs both clusters alike.
    new = VersionCluster(NEW_PORT, target, CONF, "--no-data-checksums" if old.pg < 18 <= target else "")
    try:
        old.start()
        old.create_database(DATABASE)
        with old.connect(DATABASE) as conn:
            facts = populate(conn, receiver.url)
            before = snapshot(conn)
            members_before = conn.execute(MEMBERS).fetchall()
            pending = conn.execute("SELECT public_id::text FROM outbox WHERE topic = 'booking.created' AND status = 'PENDING' "
                                   "AND available_at <= clock_timestamp() AND lease_token IS NULL ORDER BY id").fetchall()
        settings_before = settings_seen(old), settings_seen(old, "outbox_pgu_app")
        assert settings_before == (("5", 5), ("6", "2s"))
        assert len(pending) == 4  # EVERY_STATE's ready one and the three enqueued
        assert not receiver.requests, "delivery was to be paused in the old cluster"
        old.stop()

        new.start()  # initdb, with the same settings
        new.stop()
        pg_upgrade(old, new, work)

        new.start()
        with new.connect(DATABASE) as conn:
            assert conn.execute("SELECT current_setting('server_version_num')::int / 10000").fetchone()[0] == target
            after = snapshot(conn)
            for name in SNAPSHOT:
                assert after[name] == before[name], f"pg_upgrade changed the {name}"
            members = conn.execute(MEMBERS).fetchall()
        new.create_database("outbox_pg_upgrade_fresh")
        with new.connect("outbox_pg_upgrade_fresh") as fresh:
            assert members == fresh.execute(MEMBERS).fetchall(), "the upgraded extension's members differ from a fresh install's"
        assert set(members_before) <= set(members)
        with new.connect(DATABASE) as conn:
            assert after["extension"] == [("outbox_ext", CURRENT, "public")]
            assert after["privileges"] == [(True, True, False, True, True, False)]
            # The sequences go on where they were; dedupe keys still hold.
            next_id = before["messages"][-1][0] + 1
            assert conn.execute("SELECT (outbox_enqueue('audit.logged', '{}')).id").fetchone()[0] == next_id
            assert conn.execute("SELECT (outbox_enqueue('booking.created', '{}', dedupe_key => 'ready-2')).id").fetchone()[0] \
                == conn.execute("SELECT id FROM outbox WHERE dedupe_key = 'ready-2'").fetchone()[0]
        assert (settings_seen(new), settings_seen(new, "outbox_pgu_app")) == settings_before

        # Delivery on: the worker of the upgraded database delivers the old pending messages
        # (signed with the old secret) and a new one.
        with new.connect(DATABASE) as conn:
            new_id = conn.execute("SELECT public_id::text FROM outbox_enqueue('booking.created', '{\"after\": \"upgrade\"}')"
                                  ).fetchone()[0]
        new.configure(**{"outbox.worker_enabled": "on"})
        expected = {row[0] for row in pending} | {new_id}
        delivered = eventually(lambda: {r["headers"].get("webhook-id") for r in receiver.requests} >= expected and receiver.requests,
                               timeout=60, what="the old pending messages and the new one delivered")
        for request in delivered:
            Webhook(facts["secret"]).verify(request["body"], request["headers"])
        with new.connect(DATABASE) as conn:
            eventually(lambda: conn.execute("SELECT count(*) FROM outbox WHERE public_id::text = ANY(%s) AND status = 'DONE'",
                                            (list(expected),)).fetchone()[0] == len(expected),
                       timeout=30, what="the delivered messages DONE")
            assert conn.execute("SELECT state FROM outbox_worker_status() WHERE database = current_database()"
                                ).fetchone()[0] in ("idle", "delivering")
    finally:
        receiver.stop()
        for cluster in (old, new):
            cluster.remove()
        shutil.rmtree(work, ignore_errors=True)
