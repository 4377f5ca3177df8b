"""Enqueue and claim live and die with the caller's transaction; leases bring back what a
committed-but-dead consumer held; stale tokens change nothing."""

import threading
import time

import psycopg
import pytest

from conftest import connect, enqueue_many


def count(conn, where="true") -> int:
    return conn.execute(f"SELECT count(*) FROM outbox WHERE {where}").fetchone()[0]


def test_enqueue_is_invisible_to_others_until_commit(db):
    with connect() as producer:
        producer.execute("SELECT outbox_enqueue('booking.created', '{}')")
        assert count(producer) == 1
        assert count(db) == 0
        assert db.execute("SELECT count(*) FROM outbox_claim(10)").fetchone()[0] == 0
        producer.commit()
    assert count(db) == 1


def test_rollback_takes_the_message_with_it(db):
    with connect() as producer:
        producer.execute("SELECT outbox_enqueue('booking.created', '{}')")
        producer.rollback()
    assert count(db) == 0


def test_a_rejected_double_booking_takes_its_outbox_row_with_it(db):
    """The essay's case: an exclusion constraint rejects the second booking of the same room
    and dates; the email that booking would have owed disappears with it."""
    db.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
    db.execute("DROP TABLE IF EXISTS bookings")
    db.execute(
        """CREATE TABLE bookings (
               id serial PRIMARY KEY,
               room int NOT NULL,
               stay daterange NOT NULL,
               guest text NOT NULL,
               EXCLUDE USING gist (room WITH =, stay WITH &&))"""
    )

    def book(conn, guest):
        booking_id = conn.execute(
            "INSERT INTO bookings (room, stay, guest) VALUES (7, '[2026-12-01,2026-12-05)', %s) RETURNING id",
            (guest,),
        ).fetchone()[0]
        conn.execute(
            "SELECT outbox_enqueue('booking.created', jsonb_build_object('bookingId', %s::int, 'guest', %s::text),"
            " dedupe_key => 'booking-created:' || %s::text)",
            (booking_id, guest, booking_id),
        )
        conn.commit()

    with connect() as first, connect() as second:
        book(first, "ada@example.test")
        try:
            book(second, "bob@example.test")
            raise AssertionError("the double booking was accepted")
        except psycopg.errors.ExclusionViolation:
            second.rollback()

    guests = db.execute("SELECT payload->>'guest' FROM outbox").fetchall()
    assert guests == [("ada@example.test",)]
    db.execute("DROP TABLE bookings")


def test_a_rolled_back_claim_gives_the_messages_back_at_once(db):
    [message_id] = enqueue_many(db, 1)
    with connect() as consumer:
        consumer.execute("SELECT * FROM outbox_claim(10)").fetchall()
        consumer.rollback()
    row = db.execute("SELECT attempts, lease_token FROM outbox WHERE id = %s", (message_id,)).fetchone()
    assert row == (0, None), "as if never claimed"
    assert db.execute("SELECT count(*) FROM outbox_claim(10)").fetchone()[0] == 1


def test_a_consumer_that_dies_holding_its_transaction_gives_the_messages_back(db):
    enqueue_many(db, 3)
    consumer = connect()
    assert len(consumer.execute("SELECT * FROM outbox_claim(10)").fetchall()) == 3
    consumer.close()  # the connection drops: the server aborts its transaction
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if db.execute("SELECT count(*) FROM outbox_claim(10)").fetchone()[0] == 3:
            break
        time.sleep(0.05)
    else:
        raise AssertionError("the dead consumer's messages never came back")


def test_a_committed_claim_is_redelivered_when_the_lease_runs_out(db):
    [message_id] = enqueue_many(db, 1)
    with connect() as consumer:
        first = consumer.execute("SELECT lease_token FROM outbox_claim(10, lease => '1 second')").fetchone()
        consumer.commit()
    # The consumer "died" after committing its claim. Until the lease ends, nobody gets it.
    assert db.execute("SELECT count(*) FROM outbox_claim(10)").fetchone()[0] == 0
    time.sleep(1.3)
    second = db.execute("SELECT id, attempts, lease_token FROM outbox_claim(10)").fetchone()
    assert second[0] == message_id
    assert second[1] == 2, "each claim is a delivery"
    assert second[2] != first[0]

    # The first consumer wakes up late: its token is stale and changes nothing.
    assert db.execute("SELECT outbox_complete(%s, %s)", (message_id, first[0])).fetchone()[0] is False
    assert db.execute("SELECT outbox_fail(%s, 'late', %s)", (message_id, first[0])).fetchone()[0] is None
    assert count(db, "status = 'PENDING' AND last_error IS NULL") == 1
    assert db.execute("SELECT outbox_complete(%s, %s)", (message_id, second[2])).fetchone()[0] is True


def test_readiness_follows_the_clock_inside_a_long_transaction(db):
    """A long-lived consumer transaction sees delayed messages become ready: readiness is
    judged by clock_timestamp(), not by the transaction's start time."""
    with connect() as consumer:
        consumer.execute("SELECT 1")  # the transaction starts here
        db.execute("SELECT outbox_enqueue('reminder.due', '{}', interval '1 second')")
        assert consumer.execute("SELECT count(*) FROM outbox_claim(10)").fetchone()[0] == 0
        time.sleep(1.3)
        assert consumer.execute("SELECT count(*) FROM outbox_claim(10)").fetchone()[0] == 1
        consumer.commit()


