"""Least privilege: what a producer, a consumer, an administrator, a monitoring role and
everyone else may and may not do; and a hostile search_path cannot hijack the API."""

import pathlib

import psycopg
import pytest

from conftest import connect, enqueue_many
from support import eventually, recreate_database
from support.cluster import ScratchCluster

# A cluster of its own, where the extension's roles do not exist yet.
ROLES_PORT = 25348

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
    ("SELECT outbox_archive()", {"app_admin"}),
    ("SELECT outbox_compact()", {"app_admin"}),
    # (The history is read through outbox.)
    ("SELECT count(*) FROM outbox_history_0", set()),
    ("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/')", {"app_admin"}),
    ("SELECT count(*) FROM outbox_subscriptions", {"app_admin"}),
    ("SELECT secret FROM outbox_subscription", {"app_admin"}),
    ("SELECT * FROM outbox_stats()", {"app_admin", "app_monitor"}),
    ("SELECT * FROM outbox_monitoring", {"app_admin", "app_monitor"}),
    ("SELECT * FROM outbox_worker_status()", {"app_admin", "app_monitor"}),
    ("SELECT * FROM outbox_endpoint_stats()", {"app_admin", "app_monitor"}),
    ("SELECT count(*) FROM outbox_deliveries", {"app_admin"}),
    ("SELECT count(*) FROM outbox_delivery_attempts", {"app_admin"}),
    ("SELECT outbox_redeliver(1)", {"app_admin"}),
    ("SELECT outbox_disable_subscription(1)", {"app_admin"}),
    ("SELECT outbox_enable_subscription(1)", {"app_admin"}),
    ("SELECT outbox_rotate_secret(1)", {"app_admin"}),
    ("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/', rate_limit => 5, max_in_flight => 1)", {"app_admin"}),
    ("SELECT id FROM outbox_enqueue('booking.created', '{}', headers => '{\"x-tenant\": \"7\"}')", {"app_producer", "app_admin"}),
    ("SELECT * FROM outbox_topics()", set(ROLES)),
    ("SELECT outbox_depth(ARRAY['booking.created'])", {"app_consumer", "app_admin", "app_monitor"}),
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
    db.execute("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/', enabled => false)")  # id 1
    for role in roles:
        with connect(user=role, autocommit=True) as conn:
            if role in allowed:
                conn.execute(statement)
            else:
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(statement)


@pytest.mark.parametrize("change", ["payload = '{\"tampered\": true}'", "topic = 'other.topic'", "headers = '{}'",
                                    "ordering_key = 'k'", "dedupe_key = 'k'", "created_at = now()"])
def test_the_worker_role_may_not_rewrite_what_producers_wrote(db, change):
    """outbox_worker updates messages' progress only (status, leases, waiting): a grant of UPDATE
    on the whole table let it rewrite every message's content, the archived ones in
    outbox_history_N too (inherited tables are checked on the parent; stop 53's probe)."""
    db.execute("SELECT outbox_enqueue('booking.created', '{}')")
    db.execute("UPDATE outbox SET status = 'DONE', processed_at = clock_timestamp() - interval '1 hour'")
    # (The worker archives too, and an archive skips what another holds.)
    eventually(lambda: db.execute("SELECT outbox_archive() >= 0 AND NOT EXISTS (SELECT FROM ONLY outbox)").fetchone()[0],
               what="the message archived")
    enqueue_many(db, 1)
    with connect(autocommit=True) as conn:
        conn.execute("SET ROLE outbox_worker")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"UPDATE outbox SET {change}")
        # What delivery itself changes, it may.
        conn.execute("UPDATE ONLY outbox SET waiting_for = NULL, lease_token = NULL, last_error = NULL")


