"""Per-key ordering (docs/ordering.md): messages that share an ordering_key are handed out one
at a time, in enqueue order, across topics; different keys proceed in parallel; a dead letter
releases its key. For SQL consumers here; for the delivery worker (per endpoint) at the end."""

import json
import random
import threading
import time

import psycopg
import pytest

from conftest import configure_worker, connect
from support import PausedAt, ServerLog, disabled_endpoint, eventually, worker_pid


def enqueue(conn, topic, n, key=None, delay="0"):
    return conn.execute(
        "SELECT id FROM outbox_enqueue(%s, jsonb_build_object('n', %s::int), %s::interval, ordering_key => %s)",
        (topic, n, delay, key),
    ).fetchone()[0]


def claim(conn, batch_size=10, lease="30 seconds"):
    return conn.execute(
        "SELECT id, topic, ordering_key, lease_token FROM outbox_claim(%s, lease => %s::interval)", (batch_size, lease)
    ).fetchall()


def test_a_key_is_handed_out_one_message_at_a_time_in_enqueue_order_across_topics(db):
    created = enqueue(db, "booking.created", 1, "booking:42")
    other = enqueue(db, "booking.created", 2, "booking:43")
    cancelled = enqueue(db, "booking.cancelled", 3, "booking:42")
    unkeyed = enqueue(db, "booking.cancelled", 4)
    first = claim(db)
    # One message of each key, and every message without one.
    assert sorted(row[0] for row in first) == sorted([created, other, unkeyed])
    assert claim(db) == []  # booking:42's second message waits for its first
    assert db.execute("SELECT outbox_complete(%s, %s)", (created, first[0][3])).fetchone()[0]
    assert [row[0] for row in claim(db)] == [cancelled]


def test_a_retried_head_keeps_its_key_until_it_ends(db):
    head = enqueue(db, "booking.created", 1, "booking:42")
    behind = enqueue(db, "booking.created", 2, "booking:42")
    (row,) = claim(db)
    assert db.execute("SELECT outbox_fail(%s, 'HTTP 503', %s, retry_in => '0')", (head, row[3])).fetchone()[0] == "PENDING"
    # The head failed and is due again at once: it comes back, not the message behind it.
    assert [r[0] for r in claim(db)] == [head]
    assert behind not in [r[0] for r in claim(db)]


def test_a_lease_that_runs_out_gives_the_same_head_back(db):
    head = enqueue(db, "booking.created", 1, "booking:42")
    enqueue(db, "booking.created", 2, "booking:42")
    assert [r[0] for r in claim(db, lease="100 milliseconds")] == [head]
    time.sleep(0.3)
    again = claim(db)
    assert [r[0] for r in again] == [head]


def test_a_dead_letter_releases_its_key_and_stays_for_the_operator(db):
    db.execute("SET outbox.max_attempts = 1")
    head = enqueue(db, "booking.created", 1, "booking:42")
    behind = enqueue(db, "booking.created", 2, "booking:42")
    (row,) = claim(db)
    assert db.execute("SELECT outbox_fail(%s, 'template missing', %s)", (head, row[3])).fetchone()[0] == "DEAD"
    assert [r[0] for r in claim(db)] == [behind]
    assert db.execute("SELECT id FROM outbox_dead_letters").fetchall() == [(head,)]


def test_a_batch_with_a_key_is_handed_out_in_payload_order(db):
    ids = [
        row[0]
        for row in db.execute(
            "SELECT id FROM outbox_enqueue_batch('booking.created', ARRAY['{\"n\":1}','{\"n\":2}','{\"n\":3}']::jsonb[], ordering_key => 'booking:42')"
        )
    ]
    handed_out = []
    for _ in ids:
        ((message_id, _, key, token),) = claim(db)
        assert key == "booking:42"
        handed_out.append(message_id)
        db.execute("SELECT outbox_complete(%s, %s)", (message_id, token))
    assert handed_out == ids


def test_a_delayed_message_behind_a_head_keeps_its_delay(db):
    head = enqueue(db, "booking.created", 1, "booking:42")
    later = enqueue(db, "booking.created", 2, "booking:42", delay="1 hour")
    (row,) = claim(db)
    db.execute("SELECT outbox_complete(%s, %s)", (head, row[3]))
    assert claim(db) == []
    assert db.execute("SELECT available_at > now() + interval '59 minutes' FROM outbox WHERE id = %s", (later,)).fetchone()[0]


def test_completing_without_a_lease_releases_the_key(db):
    with connect() as consumer:
        head = enqueue(db, "booking.created", 1, "booking:42")
        behind = enqueue(db, "booking.created", 2, "booking:42")
        # Claimed without a lease: locked for the consumer's transaction only.
        assert [r[0] for r in claim(consumer, lease=None)] == [head]
        consumer.execute("SELECT outbox_complete(%s)", (head,))
        assert claim(db) == []  # not yet committed: the head still holds the key
        consumer.commit()
    assert [r[0] for r in claim(db)] == [behind]


def test_requeued_and_discarded_dead_letters_keep_the_key_order(db):
    db.execute("SET outbox.max_attempts = 1")
    head = enqueue(db, "booking.created", 1, "booking:42")
    behind = enqueue(db, "booking.created", 2, "booking:42")
    (row,) = claim(db)
    db.execute("SELECT outbox_fail(%s, 'boom', %s)", (head, row[3]))
    # The dead head released the key; requeued, it waits behind the message that now holds it.
    db.execute("SELECT outbox_requeue(%s::bigint)", (head,))
    assert [r[0] for r in claim(db)] == [behind]
    assert claim(db) == []


