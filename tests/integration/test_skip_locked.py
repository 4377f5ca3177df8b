"""The essay's test: a second consumer must skip the first one's rows, not wait for them.

Only the clock tells "skipping" from "blocking", so these tests assert on elapsed time, with
generous bounds; the control test shows the same situation without SKIP LOCKED does block.
"""

import time

import psycopg
import pytest

from conftest import connect, enqueue_many


def test_second_consumer_gets_nothing_at_once_while_the_first_holds_everything(db):
    enqueue_many(db, 10)
    with connect() as worker_a, connect() as worker_b:
        claimed_a = worker_a.execute("SELECT id FROM outbox_claim(10)").fetchall()
        assert len(claimed_a) == 10  # worker A's transaction stays open, holding the rows
        # Were claim to wait for A's locks, fail after 5 s rather than hang.
        worker_b.execute("SET lock_timeout = '5s'")

        started = time.perf_counter()
        claimed_b = worker_b.execute("SELECT id FROM outbox_claim(10)").fetchall()
        elapsed = time.perf_counter() - started

        assert claimed_b == []
        assert elapsed < 1.0, f"worker B blocked for {elapsed:.2f}s: it is waiting, not skipping"
        worker_a.rollback()


def test_second_consumer_takes_the_next_rows(db):
    ids = enqueue_many(db, 30)
    with connect() as worker_a, connect() as worker_b:
        claimed_a = [r[0] for r in worker_a.execute("SELECT id FROM outbox_claim(20)")]
        worker_b.execute("SET lock_timeout = '5s'")
        started = time.perf_counter()
        claimed_b = [r[0] for r in worker_b.execute("SELECT id FROM outbox_claim(20)")]
        elapsed = time.perf_counter() - started

        assert claimed_a == ids[:20], "oldest-ready first"
        assert claimed_b == ids[20:]
        assert elapsed < 1.0, f"worker B blocked for {elapsed:.2f}s"
        worker_a.commit()
        worker_b.commit()


def test_without_skip_locked_the_second_consumer_would_block(db):
    """Control: the essay's query with plain FOR UPDATE waits for worker A's locks."""
    enqueue_many(db, 10)
    with connect() as worker_a, connect() as worker_b:
        worker_a.execute("SELECT id FROM outbox_claim(10)").fetchall()
        worker_b.execute("SET lock_timeout = '1500ms'")
        started = time.perf_counter()
        with pytest.raises(psycopg.errors.LockNotAvailable):
            worker_b.execute(
                "SELECT * FROM outbox WHERE status = 'PENDING' ORDER BY available_at LIMIT 10 FOR UPDATE"
            ).fetchall()
        elapsed = time.perf_counter() - started
        assert elapsed >= 1.4, f"plain FOR UPDATE returned after {elapsed:.2f}s instead of waiting"
        worker_a.rollback()


def test_claims_without_lease_skip_locked_rows_too(db):
    ids = enqueue_many(db, 30)
    with connect() as worker_a, connect() as worker_b:
        claimed_a = [r[0] for r in worker_a.execute("SELECT id FROM outbox_claim(20, lease => NULL)")]
        worker_b.execute("SET lock_timeout = '5s'")
        started = time.perf_counter()
        claimed_b = [r[0] for r in worker_b.execute("SELECT id FROM outbox_claim(20, lease => NULL)")]
        elapsed = time.perf_counter() - started
        assert claimed_a == ids[:20] and claimed_b == ids[20:]
        assert elapsed < 1.0, f"worker B blocked for {elapsed:.2f}s"
        worker_a.rollback()  # A gives its rows back at once, untouched
        worker_b.commit()
    assert [r[0] for r in db.execute("SELECT id FROM outbox_claim(30, lease => NULL)")] == ids
