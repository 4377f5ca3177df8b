"""Fan-out done right: each endpoint's delivery of each message lives on its own (attempts,
backoff, DONE or DEAD), every HTTP attempt is logged, and an operator can replay. Against
real local receivers and the delivery worker of the test database."""

import json
import re
import threading
import time

import psycopg
import pytest

from conftest import configure_worker, connect
from support import ServerLog, disabled_endpoint, eventually, worker_pid

def enqueue(conn, topic, payload, ordering_key=None):
    return conn.execute("SELECT id, public_id::text FROM outbox_enqueue(%s, %s::jsonb, ordering_key => %s)",
                        (topic, json.dumps(payload), ordering_key)).fetchone()


def test_a_failing_endpoint_never_makes_a_healthy_one_receive_twice(fast_worker, receivers):
    db = fast_worker
    healthy, failing = receivers(), receivers()
    failing.answer_by_default(503, body=b"down for maintenance")
    healthy_id = db.execute("SELECT outbox_subscribe('booking.created', %s)", (healthy.url,)).fetchone()[0]
    failing_id = db.execute("SELECT outbox_subscribe('booking.created', %s)", (failing.url + "/b",)).fetchone()[0]
    messages = [enqueue(db, "booking.created", {"n": n}) for n in range(5)]

    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DEAD'").fetchone()[0] == 5,
               what="every message to end")
    # The healthy endpoint got each message exactly once, with its own webhook-id.
    assert sorted(r["headers"]["webhook-id"] for r in healthy.requests) == sorted(p for _, p in messages)
    # The failing one was tried outbox.max_attempts times per message, then gave up: per delivery.
    assert len(failing.requests) == 5 * 3
    states = dict(db.execute("SELECT subscription_id, array_agg(DISTINCT status::text) FROM outbox_deliveries GROUP BY 1").fetchall())
    assert states == {healthy_id: ["DONE"], failing_id: ["DEAD"]}
    dead = db.execute("SELECT attempts, last_error FROM outbox_deliveries WHERE subscription_id = %s", (failing_id,)).fetchall()
    assert dead == [(3, "HTTP 503: down for maintenance")] * 5
    # The attempt log has every request, with the answer's status.
    logged = db.execute("SELECT subscription_id, http_status, count(*) FROM outbox_delivery_attempts GROUP BY 1, 2 ORDER BY 1").fetchall()
    assert logged == [(healthy_id, 200, 5), (failing_id, 503, 15)]
    # The numbers say which endpoint is in trouble.
    assert db.execute("SELECT dead_deliveries FROM outbox_stats() WHERE topic IS NULL").fetchone()[0] == 5
    per_endpoint = dict(db.execute("SELECT subscription_id, dead FROM outbox_endpoint_stats()").fetchall())
    assert per_endpoint == {healthy_id: 0, failing_id: 5}

    # The endpoint is fixed; the operator replays its dead deliveries: same webhook-id, fresh
    # attempts, and the healthy endpoint is left alone.
    failing.answer_by_default(200)
    dead_ids = [row[0] for row in db.execute("SELECT message_id FROM outbox_deliveries WHERE status = 'DEAD' ORDER BY 1")]
    assert db.execute("SELECT outbox_redeliver(%s, message_ids => %s)", (failing_id, dead_ids)).fetchone()[0] == 5
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 5,
               what="the replayed deliveries")
    replayed = [r for r in failing.requests if r["status"] == 200]
    assert sorted(r["headers"]["webhook-id"] for r in replayed) == sorted(p for _, p in messages)
    assert all(r["headers"]["outbox-attempt"] == "1" for r in replayed)
    assert len(healthy.requests) == 5


def test_requeue_of_a_message_sent_to_several_endpoints_retries_only_the_dead_deliveries(fast_worker, receivers):
    db = fast_worker
    healthy, failing = receivers(), receivers()
    failing.answer_by_default(500)
    db.execute("SELECT outbox_subscribe('invoice.paid', %s)", (healthy.url,))
    db.execute("SELECT outbox_subscribe('invoice.paid', %s)", (failing.url,))
    message_id, _ = enqueue(db, "invoice.paid", {"invoice": 7})
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (message_id,)).fetchone()[0] == "DEAD",
               what="DEAD")
    assert "1 of 2 deliveries dead" in db.execute("SELECT last_error FROM outbox WHERE id = %s", (message_id,)).fetchone()[0]

    failing.answer_by_default(200)
    assert db.execute("SELECT outbox_requeue(%s::bigint)", (message_id,)).fetchone()[0] == 1
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (message_id,)).fetchone()[0] == "DONE",
               what="DONE after the requeue")
    assert len(healthy.requests) == 1, "the endpoint that took it does not get it again"


