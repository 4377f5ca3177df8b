"""Least privilege: what a producer, a consumer, an administrator, a monitoring role and
everyone else may and may not do; and a hostile search_path cannot hijack the API."""

import psycopg
import pytest

from conftest import connect, enqueue_many

ROLES = {
    "app_producer": "outbox_producer",
    "app_consumer": "outbox_consumer",
    "app_admin": "outbox_admin",
    "app_monitor": "pg_monitor",
    "app_nobody": None,
}

# (statement, roles that may run it)
ABILITIES = [
    ("SELECT id FROM outbox_enqueue('booking.created', '{}')", {"app_producer", "app_admin"}),
    ("SELECT id FROM outbox_enqueue_batch('booking.created', ARRAY['{}'::jsonb])", {"app_producer", "app_admin"}),
    ("SELECT id FROM outbox_claim(10)", {"app_consumer", "app_admin"}),
    ("SELECT outbox_complete(1)", {"app_consumer", "app_admin"}),
    ("SELECT outbox_complete(ARRAY[1]::bigint[])", {"app_consumer", "app_admin"}),
    ("SELECT outbox_fail(1, 'boom')", {"app_consumer", "app_admin"}),
    ("SELECT count(*) FROM outbox", {"app_admin"}),
    ("SELECT count(*) FROM outbox_dead_letters", {"app_admin"}),
    ("INSERT INTO outbox (topic, payload) VALUES ('a.b', '{}')", set()),
    ("DELETE FROM outbox", set()),
    ("SELECT outbox_requeue_all()", {"app_admin"}),
    ("SELECT outbox_discard_all()", {"app_admin"}),
    ("SELECT outbox_purge(interval '7 days')", {"app_admin"}),
    ("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/')", {"app_admin"}),
    ("SELECT count(*) FROM outbox_subscriptions", {"app_admin"}),
    ("SELECT secret FROM outbox_subscription", {"app_admin"}),
    ("SELECT * FROM outbox_stats()", {"app_admin", "app_monitor"}),
    ("SELECT * FROM outbox_monitoring", {"app_admin", "app_monitor"}),
    ("SELECT * FROM outbox_worker_status()", {"app_admin", "app_monitor"}),
    ("SELECT * FROM outbox_topics()", set(ROLES)),
]


@pytest.fixture()
def roles(db):
    for role, group in ROLES.items():
        db.execute(f"DROP ROLE IF EXISTS {role}")
        db.execute(f"CREATE ROLE {role} LOGIN")
        if group:
            db.execute(f"GRANT {group} TO {role}")
    yield list(ROLES)
    db.execute("DROP SCHEMA IF EXISTS evil CASCADE")
    for role in ROLES:
        db.execute(f"DROP ROLE {role}")


@pytest.mark.parametrize("statement,allowed", ABILITIES, ids=[a[0] for a in ABILITIES])
def test_each_role_may_do_exactly_its_part(db, roles, statement, allowed):
    enqueue_many(db, 1)
    for role in roles:
        with connect(user=role, autocommit=True) as conn:
            if role in allowed:
                conn.execute(statement)
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)


def test_a_producer_cannot_read_what_it_did_not_write(db, roles):
    db.execute("SELECT outbox_enqueue('payment.captured', '{\"card\": \"4242\"}')")
    with connect(user="app_producer", autocommit=True) as producer:
        mine = producer.execute("SELECT payload FROM outbox_enqueue('booking.created', '{\"n\": 1}')").fetchone()
        assert mine == ({"n": 1},)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            producer.execute("SELECT payload FROM outbox")


def test_a_hostile_search_path_cannot_hijack_the_api(db, roles):
    """The producer owns a schema with look-alikes of what the API uses (an operator and
    functions) that would record who ran them. Called with that schema first on its
    search_path, the API (running with the owner's rights) must not run any of them."""
    db.execute("CREATE SCHEMA evil AUTHORIZATION app_producer")
    with connect(user="app_producer", autocommit=True) as attacker:
        attacker.execute("CREATE TABLE evil.ran_as (who text)")
        attacker.execute("GRANT INSERT ON evil.ran_as TO PUBLIC")
        attacker.execute(
            """CREATE FUNCTION evil.interval_lt(interval, interval) RETURNS boolean LANGUAGE sql AS
               $$ INSERT INTO evil.ran_as VALUES (current_user) RETURNING false $$"""
        )
        attacker.execute("CREATE OPERATOR evil.< (LEFTARG = interval, RIGHTARG = interval, FUNCTION = evil.interval_lt)")
        for name, returns in (("clock_timestamp", "timestamptz"), ("gen_random_uuid", "uuid")):
            attacker.execute(
                f"""CREATE FUNCTION evil.{name}() RETURNS {returns} LANGUAGE sql AS
                    $$ INSERT INTO evil.ran_as VALUES (current_user); SELECT pg_catalog.{name}() $$"""
            )
        attacker.execute("SET search_path = evil, pg_catalog, public")
        attacker.execute("SELECT public.outbox_enqueue('booking.created', '{}', interval '1 second')")
        assert attacker.execute("SELECT count(*) FROM evil.ran_as").fetchone()[0] == 0
        # The trap works when the API is not involved: it is the API that resists.
        attacker.execute("SELECT interval '1 second' < interval '2 seconds'")
        assert attacker.execute("SELECT count(*) FROM evil.ran_as").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM outbox WHERE topic = 'booking.created'").fetchone()[0] == 1
