"""Delivery in any database: with shared_preload_libraries = 'outbox_ext' and nothing else,
CREATE EXTENSION is enough. A server of its own, configured only with the preload."""

import subprocess
import time

import psycopg
import pytest

from support import CURRENT_VERSION, cpu_share, eventually, released_versions
from support.cluster import ScratchCluster, pg_program
from support.receiver import Receiver

PORT = 25342
SLOTS_PORT = 25345
CURRENT = CURRENT_VERSION
# The latest release before the library's version (its install script is frozen in sql/versions/).
PREVIOUS = released_versions()[-1]


@pytest.fixture(scope="module")
def cluster():
    cluster = ScratchCluster(PORT).start()
    yield cluster
    cluster.remove()


def database_names(cluster) -> set[bytes]:
    """Every database's name, as bytes (one test names a database in LATIN1)."""
    with cluster.connect() as admin:
        return {row[0] for row in admin.execute("SELECT datname::bytea FROM pg_database").fetchall()}


@pytest.fixture(autouse=True)
def drops_the_databases_it_created(cluster):
    """The cluster is the module's: each test leaves it the databases it found. Those left
    behind kept their workers, and outbox.max_workers (8) caps them: in the order the file
    runs, a new database got the 8th worker; in another order (pytest-xdist's split of the
    tests) it waited, and test_a_database_on_an_older_version_waits_for_its_update_asleep
    timed out waiting for its worker."""
    before = database_names(cluster)
    yield
    with cluster.connect() as admin:
        for name in database_names(cluster) - before:
            admin.execute(b'DROP DATABASE IF EXISTS "' + name + b'" WITH (FORCE)')


@pytest.fixture()
def receiver():
    receiver = Receiver().start()
    yield receiver
    receiver.stop()


def deliver_one(cluster, database, receiver, topic):
    """Subscribes the receiver and enqueues one message; waits until it arrives."""
    with cluster.connect(database) as conn:
        conn.execute("SELECT outbox_subscribe(%s, %s)", (topic, receiver.url))
        public_id = conn.execute("SELECT public_id::text FROM outbox_enqueue(%s, '{}')", (topic,)).fetchone()[0]
    eventually(lambda: any(r["headers"]["webhook-id"] == public_id for r in receiver.requests), what=f"delivery in {database}")


def log_since(cluster, offset):
    return cluster.server_log.read_bytes()[offset:].decode(errors="replace")


def test_create_extension_is_enough_and_drop_extension_ends_the_worker(cluster, receiver):
    for name in ("shop", "billing"):
        cluster.create_database(name, extension=False)
    created = time.monotonic()
    for name in ("shop", "billing"):
        with cluster.connect(name) as conn:
            conn.execute("CREATE EXTENSION outbox_ext")
    eventually(lambda: {"shop", "billing"} <= set(cluster.worker_pids()), timeout=10, what="a worker in each database")
    assert time.monotonic() - created < 5, "within a few seconds of the COMMIT, no restart"
    deliver_one(cluster, "shop", receiver, "order.placed")
    deliver_one(cluster, "billing", receiver, "invoice.paid")

    with cluster.connect("shop") as conn:
        conn.execute("DROP EXTENSION outbox_ext")
    eventually(lambda: "shop" not in cluster.worker_pids(), timeout=10, what="shop's worker to end")
    deliver_one(cluster, "billing", receiver, "invoice.sent")
    time.sleep(2)
    assert "shop" not in cluster.worker_pids(), "it does not come back without the extension"


def test_a_launcher_ended_by_an_operator_comes_back(cluster, receiver):
    """pg_terminate_backend of the launcher ended it for good until 0.5.33 (it exited with code
    0, which unregisters a background worker): no worker was started for a new database, nor
    again for one whose worker ended, until the server restarted (stop 56's probe)."""
    def launcher_pids():
        with cluster.connect() as conn:
            return [row[0] for row in conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_ext launcher'")]

    first = launcher_pids()
    assert len(first) == 1
    with cluster.connect() as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (first[0],))
    # (Its restart time is 5 s.)
    eventually(lambda: launcher_pids() not in ([], first), timeout=20, what="a new launcher")
    cluster.create_database("after_launcher")
    eventually(lambda: "after_launcher" in cluster.worker_pids(), timeout=15, what="a worker for a new database")
    deliver_one(cluster, "after_launcher", receiver, "order.placed")