def test_requeue_of_a_message_whose_dead_endpoint_was_unsubscribed_settles_it(fast_worker, receivers):
    """A message dead at one endpoint and delivered at another: the first is unsubscribed (its
    dead delivery goes with it), then the message is requeued. Nothing is left to send; until
    0.5.33 the requeue counted it and left it PENDING, waiting for deliveries that never came
    (found by a code review of 0.5.32), for good or until the worker restarted."""
    db = fast_worker
    healthy, failing = receivers(), receivers()
    failing.answer_by_default(500)
    db.execute("SELECT outbox_subscribe('invoice.voided', %s)", (healthy.url,))
    db.execute("SELECT outbox_subscribe('invoice.voided', %s)", (failing.url,))
    message_id, _ = enqueue(db, "invoice.voided", {"invoice": 8})
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (message_id,)).fetchone()[0] == "DEAD",
               what="DEAD")
    db.execute("SELECT outbox_unsubscribe('invoice.voided', %s)", (failing.url,))

    assert db.execute("SELECT outbox_requeue(%s::bigint)", (message_id,)).fetchone()[0] == 0, "nothing to send again"
    assert db.execute("SELECT status::text, waiting_for FROM outbox WHERE id = %s", (message_id,)).fetchone() == ("DONE", None)
    assert db.execute("SELECT count(*) FROM outbox_dead_letters").fetchone()[0] == 0
    time.sleep(0.5)
    assert len(healthy.requests) == 1, "the endpoint that took it does not get it again"


def test_replay_since_a_time_and_catching_a_new_endpoint_up_only_when_asked(fast_worker, receivers):
    db = fast_worker
    first = receivers()
    db.execute("SELECT outbox_subscribe('order.shipped', %s)", (first.url,))
    early = [enqueue(db, "order.shipped", {"n": n}) for n in range(3)]
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 3, what="delivered")
    time.sleep(0.05)
    since = db.execute("SELECT clock_timestamp()").fetchone()[0]
    late = [enqueue(db, "order.shipped", {"n": n}) for n in range(3, 5)]
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 5, what="delivered")

    # A new endpoint gets new messages, and the older ones only when asked.
    second = receivers()
    second_id = db.execute("SELECT outbox_subscribe('order.shipped', %s)", (second.url,)).fetchone()[0]
    newest = enqueue(db, "order.shipped", {"n": 5})
    second.wait_for(1)
    time.sleep(1)
    assert [r["headers"]["webhook-id"] for r in second.requests] == [newest[1]]

    assert db.execute("SELECT outbox_redeliver(%s, since => %s)", (second_id, since)).fetchone()[0] == 3
    second.wait_for(4)
    assert {r["headers"]["webhook-id"] for r in second.requests} == {p for _, p in late} | {newest[1]}

    assert db.execute("SELECT outbox_redeliver(%s)", (second_id,)).fetchone()[0] == 6
    second.wait_for(10)
    assert {r["headers"]["webhook-id"] for r in second.requests} == {p for _, p in early + late + [newest]}
    assert len(first.requests) == 6, "the first endpoint was not replayed to"


@pytest.mark.parametrize("call,sqlstate,words", [
    ("outbox_redeliver(NULL)", "22004", "subscription_id must not be NULL"),
    ("outbox_redeliver(424242)", "22023", "subscription_id 424242 is not a subscription"),
])
def test_redeliver_refuses_bad_input(db, call, sqlstate, words):
    with pytest.raises(psycopg.Error) as caught:
        db.execute(f"SELECT {call}")
    assert caught.value.sqlstate == sqlstate
    assert words in caught.value.diag.message_primary


def test_the_attempt_log_is_purged_with_the_history(fast_worker, receivers):
    db = fast_worker
    receiver = receivers()
    db.execute("SELECT outbox_subscribe('a.b', %s)", (receiver.url,))
    message_id, _ = enqueue(db, "a.b", {})
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (message_id,)).fetchone()[0] == "DONE", what="DONE")
    assert db.execute("SELECT count(*) FROM outbox_delivery_attempts").fetchone()[0] == 1
    # (Backdated, as if the retention had passed.)
    db.execute("UPDATE outbox SET processed_at = processed_at - interval '2 days'")
    db.execute("UPDATE outbox_delivery_attempt SET started_at = started_at - interval '2 days'")
    # The message; the attempt log's day is emptied whole, which the count leaves out.
    assert db.execute("SELECT outbox_purge('1 day')").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM outbox_delivery_attempt").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM outbox_delivery").fetchone()[0] == 0, "deliveries go with their message"


