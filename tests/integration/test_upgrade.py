"""ALTER EXTENSION outbox_ext UPDATE from each previous version keeps the data and the users'
grants and ends with exactly the objects, definitions and privileges of a fresh install; every
upgrade script is put on disk by the ordinary install; a released script never changes."""

import hashlib
import itertools
import pathlib
import subprocess

import os

import psycopg
import pytest

from conftest import pg_program
from support import CURRENT_VERSION, EVERY_STATE, STATE, eventually, fresh_database, released_versions, version_key
from support.receiver import Receiver

ROOT = pathlib.Path(__file__).resolve().parents[2]
PREVIOUS = released_versions()
CURRENT = CURRENT_VERSION
# Scripts of released versions, frozen: their SHA-256 (a release adds its scripts here).
RELEASED = ROOT / "sql/released.sha256"


# Since 0.4.0: ordering keys (a head and one waiting behind it), a message handed to its
# endpoints with a delivery parked at a disabled one and a dead one at another, and the attempt
# log. Of topics the update's worker leaves alone: nobody subscribes to booking.keyed, and a
# message whose deliveries have not all ended is not settled.
KEYS_AND_DELIVERIES = """
INSERT INTO outbox_subscription (topic, url, enabled) VALUES ('audit.exported', 'https://second.example.test/', false);
INSERT INTO outbox (topic, payload, ordering_key, waiting_for) VALUES
    ('booking.keyed', '{"n": 1}', 'booking:1', NULL),
    ('booking.keyed', '{"n": 2}', 'booking:1', 'ordering_key'),
    ('audit.exported', '{"n": 3}', 'audit:1', 'deliveries');
INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, last_error, processed_at, ordering_key)
SELECT m.id, s.id, CASE WHEN s.url LIKE '%second%' THEN 'DEAD' ELSE 'PENDING' END::outbox_status, 3, 'HTTP 503',
       CASE WHEN s.url LIKE '%second%' THEN now() END, m.ordering_key
  FROM outbox m, outbox_subscription s WHERE m.topic = 'audit.exported';
INSERT INTO outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration, http_status, error)
SELECT message_id, subscription_id, 3, now(), interval '20 ms', 503, NULL FROM outbox_delivery;
"""
DELIVERY_STATE = """
SELECT m.payload->>'n', s.url, d.status, d.attempts, d.last_error, d.processed_at IS NOT NULL, d.ordering_key, d.waiting_for::text,
       (SELECT count(*) FROM outbox_delivery_attempt a WHERE a.message_id = d.message_id AND a.subscription_id = d.subscription_id)
  FROM outbox_delivery d JOIN outbox m ON m.id = d.message_id JOIN outbox_subscription s ON s.id = d.subscription_id
 ORDER BY 1, 2
"""


def extension_directory():
    sharedir = subprocess.run([os.environ["OUTBOX_PG_CONFIG"], "--sharedir"], check=True, capture_output=True,
                              text=True).stdout.strip()
    return pathlib.Path(sharedir) / "extension"

SCHEMA_FINGERPRINT = """
SELECT 'object ' || pg_describe_object(d.classid, d.objid, 0)
  FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
 WHERE e.extname = 'outbox_ext' AND d.deptype = 'e'
UNION ALL
SELECT 'function ' || p.oid::regprocedure || ' ' || pg_get_functiondef(p.oid) || ' acl ' || coalesce(p.proacl::text, '')
  FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace AND p.proname LIKE 'outbox%'
UNION ALL
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' ' || coalesce(c.reloptions::text, '') || ' acl ' || coalesce(c.relacl::text, '')
  FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'outbox%'
UNION ALL
SELECT 'index ' || indexdef FROM pg_indexes WHERE schemaname = 'public' AND tablename LIKE 'outbox%'
UNION ALL
SELECT 'constraint ' || conname || ' ' || pg_get_constraintdef(oid) FROM pg_constraint
 WHERE connamespace = 'public'::regnamespace AND conname LIKE 'outbox%'
UNION ALL
SELECT 'view ' || viewname || ' ' || definition FROM pg_views WHERE schemaname = 'public' AND viewname LIKE 'outbox%'
UNION ALL
SELECT 'initial privileges ' || pg_describe_object(i.classoid, i.objoid, i.objsubid) || ' ' || i.initprivs::text
  FROM pg_init_privs i
  JOIN pg_depend d ON d.classid = i.classoid AND d.objid = i.objoid AND d.deptype = 'e'
  JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'outbox_ext'
ORDER BY 1
"""