def test_a_requeued_dead_delivery_is_released_at_its_endpoint_when_the_key_is_free_there(db):
    """outbox_requeue puts a dead delivery with a key behind the endpoint's pending deliveries
    of that key; with none, the release (src/ordering, called from SQL here) frees it at once."""
    endpoint = db.execute("SELECT outbox_subscribe('booking.created', 'http://127.0.0.1:9/hook')").fetchone()[0]
    dead = db.execute("""INSERT INTO outbox (topic, payload, ordering_key, status, processed_at, attempts)
                         VALUES ('booking.created', '{}', 'booking:42', 'DEAD', now(), 5) RETURNING id""").fetchone()[0]
    db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, processed_at, attempts, ordering_key)
                  VALUES (%s, %s, 'DEAD', now(), 5, 'booking:42')""", (dead, endpoint))
    assert db.execute("SELECT outbox_requeue(%s::bigint)", (dead,)).fetchone()[0] == 1
    assert db.execute("SELECT status, waiting_for FROM outbox_delivery WHERE message_id = %s", (dead,)).fetchone() == ("PENDING", None)
    assert db.execute("SELECT status, waiting_for FROM outbox WHERE id = %s", (dead,)).fetchone() == ("PENDING", "deliveries")


def two_keys_in_their_locks_order(db):
    """Two ordering keys, the one whose lock's hash (hashtext) is lower first."""
    return [r[0] for r in db.execute(
        "SELECT k FROM unnest(ARRAY['booking:1', 'booking:2']) k ORDER BY hashtext(k)").fetchall()]