def test_drop_database_is_not_held_up_by_its_worker(cluster):
    cluster.create_database("temporary")
    eventually(lambda: "temporary" in cluster.worker_pids(), what="its worker")
    with cluster.connect() as admin:
        admin.execute("DROP DATABASE temporary")  # without FORCE
    time.sleep(1)
    assert "temporary" not in cluster.worker_pids()


def test_a_dropped_or_renamed_database_gets_no_worker_under_its_old_name(cluster):
    """The worker is kept away while DROP DATABASE or RENAME runs. It was let back before the
    statement committed: the launcher, woken, still saw the old name and started a worker there,
    which failed with FATAL:  database "…" does not exist."""
    for attempt in range(3):
        cluster.create_database("short_lived")
        eventually(lambda: "short_lived" in cluster.worker_pids(), what="its worker")
        offset = cluster.server_log.stat().st_size
        with cluster.connect() as admin:
            admin.execute("DROP DATABASE IF EXISTS renamed_away")
            admin.execute("ALTER DATABASE short_lived RENAME TO renamed_away")
        eventually(lambda: "renamed_away" in cluster.worker_pids(), timeout=10, what="the worker under the new name")
        with cluster.connect() as admin:
            admin.execute("DROP DATABASE renamed_away")
        time.sleep(2)
        written = log_since(cluster, offset)
        assert "FATAL" not in written, f"attempt {attempt + 1}: {written}"


def test_a_role_that_may_not_drop_or_copy_a_database_does_not_stop_its_worker(cluster):
    """The hook that keeps a database's worker away while DROP DATABASE, a RENAME or a copy
    runs, and while DROP EXTENSION does, acted before PostgreSQL checked the role's rights: a
    role with no rights at all stopped any database's worker with a statement that then failed
    (stop 41's probe: 18 restarts in 300 statements, and a request in flight sent twice)."""
    cluster.create_database("kept")
    eventually(lambda: "kept" in cluster.worker_pids(), what="its worker")
    worker = cluster.worker_pids()["kept"]
    with cluster.connect() as admin:
        admin.execute("DROP ROLE IF EXISTS nobody")
        admin.execute("CREATE ROLE nobody LOGIN")
    statements = ["DROP DATABASE kept", "ALTER DATABASE kept RENAME TO taken", "ALTER DATABASE kept SET TABLESPACE pg_default",
                  "CREATE DATABASE copy_of_kept TEMPLATE kept"]
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user="nobody", dbname="postgres", autocommit=True) as nobody:
        for statement in statements:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                nobody.execute(statement)
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user="nobody", dbname="kept", autocommit=True) as nobody:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            nobody.execute("DROP EXTENSION outbox_ext")
    time.sleep(1)
    assert cluster.worker_pids().get("kept") == worker, "the same worker, never stopped"
    with cluster.connect() as admin:
        admin.execute("DROP DATABASE kept")
        admin.execute("DROP ROLE nobody")


def test_create_database_takes_the_default_template(cluster):
    """CREATE DATABASE … TEMPLATE DEFAULT (template1) failed for every role once the library
    was preloaded: the hook that stops a template's worker read the option's missing name
    ("template requires a parameter", stop 48's security review)."""
    with cluster.connect() as admin:
        admin.execute("CREATE DATABASE from_default TEMPLATE DEFAULT")
        admin.execute("DROP DATABASE from_default")


def test_a_database_closed_to_public_keeps_its_worker(cluster, receiver):
    """REVOKE CONNECT … FROM PUBLIC, a common hardening step, locked the worker out: FATAL at
    every try, and nothing delivered (stop 41's probe)."""
    cluster.create_database("hardened")
    eventually(lambda: "hardened" in cluster.worker_pids(), what="its worker")
    with cluster.connect() as admin:
        admin.execute("REVOKE CONNECT ON DATABASE hardened FROM PUBLIC")
        offset = cluster.server_log.stat().st_size
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'hardened' "
                      "AND backend_type = 'outbox_ext delivery worker'")
    deliver_one(cluster, "hardened", receiver, "a.hardened")
    assert "FATAL" not in log_since(cluster, offset)


