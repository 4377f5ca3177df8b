"""Hostile and bad input through a real client: property-based (hypothesis) arguments for
every SQL function, plus the cases a generator finds only by luck (megabytes of payload, deep
nesting, aborted transactions, roles without rights). Every call must either work or raise an
ERROR with a specific SQLSTATE: never XX000 (internal error), never a lost connection. The
table and its indexes are checked afterwards (constraints and amcheck)."""

import collections
import json

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SAFE_TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=80)
TOPICS = st.one_of(
    st.none(),
    st.sampled_from(["booking.created", "invoice:paid", "", " ", "a" * 64, "a" * 65, "café.opened", "a;drop table outbox",
                     "💥", "booking created", "-x", "A.b_c-d:e"]),
    SAFE_TEXT,
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | SAFE_TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(SAFE_TEXT, inner, max_size=4),
    max_leaves=30,
)
PAYLOADS = st.one_of(st.none(), JSON.map(json.dumps))
INTERVALS = st.one_of(
    st.none(),
    st.sampled_from(["0", "1 microsecond", "-1 second", "30 seconds", "1 day", "-100 years", "178000000 years",
                     "not an interval", "1 month", "P1D"]),
)
INTS = st.one_of(st.none(), st.integers(min_value=-(2**31), max_value=2**31 - 1), st.sampled_from([0, 1, 10, 10_000, 10_001]))
IDS = st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1), st.integers(min_value=1, max_value=50))
UUIDS = st.one_of(st.none(), st.uuids().map(str), st.just("not-a-uuid"))
BOOLS = st.one_of(st.none(), st.booleans())
# Ordering keys: a few shared ones (so that messages queue behind each other), bad ones, any text.
KEYS = st.one_of(st.none(), st.sampled_from(["booking:1", "booking:2", "café:3", "", "k" * 255, "k" * 256]), SAFE_TEXT)

# (SQL with placeholders, strategies for the arguments)
CALLS = [
    ("SELECT id FROM outbox_enqueue(%s, %s::jsonb, %s::interval, %s, %s)", (TOPICS, PAYLOADS, INTERVALS, st.one_of(st.none(), SAFE_TEXT), KEYS)),
    ("SELECT count(*) FROM outbox_enqueue_batch(%s, %s::jsonb[], %s::interval, %s)",
     (TOPICS, st.one_of(st.none(), st.lists(PAYLOADS, max_size=5)), INTERVALS, KEYS)),
    ("SELECT count(*) FROM outbox_claim(%s, %s::text[], %s::interval)", (INTS, st.one_of(st.none(), st.lists(TOPICS, max_size=3)), INTERVALS)),
    ("SELECT outbox_complete(%s::bigint, %s::uuid)", (IDS, UUIDS)),
    ("SELECT outbox_complete(%s::bigint[], %s::uuid[])", (st.one_of(st.none(), st.lists(IDS, max_size=4)), st.one_of(st.none(), st.lists(UUIDS, max_size=4)))),
    ("SELECT outbox_fail(%s::bigint, %s, %s::uuid, %s::interval)", (IDS, st.one_of(st.none(), SAFE_TEXT), UUIDS, INTERVALS)),
    ("SELECT outbox_requeue(%s::bigint)", (IDS,)),
    ("SELECT outbox_requeue(%s::text)", (TOPICS,)),
    ("SELECT outbox_discard(%s::bigint)", (IDS,)),
    ("SELECT outbox_purge(%s::interval, %s, %s)", (INTERVALS, BOOLS, INTS)),
    ("SELECT outbox_subscribe(%s, %s, %s, %s::jsonb, %s::interval)",
     (TOPICS, st.one_of(st.none(), SAFE_TEXT, st.sampled_from(["http://127.0.0.1:1/x", "ftp://x", "https://u:p@h/", "http://[::1]:9/"])),
      st.one_of(st.none(), SAFE_TEXT, st.just("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")), PAYLOADS, INTERVALS)),
    ("SELECT outbox_unsubscribe(%s, %s)", (TOPICS, st.one_of(st.none(), SAFE_TEXT))),
    ("SELECT outbox_backoff(%s)", (INTS,)),
]