def test_concurrent_producers_with_one_dedupe_key_make_one_message(db):
    producers = 8
    barrier = threading.Barrier(producers)
    ids, errors = [], []

    def produce(n):
        try:
            with connect() as conn:
                barrier.wait()
                row = conn.execute(
                    "SELECT (m).id, (m).payload->>'producer' FROM outbox_enqueue('booking.created',"
                    " jsonb_build_object('producer', %s::int), dedupe_key => 'booking-created:99') m",
                    (n,),
                ).fetchone()
                conn.commit()
                ids.append(row[0])
        except Exception as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert errors == []
    assert len(ids) == producers and len(set(ids)) == 1
    assert count(db) == 1


def test_a_claim_without_lease_after_a_lease_ran_out_counts_its_own_attempt(db):
    """A consumer with a lease lets it run out; another claims the message without one and
    fails it: that is the second attempt of two, so the message is DEAD. The claim without a
    lease kept the first holder's token, so the failure counted as the first holder's attempt
    (PENDING, 1 attempt), and that token could still act on the message."""
    message_id = db.execute("SELECT id FROM outbox_enqueue('booking.created', '{}')").fetchone()[0]
    first_token = db.execute("SELECT lease_token FROM outbox_claim(1, NULL, interval '100 milliseconds')").fetchone()[0]
    time.sleep(0.3)
    with connect() as other:
        other.execute("SET outbox.max_attempts = 2")
        assert other.execute("SELECT id, lease_token FROM outbox_claim(1, NULL, lease => NULL)").fetchone() == (message_id, None)
        assert other.execute("SELECT outbox_fail(%s, 'boom')", (message_id,)).fetchone()[0] == "DEAD"
        other.commit()
    assert db.execute("SELECT status, attempts FROM outbox WHERE id = %s", (message_id,)).fetchone() == ("DEAD", 2)
    assert db.execute("SELECT outbox_complete(%s, %s)", (message_id, first_token)).fetchone()[0] is False


def test_serializable_claims_beside_an_open_serializable_transaction_do_not_run_out_of_predicate_locks(db):
    """SERIALIZABLE keeps what a committed transaction read (predicate locks) for as long as an
    older serializable transaction that writes is open. Each claim read a dozen pages of the
    ready index, each a lock: with one such transaction open, a consumer's claims failed after
    about 1,000 transactions with 53200 "out of shared memory", every one until it ended (stop
    58's probe of isolation levels). A claim now takes one lock on the whole index."""
    transactions, batch = 1500, 10
    db.execute("SELECT outbox_enqueue_batch('ser.claimed', (SELECT array_agg('{}'::jsonb) FROM generate_series(1, %s)))",
               (transactions * batch,))
    with connect() as bystander, connect(autocommit=True) as consumer:
        bystander.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
        bystander.execute("SELECT 1")  # open, and not READ ONLY
        for _ in range(transactions):
            with consumer.transaction():
                consumer.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                claimed = consumer.execute("SELECT id, lease_token FROM outbox_claim(%s, ARRAY['ser.claimed'], '1 minute')",
                                           (batch,)).fetchall()
                consumer.execute("SELECT outbox_complete_batch(%s::bigint[], %s::uuid[])",
                                 ([row[0] for row in claimed], [row[1] for row in claimed]))
        ready_index_locks = db.execute("""SELECT count(*) FROM pg_locks
                                           WHERE mode = 'SIReadLock' AND relation = 'outbox_ready_idx'::regclass""").fetchone()[0]
        assert ready_index_locks <= transactions + 1, "one lock of the ready index per transaction, not one per page"
    assert count(db, "status = 'DONE'") == transactions * batch


@pytest.mark.parametrize("call, function", [
    ("SELECT outbox_enqueue('ro.topic', '{}')", "outbox_enqueue"),
    ("SELECT outbox_enqueue_batch('ro.topic', ARRAY['{}'::jsonb])", "outbox_enqueue_batch"),
    ("SELECT * FROM outbox_claim(1, ARRAY['ro.topic'])", "outbox_claim"),
    ("SELECT outbox_complete(1)", "outbox_complete"),
    ("SELECT outbox_complete_batch('{}'::bigint[])", "outbox_complete_batch"),
    ("SELECT outbox_fail(1, 'no')", "outbox_fail"),
    ("SELECT outbox_release_keys(ARRAY['k'])", "outbox_release_keys"),
])
def test_a_function_that_writes_names_itself_in_a_read_only_transaction(db, call, function):
    """In a read-only transaction (BEGIN READ ONLY, default_transaction_read_only, a hot
    standby) PostgreSQL's error named a statement of the function: outbox_complete said "cannot
    execute SELECT in a read-only transaction", outbox_claim of a topic with nothing ready
    "SELECT FOR UPDATE" (stop 58's probe of isolation levels)."""
    db.execute("SELECT outbox_enqueue('ro.topic', '{}')")
    with connect() as reader:
        reader.execute("SET TRANSACTION READ ONLY")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as refused:
            reader.execute(call)
        assert str(refused.value).startswith(f"{function}: cannot run in a read-only transaction")
        assert "primary" in refused.value.diag.message_hint
    assert count(db) == 1, "nothing written"