def test_a_worker_that_cannot_connect_is_shown_waiting_to_start_again(cluster, receiver):
    """A worker that cannot connect (CONNECT revoked from outbox_worker itself) was retried
    with backoff and a FATAL in the log, and outbox_worker_status() showed nothing of it."""
    cluster.create_database("locked_out")
    eventually(lambda: "locked_out" in cluster.worker_pids(), what="its worker")
    state = "waiting: its last worker failed, to start again (see the server log: it may not connect)"
    try:
        with cluster.connect() as admin:
            admin.execute("REVOKE CONNECT ON DATABASE locked_out FROM PUBLIC, outbox_worker")
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'locked_out' "
                          "AND backend_type = 'outbox_ext delivery worker'")

        def shown():
            with cluster.connect("locked_out") as conn:  # (a superuser may still connect)
                rows = conn.execute("SELECT database, pid, state FROM outbox_worker_status()").fetchall()
            return ("locked_out", None, state) in rows
        eventually(shown, timeout=15, what="the database shown waiting, with why")
    finally:
        with cluster.connect() as admin:
            admin.execute("GRANT CONNECT ON DATABASE locked_out TO outbox_worker")
    eventually(lambda: "locked_out" in cluster.worker_pids(), timeout=90, what="a worker again once it may connect")
    deliver_one(cluster, "locked_out", receiver, "a.locked_out")
    with cluster.connect("locked_out") as conn:
        rows = conn.execute("SELECT database, pid IS NULL, state FROM outbox_worker_status() WHERE database = 'locked_out'").fetchall()
    assert rows and rows[0][1] is False and rows[0][2] != state, rows


def test_a_database_with_a_worker_can_be_renamed_and_used_as_a_template(cluster, receiver):
    cluster.create_database("original")
    eventually(lambda: "original" in cluster.worker_pids(), what="its worker")
    with cluster.connect() as admin:
        admin.execute("DROP DATABASE IF EXISTS copied")
        admin.execute("CREATE DATABASE copied TEMPLATE original")
        admin.execute("DROP DATABASE IF EXISTS renamed")
        admin.execute("ALTER DATABASE original RENAME TO renamed")
    eventually(lambda: {"renamed", "copied"} <= set(cluster.worker_pids()), timeout=10, what="workers for both")
    deliver_one(cluster, "renamed", receiver, "a.renamed")
    deliver_one(cluster, "copied", receiver, "a.copied")


def test_a_database_whose_name_is_not_utf8_gets_its_worker(cluster, receiver):
    """A database name is bytes: created from a SQL_ASCII (or LATIN1) database, `café` keeps its
    LATIN1 byte 0xE9. The worker connected by name, read lossily: FATAL "database "caf\ufffd"
    does not exist", again and again, and the database got no delivery (found by stop 57's probe
    of encodings). It connects by oid."""
    name = b"caf\xe9"
    with cluster.connect() as admin:
        admin.execute("DROP DATABASE IF EXISTS ascii_home WITH (FORCE)")
        admin.execute("CREATE DATABASE ascii_home ENCODING 'SQL_ASCII' TEMPLATE template0 LC_COLLATE 'C' LC_CTYPE 'C'")
    psql = [str(pg_program("psql")).encode(), b"-X", b"-q", b"-v", b"ON_ERROR_STOP=1", b"-h", b"127.0.0.1",
            b"-p", str(cluster.port).encode(), b"-U", b"postgres", b"-d", name, b"-c"]
    offset = cluster.server_log.stat().st_size
    with cluster.connect("ascii_home") as home:
        home.execute(b'DROP DATABASE IF EXISTS "' + name + b'" WITH (FORCE)')
        home.execute(b'CREATE DATABASE "' + name + b'"')
        try:
            subprocess.run(psql + [b"CREATE EXTENSION outbox_ext"], check=True, capture_output=True)
            subprocess.run(psql + [f"SELECT outbox_subscribe('a.latin1_name', '{receiver.url}')".encode()], check=True, capture_output=True)
            subprocess.run(psql + [b"SELECT outbox_enqueue('a.latin1_name', '{}')"], check=True, capture_output=True)
            eventually(lambda: any(r["headers"]["outbox-topic"] == "a.latin1_name" for r in receiver.requests), timeout=20,
                       what="the delivery in the database with a LATIN1 name")
            assert "FATAL" not in log_since(cluster, offset)
        finally:
            home.execute(b'DROP DATABASE IF EXISTS "' + name + b'" WITH (FORCE)')


