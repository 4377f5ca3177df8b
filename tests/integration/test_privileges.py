"""Nothing a database owner or any other role creates runs with the extension's rights.

The delivery worker and the SECURITY DEFINER functions run with more rights than their
callers. These tests plant look-alike operators and functions where PostgreSQL would find them
(the extension's schema, a schema first on the database's search_path) and check that none of
them ever runs with those rights: the hostile test of 0.3.0 reached superuser three ways.
"""

import json
import re
import pathlib

import psycopg
import pytest

from support import admin_connection, eventually, recreate_database, wait_for_worker
from support.receiver import Receiver

ROOT = pathlib.Path(__file__).resolve().parents[2]
DATABASE = "outbox_hostile"   # served by the delivery worker (scripts/test.sh)
ATTACKER = "mallory"
OPERATOR = "ops"              # an administrator: a member of outbox_admin, not a superuser

# A trap records who ran it and where, and, when it runs with rights that are not its caller's
# (in a SECURITY DEFINER function or in the delivery worker) as a superuser, makes the attacker
# one. Every name in it is qualified: it runs under the attacker's search_path too.
TRAP_BODY = """
DECLARE
    backend text := (SELECT a.backend_type FROM pg_catalog.pg_stat_activity a
                      WHERE a.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid());
    privileged boolean := current_user OPERATOR(pg_catalog.<>) session_user
                          OR backend OPERATOR(pg_catalog.=) 'outbox_ext delivery worker';
BEGIN
    INSERT INTO public.trap_log VALUES (current_user, session_user, backend, privileged, '{name}');
    IF privileged AND pg_catalog.current_setting('is_superuser') OPERATOR(pg_catalog.=) 'on' THEN
        EXECUTE 'ALTER ROLE mallory SUPERUSER';
    END IF;
    RETURN NULL;
END
"""


def connect_as(role=None, search_path="pg_catalog"):
    """A connection to the hostile database. The test's own statements run with pg_catalog
    alone on the search_path and name the extension's objects as public.<name>, so that they
    never call the look-alikes themselves (an operator of an exact type in public would beat
    pg_catalog's generic one, whatever the order)."""
    conn = psycopg.connect(dbname=DATABASE, user=role, autocommit=True)
    if search_path is not None:
        conn.execute(f"SET search_path = {search_path}")
    return conn


@pytest.fixture()
def hostile_database(database):
    """outbox_hostile owned by mallory (who may therefore CREATE in public), with the worker."""
    with admin_connection() as admin:
        for role in (ATTACKER, OPERATOR):
            admin.execute(f"DROP ROLE IF EXISTS {role}")
            admin.execute(f"CREATE ROLE {role} LOGIN")
    recreate_database(DATABASE, owner=ATTACKER)
    with connect_as() as db:
        db.execute("CREATE TABLE public.trap_log (current_role_name text, session_role_name text, backend text, "
                   "privileged boolean, trap text)")
        db.execute("GRANT ALL ON public.trap_log TO PUBLIC")
    yield DATABASE
    recreate_database(DATABASE)
    with admin_connection() as admin:
        for role in (ATTACKER, OPERATOR):
            admin.execute(f"DROP ROLE IF EXISTS {role}")


def create_extension(db, schema="public"):
    db.execute(f"CREATE EXTENSION outbox_ext SCHEMA {schema}")
    db.execute(f"GRANT outbox_admin TO {OPERATOR}")
    db.execute(f"GRANT USAGE ON SCHEMA {schema} TO {OPERATOR}")


def attacker_is_superuser():
    with admin_connection() as admin:
        return admin.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (ATTACKER,)).fetchone()[0]


def traps_sprung(db):
    """Look-alikes that ran with rights other than their caller's."""
    return db.execute("SELECT current_role_name, session_role_name, backend, trap FROM public.trap_log "
                      "WHERE privileged").fetchall()


PLANTED = iter(range(1, 10**9))


def plant_operator(conn, schema, name, left, right, returns="boolean"):
    """An operator `schema.name(left, right)` whose function is a trap."""
    label = f"{schema}.{name}({left},{right})"
    function = f"trap_{next(PLANTED)}"
    conn.execute(
        f"CREATE FUNCTION {schema}.{function}({left}, {right}) RETURNS {returns} LANGUAGE plpgsql AS "
        f"$trap${TRAP_BODY.format(name=label)}$trap$"
    )
    conn.execute(f"CREATE OPERATOR {schema}.{name} (LEFTARG = {left}, RIGHTARG = {right}, FUNCTION = {schema}.{function})")