def test_unsubscribing_an_endpoint_that_has_not_taken_a_message_lets_the_message_end(fast_worker, receivers):
    """A message waits for all its deliveries; when an endpoint is unsubscribed, its deliveries
    go with it, and the message ends with the others (or, with none left, is no longer the
    worker's: a new subscription or a SQL consumer takes it)."""
    db = fast_worker
    healthy, parked = receivers(), receivers()
    db.execute("SELECT outbox_subscribe('booking.created', %s)", (healthy.url,))
    db.execute("SELECT outbox_subscribe('booking.created', %s, enabled => false)", (parked.url,))
    db.execute("SELECT outbox_subscribe('invoice.paid', %s, enabled => false)", (parked.url + "/i",))
    first, _ = enqueue(db, "booking.created", {"n": 1})
    second, _ = enqueue(db, "invoice.paid", {"n": 2})
    healthy.wait_for(1)
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_delivery WHERE status = 'PENDING'").fetchone()[0] == 2)
    assert db.execute("SELECT status FROM outbox WHERE id = %s", (first,)).fetchone()[0] == "PENDING"

    db.execute("SELECT outbox_unsubscribe('booking.created', %s)", (parked.url,))
    db.execute("SELECT outbox_unsubscribe('invoice.paid')")
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (first,)).fetchone()[0] == "DONE",
               what="the message to end with its remaining delivery")
    eventually(lambda: db.execute("SELECT waiting_for IS NULL FROM outbox WHERE id = %s", (second,)).fetchone()[0],
               what="the message without endpoints to be free again")
    assert [row[0] for row in db.execute("SELECT id FROM outbox_claim(10)")] == [second]
    assert parked.requests == []


def test_an_unsubscribe_in_replica_mode_takes_the_deliveries_with_it(db):
    """Its deliveries go by the foreign key's cascade, which session_replication_role = replica
    (a superuser's session, as pg_restore --disable-triggers or a replication tool sets it)
    skips: until 0.5.33 they stayed, their subscription gone, and their messages waited for
    them for good (stop 56's probe)."""
    endpoint = disabled_endpoint(db, "replica.topic")
    with db.transaction():  # (else the worker may find the message without its delivery and make it)
        db.execute("INSERT INTO outbox (topic, payload, waiting_for) VALUES ('replica.topic', '{}', 'deliveries')")
        db.execute("INSERT INTO outbox_delivery (message_id, subscription_id) SELECT id, %s FROM outbox", (endpoint,))
    db.execute("SET session_replication_role = replica")
    try:
        assert db.execute("SELECT outbox_unsubscribe('replica.topic')").fetchone()[0] == 1
    finally:
        db.execute("RESET session_replication_role")
    assert db.execute("SELECT count(*) FROM outbox_delivery").fetchone()[0] == 0


def test_unsubscribing_an_endpoint_in_the_middle_of_a_backlog_never_deadlocks_with_the_worker(fast_worker, receivers):
    """outbox_unsubscribe removes the subscription, then its deliveries. A worker's step records
    answers (locking the endpoint's deliveries), then makes deliveries of newer messages (whose
    foreign key waits for the subscription): the other order. Unsubscribing during a backlog
    ended in a deadlock, and PostgreSQL failed the unsubscribe or the worker's step (40P01;
    found by stop 42's probe)."""
    db = fast_worker
    log = ServerLog()
    staying = receivers()
    db.execute("SELECT outbox_subscribe('load.test', %s)", (staying.url,))
    producing = threading.Event()
    producing.set()

    def produce():  # messages keep coming, so every step makes deliveries
        with connect(autocommit=True) as producer:
            while producing.is_set():
                producer.execute("SELECT count(*) FROM outbox_enqueue_batch('load.test', "
                                 "ARRAY(SELECT jsonb_build_object('n', n) FROM generate_series(1, 20) n))")
                time.sleep(0.01)

    producer = threading.Thread(target=produce)
    producer.start()
    db.execute("SET lock_timeout = '7s'")
    try:
        for _ in range(80):
            leaving = receivers()
            db.execute("SELECT outbox_subscribe('load.test', %s)", (leaving.url,))
            leaving.wait_for(20)  # its answers are being recorded, its deliveries made
            db.execute("SELECT outbox_unsubscribe('load.test', %s)", (leaving.url,))  # no 40P01
            assert db.execute("SELECT count(*) FROM outbox_subscription WHERE url = %s", (leaving.url,)).fetchone()[0] == 0
    finally:
        producing.clear()
        producer.join()
    failures = log.since()
    assert "deadlock detected" not in failures, "the worker's step failed in a deadlock"
    # Nor did a pick-up make a delivery for an endpoint removed meanwhile (its foreign key then
    # failed the whole step with 23503, retried after a back-off: stop 43's probe).
    assert "a delivery step failed" not in failures
    # Its brief waits were its own: the caller's setting is as it was.
    assert db.execute("SHOW lock_timeout").fetchone()[0] == "7s"