def check_call(conn, sql, args, outcomes, problems):
    try:
        conn.execute(sql, args).fetchall()
        outcomes["ok"] += 1
    except psycopg.Error as error:
        if conn.closed:
            problems.append(f"connection lost on {sql} {str(args)[:200]}: {error}")
            raise
        state = error.sqlstate
        outcomes[state] += 1
        # None: refused by the client before sending (cannot happen: no NULs are generated).
        if state is None or state == "XX000" or state.startswith("58"):
            problems.append(f"{state} on {sql} {str(args)[:200]}: {error}")


def run_hostile(cluster, examples):
    outcomes, problems = collections.Counter(), []
    conn = cluster.connect()

    @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
              suppress_health_check=list(HealthCheck))
    @given(st.data())
    def any_call(data):
        sql, strategies = data.draw(st.sampled_from(CALLS))
        args = tuple(data.draw(s) for s in strategies)
        check_call(conn, sql, args, outcomes, problems)

    any_call()

    # What a generator does not reach by chance.
    huge = json.dumps({"blob": "x" * (20 * 2**20)})  # 20 MB
    deep = "[" * 100_000 + "]" * 100_000
    for sql, args in [
        ("SELECT id FROM outbox_enqueue('booking.created', %s::jsonb)", (huge,)),
        ("SELECT id FROM outbox_enqueue('booking.created', %s::jsonb)", (deep,)),
        ("SELECT outbox_fail(1, %s)", ("e" * (50 * 2**20),)),  # a 50 MB error message
        ("SELECT count(*) FROM outbox_claim(2147483647)", ()),
        ("SELECT count(*) FROM outbox_claim(10, NULL, interval '178000000 years')", ()),
    ]:
        check_call(conn, sql, args, outcomes, problems)
    with conn.transaction():
        conn.execute("SAVEPOINT before_abort")
        try:
            conn.execute("SELECT 1 / 0")
        except psycopg.errors.DivisionByZero:
            pass
        check_call(conn, "SELECT id FROM outbox_enqueue('booking.created', '{}')", (), outcomes, problems)
        if outcomes.get("25P02", 0) == 0:
            problems.append("a call in an aborted transaction did not raise 25P02")
        conn.execute("ROLLBACK TO SAVEPOINT before_abort")
    conn.execute("DROP ROLE IF EXISTS hostile_nobody")
    conn.execute("CREATE ROLE hostile_nobody LOGIN")
    try:
        with psycopg.connect(dbname=conn.info.dbname, user="hostile_nobody", autocommit=True) as nobody:
            for sql, args in CALLS:
                check_call(nobody, sql.replace("%s", "NULL"), (), outcomes, problems)
    finally:
        conn.execute("DROP ROLE hostile_nobody")
    if outcomes.get("42501", 0) < len(CALLS) - 1:  # outbox_backoff is not a privileged call
        problems.append(f"a role without rights got through: {outcomes.get('42501', 0)} refusals")

    # The table is intact: constraints hold and the indexes agree with the heap.
    conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    for (index,) in conn.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'outbox'::regclass").fetchall():
        conn.execute("SELECT bt_index_check(%s::regclass, true)", (index,))
    bad = conn.execute(
        "SELECT count(*) FROM outbox WHERE status NOT IN ('PENDING', 'DONE', 'DEAD') OR attempts < 0"
        " OR NOT outbox_topic_is_valid(topic) OR (status = 'PENDING') <> (processed_at IS NULL)"
    ).fetchone()[0]
    if bad:
        problems.append(f"{bad} rows break the table's invariants")
    # No ordering key is stuck: a key with messages waiting behind a head has its head.
    stuck = conn.execute(
        "SELECT count(DISTINCT w.ordering_key) FROM outbox w WHERE w.status = 'PENDING' AND w.waiting_for = 'ordering_key'"
        " AND NOT EXISTS (SELECT FROM outbox h WHERE h.ordering_key = w.ordering_key AND h.status = 'PENDING' AND h.waiting_for IS NULL)"
    ).fetchone()[0]
    if stuck:
        problems.append(f"{stuck} ordering keys wait without a head")
    rows = conn.execute("SELECT count(*) FROM outbox").fetchone()[0]
    conn.close()
    calls = sum(outcomes.values())
    summary = ", ".join(f"{k}: {v}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1])[:8])
    return {"calls": calls, "rows": rows, "problems": problems, "sqlstates": summary}