def test_the_database_owner_cannot_become_superuser_through_the_worker(hostile_database):
    """0.3.0: the worker ran `status = 'PENDING'` with public on its search_path."""
    receiver = Receiver().start()
    try:
        with connect_as() as db:
            create_extension(db)
            db.execute("SELECT public.outbox_subscribe('hook.sent', %s, timeout => '5 seconds')", (receiver.url,))
            db.execute("SELECT public.outbox_enqueue('nobody.listens', '{}')")  # the unsubscribed-topics check
        with connect_as(ATTACKER) as mallory:
            plant_operator(mallory, "public", "=", "public.outbox_status", "public.outbox_status")
            plant_operator(mallory, "public", "*", "float8", "integer", returns="float8")
        with connect_as() as db:
            for n in range(3):
                db.execute("SELECT public.outbox_enqueue('hook.sent', %s)", (json.dumps({"n": n}),))
        receiver.wait_for(3)
        with connect_as() as db:
            assert traps_sprung(db) == []
        assert not attacker_is_superuser()
    finally:
        receiver.stop()


def test_a_search_path_set_on_the_database_does_not_reach_the_worker(hostile_database):
    """0.3.0: the worker looked up the extension's schema under the database's search_path."""
    with connect_as() as db:
        db.execute("CREATE SCHEMA outboxs")
        create_extension(db, "outboxs")
        db.execute("SELECT outboxs.outbox_enqueue('nobody.listens', '{}')")
    with connect_as(ATTACKER) as mallory:
        mallory.execute("CREATE SCHEMA evil")
        plant_operator(mallory, "evil", "=", "name", "name")
        plant_operator(mallory, "evil", "=", "text", "text")
        mallory.execute(f"ALTER DATABASE {DATABASE} SET search_path = evil, pg_catalog")
    # The next worker start runs under that search_path.
    restart_worker(DATABASE)
    wait_for_worker(DATABASE)
    with connect_as() as db:
        assert traps_sprung(db) == []
    assert not attacker_is_superuser()


def test_security_definer_functions_pass_typed_arguments(hostile_database):
    """0.3.0: outbox_requeue(topic) called outbox_requeue_dead(NULL, topic), so a planted
    outbox_requeue_dead(text, text) won the overload resolution and ran as the owner."""
    with connect_as() as db:
        create_extension(db)
        db.execute("SELECT public.outbox_enqueue('booking.created', '{}')")
    with connect_as(ATTACKER) as mallory:
        for name in ("outbox_requeue_dead", "outbox_discard_dead"):
            mallory.execute(
                f"CREATE FUNCTION public.{name}(ids text, topic text) RETURNS integer LANGUAGE plpgsql AS "
                f"$trap${TRAP_BODY.format(name=name).replace('RETURN NULL', 'RETURN 0')}$trap$"
            )
    with connect_as(OPERATOR, search_path=None) as ops:
        ops.execute("SELECT outbox_requeue('booking.created')")
        ops.execute("SELECT outbox_discard('booking.created')")
    with connect_as() as db:
        assert traps_sprung(db) == []
    assert not attacker_is_superuser()


# --- The broad one: look-alikes of everything the privileged statements use ----------------

def names_called_in_sql():
    """Every function name the extension's SQL calls (a word followed by '(')."""
    words = set()
    for path in list((ROOT / "sql").rglob("*.sql")) + list((ROOT / "src").rglob("*.sql")):
        if "versions" in path.parts or re.match(r"outbox_ext--", path.name):
            continue
        words |= set(re.findall(r"\b([a-z_][a-z0-9_]*)\s*\(", path.read_text()))
    return words