def test_an_endpoint_replaced_in_one_transaction_misses_no_message(fast_worker, receivers):
    """Unsubscribed and subscribed again in one transaction, an endpoint never stops being
    subscribed for anyone else: every message enqueued meanwhile reaches it. A pick-up that
    locked the subscriptions (to leave out one removed meanwhile) skipped the old row and could
    not see the new one: a message went to the other endpoint only (stop 43's second probe)."""
    db = fast_worker
    replaced, other = receivers(), receivers()
    db.execute("SELECT outbox_subscribe('replaced.topic', %s)", (replaced.url,))
    db.execute("SELECT outbox_subscribe('replaced.topic', %s)", (other.url,))
    with connect() as operator:
        operator.execute("SELECT outbox_unsubscribe('replaced.topic', %s)", (replaced.url,))
        operator.execute("SELECT outbox_subscribe('replaced.topic', %s)", (replaced.url,))
        messages = []
        for n in range(5):
            messages.append(enqueue(db, "replaced.topic", {"n": n})[1])
            time.sleep(0.2)  # the worker picks each up while the operator's transaction is open
        operator.commit()
    other.wait_for(5)
    replaced.wait_for(5)
    assert sorted(r["headers"]["webhook-id"] for r in replaced.requests) == sorted(messages)


def test_an_unsubscribe_not_yet_committed_holds_back_no_other_topic(fast_worker, receivers):
    """While an operator's unsubscribe is open, the worker leaves the messages of that topic for
    later and goes on with the others. Its pick-up made their deliveries in the same statement,
    whose foreign key waited for the removed subscription: every topic waited for the
    operator's commit, and the step then failed with 23503 (stop 43's second probe)."""
    db = fast_worker
    log = ServerLog()
    leaving, staying = receivers(), receivers()
    db.execute("SELECT outbox_subscribe('leaving.topic', %s)", (leaving.url,))
    db.execute("SELECT outbox_subscribe('staying.topic', %s)", (staying.url,))
    with connect() as operator:
        operator.execute("SELECT outbox_unsubscribe('leaving.topic')")  # not committed yet
        left, _ = enqueue(db, "leaving.topic", {"n": 1})
        time.sleep(0.3)  # the worker has picked it up, or tried
        enqueue(db, "staying.topic", {"n": 2})
        staying.wait_for(1, timeout=5)
        operator.commit()
    time.sleep(1)
    assert leaving.requests == []
    # The unsubscribed topic's message waits for a consumer (or a subscription), untouched.
    assert db.execute("SELECT status::text, waiting_for FROM outbox WHERE id = %s", (left,)).fetchone() == ("PENDING", None)
    assert "a delivery step failed" not in log.since()


def test_an_unsubscribe_not_yet_committed_with_requests_in_flight_holds_back_no_other_topic(fast_worker, receivers):
    """The answers of an endpoint being unsubscribed are recorded on deliveries that the
    operator's open transaction is deleting. The worker waited for those rows, and every topic
    with it, until the commit or its 10 s lock_timeout (stop 44's probe). It now leaves those
    answers for a later step and goes on."""
    db = fast_worker
    log = ServerLog()
    leaving, staying = receivers(), receivers()
    leaving.answer_by_default(200, delay=0.5)
    db.execute("SELECT outbox_subscribe('leaving.topic', %s)", (leaving.url,))
    db.execute("SELECT outbox_subscribe('staying.topic', %s)", (staying.url,))
    for n in range(4):
        enqueue(db, "leaving.topic", {"n": n})
    leaving.wait_for(4, timeout=5, started=True)  # in flight: their answers come back in 0.5 s
    with connect() as operator:
        operator.execute("SELECT outbox_unsubscribe('leaving.topic')")  # not committed yet
        time.sleep(1)  # the answers are back, and wait to be recorded
        enqueue(db, "staying.topic", {"n": 5})
        staying.wait_for(1, timeout=5)
        operator.commit()
    let_go = r"(\d+) answer\(s\) came back for deliveries that no longer waited for them"
    eventually(lambda: sum(int(n) for n in re.findall(let_go, log.since())) == 4,
               what="the answers of the unsubscribed endpoint to be let go")
    assert db.execute("SELECT count(*) FROM outbox_delivery").fetchone()[0] == 1  # staying.topic's
    assert "a delivery step failed" not in log.since()