def test_a_database_renamed_while_delivering_sends_again_only_what_was_in_flight(cluster, receiver):
    """ALTER DATABASE … RENAME needs the database without connections: its worker leaves at
    once. It left without handing back the deliveries it had queued, so the next worker took
    them for requests in flight, counted an attempt for each and sent them with outbox-attempt
    2 (found by stop 39's probe: 13 of 20; with outbox.max_attempts = 1 they went DEAD unsent)."""
    cluster.create_database("before_rename")
    receiver.answer_by_default(200, delay=2)
    with cluster.connect("before_rename") as conn:
        conn.execute("SELECT outbox_subscribe('rename.me', %s)", (receiver.url,))
        conn.execute("SELECT outbox_enqueue('rename.me', jsonb_build_object('n', n)) FROM generate_series(1, 20) n")
    receiver.wait_for(1, started=True)  # some requests in flight, the others queued behind them
    with cluster.connect() as admin:
        admin.execute("DROP DATABASE IF EXISTS after_rename")
        admin.execute("ALTER DATABASE before_rename RENAME TO after_rename")
    receiver.answer_by_default(200)

    def delivered():
        with cluster.connect("after_rename") as conn:
            return conn.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 20

    eventually(delivered, timeout=60, what="every message delivered")
    assert len({r["headers"]["webhook-id"] for r in receiver.requests}) == 20
    again = [r["headers"]["webhook-id"] for r in receiver.requests if r["headers"]["outbox-attempt"] != "1"]
    # (outbox.max_in_flight: 8.)
    assert len(again) <= 8, f"{len(again)} messages sent again, where at most the 8 in flight should be"


def test_more_databases_than_max_workers_are_named_and_wait(cluster, receiver):
    for name in list(cluster.worker_pids()):
        with cluster.connect() as admin:
            admin.execute(f'DROP DATABASE "{name}"')
    cluster.configure(**{"outbox.max_workers": "2"})
    offset = cluster.server_log.stat().st_size
    try:
        for name in ("one", "two", "three"):
            cluster.create_database(name)
        eventually(lambda: len(cluster.worker_pids()) == 2, what="two workers")
        time.sleep(1.5)
        assert len(cluster.worker_pids()) == 2, "never more than outbox.max_workers"
        waiting = (set(("one", "two", "three")) - set(cluster.worker_pids())).pop()
        assert f'database "{waiting}" has no delivery worker: outbox.max_workers (2) workers are running' in log_since(cluster, offset)
        with cluster.connect("one") as conn:
            rows = conn.execute("SELECT database, pid, state FROM outbox_worker_status() ORDER BY database").fetchall()
        assert (waiting, None, "waiting: outbox.max_workers workers are running") in rows
        # Room again: the waiting database gets its worker.
        cluster.configure(**{"outbox.max_workers": "8"})
        eventually(lambda: waiting in cluster.worker_pids(), timeout=10, what="the waiting database's worker")
    finally:
        cluster.configure(**{"outbox.max_workers": "8"})


def test_after_a_restart_a_database_without_a_background_worker_slot_is_named_and_waits():
    """After a restart the launcher knows of no database whether it has outbox_ext. One that
    got no background worker slot (max_worker_processes) was shown nowhere and named in no
    WARNING: its messages waited in silence (stop 58's probe of crashes). It waits visibly,
    "if it has outbox_ext"."""
    # The launcher, PostgreSQL's logical replication launcher and one worker.
    cluster = ScratchCluster(SLOTS_PORT, conf="max_worker_processes = 3").start()
    try:
        for name in ("first", "second"):
            cluster.create_database(name)
        eventually(lambda: len(cluster.worker_pids()) == 1, what="one worker")
        offset = cluster.server_log.stat().st_size
        cluster.pg_ctl("restart", "-m", "fast")
        eventually(lambda: len(cluster.worker_pids()) == 1, timeout=30, what="one worker after the restart")
        waiting = ({"first", "second"} - set(cluster.worker_pids())).pop()

        def shown_waiting():
            with cluster.connect(waiting) as conn:
                return conn.execute("SELECT pid, state FROM outbox_worker_status() WHERE database = %s", (waiting,)).fetchall()

        assert eventually(shown_waiting, what="the database shown waiting") == [(None, "waiting: no background worker slot (max_worker_processes)")]
        assert (f'database "{waiting}" has no delivery worker (if it has outbox_ext): no background worker slot is free'
                in log_since(cluster, offset))
    finally:
        cluster.remove()