def test_a_requeue_takes_its_keys_locks_in_the_order_every_other_taker_does(db):
    """outbox_requeue_dead locks the keys of the messages it requeues (exclusively) and of the
    deliveries it requeues (shared). Taken in two passes, each in the hashes' order, it could
    wait in a circle with a consumer ending heads of both keys, who takes them in one pass in
    the hashes' order (then; src/ordering/key_locks.rs): PostgreSQL broke the circle by failing one
    of them with 40P01 (the review of this stop's change)."""
    low, high = two_keys_in_their_locks_order(db)
    endpoint = db.execute("SELECT outbox_subscribe('booking.created', 'http://127.0.0.1:9/hook')").fetchone()[0]
    # A dead message of `high` that no endpoint took (an SQL consumer's topic), and a dead
    # delivery of `low`.
    db.execute("""INSERT INTO outbox (topic, payload, ordering_key, status, processed_at, attempts)
                  VALUES ('invoice.paid', '{}', %s, 'DEAD', now(), 5)""", (high,))
    delivered = db.execute("""INSERT INTO outbox (topic, payload, ordering_key, status, processed_at, attempts)
                              VALUES ('booking.created', '{}', %s, 'DEAD', now(), 5) RETURNING id""", (low,)).fetchone()[0]
    db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, processed_at, attempts, ordering_key)
                  VALUES (%s, %s, 'DEAD', now(), 5, %s)""", (delivered, endpoint, low))
    low_lock, high_lock = db.execute("SELECT ARRAY['outbox'::regclass::oid::int4, hashtext(%s)], "
                                     "ARRAY['outbox'::regclass::oid::int4, hashtext(%s)]", (low, high)).fetchone()
    # The requeue waits for `low`: before, it held `high` meanwhile.
    outcome = outcome_of_a_call_and_a_session_taking_two_locks(("SELECT outbox_requeue_all()", ()), low_lock, high_lock)
    assert outcome == {"operator": 2}, outcome


def outcome_of_a_call_and_a_session_taking_two_locks(call, first, second):
    """Runs an operator's `call` (SQL and its arguments) in a thread, while a session, as the
    worker or a consumer would, holds the advisory lock `first` ([int4, int4]) and then waits
    for `second`. Returns what the call returned or its SQLSTATE, and the session's SQLSTATE
    if it failed: {"operator": 2} when neither waited for the other in a circle."""
    outcome = {}

    def operator():
        try:
            with connect() as conn:
                outcome["operator"] = conn.execute(*call).fetchone()[0]
        except psycopg.Error as error:
            outcome["operator"] = error.sqlstate

    with connect() as session:
        session.execute("SET deadlock_timeout = '100ms'")
        session.execute("SELECT pg_advisory_xact_lock(%s, %s)", first)
        thread = threading.Thread(target=operator)
        thread.start()
        time.sleep(0.5)  # the call waits for `first`
        try:
            session.execute("SELECT pg_advisory_xact_lock(%s, %s)", second)
        except psycopg.Error as error:
            outcome["session"] = error.sqlstate
        session.rollback()
        thread.join(timeout=10)
    return outcome


@pytest.mark.parametrize("release", ["complete_batch", "requeue"])
def test_a_producer_of_two_keys_and_a_release_of_both_deadlock_no_one(db, release):
    """A release of several keys in one call (outbox_complete_batch, outbox_requeue_dead; a
    claim's dead letters and the worker's unhand too) took their locks in the hashes' order,
    waiting for each while holding those before it. A producer holds each key it enqueues with
    until it commits, in the order its transaction enqueues: one that held the later key and
    then enqueued with the earlier one waited for the release while the release waited for it,
    and PostgreSQL failed one of them with 40P01: the producer's business transaction when its
    deadlock_timeout ran out first, as here. A release now waits for one key at a time, holding
    none of the others (src/ordering/key_locks.rs)."""
    low, high = two_keys_in_their_locks_order(db)
    if release == "complete_batch":
        enqueue(db, "booking.created", 1, low)
        enqueue(db, "booking.created", 2, high)
        heads = claim(db)
        call = ("SELECT outbox_complete_batch(%s, %s)", ([r[0] for r in heads], [r[3] for r in heads]))
    else:
        for key in (low, high):  # dead letters of an SQL consumer's topic
            db.execute("""INSERT INTO outbox (topic, payload, ordering_key, status, processed_at, attempts)
                          VALUES ('invoice.paid', '{}', %s, 'DEAD', now(), 5)""", (key,))
        call = ("SELECT outbox_requeue_all()", ())
    outcome = {}

    def releaser():
        with connect(autocommit=True) as conn:
            outcome["released"] = conn.execute(*call).fetchone()[0]

    with connect() as producer:
        producer.execute("SET deadlock_timeout = '100ms'")
        enqueue(producer, "booking.created", 3, high)
        thread = threading.Thread(target=releaser)
        thread.start()
        time.sleep(0.5)  # the release waits for `high`: before, holding `low` meanwhile
        try:
            enqueue(producer, "booking.created", 4, low)
            producer.commit()
        except psycopg.Error as error:
            outcome["producer"] = error.sqlstate
        thread.join(timeout=10)
    assert outcome == {"released": 2}, outcome
    # Both keys went on: one message of each is claimable.
    assert sorted(r[2] for r in claim(db)) == sorted([low, high])


@pytest.mark.parametrize("operators_call", ["requeue", "redeliver"])
def test_an_operators_function_takes_the_endpoints_lock_before_its_keys(db, operators_call):
    """The worker hands on keys at an endpoint holding the endpoint's lock (which it only
    tries), and later in the same step may wait for a key producers keep holding (KEY_PATIENCE).
    outbox_requeue_dead and outbox_redeliver held their keys (shared) and then waited for the
    endpoint's lock: the two waited in a circle until PostgreSQL failed one with 40P01 (stop
    50's note). They take the endpoint's lock first now. A session here holds the lock as the
    worker does, then waits for the key as the worker's pick-up does."""
    endpoint = db.execute("SELECT outbox_subscribe('booking.created', 'http://127.0.0.1:9/hook')").fetchone()[0]
    status = "DEAD" if operators_call == "requeue" else "DONE"
    message = db.execute("""INSERT INTO outbox (topic, payload, ordering_key, status, processed_at, attempts)
                            VALUES ('booking.created', '{}', 'booking:42', %s, now(), 1) RETURNING id""", (status,)).fetchone()[0]
    db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, processed_at, attempts, ordering_key)
                  VALUES (%s, %s, %s, now(), 1, 'booking:42')""", (message, endpoint, status))
    call = {"requeue": ("SELECT outbox_requeue(%s::bigint)", (message,)),
            "redeliver": ("SELECT outbox_redeliver(%s, message_ids => ARRAY[%s]::bigint[])", (endpoint, message))}[operators_call]
    endpoint_lock, key_lock = db.execute("SELECT ARRAY['outbox_delivery'::regclass::oid::int4, hashint8(%s::bigint)], "
                                         "ARRAY['outbox'::regclass::oid::int4, hashtext('booking:42')]", (endpoint,)).fetchone()
    # The operator's call waits for the endpoint: before, holding the key meanwhile.
    outcome = outcome_of_a_call_and_a_session_taking_two_locks(call, endpoint_lock, key_lock)
    assert outcome == {"operator": 1}, outcome
    assert db.execute("SELECT status, waiting_for FROM outbox_delivery WHERE message_id = %s", (message,)).fetchone() == ("PENDING", None)


@pytest.mark.parametrize(
    "key, sqlstate",
    [("", "22023"), ("k" * 256, "22001")],
)
def test_bad_ordering_keys_are_refused_naming_the_argument(db, key, sqlstate):
    for call in (
        "SELECT outbox_enqueue('booking.created', '{}', ordering_key => %s)",
        "SELECT outbox_enqueue_batch('booking.created', ARRAY['{}']::jsonb[], ordering_key => %s)",
    ):
        with pytest.raises(psycopg.Error) as error:
            db.execute(call, (key,))
        assert error.value.sqlstate == sqlstate
        assert "ordering_key" in error.value.diag.message_primary
    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0
    # NULL is "no key"; 255 characters are allowed.
    enqueue(db, "booking.created", 1, None)
    enqueue(db, "booking.created", 2, "k" * 255)
    assert len(claim(db)) == 2


def test_stats_show_keys_held_back_and_how_long(db):
    enqueue(db, "booking.created", 1, "booking:42")
    enqueue(db, "booking.created", 2, "booking:42")
    enqueue(db, "booking.created", 3, "booking:42")
    enqueue(db, "invoice.paid", 4, "invoice:7")  # a head alone: not blocked
    enqueue(db, "invoice.paid", 5, "booking:43")
    enqueue(db, "booking.created", 6, "booking:43")
    db.execute("UPDATE outbox SET created_at = created_at - interval '1 hour' WHERE payload->>'n' = '2'")
    rows = {
        row[0]: row[1:]
        for row in db.execute("SELECT topic, blocked_keys, oldest_blocked_age, ready FROM outbox_stats()")
    }
    total = rows[None]
    assert total[0] == 2  # booking:42 and booking:43
    assert total[1].total_seconds() > 3500
    assert total[2] == 3  # the three heads
    assert rows["booking.created"][0] == 2
    assert rows["invoice.paid"][0] == 0
    view = db.execute("SELECT blocked_keys FROM outbox_monitoring WHERE topic IS NULL").fetchone()
    assert view == (2,)


def test_stats_show_keys_held_back_at_an_endpoint(db):
    """For the topics the worker delivers a key is held back per endpoint, on the deliveries
    (its head delivery failing and backing off, say). Until 0.5.34 blocked_keys and
    oldest_blocked_age counted the messages only: a key held back at an endpoint showed 0 and
    NULL, and the alert on them could not fire for a webhook topic (found by stop 57's probe of
    the monitoring)."""
    endpoint = disabled_endpoint(db, "webhook.sent")  # (left alone by the worker)
    # Messages 1 to 3 of booking:1 (the second an hour old), 4 of booking:2: each a head alone.
    # (With their deliveries in one transaction: the worker gives a message waiting for
    # deliveries that has none its deliveries itself.)
    with db.transaction():
        db.execute("""INSERT INTO outbox (topic, payload, ordering_key, waiting_for, created_at)
                      SELECT 'webhook.sent', jsonb_build_object('n', n), k, 'deliveries',
                             now() - CASE WHEN n = 2 THEN interval '1 hour' ELSE interval '0' END
                        FROM unnest(ARRAY[1, 2, 3, 4], ARRAY['booking:1', 'booking:1', 'booking:1', 'booking:2']) AS m(n, k)
                       ORDER BY n""")
        db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, ordering_key, waiting_for, attempts, available_at)
                      SELECT o.id, %s, o.ordering_key,
                             CASE WHEN o.payload->>'n' IN ('2', '3') THEN 'ordering_key'::outbox_wait END,
                             1, clock_timestamp() + interval '1 hour'
                        FROM outbox o""", (endpoint,))
    rows = {row[0]: row[1:] for row in db.execute("SELECT topic, blocked_keys, oldest_blocked_age FROM outbox_stats()")}
    assert rows["webhook.sent"][0] == 1 and rows[None][0] == 1, rows
    assert rows["webhook.sent"][1].total_seconds() > 3500 and rows[None][1].total_seconds() > 3500, rows