def test_a_redelivery_not_yet_committed_holds_back_no_other_endpoints_answers(fast_worker, receivers):
    """A redelivery to one endpoint locks the messages of its topic still in flight to others.
    Recording another endpoint's answers to those messages waited for the redelivery's commit,
    and every topic with it. They are now left for a later step, and recorded after it."""
    db = fast_worker
    log = ServerLog()
    first, slow, other = receivers(), receivers(), receivers()
    slow.answer_by_default(200, delay=0.5)
    first_id = db.execute("SELECT outbox_subscribe('shared.topic', %s)", (first.url,)).fetchone()[0]
    slow_id = db.execute("SELECT outbox_subscribe('shared.topic', %s)", (slow.url,)).fetchone()[0]
    db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
    for n in range(4):
        enqueue(db, "shared.topic", {"n": n})
    first.wait_for(4, timeout=5)
    slow.wait_for(4, timeout=5, started=True)  # in flight: their answers come back in 0.5 s
    with connect() as operator:
        assert operator.execute("SELECT outbox_redeliver(%s)", (first_id,)).fetchone()[0] == 4  # not committed yet
        time.sleep(1)  # the slow answers are back, and wait to be recorded
        enqueue(db, "other.topic", {"n": 5})
        other.wait_for(1, timeout=5)
        operator.commit()
    first.wait_for(8, timeout=5)
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_delivery WHERE subscription_id = %s AND status = 'DONE'",
                                  (slow_id,)).fetchone()[0] == 4, what="the slow endpoint's answers recorded")
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 5,
               what="every message DONE")
    assert "a delivery step failed" not in log.since()


def test_a_worker_starts_while_a_redelivery_holds_a_delivery_its_predecessor_leased(fast_worker, receivers):
    """A worker starting makes its predecessor's leased deliveries due again. One that an open
    redelivery held made the start wait for it (10 s of lock_timeout, every endpoint with it, and
    then gave up releasing any). It is left to the redelivery now."""
    db = fast_worker
    log = ServerLog()
    slow, other = receivers(), receivers()
    slow.answer_by_default(200, delay=0.5)
    slow_id = db.execute("SELECT outbox_subscribe('shared.topic', %s)", (slow.url,)).fetchone()[0]
    db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
    enqueue(db, "shared.topic", {"n": 1})
    slow.wait_for(1, timeout=5, started=True)  # in flight
    with connect() as operator:
        assert operator.execute("SELECT outbox_redeliver(%s)", (slow_id,)).fetchone()[0] == 1  # not committed yet
        pid = worker_pid(db.info.dbname)
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))  # its answer waits for the redelivery: left leased
        eventually(lambda: worker_pid(db.info.dbname) not in (None, pid), timeout=15, what="a new worker")
        enqueue(db, "other.topic", {"n": 2})
        other.wait_for(1, timeout=5)
        operator.commit()
    slow.wait_for(2, timeout=5)
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 2,
               what="every message DONE")
    assert "a delivery step failed" not in log.since()


def test_a_message_an_unsubscribe_leaves_without_deliveries_waits_for_an_open_redelivery(fast_worker, receivers):
    """A message whose every endpoint is unsubscribed is no longer the worker's: it is let go,
    PENDING for whoever comes next. One that a redelivery to a newer endpoint holds, not yet
    committed (adding its delivery there), made the worker wait for that transaction, every
    endpoint with it, and then let the message go beside its new delivery (stop 47's list of
    waits left). The worker leaves it until the redelivery ends now."""
    db = fast_worker
    newer, other = receivers(), receivers()
    disabled_endpoint(db, "shared.topic")  # the message's only endpoint: its delivery is parked
    db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
    message, _ = enqueue(db, "shared.topic", {"n": 1})
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_delivery WHERE message_id = %s", (message,)).fetchone()[0] == 1,
               what="its delivery, parked")
    newer_id = db.execute("SELECT outbox_subscribe('shared.topic', %s)", (newer.url,)).fetchone()[0]
    log = ServerLog()
    with connect() as operator:
        redelivered = operator.execute("SELECT outbox_redeliver(%s, message_ids => ARRAY[%s]::bigint[])", (newer_id, message))
        assert redelivered.fetchone()[0] == 1  # not committed yet
        db.execute("SELECT outbox_unsubscribe('shared.topic', 'http://127.0.0.1:9/')")
        time.sleep(0.5)  # the worker reads the subscriptions again, and finds the message without a delivery
        enqueue(db, "other.topic", {"n": 2})
        other.wait_for(1, timeout=3)
        operator.commit()
    newer.wait_for(1, timeout=5)
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (message,)).fetchone()[0] == "DONE",
               what="the message DONE with its delivery")
    assert "a delivery step failed" not in log.since()