def test_the_upgrade_script_is_generated_from_the_current_sources():
    generated = subprocess.run([ROOT / "scripts/make-upgrade-script.sh", "--stdout"], check=True,
                               capture_output=True, text=True).stdout
    assert generated == (ROOT / f"sql/outbox_ext--{PREVIOUS[-1]}--{CURRENT}.sql").read_text(), \
        "run scripts/make-upgrade-script.sh after editing the SQL sources"


def test_the_corrected_updates_are_generated_from_the_released_steps():
    assert subprocess.run([ROOT / "scripts/make-corrected-updates.py", "--check"]).returncode == 0, \
        "run scripts/make-corrected-updates.py"


def test_released_scripts_never_change():
    """0.3.0's generator rewrote the released 0.2.0 -> 0.3.0 script whenever it ran."""
    listed = {}
    for line in RELEASED.read_text().splitlines():
        digest, name = line.split()
        listed[name] = digest
        assert hashlib.sha256((ROOT / name).read_bytes()).hexdigest() == digest, f"{name} was released and changed"
    # Every script that does not lead to the version in the making is a released one.
    for path in sorted((ROOT / "sql").rglob("outbox_ext--*.sql")):
        target = path.stem.split("--")[-1]
        if version_key(target) < version_key(CURRENT):
            assert str(path.relative_to(ROOT)) in listed, f"{path.name} belongs to a release: add it to {RELEASED.name}"
            assert target in PREVIOUS, f"release {target} has no install script in sql/versions/"


def test_the_ordinary_install_puts_every_upgrade_script_on_disk():
    """0.3.0 kept 0.1.0 -> 0.2.0 where `cargo pgrx install` never copied it (the tests copied it
    by hand), so installs of 0.1.0 could not be upgraded."""
    scripts = [p for p in (ROOT / "sql").rglob("outbox_ext--*--*.sql")]
    assert scripts
    installed = extension_directory()
    for script in scripts:
        on_disk = installed / script.name
        assert on_disk.exists(), f"{script.name} is not installed"
        assert on_disk.read_bytes() == script.read_bytes(), f"the installed {script.name} differs"
    # A path from every released version to this one, made of installed scripts only.
    steps = {tuple(p.stem.split("--")[1:]) for p in installed.glob("outbox_ext--*--*.sql")}
    for previous in PREVIOUS:
        reachable, frontier = {previous}, [previous]
        while frontier:
            version = frontier.pop()
            for start, end in steps:
                if start == version and end not in reachable:
                    reachable.add(end)
                    frontier.append(end)
        assert CURRENT in reachable, f"no installed upgrade path from {previous} to {CURRENT}"