def test_four_consumers_keep_every_key_in_order_through_failures(db):
    """4 consumers, 50 keys × 40 messages, 20% of handlings failing with a short retry_in. From
    the consumers' logs: per key, completions in enqueue order and never two messages of a key
    held at once."""
    keys, per_key = 50, 40
    order = [(n, f"key:{k}") for n in range(per_key) for k in range(keys)]
    db.execute(
        """SELECT count(*) FROM (SELECT outbox_enqueue('booking.created', jsonb_build_object('n', n, 'key', key), ordering_key => key)
                                   FROM unnest(%s::int[], %s::text[]) WITH ORDINALITY AS t(n, key, i) ORDER BY i) e""",
        ([n for n, _ in order], [k for _, k in order]),
    )
    expected = {}
    for message_id, key in db.execute("SELECT id, ordering_key FROM outbox ORDER BY id"):
        expected.setdefault(key, []).append(message_id)

    log = []  # (key, message id, held from, held until, outcome, consumer), from every consumer
    log_lock = threading.Lock()
    done = threading.Event()
    errors = []

    def consumer(seed):
        chance = random.Random(seed)
        try:
            with connect(autocommit=True) as conn:
                # A fifth of handlings fail: at the default outbox.max_attempts (8) one message in
                # 390,000 would go DEAD, about one run in 200 (CI's failure at stop 58).
                conn.execute("SET outbox.max_attempts = 1000")
                while not done.is_set():
                    claimed = conn.execute(
                        "SELECT id, ordering_key, lease_token FROM outbox_claim(20, lease => '30 seconds')"
                    ).fetchall()
                    held_from = time.monotonic()
                    if not claimed:
                        if conn.execute("SELECT count(*) FROM outbox WHERE status = 'PENDING'").fetchone()[0] == 0:
                            done.set()
                        time.sleep(0.01)
                        continue
                    for message_id, key, token in claimed:
                        time.sleep(chance.random() * 0.001)
                        failing = chance.random() < 0.2
                        held_until = time.monotonic()
                        if failing:
                            conn.execute("SELECT outbox_fail(%s, 'flaky', %s, retry_in => '20 milliseconds')", (message_id, token))
                        else:
                            assert conn.execute("SELECT outbox_complete(%s, %s)", (message_id, token)).fetchone()[0]
                        with log_lock:
                            log.append((key, message_id, held_from, held_until, "failed" if failing else "done", seed))
        except Exception as error:  # reported by the test thread
            errors.append(error)
            done.set()

    threads = [threading.Thread(target=consumer, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert not errors, errors
    assert not any(thread.is_alive() for thread in threads), "the consumers did not drain the queue"

    assert db.execute("SELECT count(*) FROM outbox WHERE status = 'DEAD'").fetchone()[0] == 0
    completions, holds = {}, {}
    for key, message_id, held_from, held_until, outcome, _ in sorted(log, key=lambda entry: entry[3]):
        if outcome == "done":
            completions.setdefault(key, []).append(message_id)
        holds.setdefault(key, []).append((held_from, held_until, message_id))
    assert completions == expected
    failures = sum(1 for entry in log if entry[4] == "failed")
    assert failures > 0.1 * len(log)
    for key, intervals in holds.items():
        intervals.sort()
        for (_, earlier_until, earlier), (later_from, _, later) in zip(intervals, intervals[1:]):
            assert later_from >= earlier_until, f"{key}: {later} was held while {earlier} still was"
    # Every message was handled, and the keys went in parallel: every consumer completed some.
    assert len({entry[1] for entry in log}) == keys * per_key
    assert {entry[5] for entry in log if entry[4] == "done"} == {0, 1, 2, 3}


# -- the delivery worker: order per key and endpoint ---------------------------------------


def test_an_idle_worker_sends_a_keys_backlog_without_waiting_for_the_poll(fast_worker, receivers):
    """When a keyed delivery ends, the key's next one at that endpoint is claimable at once. An
    idle worker (nothing else to do) sent a key's backlog at one message per
    outbox.poll_interval until 0.5.33: the endpoint was not marked due when a key was handed on
    there (stop 56's probe: 10 messages of one key took 8 s; 4,000 over 20 keys after a
    failover went at 20 a second)."""
    db = fast_worker
    receiver = receivers()
    configure_worker({"outbox.poll_interval": "10s"})
    db.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    for n in range(10):
        enqueue(db, "booking.created", n, key="booking:1")
    # Ten polls would take 100 s; a generous bound well below one poll.
    receiver.wait_for(10, timeout=8)
    assert [json.loads(r["body"])["n"] for r in receiver.requests] == list(range(10))


def test_the_worker_delivers_each_key_in_order_to_each_endpoint_through_random_failures(fast_worker, receivers):
    db = fast_worker
    flaky, steady = receivers(), receivers()
    chance = random.Random(7)
    lock = threading.Lock()

    def sometimes_failing():
        with lock:
            failing = chance.random() < 0.3
        return (503, 0.0, {}, b"") if failing else (200, 0.0, {}, b"")

    flaky.answer_with(sometimes_failing)
    db.execute("SELECT outbox_subscribe('booking.created', %s)", (flaky.url,))
    db.execute("SELECT outbox_subscribe('booking.created', %s)", (steady.url,))
    configure_worker({"outbox.max_attempts": "50"})
    keys, per_key = 10, 15
    for n in range(per_key):
        for k in range(keys):
            db.execute(
                "SELECT outbox_enqueue('booking.created', %s::jsonb, ordering_key => %s)",
                (json.dumps({"key": k, "n": n}), f"booking:{k}"),
            )
    total = keys * per_key
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == total, timeout=60)

    assert any(r["status"] == 503 for r in flaky.requests)
    for receiver in (flaky, steady):
        arrivals = {}
        for request in sorted(receiver.requests, key=lambda r: r["received_at"]):
            if request["status"] != 200:
                continue
            body = json.loads(request["body"])
            arrivals.setdefault(body["key"], []).append(body["n"])
        for key in range(keys):
            successes = arrivals[key]
            # Each message arrives once with 2xx, in enqueue order.
            assert successes == list(range(per_key)), (key, successes)


def test_a_producers_open_transaction_on_a_key_holds_back_no_other_topic(fast_worker, receivers):
    """A producer queuing a message behind an ordering key holds the key until it commits;
    whoever hands the key's head on waits for it, to see the new message. The worker's pick-up
    handing a head to its deliveries waited so with its whole step, every endpoint's, for as long
    as the producer's transaction lasted (up to its 10 s lock_timeout, then again: stop 46's
    audit). It leaves that head for a later pick-up instead, for as long as the transaction
    lasts (longer than the worker's patience with a key producers keep committing to)."""
    db = fast_worker
    keyed, other = receivers(), receivers()
    head = enqueue(db, "booking.created", 1, "booking:42")  # nobody delivers the topic yet
    with connect() as producer:
        behind = enqueue(producer, "booking.created", 2, "booking:42")  # not committed yet
        db.execute("SELECT outbox_subscribe('booking.created', %s)", (keyed.url,))
        db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
        time.sleep(1.5)  # the worker tries to pick the head up, for longer than KEY_PATIENCE
        enqueue(db, "other.topic", 3)
        other.wait_for(1, timeout=5)
        producer.commit()
    keyed.wait_for(2, timeout=10)
    assert [json.loads(r["body"])["n"] for r in keyed.requests] == [1, 2], "in the key's order"
    # (The receiver sees a request before the worker records its answer.)
    eventually(lambda: {head, behind} <= {row[0] for row in db.execute("SELECT id FROM outbox WHERE status = 'DONE'")},
               what="both messages done")


def test_a_redelivery_not_yet_committed_holds_back_no_other_topic_and_keeps_the_keys_order(fast_worker, receivers):
    """A redelivery of a keyed message makes its delivery the key's head at the endpoint again.
    Before it committed, the worker making a newer message of that key the head there too
    waited for it with its whole step, every endpoint's, and then failed on the one-head-per-key
    index (stop 46's audit). The redelivery holds the key as a producer does, and the worker
    leaves that message for a later pick-up."""
    db = fast_worker
    keyed, other = receivers(), receivers()
    subscription = db.execute("SELECT outbox_subscribe('booking.created', %s)", (keyed.url,)).fetchone()[0]
    db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
    first = enqueue(db, "booking.created", 1, "booking:42")
    log = ServerLog()
    keyed.wait_for(1, timeout=10)
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (first,)).fetchone()[0] == "DONE")
    with connect() as operator:
        operator.execute("SELECT outbox_redeliver(%s, message_ids => ARRAY[%s]::bigint[])", (subscription, first))  # not committed yet
        enqueue(db, "booking.created", 2, "booking:42")
        time.sleep(0.5)  # the worker picks it up, or tries to
        enqueue(db, "other.topic", 3)
        other.wait_for(1, timeout=5)
        operator.commit()
    keyed.wait_for(3, timeout=10)
    assert [json.loads(r["body"])["n"] for r in keyed.requests] == [1, 1, 2], "the replay before the newer message"
    assert "delivery step failed" not in log.since()


