"""Executed plans, as auto_explain reports them: for the tests that check a statement reads
only what it must."""

import json


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


def find(plan, node_type):
    return [n for n in nodes(plan) if n["Node Type"] == node_type]


def blocks_touched(node):
    return node["Shared Hit Blocks"] + node["Shared Read Blocks"]