def test_a_database_whose_extension_was_dropped_is_not_named_as_waiting(cluster, receiver):
    """DROP EXTENSION stops its database's worker, and a database waiting for one takes the
    slot. Until 0.5.34 the launcher still took the first for a database with the extension:
    with every worker taken again it warned that it had no worker and showed it waiting, where
    the docs advise raising outbox.max_workers (found by stop 57's probe of the docs)."""
    for name in list(cluster.worker_pids()):
        with cluster.connect() as admin:
            admin.execute(f'DROP DATABASE "{name}"')
    cluster.configure(**{"outbox.max_workers": "2"})
    try:
        for name in ("north", "south", "east"):
            cluster.create_database(name)
        eventually(lambda: len(cluster.worker_pids()) == 2, what="two workers")
        waiting = ({"north", "south", "east"} - set(cluster.worker_pids())).pop()
        dropped = sorted(cluster.worker_pids())[0]
        offset = cluster.server_log.stat().st_size
        with cluster.connect(dropped) as conn:
            conn.execute("DROP EXTENSION outbox_ext")
        eventually(lambda: waiting in cluster.worker_pids(), timeout=10, what="the waiting database's worker")
        time.sleep(3)  # the launcher's next rounds
        assert f'database "{dropped}" has no delivery worker' not in log_since(cluster, offset)
        with cluster.connect(waiting) as conn:
            rows = conn.execute("SELECT database, pid, state FROM outbox_worker_status()").fetchall()
        assert dropped not in [row[0] for row in rows], rows
        assert len(cluster.worker_pids()) == 2 and dropped not in cluster.worker_pids()
    finally:
        cluster.configure(**{"outbox.max_workers": "8"})


def test_a_database_beyond_max_workers_is_named_after_a_restart_and_when_copied_from_a_template(cluster, receiver):
    """The launcher learns that a database has the extension from CREATE EXTENSION, or by
    starting a worker there. After a restart, or for a copy of a database (CREATE DATABASE …
    TEMPLATE), nothing was announced: with every worker taken, it must still find out, and say
    that the database waits."""
    for name in list(cluster.worker_pids()):
        with cluster.connect() as admin:
            admin.execute(f'DROP DATABASE "{name}"')
    cluster.configure(**{"outbox.max_workers": "2"})
    try:
        for name in ("first", "second"):
            cluster.create_database(name)
        eventually(lambda: len(cluster.worker_pids()) == 2, what="two workers")

        def named_as_waiting(database, offset):
            warned = f'database "{database}" has no delivery worker: outbox.max_workers (2) workers are running' in log_since(cluster, offset)
            with cluster.connect("second") as conn:
                rows = conn.execute("SELECT database, pid, state FROM outbox_worker_status()").fetchall()
            return warned and (database, None, "waiting: outbox.max_workers workers are running") in rows

        offset = cluster.server_log.stat().st_size
        with cluster.connect() as admin:
            admin.execute("CREATE DATABASE copy TEMPLATE first")
        eventually(lambda: named_as_waiting("copy", offset), timeout=15, what="the copy named as waiting")

        offset = cluster.server_log.stat().st_size
        cluster.pg_ctl("restart", "-m", "fast")
        eventually(lambda: len(cluster.worker_pids()) == 2, timeout=30, what="two workers after the restart")
        waiting = ({"first", "second", "copy"} - set(cluster.worker_pids())).pop()
        eventually(lambda: named_as_waiting(waiting, offset), timeout=15, what=f"{waiting} named as waiting after the restart")
        assert len(cluster.worker_pids()) == 2, "never more than outbox.max_workers deliver"
    finally:
        cluster.configure(**{"outbox.max_workers": "8"})
    with cluster.connect() as admin:
        admin.execute("DROP DATABASE copy WITH (FORCE)")


def test_worker_databases_limits_them_and_a_missing_one_waits_quietly(cluster, receiver):
    offset = cluster.server_log.stat().st_size
    cluster.create_database("listed")
    cluster.create_database("unlisted")
    cluster.configure(**{"outbox.worker_databases": "listed, not_yet_created"})
    try:
        eventually(lambda: "unlisted" not in cluster.worker_pids(), timeout=10, what="unlisted's worker to stop")
        eventually(lambda: "listed" in cluster.worker_pids(), timeout=10, what="listed's worker")
        time.sleep(3)
        written = log_since(cluster, offset)
        assert written.count('names "not_yet_created", which does not exist (yet)') == 1, written
        assert "FATAL" not in written, written
        cluster.create_database("not_yet_created")
        eventually(lambda: "not_yet_created" in cluster.worker_pids(), timeout=10, what="its worker once it exists")
    finally:
        cluster.configure(**{"outbox.worker_databases": "*"})
    eventually(lambda: "unlisted" in cluster.worker_pids(), timeout=10, what="every database again")