def a_dead_keyed_message(db, keyed, n):
    """Message `n` of key booking:42, dead at `keyed`'s endpoint (subscribed to booking.created),
    which answers 200 from then on. Returns its id."""
    keyed.answer_by_default(500)
    db.execute("SELECT outbox_subscribe('booking.created', %s)", (keyed.url,))
    dead = enqueue(db, "booking.created", n, "booking:42")
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (dead,)).fetchone()[0] == "DEAD",
               what="the first message dead at its endpoint")
    keyed.answer_by_default(200)
    return dead


def test_a_requeue_not_yet_committed_holds_back_no_other_topic_and_keeps_the_keys_order(fast_worker, receivers):
    """Requeuing a dead keyed delivery makes it the key's head at the endpoint again, as a
    redelivery does. Before it committed, the worker making a newer message of that key the
    head there too waited for it with its whole step, every endpoint's, and then failed on the
    one-head-per-key index: outbox_requeue_dead did not hold the key as outbox_redeliver does."""
    db = fast_worker
    keyed, other = receivers(), receivers()
    db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
    first = a_dead_keyed_message(db, keyed, 1)
    log = ServerLog()
    with connect() as operator:
        assert operator.execute("SELECT outbox_requeue(%s::bigint)", (first,)).fetchone()[0] == 1  # not committed yet
        enqueue(db, "booking.created", 2, "booking:42")
        time.sleep(0.5)  # the worker picks it up, or tries to
        enqueue(db, "other.topic", 3)
        other.wait_for(1, timeout=5)
        while_open = log.since()
        operator.commit()
    eventually(lambda: [json.loads(r["body"])["n"] for r in keyed.requests if r["status"] == 200] == [1, 2],
               timeout=10, what="the requeued message, then the newer one")
    assert "delivery step failed" not in while_open


