"""Many consumers drain thousands of messages: every message is completed exactly once."""

import collections
import threading

from conftest import connect, enqueue_many

MESSAGES = 5000
CONSUMERS = 8


def drain(consumer_style):
    """Run CONSUMERS threads until the queue is empty; return every id each one completed."""
    completed = collections.Counter()
    lock = threading.Lock()
    errors = []

    def consume():
        try:
            with connect() as conn:
                while True:
                    batch = consumer_style(conn)
                    if not batch:
                        return
                    with lock:
                        completed.update(batch)
        except Exception as error:  # surfaced by the caller
            errors.append(error)

    threads = [threading.Thread(target=consume) for _ in range(CONSUMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    return completed


def claim_and_complete_in_one_transaction(conn):
    rows = conn.execute("SELECT id, lease_token FROM outbox_claim(50)").fetchall()
    ids = [r[0] for r in rows]
    done = []
    for message_id, token in rows:
        if conn.execute("SELECT outbox_complete(%s, %s)", (message_id, token)).fetchone()[0]:
            done.append(message_id)
    conn.commit()
    assert done == ids
    return done


def claim_without_lease_and_complete(conn):
    """Lock-only claims: nothing is written until the outcome, in the same transaction."""
    ids = [r[0] for r in conn.execute("SELECT id FROM outbox_claim(50, lease => NULL)").fetchall()]
    assert conn.execute("SELECT outbox_complete(%s::bigint[])", (ids,)).fetchone()[0] == len(ids)
    conn.commit()
    return ids


def claim_then_complete_later(conn):
    """Lease style: commit the claim, handle outside any transaction, complete in a second one."""
    rows = conn.execute("SELECT id, lease_token FROM outbox_claim(50, lease => '5 minutes')").fetchall()
    conn.commit()
    if not rows:
        return []
    ids = [r[0] for r in rows]
    tokens = [r[1] for r in rows]
    assert conn.execute("SELECT outbox_complete(%s::bigint[], %s::uuid[])", (ids, tokens)).fetchone()[0] == len(ids)
    conn.commit()
    return ids


def assert_exactly_once(db, completed, ids):
    assert sorted(completed) == sorted(ids), "every message completed"
    duplicates = {i: n for i, n in completed.items() if n > 1}
    assert duplicates == {}, f"completed more than once: {list(duplicates)[:10]}"
    assert db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE' AND attempts = 1").fetchone()[0] == len(ids)


def test_eight_consumers_drain_in_single_transactions(db):
    ids = enqueue_many(db, MESSAGES)
    assert_exactly_once(db, drain(claim_and_complete_in_one_transaction), ids)


def test_eight_consumers_drain_with_leases(db):
    ids = enqueue_many(db, MESSAGES)
    assert_exactly_once(db, drain(claim_then_complete_later), ids)


def test_eight_consumers_drain_with_claims_without_lease(db):
    ids = enqueue_many(db, MESSAGES)
    completed = drain(claim_without_lease_and_complete)
    assert sorted(completed) == sorted(ids)
    assert max(completed.values()) == 1
    # Nothing but the outcome was written: attempts counts failures only in this style.
    assert db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE' AND attempts = 0").fetchone()[0] == len(ids)