def test_a_database_left_out_of_worker_databases_records_its_answers_before_its_worker_goes(cluster, receiver):
    """Its worker leaves as at a shutdown: the requests in flight get their answers recorded.
    Until 0.5.33 it left at once, and the messages whose requests had been answered were sent
    again (stop 56's probe: 7 of 1,500)."""
    cluster.create_database("drained")
    eventually(lambda: "drained" in cluster.worker_pids(), what="its worker")
    receiver.answer_by_default(200, delay=1.5)
    with cluster.connect("drained") as conn:
        conn.execute("SELECT outbox_subscribe('order.slow', %s)", (receiver.url,))
        for n in range(4):
            conn.execute("SELECT outbox_enqueue('order.slow', jsonb_build_object('n', %s::int))", (n,))
    eventually(lambda: receiver.started >= 4, timeout=10, what="the requests in flight")
    cluster.configure(**{"outbox.worker_databases": "postgres"})
    try:
        eventually(lambda: "drained" not in cluster.worker_pids(), timeout=15, what="its worker to go")
    finally:
        cluster.configure(**{"outbox.worker_databases": "*"})
    receiver.answer_by_default(200)
    with cluster.connect("drained") as conn:
        eventually(lambda: conn.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 4,
                   timeout=15, what="every message DONE")
    sent = [r["headers"]["webhook-id"] for r in receiver.requests]
    assert len(sent) == 4 and len(set(sent)) == 4, f"sent again: {sent}"


def test_no_connection_to_a_database_that_allows_none(cluster):
    cluster.create_database("closed")
    eventually(lambda: "closed" in cluster.worker_pids(), what="its worker")
    with cluster.connect() as admin:
        admin.execute("ALTER DATABASE closed WITH ALLOW_CONNECTIONS false")
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = 'closed'")
    time.sleep(3)
    assert "closed" not in cluster.worker_pids()
    with cluster.connect() as admin:
        admin.execute("ALTER DATABASE closed WITH ALLOW_CONNECTIONS true")
        admin.execute("DROP DATABASE closed")


def test_a_database_on_an_older_version_waits_for_its_update_asleep(cluster, receiver):
    """After a new library, a database still on the old version has a worker that waits for
    ALTER EXTENSION … UPDATE and says so (docs/upgrades.md). It said "idle" and ran a
    transaction per loop, a whole core, until the update. Nor does it touch the tables: its
    housekeeping ran the new library's statements against the old schema, moving DONE messages
    to the history meanwhile."""
    assert PREVIOUS != CURRENT
    cluster.create_database("current")
    cluster.create_database("behind", extension=False)
    with cluster.connect("behind") as conn, conn.transaction():
        conn.execute(f"CREATE EXTENSION outbox_ext VERSION '{PREVIOUS}'")
        # A message done two minutes ago: one the worker's archiving would move at once.
        conn.execute("""INSERT INTO outbox (topic, payload, status, attempts, processed_at)
                        VALUES ('done.before', '{}', 'DONE', 1, now() - interval '2 minutes')""")
    eventually(lambda: "behind" in cluster.worker_pids(), timeout=10, what="its worker")
    pid = cluster.worker_pids()["behind"]

    def state():
        with cluster.connect("current") as conn:
            return conn.execute("SELECT state FROM outbox_worker_status() WHERE database = 'behind'").fetchone()[0]

    eventually(lambda: state() == "waiting for ALTER EXTENSION outbox_ext UPDATE", what="the state that says why")
    busy = cpu_share(pid)
    assert busy < 0.2, f"the worker used {busy:.0%} of a CPU while waiting for the update"
    assert state() == "waiting for ALTER EXTENSION outbox_ext UPDATE"
    with cluster.connect("behind") as conn:
        assert conn.execute("SELECT status FROM ONLY outbox").fetchall() == [("DONE",)], "archived before the update"

    with cluster.connect("behind") as conn:
        conn.execute("ALTER EXTENSION outbox_ext UPDATE")
    deliver_one(cluster, "behind", receiver, "after.update")
    assert state() in ("idle", "delivering")

    def archived():
        with cluster.connect("behind") as conn:
            return conn.execute("SELECT count(*) FROM ONLY outbox WHERE topic = 'done.before'").fetchone() == (0,)

    eventually(archived, what="the housekeeping to resume after the update")