def test_a_requeue_that_commits_while_a_pick_up_tries_its_key_fails_no_step(fast_worker, receivers):
    """The worker's pick-up tries the ordering key's lock of each message it picks up. If an
    operator's requeue holding that key (and making the key's head) committed in the instant
    between the pick-up's snapshot and its try of the lock, the lock was free but the head was
    not in the snapshot: the new delivery became a second head and the step failed on the
    one-head-per-key index (seen once in five runs of the test above). The worker is stopped
    at its try of the lock while the requeue commits, to place the commit in that instant."""
    db = fast_worker
    keyed = receivers()
    first = a_dead_keyed_message(db, keyed, 1)
    log = ServerLog()
    with connect() as operator:
        assert operator.execute("SELECT outbox_requeue(%s::bigint)", (first,)).fetchone()[0] == 1  # not committed yet
        enqueue(db, "booking.created", 2, "booking:42")
        time.sleep(0.3)  # the worker leaves it alone, and tries again every 100 ms
        with PausedAt(worker_pid(db.info.dbname), "pg_try_advisory_xact_lock_int4") as paused:
            paused.wait()
            operator.commit()
    eventually(lambda: [json.loads(r["body"])["n"] for r in keyed.requests if r["status"] == 200] == [1, 2],
               timeout=10, what="the requeued message, then the newer one")
    assert "delivery step failed" not in log.since()


def redelivering_the_queued_message_while_the_head_is_in_flight(db, keyed):
    """Two messages of one key for `keyed`'s endpoint: the first in flight (its answer comes
    back in 1 s), the second queued behind it at the endpoint. Returns the open operator
    connection whose redelivery of the second holds its delivery, and the endpoint's id."""
    keyed.answer(200, delay=1.0)
    subscription = db.execute("SELECT outbox_subscribe('booking.created', %s)", (keyed.url,)).fetchone()[0]
    enqueue(db, "booking.created", 1, "booking:42")
    second = enqueue(db, "booking.created", 2, "booking:42")
    keyed.wait_for(1, timeout=10, started=True)
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_delivery WHERE message_id = %s", (second,)).fetchone()[0] == 1,
               what="the second message's delivery, queued behind the first")
    operator = connect()
    operator.execute("SELECT outbox_redeliver(%s, message_ids => ARRAY[%s]::bigint[])", (subscription, second))  # not committed yet
    return operator, subscription


def test_a_redelivery_not_yet_committed_holds_back_no_other_endpoint_when_the_keys_head_ends(fast_worker, receivers):
    """When a keyed delivery ends, the next one of its key at that endpoint becomes the head.
    An operator's redelivery of that next one, not yet committed, made the worker's whole step
    wait for it, every endpoint with it (stop 47's list of waits left). The worker leaves the
    key for later now, and hands it on once the redelivery commits."""
    db = fast_worker
    keyed, other = receivers(), receivers()
    db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
    log = ServerLog()
    operator, _ = redelivering_the_queued_message_while_the_head_is_in_flight(db, keyed)
    with operator:
        keyed.wait_for(1, timeout=5)  # the head's answer: the worker ends it, and the key waits
        time.sleep(0.3)
        enqueue(db, "other.topic", 3)
        other.wait_for(1, timeout=3)
        # A newer message of the key meanwhile queues behind the one held, though the key has
        # no claimable delivery at the endpoint (it became the head and went first: the
        # review of this stop's change).
        enqueue(db, "booking.created", 4, "booking:42")
        time.sleep(0.3)
        operator.commit()
    keyed.wait_for(3, timeout=5)
    assert [json.loads(r["body"])["n"] for r in keyed.requests] == [1, 2, 4]
    assert "delivery step failed" not in log.since()


def test_a_requeue_and_the_workers_hand_on_of_one_key_at_one_endpoint_make_one_head(fast_worker, receivers):
    """Both hand on a key at an endpoint where it has no claimable delivery: the worker after a
    redelivery that held the key's next delivery commits, an operator's requeue of a dead
    delivery of the key. Each made a different delivery the head; the worker's one waited for
    the requeue's commit on the one-head-per-key index, with its whole step (every endpoint's),
    and then failed (stop 48's race). Now whoever hands on a key at an endpoint holds it there
    until its commit, and the worker leaves it for later rather than wait."""
    db = fast_worker
    keyed, other = receivers(), receivers()
    db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
    dead = a_dead_keyed_message(db, keyed, 0)
    log = ServerLog()
    redelivery, _ = redelivering_the_queued_message_while_the_head_is_in_flight(db, keyed)
    with redelivery, connect() as requeue:
        eventually(lambda: 1 in [json.loads(r["body"])["n"] for r in keyed.requests], timeout=5,
                   what="the head's answer: the worker ends it, and leaves the key for the redelivery")
        time.sleep(0.3)
        # The key has no claimable delivery at the endpoint: the requeue hands it on there, once
        # the redelivery, which holds the key there too, has committed (before, at once).
        requeued = []
        requeuing = threading.Thread(target=lambda: requeued.append(
            requeue.execute("SELECT outbox_requeue(%s::bigint)", (dead,)).fetchone()[0]))
        requeuing.start()
        time.sleep(0.3)
        redelivery.commit()  # the worker hands the key on within 100 ms, or leaves it to the requeue
        requeuing.join(timeout=5)
        assert requeued == [1]
        time.sleep(0.5)
        enqueue(db, "other.topic", 3)
        other.wait_for(1, timeout=5)
        requeue.commit()
    # One of the two became the key's head at the endpoint, the other queued behind it.
    eventually(lambda: sorted(json.loads(r["body"])["n"] for r in keyed.requests if r["status"] == 200) == [0, 1, 2],
               timeout=10, what="the requeued message and the redelivered one")
    assert "delivery step failed" not in log.since()