@pytest.mark.parametrize("previous", PREVIOUS)
def test_update_from_a_previous_version_keeps_data_and_matches_a_fresh_install(database, previous):
    with fresh_database("outbox_upgrade_fresh") as fresh:
        fresh.execute("CREATE EXTENSION outbox_ext")
        expected_schema = fresh.execute(SCHEMA_FINGERPRINT).fetchall()
        default_version = fresh.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'").fetchone()[0]

    with fresh_database("outbox_upgrade_old") as old:
        old.execute(f"CREATE EXTENSION outbox_ext VERSION '{previous}'")
        old.execute(EVERY_STATE)
        # (Of a topic without messages: once updated, the database gets a delivery worker,
        # which would take the messages of a subscribed topic.)
        old.execute("INSERT INTO outbox_subscription (topic, url, secret, enabled) VALUES "
                    "('audit.exported', 'https://hooks.example.test/', 'whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw', false)")
        claim_language = old.execute("SELECT l.lanname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang "
                                     "WHERE p.oid = 'outbox_claim(integer, text[], interval)'::regprocedure").fetchone()[0]
        if claim_language == "c":
            # The old version's declarations call the new library's code: a clear error until
            # the update, never a statement run against tables it does not fit.
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="ALTER EXTENSION outbox_ext UPDATE"):
                old.execute("SELECT outbox_claim(1, lease => NULL)")
        # A user's grants on the extension's objects (0.3.0's upgrade from 0.2.0 lost them).
        old.execute("DROP ROLE IF EXISTS outbox_upgrade_mon")
        old.execute("CREATE ROLE outbox_upgrade_mon")
        views = [row[0] for row in old.execute(
            "SELECT viewname FROM pg_views WHERE schemaname = 'public' AND viewname LIKE 'outbox%' ORDER BY 1")]
        assert views
        old.execute(f"GRANT SELECT ON {', '.join(views)} TO outbox_upgrade_mon")
        old.execute("GRANT EXECUTE ON FUNCTION outbox_claim(integer, text[], interval) TO outbox_upgrade_mon")
        with_deliveries = version_key(previous) >= (0, 4, 0)
        if with_deliveries:
            old.execute(KEYS_AND_DELIVERIES)
            deliveries_before = old.execute(DELIVERY_STATE).fetchall()
            assert len(deliveries_before) == 2
        before = old.execute(STATE).fetchall()
        secret = old.execute("SELECT secret FROM outbox_subscription WHERE url LIKE 'https://hooks.%'").fetchone()[0]

        old.execute("ALTER EXTENSION outbox_ext UPDATE")
        assert old.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'").fetchone()[0] == default_version
        for view in views:
            assert old.execute("SELECT has_table_privilege('outbox_upgrade_mon', %s, 'SELECT')", (view,)).fetchone()[0], \
                f"the update dropped a user's grant on {view}"
        assert old.execute("SELECT has_function_privilege('outbox_upgrade_mon', 'outbox_claim(integer, text[], interval)', "
                           "'EXECUTE')").fetchone()[0], "the update dropped a user's grant on outbox_claim"
        # The users' grants are theirs, not the extension's initial privileges: a dump keeps them.
        dump = subprocess.run([pg_program("pg_dump"), "--schema-only", "-d", "outbox_upgrade_old"],
                              capture_output=True, text=True, check=True).stdout
        assert "GRANT ALL ON FUNCTION public.outbox_claim(batch_size integer, topics text[], lease interval) TO outbox_upgrade_mon" in dump
        old.execute(f"REVOKE SELECT ON {', '.join(views)} FROM outbox_upgrade_mon")
        old.execute("REVOKE EXECUTE ON FUNCTION outbox_claim(integer, text[], interval) FROM outbox_upgrade_mon")
        old.execute("DROP ROLE outbox_upgrade_mon")
        assert old.execute(SCHEMA_FINGERPRINT).fetchall() == expected_schema
        assert old.execute(STATE).fetchall() == before
        assert old.execute("SELECT secret FROM outbox_subscription WHERE url LIKE 'https://hooks.%'").fetchone()[0] == secret
        if with_deliveries:
            assert old.execute(DELIVERY_STATE).fetchall() == deliveries_before
            # The key still orders its messages: the head is claimed, the one behind it waits.
            assert old.execute("SELECT payload->>'n' FROM outbox_claim(10, ARRAY['booking.keyed'], lease => NULL)").fetchall() \
                == [("1",)]
            old.execute("DELETE FROM outbox_subscription WHERE url LIKE 'https://second.%'")
            old.execute("DELETE FROM outbox WHERE topic IN ('booking.keyed', 'audit.exported')")
            old.execute("DELETE FROM outbox_delivery_attempt")

        # The API works on the upgraded data, old and new functions alike.
        assert old.execute("SELECT id, payload FROM outbox_enqueue('booking.created', '{}', dedupe_key => 'k2')").fetchone() == (2, None)
        assert old.execute("SELECT payload->>'state' FROM outbox_claim(10)").fetchall() == [("ready",)]
        assert old.execute("SELECT outbox_requeue_all()").fetchone()[0] == 1
        assert old.execute("SELECT pending, dead FROM outbox_stats() WHERE topic IS NULL").fetchone() == (5, 0)