def test_monitoring_sees_where_an_endpoint_is_but_not_its_capability_url(db, roles):
    """Many webhook URLs carry their credential in the path or the query (Slack's, Zapier's,
    ?token=…). outbox_endpoint_stats() is granted to pg_monitor, which must not read what the
    subscriptions table keeps for outbox_admin only (found by stop 40's probe: the whole URL)."""
    db.execute("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test:8443/services/T0/B0/s3cr3t?token=SUPERSECRET', enabled => false)")
    db.execute("SELECT outbox_subscribe('booking.created', 'https://other.example.test', enabled => false)")
    seen = {}
    for role in ("app_monitor", "app_admin"):
        with connect(user=role, autocommit=True) as conn:
            seen[role] = [r[0] for r in conn.execute("SELECT url FROM outbox_endpoint_stats() ORDER BY subscription_id")]
    assert seen["app_monitor"] == ["https://hooks.example.test:8443/…", "https://other.example.test"]
    assert seen["app_admin"] == ["https://hooks.example.test:8443/services/T0/B0/s3cr3t?token=SUPERSECRET", "https://other.example.test"]
    # A session that reads backslashes in literals as escapes (standard_conforming_strings off,
    # as old applications set it) got an encoding error before 0.5.30: the function's body is
    # read in the caller's settings.
    with connect(user="app_monitor", autocommit=True) as conn:
        conn.execute("SET standard_conforming_strings = off")
        assert conn.execute("SELECT url FROM outbox_endpoint_stats() ORDER BY subscription_id LIMIT 1").fetchone()[0] \
            == "https://hooks.example.test:8443/…"


def test_monitoring_reads_why_an_endpoint_was_disabled_but_not_what_it_answered(db, roles):
    """An endpoint the worker disables keeps its last error as the reason, with the start of the
    receiver's answer, which often repeats the request (Express: "Cannot POST /cap/<token>") and
    its headers: pg_monitor read the capability URL there (stop 41's probe)."""
    answer = "<pre>Cannot POST /services/T0/B0/s3cr3t?token=SUPERSECRET</pre> auth=Bearer HDR-SECRET"
    reason = ("every attempt failed since 2026-12-04 10:00:00+00 (outbox.endpoint_disable_after = 1 day); "
              f"last error: HTTP 404: {answer}")
    db.execute("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/services/T0/B0/s3cr3t?token=SUPERSECRET', enabled => false)")
    db.execute("UPDATE outbox_subscription SET disabled_reason = %s", (reason,))
    seen = {}
    for role in ("app_monitor", "app_admin"):
        with connect(user=role, autocommit=True) as conn:
            seen[role] = conn.execute("SELECT disabled_reason FROM outbox_endpoint_stats()").fetchone()[0]
    assert seen["app_monitor"] == reason.replace(f": {answer}", ": …")
    assert seen["app_admin"] == reason


def test_a_producer_cannot_read_what_it_did_not_write(db, roles):
    db.execute("SELECT outbox_enqueue('payment.captured', '{\"card\": \"4242\"}')")
    with connect(user="app_producer", autocommit=True) as producer:
        mine = producer.execute("SELECT payload FROM outbox_enqueue('booking.created', '{\"n\": 1}')").fetchone()
        assert mine == ({"n": 1},)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            producer.execute("SELECT payload FROM outbox")


# The bulk load docs/api.md gives a producer, which may not write the table itself.
BULK_LOAD = (
    "CREATE TEMP TABLE staging (n bigserial, payload jsonb) ON COMMIT DROP",
    "COPY staging (payload) FROM STDIN",
    "SELECT count(*) FROM outbox_enqueue_batch('booking.imported', ARRAY(SELECT payload FROM staging ORDER BY n))",
)


def test_a_producer_bulk_loads_through_copy_into_a_temporary_table(db, roles):
    create, copy_in, enqueue = BULK_LOAD
    with connect(user="app_producer") as producer:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            with producer.cursor().copy("COPY outbox (topic, payload) FROM STDIN") as copy:
                copy.write_row(("booking.imported", "{}"))
        producer.rollback()
        producer.execute(create)
        with producer.cursor().copy(copy_in) as copy:
            for n in range(2_000):
                copy.write_row((f'{{"n": {n}}}',))
        assert producer.execute(enqueue).fetchone()[0] == 2_000
        assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0, "visible before the load commits"
        producer.commit()
    # Recorded in the order of the file, and claimable like any other messages.
    assert [row[0] for row in db.execute("SELECT (payload->>'n')::int FROM outbox ORDER BY id")] == list(range(2_000))
    assert db.execute("SELECT count(*) FROM outbox_claim(10000, ARRAY['booking.imported'])").fetchone()[0] == 2_000


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