def test_a_key_left_for_a_redelivery_is_handed_on_by_the_next_worker(fast_worker, receivers):
    """The worker leaves a key whose next delivery an open redelivery holds, to hand it on
    later. A worker that stops meanwhile forgets that: the next one, starting, hands on every
    key left with queued deliveries and none claimable at an endpoint."""
    db = fast_worker
    keyed = receivers()
    operator, subscription = redelivering_the_queued_message_while_the_head_is_in_flight(db, keyed)
    with operator:
        keyed.wait_for(1, timeout=5)
        time.sleep(0.5)  # the head ended, and its key waits for the redelivery
        pid = worker_pid(db.info.dbname)
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        eventually(lambda: worker_pid(db.info.dbname) not in (None, pid), timeout=15, what="a new worker")
        time.sleep(0.3)  # started
        operator.commit()
    keyed.wait_for(2, timeout=5)
    assert [json.loads(r["body"])["n"] for r in keyed.requests] == [1, 2]


def test_an_operators_function_waits_for_the_next_delivery_another_transaction_holds(db):
    """The worker leaves a key whose next delivery at an endpoint another transaction holds,
    and comes back to it. An operator's function that hands keys on (outbox_redeliver,
    outbox_requeue_dead, through outbox_release_delivery_keys) has no one to come back: it
    waits for that transaction, then hands the key on."""
    endpoint = db.execute("SELECT outbox_subscribe('parked.topic', 'http://127.0.0.1:9/hooks')").fetchone()[0]
    db.execute("SELECT outbox_disable_subscription(%s)", (endpoint,))  # nothing is sent to it
    head, queued = (enqueue(db, "unsubscribed.topic", n, "booking:42") for n in (1, 2))
    db.execute(
        "INSERT INTO outbox_delivery (message_id, subscription_id, ordering_key, waiting_for)"
        " VALUES (%s, %s, 'booking:42', NULL), (%s, %s, 'booking:42', 'ordering_key')",
        (head, endpoint, queued, endpoint),
    )
    released = []
    with connect() as holder:
        holder.execute("SELECT FROM outbox_delivery WHERE message_id = %s FOR UPDATE", (queued,))
        # The head ends (by hand) while the next one is held. (The worker, should it look now,
        # leaves the key for later too, and hands it on when the holder ends: either hands it on.)
        db.execute("UPDATE outbox_delivery SET status = 'DONE', processed_at = now() WHERE message_id = %s", (head,))

        def release():
            with connect() as operator:
                released.append(operator.execute("SELECT outbox_release_delivery_keys(ARRAY[%s]::bigint[], ARRAY['booking:42'])",
                                                 (endpoint,)).fetchone()[0])

        thread = threading.Thread(target=release)
        thread.start()
        time.sleep(0.5)
        assert released == [], "it waits for the transaction holding the delivery"
        holder.commit()
    thread.join(timeout=10)
    assert released in ([1], [0]), released
    assert db.execute("SELECT waiting_for FROM outbox_delivery WHERE message_id = %s", (queued,)).fetchone()[0] is None


def test_handing_on_every_key_there_is_stays_linear(db):
    """A worker starting hands on every key with deliveries queued at an endpoint and none
    claimable (test above), through the statement that hands on the keys of each step's ended
    deliveries, planned for a few. Its first form joined two lists of keys: 20,000 keys took
    140 s (stop 48, by hand)."""
    endpoint = disabled_endpoint(db, "parked.topic")
    db.execute("INSERT INTO outbox (topic, payload, ordering_key, waiting_for)"
               " SELECT 'parked.topic', '{}', 'k' || g, 'deliveries' FROM generate_series(1, 20000) g")
    db.execute("INSERT INTO outbox_delivery (message_id, subscription_id, ordering_key, waiting_for)"
               " SELECT id, %s, ordering_key, 'ordering_key' FROM outbox", (endpoint,))
    db.execute("SET statement_timeout = '10s'")
    released = db.execute("SELECT outbox_release_delivery_keys(array_agg(subscription_id), array_agg(ordering_key))"
                          " FROM outbox_delivery").fetchone()[0]
    db.execute("RESET statement_timeout")
    assert released == 20000


def producers_keep_holding(key, n, stop, enqueued, errors):
    """Starts three producers of messages `n` of `key` whose transactions overlap, each
    beginning before the last one ends, until `stop` is set: the key is held all the time.
    Their messages' ids go to `enqueued`, their SQLSTATEs, should they fail, to `errors`.
    Returns their threads."""

    def produce(offset):
        time.sleep(offset)
        try:
            with connect() as producer:
                while not stop.is_set():
                    with producer.transaction():
                        enqueued.append(enqueue(producer, "booking.created", n, key))
                        time.sleep(0.3)  # the next producer begins meanwhile
        except psycopg.Error as error:
            errors.append(error.sqlstate)

    threads = [threading.Thread(target=produce, args=(offset,)) for offset in (0, 0.1, 0.2)]
    for thread in threads:
        thread.start()
    return threads


def test_a_key_producers_keep_holding_is_handed_on_all_the_same(fast_worker, receivers):
    """The pick-up leaves alone a head whose key a producer holds. Producers whose transactions
    overlap, each beginning before the last one ends, hold the key all the time: left alone, the
    head would never be handed on while they kept at it. After a while (KEY_PATIENCE, 1 s) the
    worker waits for the key as a consumer does, and the producers that come after it wait for
    it."""
    db = fast_worker
    receiver = receivers()
    enqueue(db, "booking.created", 0, "booking:42")  # the head; nobody delivers the topic yet
    stop = threading.Event()
    enqueued, errors = [], []
    threads = producers_keep_holding("booking:42", 1, stop, enqueued, errors)
    try:
        time.sleep(0.5)  # the key held all the time from here on
        db.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
        receiver.wait_for(1, timeout=5)
        assert json.loads(receiver.requests[0]["body"])["n"] == 0, "the head first"
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    receiver.wait_for(1 + len(enqueued), timeout=20)