def test_an_update_with_messages_in_flight_delivers_every_one(database):
    """Messages a 0.3.0 worker left pending (ready, leased, backing off, delayed) get their
    deliveries after ALTER EXTENSION UPDATE, which also starts the database's worker."""
    receiver = Receiver().start()
    try:
        with fresh_database("outbox_upgrade_live") as old:
            old.execute("CREATE EXTENSION outbox_ext VERSION '0.3.0'")
            old.execute("INSERT INTO outbox_subscription (topic, url) VALUES ('booking.created', %s)", (receiver.url,))
            old.execute("""INSERT INTO outbox (topic, payload, attempts, available_at, lease_token, last_error) VALUES
                ('booking.created', '{"state": "ready"}', 0, clock_timestamp(), NULL, NULL),
                ('booking.created', '{"state": "leased"}', 1, clock_timestamp() + interval '2 seconds', gen_random_uuid(), NULL),
                ('booking.created', '{"state": "backing off"}', 1, clock_timestamp() + interval '1 second', NULL, 'HTTP 503'),
                ('booking.created', '{"state": "delayed"}', 0, clock_timestamp() + interval '3 seconds', NULL, NULL)""")
            expected = {row[0] for row in old.execute("SELECT public_id::text FROM outbox")}
            old.execute("ALTER EXTENSION outbox_ext UPDATE")
            eventually(lambda: old.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 4,
                       timeout=30, what="every message delivered after the update")
            delivered = [r["headers"]["webhook-id"] for r in receiver.requests]
            assert sorted(delivered) == sorted(expected), "each once"
            # The one that was backing off kept its count: its delivery started where it stood.
            assert old.execute("SELECT d.attempts FROM outbox_deliveries d JOIN outbox m ON m.id = d.message_id "
                               "WHERE m.payload->>'state' = 'backing off'").fetchone()[0] == 2
    finally:
        receiver.stop()


def test_the_update_from_0_5_2_moves_done_messages_and_their_deliveries_to_their_day(database):
    """0.5.3 keeps DONE messages in the history of their day (docs/storage.md): the update moves
    0.5.2's there, with their deliveries, and leaves in outbox what stays there."""
    with fresh_database("outbox_upgrade_history") as old:
        old.execute("CREATE EXTENSION outbox_ext VERSION '0.5.2'")
        old.execute(EVERY_STATE)
        subscription = old.execute("""INSERT INTO outbox_subscription (topic, url, enabled)
                                      VALUES ('audit.exported', 'https://hooks.example.test/', false) RETURNING id""").fetchone()[0]
        for days_ago in (0, 2):
            old.execute("""INSERT INTO outbox (topic, payload, status, attempts, processed_at)
                           SELECT 'audit.exported', jsonb_build_object('n', g), 'DONE', 1, now() - %s * interval '1 day' - interval '1 hour'
                             FROM generate_series(1, 5000) g""", (days_ago,))
        old.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, processed_at)
                       SELECT id, %s, 'DONE', 1, processed_at FROM outbox WHERE topic = 'audit.exported'""", (subscription,))
        before = old.execute(STATE).fetchall()
        deliveries_before = old.execute("SELECT message_id, subscription_id, status, processed_at FROM outbox_delivery ORDER BY 1").fetchall()

        old.execute("ALTER EXTENSION outbox_ext UPDATE")

        assert old.execute(STATE).fetchall() == before
        assert old.execute("SELECT message_id, subscription_id, status, processed_at FROM outbox_delivery ORDER BY 1").fetchall() \
            == deliveries_before
        places = dict(old.execute("""SELECT tableoid::regclass::text, count(*) FROM outbox WHERE topic = 'audit.exported'
                                      GROUP BY 1""").fetchall())
        days = old.execute("""SELECT DISTINCT 'outbox_history_' || outbox_attempt_log_slot(processed_at) FROM outbox
                               WHERE topic = 'audit.exported'""").fetchall()
        assert places == {day: 5000 for (day,) in days} and len(days) == 2, "each in the history of its day"
        delivery_places = {row[0] for row in old.execute("SELECT DISTINCT tableoid::regclass::text FROM outbox_delivery")}
        assert delivery_places == {day.replace("outbox_", "outbox_delivery_") for (day,) in days}
        # What stays in outbox: pending, dead, the DONE one holding its dedupe_key.
        assert old.execute("SELECT count(*) FROM ONLY outbox").fetchone()[0] == 6


USERS_ACL = """
SELECT 'relation ' || c.relname || ' ' || coalesce(c.relacl::text, '') FROM pg_class c
 WHERE c.relnamespace = 'public'::regnamespace AND c.relname LIKE 'outbox%' AND c.relacl::text LIKE '%outbox_upgrade_%'