@pytest.mark.parametrize("operator_ends_with", ["commit", "rollback"])
def test_a_paused_worker_hands_back_what_it_can_while_an_unsubscribe_is_open(fast_worker, receivers, operator_ends_with):
    """Paused (outbox.worker_enabled = off), the worker hands back what it leased ahead and did
    not send. An endpoint being unsubscribed, not yet committed: handing back its deliveries
    waited for the unsubscribe, and with it the recording of every other endpoint's answers.
    Rolled back, its deliveries are handed back then, their attempts not counted."""
    db = fast_worker
    leaving, staying = receivers(), receivers()
    leaving.answer_by_default(200, delay=1.0)
    staying.answer_by_default(200, delay=1.0)
    leaving_id = db.execute("SELECT outbox_subscribe('leaving.topic', %s, max_in_flight => 1)", (leaving.url,)).fetchone()[0]
    db.execute("SELECT outbox_subscribe('staying.topic', %s)", (staying.url,))
    for n in range(6):
        enqueue(db, "leaving.topic", {"n": n})
    leaving.wait_for(1, timeout=5, started=True)
    leased_ahead = "SELECT count(*) FROM outbox_delivery WHERE subscription_id = %s AND leased AND attempts = 1"
    # Leased ahead: one request in flight, the others queued in the worker.
    eventually(lambda: db.execute(leased_ahead, (leaving_id,)).fetchone()[0] >= 2, what="deliveries leased ahead")
    staying_message, _ = enqueue(db, "staying.topic", {"n": 6})
    staying.wait_for(1, timeout=5, started=True)
    try:
        with connect() as operator:
            operator.execute("SELECT outbox_unsubscribe('leaving.topic')")  # not committed yet
            configure_worker({"outbox.worker_enabled": "off"})  # hands back what is queued
            eventually(lambda: db.execute("SELECT status::text FROM outbox WHERE id = %s", (staying_message,)).fetchone()[0] == "DONE",
                       timeout=5, what="the other endpoint's answer recorded")
            getattr(operator, operator_ends_with)()
        if operator_ends_with == "rollback":
            eventually(lambda: db.execute(leased_ahead, (leaving_id,)).fetchone()[0] == 0, timeout=5,
                       what="the deliveries leased ahead handed back")
            left = db.execute("SELECT count(*) FILTER (WHERE attempts = 0 AND NOT leased), count(*) FROM outbox_delivery"
                              " WHERE subscription_id = %s AND status = 'PENDING'", (leaving_id,)).fetchone()
            assert left[0] == left[1] >= 1, f"{left[0]} of {left[1]} pending deliveries due again with no attempt counted"
    finally:
        configure_worker({"outbox.worker_enabled": "on"})


def test_unsubscribing_gives_up_when_the_callers_lock_timeout_runs_out(db, receivers):
    """The brief waits and tries of outbox_unsubscribe stay within the caller's lock_timeout:
    with 300 ms, it fails like any statement would. It went on trying for 13 s (stop 43's
    probe)."""
    subscription = db.execute("SELECT outbox_subscribe('held.topic', %s)", (receivers().url,)).fetchone()[0]
    with connect() as holder:
        holder.execute("SELECT FROM outbox_subscription WHERE id = %s FOR UPDATE", (subscription,))
        db.execute("SET lock_timeout = '300ms'")
        started = time.monotonic()
        with pytest.raises(psycopg.errors.LockNotAvailable):
            db.execute("SELECT outbox_unsubscribe('held.topic')")
        waited = time.monotonic() - started
    assert waited < 3, f"it waited {waited:.1f} s"
    assert db.execute("SHOW lock_timeout").fetchone()[0] == "300ms"
    assert db.execute("SELECT count(*) FROM outbox_subscription").fetchone()[0] == 1


def test_an_operators_open_transaction_on_an_endpoint_holds_back_none_of_its_deliveries(fast_worker, receivers):
    """outbox_rotate_secret, outbox_disable_subscription and outbox_enable_subscription lock
    the subscription as an update does (FOR NO KEY UPDATE), which leaves the worker's new
    deliveries of it free to go. FOR UPDATE held every new message of the topic back until
    the operator's transaction ended, and the worker's step failed after its 10 s lock_timeout
    (or in a deadlock, when the operator went on to wait for the worker: stop 43's probe)."""
    db = fast_worker
    receiver = receivers()
    subscription = db.execute("SELECT outbox_subscribe('rotating.topic', %s)", (receiver.url,)).fetchone()[0]
    with connect() as operator:
        operator.execute("SELECT outbox_rotate_secret(%s)", (subscription,))  # not committed yet
        enqueue(db, "rotating.topic", {"n": 1})
        receiver.wait_for(1, timeout=5)
        operator.rollback()


