"""Executed plans, as auto_explain reports them, for the tests that check a statement reads
only what it must; and a session's kept plans, for those that check a function stays linear
when its session planned it on empty tables."""

import json

from support import disabled_endpoint


def plan_of(conn, statement, marker):
    """The executed plan (JSON, with buffers) of the statement nested in `statement` whose
    text contains `marker`, as auto_explain reports it. The statement runs in a transaction
    that is rolled back."""
    notices = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary))
    conn.execute("LOAD 'auto_explain'")
    for setting, value in {
        "auto_explain.log_min_duration": "0",
        "auto_explain.log_nested_statements": "on",
        "auto_explain.log_analyze": "on",
        "auto_explain.log_buffers": "on",
        "auto_explain.log_format": "json",
        "auto_explain.log_level": "notice",
    }.items():
        conn.execute(f"SET {setting} = '{value}'")
    conn.execute("BEGIN")
    conn.execute(statement).fetchall()
    conn.execute("ROLLBACK")
    conn.execute("SET auto_explain.log_min_duration = -1")
    plans = [json.loads(n[n.index("{"):]) for n in notices if marker in n and "{" in n]
    assert len(plans) == 1, f"expected one plan containing {marker!r} among {len(notices)} notices"
    return plans[0]


def nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def path(plan):
    """The nodes rows flow through, without the sub-selects hung off them (a filter's hashed
    SubPlan, an InitPlan), which run once per statement."""
    yield plan
    for child in plan.get("Plans", []):
        if child.get("Parent Relationship") not in ("SubPlan", "InitPlan"):
            yield from path(child)


def find(plan, node_type):
    return [n for n in nodes(plan) if n["Node Type"] == node_type]


def blocks_touched(node):
    return node["Shared Hit Blocks"] + node["Shared Read Blocks"]


def planned_on_empty_tables_then_bulk_loaded(conn, call, status="DONE", dedupe_keys=False):
    """`call` (its `{subscription}` replaced by the id of a disabled endpoint of 'history.test')
    run 8 times on empty tables, past the plan cache's five custom plans: the session keeps a
    generic one, as the worker's does from the moment the extension exists, and as a pooled
    connection that runs a job every few minutes does. Then 30,000 messages of 'history.test'
    in `status`, processed an hour ago, with a delivery each in the same status (and a
    dedupe_key each, when asked), loaded at once: an import, a backlog, an outage's dead
    letters. Returns the call, ready to run again."""
    subscription = disabled_endpoint(conn)
    call = call.format(subscription=subscription)
    # (Autovacuum kept away: an ANALYZE of its between the load and the call gave the call the
    # statistics it is to do without, and a test passed by luck: stop 57 saw outbox_requeue's
    # fail once in two runs.)
    for table in ("outbox", "outbox_delivery"):
        conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
    for _ in range(8):
        assert conn.execute(call).fetchone()[0] == 0
    conn.execute("""INSERT INTO outbox (topic, payload, status, attempts, processed_at, dedupe_key)
                    SELECT 'history.test', '{}', %s, 1, now() - interval '1 hour', CASE WHEN %s THEN 'key ' || g END
                      FROM generate_series(1, 30000) g""", (status, dedupe_keys))
    conn.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, processed_at)
                    SELECT id, %s, status, 1, processed_at FROM ONLY outbox""", (subscription,))
    return call