UNION ALL
SELECT 'column ' || a.attrelid::regclass || '.' || a.attname || ' ' || a.attacl::text FROM pg_attribute a
 WHERE a.attrelid::regclass::text LIKE 'outbox%' AND a.attacl::text LIKE '%outbox_upgrade_%'
UNION ALL
SELECT 'function ' || p.oid::regprocedure || ' ' || p.proacl::text FROM pg_proc p
 WHERE p.proname LIKE 'outbox%' AND p.proacl::text LIKE '%outbox_upgrade_%'
ORDER BY 1
"""


# Releases whose update scripts keep the users' grants as they were (from 0.5.17; a database at
# 0.5.16 goes through 0.5.17's script, which already takes column grants).
@pytest.mark.parametrize("previous", [v for v in PREVIOUS if version_key(v) >= (0, 5, 16)])
def test_an_update_keeps_column_grants_and_who_granted_what(database, previous):
    """A user's column grant on an extension table made the next update fail on PostgreSQL 16+
    ("ACL arrays must be one-dimensional"): the update left an empty initial privilege behind.
    And the update granted again, as the superuser running it, what was still granted, so a
    REVOKE … CASCADE from the role that granted it no longer took it away."""
    with fresh_database("outbox_upgrade_grants") as old:
        old.execute(f"CREATE EXTENSION outbox_ext VERSION '{previous}'")
        for role in ("outbox_upgrade_lead", "outbox_upgrade_team"):
            old.execute(f"DROP ROLE IF EXISTS {role}")
            old.execute(f"CREATE ROLE {role}")
        old.execute("GRANT SELECT (id, topic) ON outbox TO outbox_upgrade_team")
        old.execute("GRANT EXECUTE ON FUNCTION outbox_stats() TO outbox_upgrade_lead WITH GRANT OPTION")
        old.execute("SET ROLE outbox_upgrade_lead")
        old.execute("GRANT EXECUTE ON FUNCTION outbox_stats() TO outbox_upgrade_team")
        old.execute("RESET ROLE")
        before = old.execute(USERS_ACL).fetchall()
        assert len(before) == 3, before

        old.execute("ALTER EXTENSION outbox_ext UPDATE")
        # Once more, as the next release's update will: it must not stumble on what this one left.
        old.execute("ALTER EXTENSION outbox_ext UPDATE")

        assert old.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'").fetchone()[0] == CURRENT
        if version_key(previous) >= (0, 5, 17):
            assert old.execute(USERS_ACL).fetchall() == before, "the same grants, by the same grantors"
            old.execute("REVOKE EXECUTE ON FUNCTION outbox_stats() FROM outbox_upgrade_lead CASCADE")
            assert not old.execute("SELECT has_function_privilege('outbox_upgrade_team', 'outbox_stats()', 'EXECUTE')").fetchone()[0]
        else:
            assert {row[0].split(" ")[1] for row in old.execute(USERS_ACL)} == {row[0].split(" ")[1] for row in before}
        assert old.execute("SELECT has_column_privilege('outbox_upgrade_team', 'outbox', 'topic', 'SELECT')").fetchone()[0]
        assert old.execute("""SELECT count(*) FROM pg_init_privs i JOIN pg_depend d ON d.classid = i.classoid AND d.objid = i.objoid
                                JOIN pg_extension e ON e.oid = d.refobjid AND e.extname = 'outbox_ext'
                               WHERE array_ndims(i.initprivs) IS NULL""").fetchone()[0] == 0, "no empty initial privileges"
        old.execute("DROP EXTENSION outbox_ext")
        for role in ("outbox_upgrade_team", "outbox_upgrade_lead"):
            old.execute(f"DROP ROLE {role}")


def test_a_session_that_saw_an_update_rolled_back_refuses_the_old_schema(database):
    """The library checks once per session that the database's extension is its version. A
    session that ran the update in a transaction, used it, and rolled back (or whose extension
    another session dropped and created at an older version) kept running the new library's
    statements against the old schema."""
    previous = PREVIOUS[-1]
    with fresh_database("outbox_upgrade_rollback") as session:
        session.execute(f"CREATE EXTENSION outbox_ext VERSION '{previous}'")
        for rollback in ("ROLLBACK", "ROLLBACK TO SAVEPOINT before_update"):
            session.execute("BEGIN")
            if rollback.startswith("ROLLBACK TO"):
                session.execute("SAVEPOINT before_update")
            session.execute("ALTER EXTENSION outbox_ext UPDATE")
            session.execute("SELECT outbox_enqueue('booking.created', '{}')")
            session.execute(rollback)
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="ALTER EXTENSION outbox_ext UPDATE"):
                session.execute("SELECT outbox_enqueue('booking.created', '{}')")
            session.execute("ROLLBACK")
        assert session.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0

        session.execute("ALTER EXTENSION outbox_ext UPDATE")
        session.execute("SELECT outbox_enqueue('booking.created', '{}')")
        with psycopg.connect(dbname="outbox_upgrade_rollback", autocommit=True) as other:
            other.execute("DROP EXTENSION outbox_ext")
            other.execute(f"CREATE EXTENSION outbox_ext VERSION '{previous}'")
        with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="ALTER EXTENSION outbox_ext UPDATE"):
            session.execute("SELECT outbox_enqueue('booking.created', '{}')")


# The types a statement of an update script may apply an operator to, besides the extension's own.
LOOKALIKE_TYPES = ["text", "varchar", "name", "integer", "bigint", "smallint", "numeric", "double precision", "real",
                   "interval", "timestamptz", "timestamp", "date", "oid", "regclass", "jsonb", "boolean", "uuid", '"char"',
                   # (an enum compared with a literal: (anyenum, text) takes it as a string)
                   "anyenum", "anyelement"]
LOOKALIKE_OPERATORS = {"=": "boolean", "<>": "boolean", "<": "boolean", ">": "boolean", "<=": "boolean", ">=": "boolean",
                       "||": "text", "+": None, "-": None, "*": None, "/": None, "%": None, "~~": "boolean", "->>": "text",
                       "->": "jsonb", "@>": "boolean"}


def lookalikes(types):
    """SQL that plants, in public, an operator for every pair of `types` and every operator name an
    update script may use: each notes who called it in planted_calls, then does what
    pg_catalog's would (marked IMMUTABLE, so that an index's predicate may use it too). One that
    a statement of an update resolves to instead of pg_catalog's (a better match for its
    arguments' types) runs with the updater's rights."""
    statements = ["""CREATE TABLE public.planted_calls (called_by name, superuser text, operator text);
                     GRANT INSERT ON public.planted_calls TO PUBLIC;
                     CREATE FUNCTION public.planted_note(operator text) RETURNS void LANGUAGE sql AS
                       $$ INSERT INTO public.planted_calls VALUES (current_user, current_setting('is_superuser'), operator) $$"""]
    for number, (operator, (left, right)) in enumerate(
            ((operator, pair) for operator in LOOKALIKE_OPERATORS for pair in itertools.product(types, types))):
        result = LOOKALIKE_OPERATORS[operator] or left
        if result.startswith("any"):
            continue  # (arithmetic on an enum: nothing to look like)
        statements.append(f"""
            CREATE FUNCTION public.planted_{number}({left}, {right}) RETURNS {result} LANGUAGE plpgsql IMMUTABLE AS $$
            DECLARE answer {result};
            BEGIN
                PERFORM public.planted_note('{operator} ({left}, {right})');  -- (volatile: it may write)
                EXECUTE 'SELECT ($1 OPERATOR(pg_catalog.{operator}) $2)::{result}' INTO answer USING $1, $2;
                RETURN answer;
            END $$;
            CREATE OPERATOR public.{operator} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = public.planted_{number})""")
    return ";\n".join(statements)


# What uses a planted operator or function: the objects that depend on one (an index, a
# constraint, a view's rule, a column's default, a function's default argument).
PLANTED_IN_USE = """
SELECT pg_describe_object(d.classid, d.objid, d.objsubid), pg_describe_object(d.refclassid, d.refobjid, 0)
  FROM pg_depend d
  LEFT JOIN pg_operator o ON d.refclassid = 'pg_operator'::regclass AND o.oid = d.refobjid
  LEFT JOIN pg_proc p ON d.refclassid = 'pg_proc'::regclass AND p.oid = d.refobjid
 WHERE coalesce(o.oprname, p.proname) IS NOT NULL
   AND coalesce(o.oprnamespace, p.pronamespace) <> 'pg_catalog'::regnamespace
   AND pg_get_userbyid(coalesce(o.oprowner, p.proowner)) = 'outbox_planter'
   AND d.deptype <> 'e'
   AND NOT (d.classid = 'pg_operator'::regclass AND d.objid IN (SELECT oid FROM pg_operator WHERE oprowner = 'outbox_planter'::regrole))
   AND NOT (d.classid = 'pg_proc'::regclass AND d.objid IN (SELECT oid FROM pg_proc WHERE proowner = 'outbox_planter'::regrole))
