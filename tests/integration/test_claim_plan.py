"""The claim seeks the partial index of pending rows in order: no sort to find the ready rows,
and no cost that grows with the DONE history. The plan is the real one of the query inside outbox_claim, captured by
auto_explain (sent to this client as a NOTICE)."""

import time

from conftest import connect, enqueue_many
from support.plans import blocks_touched, find, path, plan_of

DONE_HISTORY = 200_000


def claim_plan(conn):
    return plan_of(conn, "SELECT id FROM outbox_claim(10)", "SKIP LOCKED")


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
        # Selecting the ready rows: Limit <- LockRows (FOR UPDATE SKIP LOCKED) <- an ordered
        # scan of the partial index, with no sort in between (a sub-select hung off the scan's
        # filter, as many topics' is, is not in the rows' path).
        [lock_rows] = find(plan["Plan"], "LockRows")
        selection = [n["Node Type"] for n in path(lock_rows)]
        assert selection == ["LockRows", "Index Scan"], selection
        assert lock_rows["Plans"][0]["Index Name"] == "outbox_ready_idx"
        assert lock_rows["Actual Rows"] == 10
        # The only sort allowed puts the claimed batch itself (10 rows) in readiness order.
        for sort in find(plan["Plan"], "Sort"):
            assert sort["Actual Rows"] <= 10, sort

    # With a history, nothing in the claim reads the table sequentially (on the 2-page table
    # of the first plan a sequential scan is the planner's right choice).
    assert find(after["Plan"], "Seq Scan") == []
    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 100 + DONE_HISTORY

    # Flat: finding the ready rows touches the same handful of pages with or without 200k
    # DONE rows behind them.
    [limit_before], [limit_after] = find(before["Plan"], "Limit"), find(after["Plan"], "Limit")
    assert blocks_touched(limit_after) <= blocks_touched(limit_before) * 1.5 + 5, (limit_before, limit_after)
    # The whole claim (updating 10 rows and their index entries) grows only with the depth
    # of the indexes; reading the history would touch thousands of pages.
    assert blocks_touched(after["Plan"]) <= 3 * blocks_touched(before["Plan"]) + 50


def test_a_claim_of_many_topics_behind_another_topics_backlog_costs_what_one_topics_does(db):
    """A consumer of many topics walks past the ready rows of topics it does not take (an
    ordered walk of outbox_ready_idx). Its kept plan compared each of those rows with every
    topic in turn: behind 100,000 rows of another topic, a claim of 1,000 topics took 1.5 s and
    one of 100,000 topics 141 s (a bad-input audit). The topics are hashed once per statement
    now. (Generous bound: the old cost was about a hundred times one topic's.)"""
    db.execute("SELECT count(*) FROM outbox_enqueue_batch('sql.consumers.topic', "
               "(SELECT array_agg(jsonb_build_object('n', n)) FROM generate_series(1, 100000) n))")
    db.execute("VACUUM ANALYZE outbox")
    many = ["t" + str(n) for n in range(2000)]

    def seconds(topics):
        timings = []
        for _ in range(3):
            # (A new session each time: a session's next claims start where its last one found
            # the queue's head, and would not walk the backlog again.)
            with connect() as consumer:
                started = time.monotonic()
                assert consumer.execute("SELECT count(*) FROM outbox_claim(1, %s)", (topics,)).fetchone()[0] == 0
                timings.append(time.monotonic() - started)
        return sorted(timings)[1]

    one = seconds(["t0"])
    of_many = seconds(many)
    assert of_many <= 10 * one + 0.5, (one, of_many)


def test_many_topics_are_hashed_even_by_a_plan_made_on_an_empty_table(db):
    """With four or more topics the claim matches them through a sub-select PostgreSQL may
    hash; it decides when it plans, from the rows it expects. A session's kept plan made while
    the table was empty must hash them still, or a backlog arriving later is walked at the
    cost of rows x topics until the plan is made again."""
    topics = ["t" + str(n) for n in range(2000)]
    for _ in range(8):  # past the plan cache's custom plans, on an empty table
        assert db.execute("SELECT count(*) FROM outbox_claim(1, %s)", (topics,)).fetchone()[0] == 0
    db.execute("SELECT count(*) FROM outbox_enqueue_batch('sql.consumers.topic', "
               "(SELECT array_agg(jsonb_build_object('n', n)) FROM generate_series(1, 1000) n))")
    plan = plan_of(db, f"SELECT count(*) FROM outbox_claim(1, ARRAY{topics!r}::text[])", "SKIP LOCKED")
    [lock_rows] = find(plan["Plan"], "LockRows")
    filters = " ".join(n.get("Filter", "") for n in path(lock_rows))
    assert "hashed SubPlan" in filters, filters