def test_messages_an_unsubscribed_endpoint_leaves_come_before_newer_ones_of_their_key(fast_worker, receivers):
    """Handing messages to the worker lets the next message of their key become the head. Left
    without any delivery by an unsubscribe, they went back behind their key, now led by a newer
    message: a consumer claimed s=3 before s=1 and s=2 (found by stop 40's probe). The newer
    head, which nobody holds, steps back behind them."""
    db = fast_worker
    parked = receivers()
    db.execute("SELECT outbox_subscribe('m.t', %s, enabled => false)", (parked.url,))
    first, _ = enqueue(db, "m.t", {"s": 1}, ordering_key="MK")
    second, _ = enqueue(db, "m.t", {"s": 2}, ordering_key="MK")
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE waiting_for = 'deliveries'").fetchone()[0] == 2,
               what="both messages handed to the worker")
    with db.transaction():
        db.execute("SELECT outbox_unsubscribe('m.t')")
        third, _ = enqueue(db, "m.t", {"s": 3}, ordering_key="MK")
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE waiting_for = 'deliveries'").fetchone()[0] == 0,
               what="the messages back from the worker")
    claimed = []
    for _ in range(3):
        [(id, payload)] = db.execute("SELECT id, payload FROM outbox_claim(10, ARRAY['m.t'], lease => NULL)").fetchall()
        claimed.append(payload["s"])
        db.execute("SELECT outbox_complete(%s::bigint)", (id,))
    assert claimed == [1, 2, 3]
    assert parked.requests == []


def test_recording_an_answer_neither_waits_for_nor_deadlocks_with_a_redelivery(fast_worker, receivers):
    """outbox_redeliver locks the messages, then their deliveries. The worker recording an
    answer took the delivery first and deadlocked with it; then it waited for the message, and
    its whole step with it, every endpoint's (until 0.5.22). It now leaves the answer for a
    later step and records it after the commit. Meanwhile the delivery's lease runs out: it is
    not sent again, and the worker waits for no lock when it claims it."""
    db = fast_worker
    log = ServerLog()
    receiver = receivers()
    receiver.answer(200, delay=1.0)  # the answer comes back while the operator holds the message
    subscription = db.execute("SELECT outbox_subscribe('order.paid', %s)", (receiver.url,)).fetchone()[0]
    message_id, _ = enqueue(db, "order.paid", {"n": 1})
    receiver.wait_for(1, started=True)
    worker_waits = ("SELECT count(*) FROM pg_stat_activity"
                    " WHERE backend_type = 'outbox_ext delivery worker' AND wait_event_type = 'Lock'")
    with connect() as operator:
        with operator.transaction():
            # As outbox_redeliver does: the messages first...
            operator.execute("SELECT FROM outbox WHERE id = %s FOR UPDATE", (message_id,))
            receiver.wait_for(1)
            time.sleep(8)  # past the delivery's lease: outbox.http_timeout (2 s) + 5 s
            assert db.execute(worker_waits).fetchone()[0] == 0, "the worker waits for the operator"
            # ...then its delivery (no deadlock: this does not wait for the worker).
            operator.execute("SET LOCAL lock_timeout = '5s'")
            operator.execute("UPDATE outbox_delivery SET last_error = 'seen by the operator' WHERE message_id = %s AND subscription_id = %s",
                             (message_id, subscription))
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (message_id,)).fetchone()[0] == "DONE", what="DONE")
    assert len(receiver.requests) == 1, "sent again while its answer waited"
    assert "deadlock detected" not in log.since(), "the worker's step failed in a deadlock"
    assert "a delivery step failed" not in log.since()


def test_a_message_an_operator_holds_is_settled_after_its_commit_holding_back_no_other_topic(fast_worker, receivers):
    """A delivery out of attempts found at a claim is dead-lettered, and its message settled.
    Settling waited for an operator's transaction holding the message (a redelivery), and the
    worker's whole step with it. It now settles that message after the commit."""
    db = fast_worker
    log = ServerLog()
    parked, other = receivers(), receivers()
    endpoint = db.execute("SELECT outbox_subscribe('parked.topic', %s)", (parked.url,)).fetchone()[0]
    db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
    db.execute("SELECT outbox_disable_subscription(%s)", (endpoint,))
    message_id = db.execute("INSERT INTO outbox (topic, payload, waiting_for) VALUES ('parked.topic', '{}', 'deliveries') RETURNING id").fetchone()[0]
    # Out of attempts (outbox.max_attempts = 3), as after leases that ran out.
    db.execute("INSERT INTO outbox_delivery (message_id, subscription_id, attempts) VALUES (%s, %s, 3)", (message_id, endpoint))
    with connect() as operator:
        operator.execute("SELECT FROM outbox WHERE id = %s FOR UPDATE", (message_id,))  # as outbox_redeliver does
        db.execute("SELECT outbox_enable_subscription(%s)", (endpoint,))
        eventually(lambda: db.execute("SELECT status::text FROM outbox_delivery WHERE message_id = %s", (message_id,)).fetchone()[0] == "DEAD",
                   what="the delivery dead-lettered")
        enqueue(db, "other.topic", {"n": 1})
        other.wait_for(1, timeout=5)
        assert db.execute("SELECT status::text FROM outbox WHERE id = %s", (message_id,)).fetchone()[0] == "PENDING"
        operator.commit()
    eventually(lambda: db.execute("SELECT status::text FROM outbox WHERE id = %s", (message_id,)).fetchone()[0] == "DEAD",
               what="the message settled")
    assert parked.requests == []
    assert "a delivery step failed" not in log.since()