"""


# The releases whose paths to this one begin differently (a path from a release passes through
# every later step of the releases after it here).
PATH_STARTS = [v for v in PREVIOUS if v in ("0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.1", "0.5.2", "0.5.3", "0.5.4")] + PREVIOUS[-1:]


@pytest.mark.parametrize("previous", PATH_STARTS)
def test_an_update_runs_no_operator_the_database_owner_planted(database, previous):
    """The update runs as a superuser with the extension's schema on its search_path. An
    operator there that fits a statement's argument types better than pg_catalog's was chosen:
    the security probe of 0.5.32 made a database owner superuser with an `||(text, integer)` the
    updates from 0.5.3 and older ran in a DO block. The database owner plants look-alikes of every
    operator for every pair of types after the old version's install (as in a database in use);
    none may run during the update."""
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS outbox_upgrade_planted WITH (FORCE)")
        admin.execute("DROP ROLE IF EXISTS outbox_planter")
        admin.execute("CREATE ROLE outbox_planter LOGIN")
        admin.execute("CREATE DATABASE outbox_upgrade_planted OWNER outbox_planter")
    try:
        with psycopg.connect(dbname="outbox_upgrade_planted", autocommit=True) as old:
            old.execute(f"CREATE EXTENSION outbox_ext VERSION '{previous}'")
            old.execute(EVERY_STATE)
            if version_key(previous) >= (0, 4, 0):
                old.execute(KEYS_AND_DELIVERIES)
            own_types = [row[0] for row in old.execute(
                "SELECT typname FROM pg_type WHERE typnamespace = 'public'::regnamespace AND typname LIKE 'outbox%' AND typtype = 'e'")]
            with psycopg.connect(dbname="outbox_upgrade_planted", user="outbox_planter", autocommit=True) as owner:
                owner.execute(lookalikes(LOOKALIKE_TYPES + own_types))
            old.execute("ALTER EXTENSION outbox_ext UPDATE")
            assert old.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'").fetchone()[0] == CURRENT
            calls = old.execute("SELECT DISTINCT called_by, superuser, operator FROM public.planted_calls").fetchall()
            # Nor may anything of the extension (a constraint, an index, a view, a default) keep
            # one to run later, with the rights of whoever writes.
            kept = old.execute(PLANTED_IN_USE).fetchall()
            assert (calls, kept) == ([], []), f"the update from {previous} ran the database owner's operators {calls} and left {kept} in use"
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute("DROP DATABASE IF EXISTS outbox_upgrade_planted WITH (FORCE)")
            admin.execute("DROP ROLE IF EXISTS outbox_planter")
