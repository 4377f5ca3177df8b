"""A claim reads the ready queue from where the connection's previous claim found its head
(src/claim/head.rs), not over the dead index entries every claim and completion leaves at the
front of outbox_ready_idx, which only VACUUM removes and which a pinned xmin horizon keeps.
And it still finds, within a second, every message that became ready behind that head."""

import threading
import time

from conftest import connect, enqueue_many
from support import eventually

CYCLE = """SELECT count(*) FROM outbox_enqueue_batch('booking.created', array_fill('{}'::jsonb, ARRAY[10]))"""


def ready_index_blocks_read_by(conn, statement, monitor):
    """Blocks of outbox_ready_idx read by `statement` on `conn` (its statistics flushed and
    read on `monitor`, another connection). They count every access to the index: a claim's
    reads, and also the entries an enqueue or a leased claim inserts."""
    def read():
        return monitor.execute("""SELECT idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes
                                   WHERE indexrelname = 'outbox_ready_idx'""").fetchone()[0]
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    before = read()
    statement()
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT 1")
    return read() - before


def test_claims_do_not_walk_the_dead_entries_a_pinned_horizon_keeps(db):
    enqueue_many(db, 20)
    # A session idle in a transaction: nothing any claim leaves behind can be removed.
    holder = connect()
    holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT count(*) FROM outbox").fetchone()
    monitor = connect(autocommit=True)
    try:
        def cycles(seconds, measured=None):
            """Enqueue, claim and complete 10 messages at a time for `seconds`; with `measured`,
            append the index blocks each claim alone reads. (Without a lease the claim writes
            no new entry: what it reads is its walk alone.)"""
            started = time.monotonic()
            while time.monotonic() - started < seconds:
                db.execute(CYCLE)
                rows = []
                claim = lambda: rows.extend(db.execute("SELECT id, lease_token FROM outbox_claim(10, lease => NULL)").fetchall())
                if measured is None:
                    claim()
                else:
                    measured.append(ready_index_blocks_read_by(db, claim, monitor))
                assert len(rows) == 10
                db.execute("SELECT outbox_complete_batch(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))

        cycles(6)
        # The last two seconds are measured.
        per_claim_reads = []
        cycles(2, per_claim_reads)
        per_claim = sum(per_claim_reads) / len(per_claim_reads)
        # A new connection knows no head: its claim reads the queue from the start, over every
        # dead entry since the horizon was pinned.
        with connect(autocommit=True) as newcomer:
            from_the_start = ready_index_blocks_read_by(newcomer, lambda: newcomer.execute("SELECT id FROM outbox_claim(10)").fetchall(), monitor)
    finally:
        holder.close()
        monitor.close()
    assert from_the_start > 50, f"the horizon was pinned: the walk from the start reads {from_the_start} blocks"
    # Each claim reads the last second's entries and, once a second, the whole walk.
    assert per_claim < 0.4 * from_the_start, (per_claim, from_the_start)


def test_a_message_released_behind_its_key_is_claimed_after_the_head_moved_past_it(db):
    first = db.execute("SELECT id FROM outbox_enqueue('booking.created', '{}', ordering_key => 'k')").fetchone()[0]
    second = db.execute("SELECT id FROM outbox_enqueue('booking.created', '{}', ordering_key => 'k')").fetchone()[0]
    unkeyed = enqueue_many(db, 2)
    time.sleep(1.1)  # older than the head's slack: the head is the oldest message found
    claimed = db.execute("SELECT id, lease_token FROM outbox_claim(1)").fetchone()
    assert claimed[0] == first
    assert db.execute("SELECT id FROM outbox_claim(1)").fetchone()[0] == unkeyed[0]
    # The second message of the key was enqueued before unkeyed[0], where this connection's
    # claims now start; completing the first releases it.
    db.execute("SELECT outbox_complete(%s, %s)", claimed)
    assert sorted(r[0] for r in db.execute("SELECT id FROM outbox_claim(10)")) == [second, unkeyed[1]]


def test_a_message_whose_transaction_commits_late_is_claimed_within_a_second_or_two(db):
    producer = connect()
    late = producer.execute("SELECT id FROM outbox_enqueue('booking.created', '{\"late\": true}')").fetchone()[0]
    time.sleep(1.5)  # longer than the head's slack
    newer = enqueue_many(db, 1)[0]
    assert db.execute("SELECT id FROM outbox_claim(10)").fetchone()[0] == newer
    producer.commit()
    producer.close()
    claimed = []
    eventually(lambda: claimed.extend(r[0] for r in db.execute("SELECT id FROM outbox_claim(10)")) or late in claimed,
               timeout=3, what="the late message claimed")
    assert claimed == [late]


def test_messages_another_consumer_claimed_and_rolled_back_are_claimed_again(db):
    ids = enqueue_many(db, 10)
    time.sleep(1.1)
    other = connect()
    held = [r[0] for r in other.execute("SELECT id FROM outbox_claim(5, lease => NULL)")]
    assert held == ids[:5]
    # This connection's claims move past the rows the other one holds.
    assert [r[0] for r in db.execute("SELECT id FROM outbox_claim(5)")] == ids[5:]
    other.rollback()
    other.close()
    claimed = []
    eventually(lambda: claimed.extend(r[0] for r in db.execute("SELECT id FROM outbox_claim(10)")) or len(claimed) == 5,
               timeout=3, what="the rolled-back claims claimed again")
    assert sorted(claimed) == ids[:5]


def test_concurrent_consumers_claim_every_message_once(db):
    """Eight connections, each with its own head, drain a backlog that producers keep adding
    to: every message is claimed exactly once."""
    enqueue_many(db, 500)
    claimed, lock, stop = [], threading.Lock(), threading.Event()

    def consume():
        with connect(autocommit=True) as conn:
            while not stop.is_set():
                rows = conn.execute("SELECT id, lease_token FROM outbox_claim(7)").fetchall()
                if rows:
                    conn.execute("SELECT outbox_complete_batch(%s, %s)", ([r[0] for r in rows], [r[1] for r in rows]))
                    with lock:
                        claimed.extend(r[0] for r in rows)

    consumers = [threading.Thread(target=consume) for _ in range(8)]
    for consumer in consumers:
        consumer.start()
    expected = 500
    with connect(autocommit=True) as producer:
        for _ in range(50):
            producer.execute(CYCLE)
            expected += 10
    try:
        eventually(lambda: len(claimed) >= expected, timeout=30, what="every message claimed")
    finally:
        stop.set()
        for consumer in consumers:
            consumer.join()
    assert len(claimed) == len(set(claimed)) == expected
    assert db.execute("SELECT count(*) FROM outbox WHERE status <> 'DONE'").fetchone()[0] == 0