def test_a_producer_of_two_keys_and_the_worker_waiting_for_them_deadlock_no_one(fast_worker, receivers):
    """The pick-up waits for a key producers keep holding (KEY_PATIENCE). It waited where it met
    the key's head, oldest first, holding the keys it had got before, another such key's
    included: a producer that held the key it waited for and then enqueued with one of those
    waited for the worker while the worker waited for it, and PostgreSQL failed one of them
    with 40P01 (stop 51's review). The pick-up now waits for one such key at a time, before it
    tries any other. Producers keep holding two keys here; the worker is stopped as it begins
    to wait, while a producer of both takes the first."""
    db = fast_worker
    receiver = receivers()
    enqueue(db, "booking.created", 1, "booking:1")  # older: the pick-up meets it first
    enqueue(db, "booking.created", 2, "booking:42")
    log = ServerLog()
    stop = threading.Event()
    enqueued, errors = [], []

    def produce_both():
        try:
            with connect() as producer, producer.transaction():
                enqueue(producer, "booking.created", 3, "booking:42")
                time.sleep(0.5)
                enqueue(producer, "booking.created", 4, "booking:1")
        except psycopg.Error as error:
            errors.append(error.sqlstate)

    threads = [thread for key in ("booking:1", "booking:42") for thread in producers_keep_holding(key, 0, stop, enqueued, errors)]
    both = threading.Thread(target=produce_both)
    try:
        time.sleep(0.5)  # both keys held all the time from here on
        db.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
        time.sleep(1.5)  # both heads left alone for longer than the patience
        with PausedAt(worker_pid(db.info.dbname), waits_for_a_key()) as paused:
            paused.wait()
            both.start()
            time.sleep(0.2)  # it holds booking:42
        both.join(timeout=15)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert "deadlock detected" not in log.since()
    eventually(lambda: {json.loads(r["body"])["n"] for r in receiver.requests} >= {1, 2, 3, 4}, timeout=20,
               what="every message of both keys")


def waits_for_a_key(hash=None):
    """A gdb breakpoint at the worker's wait for a key's lock (of the key whose hashtext is
    `hash`, if given): LockAcquire of an advisory lock, exclusive, waiting. The arguments'
    registers on x86-64; LOCKTAG's locktag_type is its 15th byte, its third field the hash."""
    condition = "*(unsigned char *) ($rdi + 14) == 10 && $esi == 7 && $ecx == 0"
    if hash is not None:
        condition += f" && *(int *) ($rdi + 8) == {hash}"
    return f"LockAcquire if {condition}"


def test_a_step_that_hands_a_key_back_waits_for_no_key_producers_keep_holding(fast_worker, receivers):
    """A step hands messages left without deliveries (every endpoint unsubscribed meanwhile)
    back to their keys, holding those keys until it commits. The same step's pick-up then
    waited for a key producers keep holding (KEY_PATIENCE): a producer that held that key and
    enqueued with one handed back waited for the worker while the worker waited for it, until
    PostgreSQL failed one of them with 40P01 (stop 51's leftover). Such a step waits for no key
    now; the next one does. The worker is held where it takes the handed-back key's lock for
    longer than the patience, then stopped where it waits for the producers' key."""
    db = fast_worker
    receiver = receivers()
    held_key, handed_back = "booking:1", "booking:2"
    held_hash, handed_back_hash = db.execute("SELECT hashtext(%s), hashtext(%s)", (held_key, handed_back)).fetchone()
    enqueue(db, "booking.created", 1, held_key)
    log = ServerLog()
    stop = threading.Event()
    enqueued, errors = [], []
    threads = producers_keep_holding(held_key, 0, stop, enqueued, errors)
    try:
        time.sleep(0.5)  # the key held all the time from here on
        db.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
        db.execute("SELECT outbox_subscribe('invoice.sent', %s)", (receiver.url,))
        time.sleep(0.5)  # its head left alone
        outcome = {}

        def produce_both():
            try:
                with connect() as producer, producer.transaction():
                    enqueue(producer, "booking.created", 2, held_key)
                    outcome["id"] = enqueue(producer, "invoice.paid", 3, handed_back)
            except psycopg.Error as error:
                outcome["error"] = error.sqlstate

        both = threading.Thread(target=produce_both)
        worker = worker_pid(db.info.dbname)

        def worker_waits_for_the_key():
            return db.execute("""SELECT EXISTS (SELECT FROM pg_locks WHERE pid = %s AND locktype = 'advisory'
                                                   AND objid::int = %s AND NOT granted)""", (worker, held_hash)).fetchone()[0]

        with PausedAt(worker, waits_for_a_key(held_hash), after=waits_for_a_key(handed_back_hash), linger=1.5) as paused:
            paused.wait_until_armed()
            # Once the worker has waited for the key and handed its head on, the next head is
            # left alone from the next step, with new messages behind it at the steps after:
            # patience runs out a second later, while the worker is held where it hands the
            # other key back.
            eventually(worker_waits_for_the_key, timeout=10, interval=0.01, what="the worker waiting for the key")
            eventually(lambda: not worker_waits_for_the_key(), timeout=10, interval=0.01, what="the wait's end")
            time.sleep(0.5)
            # A message the worker took whose endpoints are all gone (as an unsubscribe leaves
            # it), and an unsubscribe, after which the worker looks for such messages.
            db.execute("""INSERT INTO outbox (topic, payload, ordering_key, status, waiting_for)
                          VALUES ('invoice.paid', '{}', %s, 'PENDING', 'deliveries')""", (handed_back,))
            db.execute("SELECT outbox_unsubscribe('invoice.sent')")
            paused.wait()
            both.start()
            time.sleep(0.3)  # the producer holds its key, and (before) then waited for the worker's
        both.join(timeout=15)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == [] and "id" in outcome, (errors, outcome)
    assert "deadlock detected" not in log.since()

