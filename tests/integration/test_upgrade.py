"""ALTER EXTENSION outbox_ext UPDATE from each previous version keeps the data and ends with
exactly the objects, definitions and privileges of a fresh install."""

import pathlib
import subprocess

import psycopg
import pytest

from conftest import DATABASE

ROOT = pathlib.Path(__file__).resolve().parents[2]
PREVIOUS = ["0.1.0", "0.2.0"]

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
ORDER BY 1
"""

STATE = "SELECT id, public_id, topic, payload, status, attempts, last_error, dedupe_key, lease_token IS NOT NULL FROM outbox ORDER BY id"


def fresh_database(name):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        admin.execute(f"CREATE DATABASE {name}")
    return psycopg.connect(dbname=name, autocommit=True)


def test_the_upgrade_script_is_generated_from_the_current_sources():
    generated = subprocess.run([ROOT / "scripts/make-upgrade-script.sh", "--stdout"], check=True,
                               capture_output=True, text=True).stdout
    assert generated == (ROOT / "sql/outbox_ext--0.2.0--0.3.0.sql").read_text(), \
        "run scripts/make-upgrade-script.sh after editing sql/api.sql, operations.sql or privileges.sql"


@pytest.mark.parametrize("previous", PREVIOUS)
def test_update_from_a_previous_version_keeps_data_and_matches_a_fresh_install(database, previous):
    with fresh_database("outbox_upgrade_fresh") as fresh:
        fresh.execute("CREATE EXTENSION outbox_ext")
        expected_schema = fresh.execute(SCHEMA_FINGERPRINT).fetchall()
        default_version = fresh.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'").fetchone()[0]

    with fresh_database("outbox_upgrade_old") as old:
        old.execute(f"CREATE EXTENSION outbox_ext VERSION '{previous}'")
        old.execute("SET outbox.max_attempts = 1")
        old.execute("SELECT outbox_enqueue('booking.created', jsonb_build_object('n', n), dedupe_key => 'k' || n) FROM generate_series(1, 5) n")
        old.execute("SELECT outbox_complete(1)")
        old.execute("SELECT outbox_fail(id, 'HTTP 500: boom', lease_token) FROM outbox_claim(1)")  # -> DEAD
        old.execute("SELECT * FROM outbox_claim(1)")  # leased
        old.execute("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/', outbox_generate_secret())")
        before = old.execute(STATE).fetchall()
        secret = old.execute("SELECT secret FROM outbox_subscription").fetchone()[0]

        old.execute("ALTER EXTENSION outbox_ext UPDATE")
        assert old.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'").fetchone()[0] == default_version
        assert old.execute(SCHEMA_FINGERPRINT).fetchall() == expected_schema
        assert old.execute(STATE).fetchall() == before
        assert old.execute("SELECT secret FROM outbox_subscription").fetchone()[0] == secret

        # The API works on the upgraded data, old and new functions alike.
        old.execute("RESET outbox.max_attempts")
        assert old.execute("SELECT (outbox_enqueue('booking.created', '{}', dedupe_key => 'k2')).id").fetchone()[0] == 2
        assert old.execute("SELECT count(*) FROM outbox_claim(10)").fetchone()[0] == 2
        assert old.execute("SELECT outbox_requeue_all()").fetchone()[0] == 1
        assert old.execute("SELECT pending, dead FROM outbox_stats() WHERE topic IS NULL").fetchone() == (4, 0)