def test_a_hostile_search_path_cannot_hijack_the_kept_plans_of_claim_and_complete(db, roles):
    """outbox_enqueue, outbox_claim and outbox_complete keep their plans for the session and
    have no pinned search_path: their statements qualify every operator instead. Look-alike
    operators for exactly the types they compare, which would win over pg_catalog's generic
    ones (an exact type match beats anyenum), must not run, through a whole produce-consume
    cycle with and without a lease."""
    db.execute("CREATE SCHEMA evil AUTHORIZATION app_producer")
    db.execute("GRANT USAGE ON SCHEMA evil TO PUBLIC")
    traps = [
        ("=", "bigint", "bigint", "int8eq"),
        ("=", "public.outbox_status", "public.outbox_status", "enum_eq"),
        ("<=", "timestamptz", "timestamptz", "timestamptz_le"),
        ("+", "timestamptz", "interval", "timestamptz_pl_interval"),
        ("+", "integer", "integer", "int4pl"),
        ("=", "text", "text", "texteq"),
    ]
    with connect(user="app_producer", autocommit=True) as attacker:
        attacker.execute("CREATE TABLE evil.ran_as (who text)")
        attacker.execute("GRANT INSERT ON evil.ran_as TO PUBLIC")
        for n, (operator, left, right, builtin) in enumerate(traps):
            returns = "timestamptz" if left == "timestamptz" and operator == "+" else ("integer" if operator == "+" else "boolean")
            attacker.execute(
                f"""CREATE FUNCTION evil.trap{n}({left}, {right}) RETURNS {returns} LANGUAGE sql AS
                    $$ INSERT INTO evil.ran_as VALUES (current_user); SELECT pg_catalog.{builtin}($1, $2) $$"""
            )
            attacker.execute(f"CREATE OPERATOR evil.{operator} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = evil.trap{n})")
        attacker.execute("SET search_path = evil, pg_catalog, public")
        for n in range(4):
            attacker.execute("SELECT outbox_enqueue('booking.created', '{}', dedupe_key => %s)", (f"k{n % 3}",))
    with connect(user="app_consumer", autocommit=True) as victim:
        victim.execute("SET search_path = evil, pg_catalog, public")
        # The trap works when the API is not involved.
        victim.execute("SELECT 1::bigint = 1::bigint")
        assert db.execute("SELECT count(*) FROM evil.ran_as").fetchone()[0] == 1
        for _ in range(7):  # past the plan cache's first five calls
            with victim.transaction():
                held = victim.execute("SELECT id, lease_token FROM outbox_claim(1)").fetchall()
                for id, token in held:
                    assert victim.execute("SELECT outbox_complete(%s::bigint, %s::uuid)", (id, token)).fetchone()[0]
                locked = victim.execute("SELECT array_agg(id) FROM outbox_claim(5, ARRAY['booking.created'], NULL)").fetchone()[0]
                victim.execute("SELECT outbox_complete(%s::bigint[])", (locked or [],))
        assert db.execute("SELECT count(*) FROM evil.ran_as").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FILTER (WHERE status = 'DONE'), count(*) FROM outbox").fetchone() == (3, 3)