def plant_look_alikes(conn, schema, catalog=None):
    """Copies, in `schema`, of every function the extension's SQL names (same signatures, for
    the pg_catalog and the extension's own ones), all-text overloads of the extension's
    functions, and operators of the types the statements compare and compute with.

    With `catalog` (a connection to a database that has the extension), the extension's
    functions are read there, and only overloads that differ from them are planted: this is
    for a database where the extension is yet to be created, whose own functions would collide
    with exact copies."""
    words = names_called_in_sql()
    functions = (catalog or conn).execute(
        """SELECT p.proname, pg_get_function_identity_arguments(p.oid), p.prorettype::regtype::text, p.prokind,
                  p.pronargs, p.proretset, p.pronamespace <> 'pg_catalog'::regnamespace, oidvectortypes(p.proargtypes)
             FROM pg_proc p
            WHERE p.pronamespace IN ('pg_catalog'::regnamespace, (SELECT extnamespace FROM pg_extension WHERE extname = 'outbox_ext'))
              AND p.proname = ANY(%s)""",
        (sorted(words),),
    ).fetchall()
    planted = 0
    own = {(name, types) for name, *_, extensions_own, types in functions if extensions_own}
    for name, arguments, returns, kind, nargs, returns_set, extensions_own, types in functions:
        signatures = set() if catalog and extensions_own else {arguments}
        if name.startswith("outbox_") and nargs > 0:
            signatures |= {", ".join(["text"] * nargs), ", ".join(["character varying"] * nargs)}
            if catalog:  # an overload of the extension's own (outbox_requeue(text) for (bigint))
                signatures = {s for s in signatures if (name, s) not in own}
        for signature in signatures:
            if kind == "a":
                statement = (f"CREATE AGGREGATE {schema}.{name}({signature or '*'}) "
                             f"(SFUNC = {schema}.trap_transition, STYPE = bigint)")
            elif kind == "f":
                result = f"SETOF {returns}" if returns_set else returns
                if returns in ("record", "void", "trigger", "internal", "anyelement", "anyarray", "anyenum"):
                    result = "SETOF text" if returns_set else "text"
                statement = (f"CREATE FUNCTION {schema}.{name}({signature}) RETURNS {result} LANGUAGE plpgsql AS "
                             f"$trap${TRAP_BODY.format(name=name + '(' + signature + ')')}$trap$")
            else:
                continue
            try:
                with conn.transaction():
                    conn.execute(statement)
                planted += 1
            except psycopg.Error:
                pass  # polymorphic, variadic "any", an existing identical signature: not plantable
    types = ["integer", "bigint", "float8", "numeric", "text", "character varying", "name", "uuid",
             "timestamptz", "interval", "jsonb", "boolean", "public.outbox_status", "text[]", "bigint[]"]
    for operator in ["=", "<>", "<", "<=", ">", ">=", "+", "-", "*", "/", "||", "@>", "&&"]:
        for left in types:
            for right in types:
                try:
                    with conn.transaction():
                        plant_operator(conn, schema, operator, left, right,
                                       returns="boolean" if operator in ("=", "<>", "<", "<=", ">", ">=", "@>", "&&") else left)
                    planted += 1
                except psycopg.Error:
                    pass
    return planted


def test_no_look_alike_runs_with_the_extensions_rights(hostile_database):
    receiver = Receiver().start()
    receiver.answer(status=503, times=2)  # a failure, so that the worker's fail path runs too
    try:
        with connect_as() as db:
            create_extension(db)
            db.execute("SELECT public.outbox_subscribe('hook.sent', %s, public.outbox_generate_secret(), '{\"X-Team\": \"7\"}', "
                       "timeout => '5 seconds')", (receiver.url,))
            db.execute("SELECT public.outbox_enqueue('nobody.listens', '{}')")
        with connect_as(ATTACKER) as mallory:
            mallory.execute("CREATE SCHEMA evil")
            mallory.execute("CREATE FUNCTION public.trap_transition(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint'")
            mallory.execute("CREATE FUNCTION evil.trap_transition(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint'")
            planted = plant_look_alikes(mallory, "public") + plant_look_alikes(mallory, "evil")
            assert planted > 500, f"only {planted} look-alikes planted"
            mallory.execute(f"ALTER DATABASE {DATABASE} SET search_path = evil, public, pg_catalog")
        restart_worker(DATABASE)
        wait_for_worker(DATABASE)

        # The worker: a delivery that fails, one that succeeds, the unsubscribed-topics check.
        with connect_as() as db:
            db.execute("SELECT public.outbox_enqueue('hook.sent', '{\"n\": 1}')")
            db.execute("SELECT public.outbox_enqueue('hook.sent', '{\"n\": 2}')")
        receiver.wait_for(3)
        with connect_as() as db:
            eventually(lambda: db.execute(
                "SELECT count(*) FROM public.outbox WHERE status::text <> 'PENDING' AND topic::text = 'hook.sent'").fetchone()[0] == 2,
                what="the worker to record both outcomes")

        # Every SECURITY DEFINER function, called by an administrator with an ordinary
        # search_path and by the attacker's search_path (through a role that may call them).
        with connect_as() as db:
            db.execute(f"GRANT outbox_admin TO {ATTACKER}")
        calls = [
            "SELECT outbox_enqueue('a.b', '{}', interval '0', 'key-1')",
            "SELECT outbox_enqueue('a.b', '{}', dedupe_key => 'key-1')",
            "SELECT outbox_enqueue_batch('a.b', ARRAY['{}'::jsonb, '{}'::jsonb])",
            "SELECT outbox_claim(5, ARRAY['a.b'], interval '1 minute')",
            "SELECT outbox_claim(5, NULL, NULL)",
            "SELECT outbox_complete(1)",
            "SELECT outbox_complete(ARRAY[1, 2]::bigint[])",
            "SELECT outbox_complete_batch(ARRAY[3]::bigint[], ARRAY[NULL]::uuid[])",
            "SELECT outbox_fail(4, 'boom')",
            "SELECT outbox_fail(5, 'boom', NULL, interval '1 second')",
            "SELECT * FROM outbox_stats()",
            "SELECT * FROM outbox_monitoring",
            "SELECT * FROM outbox_dead_letters",
            "SELECT outbox_requeue(1)",
            "SELECT outbox_requeue('a.b')",
            "SELECT outbox_requeue_all()",
            "SELECT outbox_discard(1)",
            "SELECT outbox_discard('a.b')",
            "SELECT outbox_discard_all()",
            "SELECT outbox_purge('0')",
            "SELECT outbox_purge('0', true, 10)",
            "SELECT outbox_subscribe('a.b', 'http://127.0.0.1:9/x', NULL, '{\"X-A\": \"b\"}', '1 second', false)",
            "SELECT * FROM outbox_subscriptions",
            "SELECT * FROM outbox_topics()",
            "SELECT outbox_unsubscribe('a.b')",
            "SELECT * FROM outbox_worker_status()",
        ]
        # The administrator calls them as usual; the attacker names them in full, so that her
        # search_path (evil, public, pg_catalog) is in force inside them.
        for role, search_path, prefix in ((OPERATOR, "public, pg_catalog", ""), (ATTACKER, None, "public.")):
            with connect_as(role, search_path=search_path) as conn:
                for call in calls:
                    conn.execute(re.sub(r"\b(outbox_[a-z_]+)\b", prefix + r"\1", call) if prefix else call)
        with connect_as() as db:
            assert traps_sprung(db) == []
        assert not attacker_is_superuser()
    finally:
        receiver.stop()