def test_a_delivery_dead_lettered_after_the_limit_was_lowered_says_so(fast_worker, receivers):
    """A delivery found out of attempts at a claim either lost its last attempt's outcome (the
    worker stopped during the request) or saw outbox.max_attempts lowered below its attempts.
    Until 0.5.33 the dead letter asked "did the delivery worker crash?" in both cases: an operator
    who had lowered the limit was sent looking for a crash. The attempt log tells them apart."""
    db = fast_worker
    receiver = receivers()
    endpoint = db.execute("SELECT outbox_subscribe('lowered.topic', %s)", (receiver.url,)).fetchone()[0]
    db.execute("SELECT outbox_disable_subscription(%s)", (endpoint,))
    # (In one transaction: else the worker may find a message without its delivery and make it.)
    with db.transaction():
        answered, unanswered = (
            db.execute("INSERT INTO outbox (topic, payload, waiting_for) VALUES ('lowered.topic', '{}', 'deliveries') RETURNING id").fetchone()[0]
            for _ in range(2)
        )
        # Both out of attempts (outbox.max_attempts = 3): the first answered 500 three times...
        db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, attempts, last_error)
                      VALUES (%s, %s, 3, 'HTTP 500'), (%s, %s, 3, 'HTTP 500')""", (answered, endpoint, unanswered, endpoint))
        db.execute("""INSERT INTO outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration, http_status)
                      SELECT %s, %s, attempt, now() - (4 - attempt) * interval '1 minute', '10ms', 500 FROM generate_series(1, 3) attempt""", (answered, endpoint))
        # ...the second answered twice, and its third request got no outcome (its earlier round, before
        # a redelivery started its attempts again, had a third one answered).
        db.execute("""INSERT INTO outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration, http_status)
                      SELECT %s, %s, attempt, now() - (4 - attempt) * interval '1 minute' - round * interval '1 hour', '10ms', 500
                        FROM generate_series(1, 3) attempt, generate_series(0, 1) round
                       WHERE round = 1 OR attempt < 3""", (unanswered, endpoint))
    db.execute("SELECT outbox_enable_subscription(%s)", (endpoint,))
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_delivery WHERE subscription_id = %s AND status = 'DEAD'", (endpoint,)).fetchone()[0] == 2,
               what="both dead-lettered")
    reason = dict(db.execute("SELECT message_id, last_error FROM outbox_delivery WHERE subscription_id = %s", (endpoint,)).fetchall())
    assert reason[answered] == "attempts (3) reached outbox.max_attempts (3); last error: HTTP 500"
    assert reason[unanswered].startswith("lease expired without an outcome after 3 attempts (did the delivery worker crash?)"), reason
    assert receiver.requests == []


def test_a_worker_on_tables_never_analyzed_looks_up_orphaned_messages_by_key(fast_worker, receivers):
    """A worker starting looks for messages whose deliveries were all removed while it was away.
    On tables never analyzed (a restore, a pg_upgrade), its plan read all of outbox_delivery
    once per waiting message: 50 s at 50,000 restored messages, the worker deaf to everything
    meanwhile (found by stop 39's probe). It looks each message up by key."""
    db = fast_worker
    receiver = receivers()
    db.execute("SELECT outbox_subscribe('fresh.topic', %s)", (receiver.url,))
    for table in ("outbox", "outbox_delivery"):  # as restored, before autovacuum analyzes them
        db.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    parked = disabled_endpoint(db, "restored.topic")
    db.execute("""INSERT INTO outbox (topic, payload, waiting_for)
                  SELECT 'restored.topic', '{}', 'deliveries' FROM generate_series(1, 50000)""")
    db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status)
                  SELECT id, %s, 'PENDING' FROM ONLY outbox""", (parked,))
    pid = worker_pid(db.info.dbname)
    started = time.monotonic()
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))  # the next one starts on these tables
    eventually(lambda: worker_pid(db.info.dbname) not in (None, pid), what="a new worker")
    enqueue(db, "fresh.topic", {})
    receiver.wait_for(1, timeout=90)
    waited = time.monotonic() - started
    assert waited < 20, f"the new worker delivered its first message after {waited:.0f} s"