def test_the_owner_of_the_extensions_schema_cannot_run_sql_as_its_owner_by_renaming_it(db, roles):
    """The extension's statements name its schema as it is called when they are planned. One
    named it inside a string literal (the release of an ordering key), so the schema's owner (the
    database owner, for public) could rename it to close the literal and call an operator of
    theirs as the extension's owner, a superuser, from any consumer's call (found by stop 39's
    probe). Since 0.5.17 the schema cannot be renamed at all (the next test); a superuser who
    turns that guard off and renames it still runs nothing of the schema owner's through the
    C functions, which find the schema by its oid at run time."""
    db.execute("DROP ROLE IF EXISTS schema_owner")
    db.execute("CREATE ROLE schema_owner LOGIN")
    database = db.execute("SELECT current_database()").fetchone()[0]
    db.execute(f'GRANT CONNECT, CREATE ON DATABASE "{database}" TO schema_owner')
    # (As the database owner: it owns public, and may create schemas and rename them.)
    db.execute("ALTER SCHEMA public OWNER TO schema_owner")
    db.execute("CREATE SCHEMA evil AUTHORIZATION schema_owner")
    renamed = "' OPERATOR(evil.%) 0, 0)--"
    try:
        with connect(user="schema_owner", autocommit=True) as attacker:
            attacker.execute("CREATE TABLE evil.ran_as (who text)")
            attacker.execute("GRANT USAGE ON SCHEMA evil TO PUBLIC")
            attacker.execute("GRANT INSERT ON evil.ran_as TO PUBLIC")
            attacker.execute("""CREATE FUNCTION evil.trap(text, integer) RETURNS integer LANGUAGE sql AS
                                $$ INSERT INTO evil.ran_as VALUES (current_user); SELECT 0 $$""")
            attacker.execute("CREATE OPERATOR evil.% (LEFTARG = text, RIGHTARG = integer, FUNCTION = evil.trap)")
        db.execute("ALTER EVENT TRIGGER outbox_keep_schema_name DISABLE")
        with connect(user="schema_owner", autocommit=True) as attacker:
            attacker.execute(f'ALTER SCHEMA public RENAME TO "{renamed}"')
        with connect(user="app_producer", autocommit=True) as producer:
            producer.execute(f'SET search_path = "{renamed}"')
            for n in range(2):
                producer.execute("SELECT outbox_enqueue('booking.created', '{}', ordering_key => 'booking:42')")
        with connect(user="app_consumer", autocommit=True) as consumer:
            consumer.execute(f'SET search_path = "{renamed}"')
            for _ in range(2):  # the head, then the message its completion released
                [(id, token)] = consumer.execute("SELECT id, lease_token FROM outbox_claim(10)").fetchall()
                assert consumer.execute("SELECT outbox_complete(%s::bigint, %s::uuid)", (id, token)).fetchone()[0]
        assert db.execute("SELECT who FROM evil.ran_as").fetchall() == []
    finally:
        if db.execute("SELECT to_regnamespace(%s)", (f'"{renamed}"',)).fetchone()[0]:
            db.execute(f'ALTER SCHEMA "{renamed}" RENAME TO public')
        db.execute("ALTER EVENT TRIGGER outbox_keep_schema_name ENABLE")
        db.execute("ALTER SCHEMA public OWNER TO pg_database_owner")
        db.execute("DROP SCHEMA IF EXISTS evil CASCADE")
        db.execute(f'REVOKE CONNECT, CREATE ON DATABASE "{database}" FROM schema_owner')
        db.execute("DROP ROLE schema_owner")


def test_the_database_owner_cannot_swap_the_extensions_schema_for_one_of_its_own(db, roles):
    """The PL/pgSQL and SQL functions name the extension's schema as it was called when they were
    created (public.outbox_subscription). Its owner (the database owner, for public) renamed it
    and created a new public with a view of that name: outbox_topics(), granted to PUBLIC, then
    ran the view's function as the extension's owner, a superuser, and so did the worker's
    archive every second (found by stop 40's probe). The rename is refused."""
    db.execute("DROP ROLE IF EXISTS schema_owner")
    db.execute("CREATE ROLE schema_owner LOGIN")
    database = db.execute("SELECT current_database()").fetchone()[0]
    db.execute(f'GRANT CONNECT, CREATE ON DATABASE "{database}" TO schema_owner')
    db.execute("ALTER SCHEMA public OWNER TO schema_owner")
    try:
        with connect(user="schema_owner", autocommit=True) as attacker:
            with pytest.raises(psycopg.errors.FeatureNotSupported, match="schema public holds the extension and cannot be renamed"):
                attacker.execute("ALTER SCHEMA public RENAME TO public_old")
            # (Had it worked: a public of the attacker's, whose outbox_subscription runs its code.)
            attacker.execute("CREATE SCHEMA IF NOT EXISTS public_new")
            attacker.execute("""CREATE FUNCTION public_new.trap() RETURNS text LANGUAGE sql AS
                                $$ SELECT current_user::text $$""")
            attacker.execute("CREATE VIEW public_new.outbox_subscription AS SELECT public_new.trap() AS topic")
            # The schema owner may still change what it owns otherwise.
            attacker.execute("ALTER SCHEMA public_new RENAME TO public_newer")
            attacker.execute("COMMENT ON SCHEMA public IS 'the application''s'")
        topics = db.execute("SELECT count(*) FROM outbox_topics()").fetchone()[0]
        assert topics == 0, "outbox_topics() read the extension's own subscriptions"
        assert db.execute("SELECT nspname FROM pg_namespace n JOIN pg_extension e ON e.extnamespace = n.oid "
                          "WHERE extname = 'outbox_ext'").fetchone()[0] == "public"
    finally:
        if db.execute("SELECT to_regnamespace('public_old')").fetchone()[0]:
            db.execute("DROP SCHEMA IF EXISTS public CASCADE")
            db.execute("ALTER SCHEMA public_old RENAME TO public")
        db.execute("DROP SCHEMA IF EXISTS public_newer CASCADE")
        db.execute("COMMENT ON SCHEMA public IS 'standard public schema'")
        db.execute("ALTER SCHEMA public OWNER TO pg_database_owner")
        db.execute(f'REVOKE CONNECT, CREATE ON DATABASE "{database}" FROM schema_owner')
        db.execute("DROP ROLE schema_owner")


