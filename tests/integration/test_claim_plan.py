"""The claim seeks the partial index of pending rows in order: no sort, and no cost that grows
with the DONE history. The plan is the real one of the query inside outbox_claim, captured by
auto_explain (sent to this client as a NOTICE)."""

import json

from conftest import enqueue_many

DONE_HISTORY = 200_000


def claim_plan(conn):
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
    claimed = conn.execute("SELECT id FROM outbox_claim(10)").fetchall()
    conn.execute("ROLLBACK")
    conn.execute("SET auto_explain.log_min_duration = -1")
    plans = [json.loads(n[n.index("{"):]) for n in notices if "SKIP LOCKED" in n]
    assert len(plans) == 1, f"expected the claim query's plan among {len(notices)} notices"
    assert len(claimed) == 10
    return plans[0]


def nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def blocks_touched(plan):
    top = plan["Plan"]
    return top["Shared Hit Blocks"] + top["Shared Read Blocks"]


def test_claim_uses_the_pending_index_without_sorting_and_ignores_done_history(db):
    enqueue_many(db, 100)
    db.execute("ANALYZE outbox")
    before = claim_plan(db)

    db.execute(
        """INSERT INTO outbox (topic, payload, status, attempts, processed_at, available_at)
           SELECT 'booking.created', '{"old": true}', 'DONE', 1, now(), now() - interval '1 day'
             FROM generate_series(1, %s)""",
        (DONE_HISTORY,),
    )
    db.execute("VACUUM ANALYZE outbox")
    after = claim_plan(db)

    for plan in (before, after):
        all_nodes = list(nodes(plan["Plan"]))
        kinds = [n["Node Type"] for n in all_nodes]
        assert "Sort" not in kinds, kinds
        assert "Seq Scan" not in kinds, kinds
        scans = [n for n in all_nodes if n["Node Type"] in ("Index Scan", "Index Only Scan")]
        assert [s["Index Name"] for s in scans] == ["outbox_ready_idx"], kinds

    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 100 + DONE_HISTORY
    touched_before, touched_after = blocks_touched(before), blocks_touched(after)
    # Flat: the same handful of pages with or without 200k DONE rows (a seq scan or a
    # full-index scan would touch thousands).
    assert touched_after <= touched_before * 1.5 + 5, (touched_before, touched_after)