def restart_worker(database):
    """Ends the database's delivery worker; it is started again by the extension."""
    with admin_connection() as admin:
        pids = [row[0] for row in admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_ext delivery worker' AND datname = %s",
            (database,))]
        for pid in pids:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        eventually(lambda: all(admin.execute("SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0]
                               for pid in pids), what="the worker to exit")


def test_no_look_alike_planted_before_the_install_runs_or_is_built_in(hostile_database, database):
    """The install itself runs as a superuser with the extension's schema on its search_path:
    the database owner, who owns public, planted public.||(text, integer) before CREATE
    EXTENSION, and the install's DO blocks ran it as a superuser. An expression stored by the
    install (a CHECK, a view, a default) would also keep calling whatever it resolved to."""
    with psycopg.connect(dbname=database, autocommit=True) as catalog, connect_as(ATTACKER) as mallory:
        mallory.execute("CREATE FUNCTION public.trap_transition(bigint) RETURNS bigint LANGUAGE sql AS 'SELECT 1::bigint'")
        planted = plant_look_alikes(mallory, "public", catalog=catalog)
        assert planted > 500, f"only {planted} look-alikes planted"
    receiver = Receiver().start()
    try:
        with connect_as() as db:
            create_extension(db)
            ran_at_install = db.execute("SELECT current_role_name, trap FROM public.trap_log").fetchall()
            assert ran_at_install == []
            built_in = db.execute(
                """SELECT pg_describe_object(d.classid, d.objid, d.objsubid) || ' -> ' || pg_describe_object(d.refclassid, d.refobjid, 0)
                     FROM pg_catalog.pg_depend d
                    WHERE (d.refclassid, d.refobjid) IN (SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid FROM pg_catalog.pg_proc p
                                                          WHERE p.proowner = %(attacker)s::pg_catalog.regrole
                                                         UNION ALL
                                                         SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid FROM pg_catalog.pg_operator o
                                                          WHERE o.oprowner = %(attacker)s::pg_catalog.regrole)
                      AND (d.classid, d.objid) NOT IN (SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, o.oid FROM pg_catalog.pg_operator o
                                                        WHERE o.oprowner = %(attacker)s::pg_catalog.regrole
                                                       UNION ALL
                                                       SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid FROM pg_catalog.pg_proc p
                                                        WHERE p.proowner = %(attacker)s::pg_catalog.regrole)""",
                {"attacker": ATTACKER}).fetchall()
            assert built_in == []
            # What the stored expressions check, and the worker's first steps.
            db.execute("SELECT public.outbox_subscribe('hook.sent', %s, public.outbox_generate_secret(), '{\"X-Team\": \"7\"}', "
                       "timeout => '5 seconds', rate_limit => 5, max_in_flight => 2)", (receiver.url,))
            db.execute("SELECT public.outbox_enqueue('hook.sent', '{\"n\": 1}', ordering_key => 'k')")
        receiver.wait_for(1)
        with connect_as() as db:
            assert db.execute("SELECT current_role_name, trap FROM public.trap_log").fetchall() == []
        assert not attacker_is_superuser()
    finally:
        receiver.stop()