def test_a_dedupe_key_never_reveals_another_producers_message(db, roles):
    """0.3.0 returned the other message, payload included, and queued nothing. Keys are scoped
    to the topic; a duplicate returns only the id and public_id of the message that holds the
    key (payload NULL says: a duplicate)."""
    secret_id = db.execute("SELECT (outbox_enqueue('secret.topic', '{\"card\": \"4242\"}', "
                           "dedupe_key => 'booking-created:42')).id").fetchone()[0]
    with connect(user="app_producer", autocommit=True) as producer:
        mine = producer.execute("SELECT id, topic, payload FROM outbox_enqueue('other.topic', '{\"n\": 1}', "
                                "dedupe_key => 'booking-created:42')").fetchone()
        assert mine[1:] == ("other.topic", {"n": 1})
        duplicate = producer.execute(
            "SELECT id, public_id IS NOT NULL, topic, payload, status, attempts, last_error, created_at "
            "FROM outbox_enqueue('secret.topic', '{\"n\": 2}', dedupe_key => 'booking-created:42')").fetchone()
        assert duplicate == (secret_id, True, "secret.topic", None, None, None, None, None)
    assert db.execute("SELECT topic, payload FROM outbox ORDER BY id").fetchall() == [
        ("secret.topic", {"card": "4242"}), ("other.topic", {"n": 1})]


# What PUBLIC may execute: the list in docs/security.md ("Open to every role").
OPEN_TO_ALL = {
    "outbox_topics()",
    "outbox_topic_is_valid(text)",
    "outbox_backoff(integer)",
    "outbox_max_attempts()",
    "outbox_uuid_v7()",
}


def test_public_may_use_only_what_the_security_docs_name(db):
    """0.3.0 let any role call outbox_wake_worker_at_commit() in a loop (the worker's CPU went
    from 0.01 s to 9 s per 10 s), outbox_generate_secret() and the check helpers."""
    extension_objects = """
        SELECT d.classid, d.objid FROM pg_depend d JOIN pg_extension e ON e.oid = d.refobjid
         WHERE e.extname = 'outbox_ext' AND d.deptype = 'e'"""
    open_functions = {row[0] for row in db.execute(f"""
        SELECT p.oid::regprocedure::text FROM ({extension_objects}) o JOIN pg_proc p ON o.classid = 'pg_proc'::regclass AND p.oid = o.objid
         WHERE EXISTS (SELECT FROM aclexplode(coalesce(p.proacl, acldefault('f', p.proowner))) a
                        WHERE a.grantee = 0 AND a.privilege_type = 'EXECUTE')""")}
    assert open_functions == OPEN_TO_ALL
    open_relations = db.execute(f"""
        SELECT c.relname FROM ({extension_objects}) o JOIN pg_class c ON o.classid = 'pg_class'::regclass AND c.oid = o.objid
         WHERE EXISTS (SELECT FROM aclexplode(coalesce(c.relacl, acldefault('r', c.relowner))) a WHERE a.grantee = 0)""").fetchall()
    assert open_relations == []
    docs = (pathlib.Path(__file__).resolve().parents[2] / "docs/security.md").read_text()
    for function in OPEN_TO_ALL:
        assert f"`{function}`" in docs, f"docs/security.md does not name {function} as open to all"


def test_a_role_with_no_grants_cannot_wake_the_worker(db, roles):
    with connect(user="app_nobody", autocommit=True) as nobody:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            nobody.execute("SELECT outbox_wake_worker_at_commit()")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            nobody.execute("SELECT outbox_generate_secret()")


def test_create_extension_warns_when_others_may_create_objects_in_its_schema(db):
    """Whoever may create objects in the extension's schema can plant an overload that an
    administrator's call with untyped literals resolves to, run with the administrator's
    rights: an outbox_subscribe handed it the secret (stop 58's probe of privileges). PostgreSQL
    15 and later grant no one CREATE on public; when someone has it, CREATE EXTENSION says so."""
    database = "outbox_open_schema"
    recreate_database(database)
    try:
        with psycopg.connect(dbname=database, autocommit=True) as admin:
            warnings = []
            # (A notice's fields are read in the handler: the object is empty after it.)
            admin.add_notice_handler(lambda n: warnings.append((n.severity_nonlocalized, n.message_primary, n.message_hint)))
            admin.execute("CREATE EXTENSION outbox_ext")
            assert warnings == [], "public as PostgreSQL makes it: nothing to say"
            admin.execute("DROP EXTENSION outbox_ext")
            admin.execute("GRANT CREATE ON SCHEMA public TO PUBLIC")
            admin.execute("CREATE EXTENSION outbox_ext")
            (warning,) = [w for w in warnings if w[0] == "WARNING"]
            assert warning[1] == "outbox_ext: PUBLIC may create objects in the schema of outbox_ext"
            assert "REVOKE CREATE" in warning[2]
    finally:
        recreate_database(database)
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {database} WITH (FORCE)")


def test_roles_made_in_advance_by_a_role_with_createrole_are_refused():
    """The extension makes its roles when they do not exist. A role with CREATEROLE, not a
    superuser, could make them first, with a password it knows or with itself as their admin
    (PostgreSQL 16 and later make a role's creator so), and then act as outbox_admin and read
    every subscription's secret once a superuser created the extension (found by stop 40's
    probe, on 18). CREATE EXTENSION refuses such roles, and says how to make them safe."""
    cluster = ScratchCluster(ROLES_PORT).start()
    try:
        with cluster.connect() as admin:
            admin.execute("CREATE ROLE creator LOGIN CREATEROLE")
        with psycopg.connect(host="127.0.0.1", port=cluster.port, user="creator", dbname="postgres", autocommit=True) as creator:
            creator.execute("CREATE ROLE outbox_admin LOGIN PASSWORD 'known to creator'")
            creator.execute("CREATE ROLE outbox_worker LOGIN")
        with cluster.connect() as admin:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="role outbox_admin already exists, with a password"):
                admin.execute("CREATE EXTENSION outbox_ext")
            admin.execute("ALTER ROLE outbox_admin NOLOGIN PASSWORD NULL")
            # Its admin may grant it to anyone, itself included (on 15 a superuser made it so).
            admin.execute("GRANT outbox_admin TO creator WITH ADMIN OPTION")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                               match="role outbox_admin already exists, and role creator .not a superuser. may grant it"):
                admin.execute("CREATE EXTENSION outbox_ext")
            admin.execute("REVOKE outbox_admin FROM creator")
            if admin.info.server_version >= 160000:  # creator made it: creator may grant it
                with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="role outbox_worker already exists, and role creator"):
                    admin.execute("CREATE EXTENSION outbox_ext")
                admin.execute("REVOKE outbox_worker FROM creator")
            admin.execute("GRANT outbox_worker TO creator")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match=r"role outbox_worker already exists, with a member \(creator\)"):
                admin.execute("CREATE EXTENSION outbox_ext")
            admin.execute("REVOKE outbox_worker FROM creator")
            # Stop 41's probe: made while its creator could act as it, the role may own a
            # SECURITY DEFINER function, in any database, that reads what the role may read.
            admin.execute("ALTER ROLE outbox_admin LOGIN")
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState, match="role outbox_admin already exists, and may log in"):
                admin.execute("CREATE EXTENSION outbox_ext")
            admin.execute("ALTER ROLE outbox_admin NOLOGIN")
            admin.execute("CREATE DATABASE elsewhere")
        with cluster.connect(dbname="elsewhere") as elsewhere:
            elsewhere.execute("CREATE SCHEMA evil AUTHORIZATION outbox_admin")
            elsewhere.execute("CREATE FUNCTION evil.steal() RETURNS SETOF text LANGUAGE sql SECURITY DEFINER AS 'SELECT 1::text'")
            elsewhere.execute("ALTER FUNCTION evil.steal() OWNER TO outbox_admin")
            elsewhere.execute("ALTER SCHEMA evil OWNER TO postgres")
        with cluster.connect() as admin:
            with pytest.raises(psycopg.errors.ObjectNotInPrerequisiteState,
                               match=r"role outbox_admin already exists, and owns objects \(database elsewhere\)"):
                admin.execute("CREATE EXTENSION outbox_ext")
        with cluster.connect(dbname="elsewhere") as elsewhere:
            elsewhere.execute("DROP OWNED BY outbox_admin")
        with cluster.connect() as admin:
            admin.execute("CREATE EXTENSION outbox_ext")
            assert admin.execute("SELECT extversion FROM pg_extension WHERE extname = 'outbox_ext'").fetchone()
    finally:
        cluster.remove()
