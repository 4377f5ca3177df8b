"""Endpoints that protect themselves and their receivers (docs/worker.md): the circuit breaker
with parking, rate limits, secret rotation, the SSRF guard and per-message headers. End to end,
with real local receivers and the delivery worker of the test database."""

import itertools
import json
import socket
import time

import psycopg
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from conftest import configure_worker, connect, reset_worker_settings
from support import ServerLog, eventually, worker_pid

FAST = {
    "outbox.backoff_base": "100ms",
    "outbox.backoff_max": "300ms",
    "outbox.backoff_jitter": "0",
    "outbox.max_attempts": "1000",
    "outbox.http_timeout": "1s",
    "outbox.poll_interval": "200ms",
    "outbox.max_in_flight": "8",
}


@pytest.fixture()
def worker(db):
    configure_worker(FAST)
    yield db
    reset_worker_settings()


def enqueue_many(conn, count, topic="booking.created", headers=None):
    conn.execute(
        "SELECT count(*) FROM (SELECT outbox_enqueue(%s, jsonb_build_object('n', n), headers => %s::jsonb) FROM generate_series(1, %s) n) e",
        (topic, json.dumps(headers) if headers else None, count),
    )


def done(conn):
    return conn.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0]


# -- 1. circuit breaker and parking ----------------------------------------------------------


def test_a_receiver_that_is_down_is_probed_one_request_at_a_time_then_disabled_and_its_deliveries_parked(worker, receivers):
    db = worker
    configure_worker({"outbox.endpoint_disable_after": "3s"})
    down, healthy = receivers(), receivers()
    down.answer_by_default(503, delay=0.05, body=b"maintenance")
    since_start = ServerLog()
    # (A token in its query, as many endpoints take one: the server log does not show it.)
    down_id = db.execute("SELECT outbox_subscribe('booking.created', %s)", (down.url + "?token=s3cr3t",)).fetchone()[0]
    db.execute("SELECT outbox_subscribe('booking.created', %s)", (healthy.url,))
    enqueue_many(db, 20)

    # The healthy endpoint is not held back by the failing one.
    healthy.wait_for(20, timeout=15)
    # Once its first answers failed, the down endpoint gets one request at a time.
    down.wait_for(8, timeout=15)
    # (Requests sent before its first failure was known may still be in hand: the count starts
    # once they are answered.)
    eventually(lambda: down.concurrent <= 1, timeout=10, what="the requests sent before the failures to be answered")
    down.reset_concurrency()
    down.wait_for(len(down.requests) + 10, timeout=15)
    assert down.max_concurrent == 1, f"{down.max_concurrent} requests at once to a failing endpoint"

    # Failing for outbox.endpoint_disable_after: disabled, with a reason and a WARNING.
    enabled, reason = eventually(
        lambda: (row := db.execute("SELECT enabled, disabled_reason FROM outbox_subscriptions WHERE id = %s", (down_id,)).fetchone())
        and not row[0] and row,
        timeout=20,
        what="the failing endpoint to be disabled",
    )
    assert "every attempt failed since" in reason and "HTTP 503: maintenance" in reason, reason
    # Named by its origin, as in a dead message's last_error (until 0.5.34 the whole URL: stop
    # 57's probe of the docs).
    log = since_start.since()
    assert f"subscription {down_id} of \"booking.created\" to {down.url.removesuffix('/hooks')} disabled" in log
    assert "s3cr3t" not in log

    # Parked: kept, not attempted, not dead-lettered; new messages get a parked delivery too.
    time.sleep(0.5)  # answers in flight when it was disabled are recorded
    attempts = db.execute("SELECT sum(attempts) FROM outbox_delivery WHERE subscription_id = %s", (down_id,)).fetchone()[0]
    requests = len(down.requests)
    enqueue_many(db, 1)
    healthy.wait_for(21, timeout=10)
    time.sleep(1.5)
    assert len(down.requests) == requests, "a disabled endpoint got requests"
    parked = db.execute(
        "SELECT count(*), sum(attempts) FROM outbox_delivery WHERE subscription_id = %s AND status = 'PENDING'", (down_id,)
    ).fetchone()
    assert parked == (21, attempts)
    assert db.execute("SELECT count(*) FROM outbox WHERE status = 'DEAD'").fetchone()[0] == 0
    total = db.execute("SELECT disabled_endpoints, parked_deliveries FROM outbox_monitoring WHERE topic IS NULL").fetchone()
    assert total == (1, 21)

    # Enabled again (the receiver is back): every parked delivery goes, and the messages end.
    down.answer_by_default(200)
    assert db.execute("SELECT outbox_enable_subscription(%s)", (down_id,)).fetchone()[0] is True
    assert db.execute("SELECT outbox_enable_subscription(%s)", (down_id,)).fetchone()[0] is False
    eventually(lambda: done(db) == 21, timeout=20, what="all 21 messages DONE")
    delivered = {r["headers"]["webhook-id"] for r in down.requests if r["status"] == 200}
    assert len(delivered) == 21
    assert db.execute("SELECT disabled_endpoints, parked_deliveries FROM outbox_stats() WHERE topic IS NULL").fetchone() == (0, 0)


def test_disabling_by_hand_parks_and_enabling_resumes(worker, receivers):
    db = worker
    receiver = receivers()
    subscription = db.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,)).fetchone()[0]
    assert db.execute("SELECT outbox_disable_subscription(%s, 'receiver migrating')", (subscription,)).fetchone()[0] is True
    assert db.execute("SELECT outbox_disable_subscription(%s)", (subscription,)).fetchone()[0] is False
    assert db.execute("SELECT disabled_reason FROM outbox_subscriptions").fetchone()[0] == "receiver migrating"
    enqueue_many(db, 5)
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_delivery WHERE status = 'PENDING'").fetchone()[0] == 5,
               what="parked deliveries")
    time.sleep(1)
    assert receiver.requests == []
    db.execute("SELECT outbox_enable_subscription(%s)", (subscription,))
    receiver.wait_for(5)
    eventually(lambda: done(db) == 5)


def test_subscribing_a_disabled_endpoint_again_enabled_resumes_its_parked_deliveries_at_once(worker, receivers):
    """outbox_subscribe(..., enabled => true) of a disabled subscription enables it, as
    outbox_enable_subscription does. Until 0.5.33 its parked deliveries kept their backoff (up
    to an hour and more after days of failures), where outbox_enable_subscription makes them
    due at once (found by a code review of 0.5.32)."""
    db = worker
    receiver = receivers()
    subscription = db.execute("SELECT outbox_subscribe('booking.created', %s, enabled => false)", (receiver.url,)).fetchone()[0]
    enqueue_many(db, 3)
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_delivery WHERE status = 'PENDING'").fetchone()[0] == 3,
               what="parked deliveries")
    # As after failures: backing off for an hour.
    db.execute("UPDATE outbox_delivery SET available_at = now() + interval '1 hour', attempts = 5 WHERE subscription_id = %s",
               (subscription,))
    assert db.execute("SELECT outbox_subscribe('booking.created', %s, enabled => true)", (receiver.url,)).fetchone()[0] == subscription
    receiver.wait_for(3, timeout=15)
    eventually(lambda: done(db) == 3)
    assert db.execute("SELECT disabled_reason, failing_since FROM outbox_subscription WHERE id = %s", (subscription,)).fetchone() == (None, None)


@pytest.mark.parametrize(
    "call, sqlstate, named",
    [
        ("SELECT outbox_enable_subscription(NULL)", "22004", "outbox_enable_subscription: id must not be NULL"),
        ("SELECT outbox_enable_subscription(999)", "22023", "outbox_enable_subscription: id 999 is not a subscription"),
        ("SELECT outbox_disable_subscription(999)", "22023", "outbox_disable_subscription: id 999"),
        ("SELECT outbox_rotate_secret(999)", "22023", "outbox_rotate_secret: subscription_id 999"),
        ("SELECT outbox_rotate_secret(1, overlap => '-1 hour')", "22023", "overlap"),
        ("SELECT outbox_rotate_secret(1, overlap => NULL)", "22004", "overlap"),
        ("SELECT outbox_rotate_secret(1, 'not-a-secret')", "22023", "outbox_rotate_secret: new_secret"),
        ("SELECT outbox_subscribe('booking.created', 'https://x.example/', rate_limit => 0)", "22023", "rate_limit"),
        ("SELECT outbox_subscribe('booking.created', 'https://x.example/', rate_limit => -5)", "22023", "rate_limit"),
        ("SELECT outbox_subscribe('booking.created', 'https://x.example/', rate_limit => 'NaN')", "22023", "rate_limit"),
        ("SELECT outbox_subscribe('booking.created', 'https://x.example/', max_in_flight => 0)", "22023", "max_in_flight"),
    ],
)
def test_bad_endpoint_arguments_are_refused_naming_the_function_and_argument(db, call, sqlstate, named):
    db.execute("SELECT outbox_subscribe('audit.exported', 'https://hooks.example.test/', outbox_generate_secret())")  # id 1
    with pytest.raises(psycopg.Error) as error:
        db.execute(call)
    assert error.value.sqlstate == sqlstate
    assert named in error.value.diag.message_primary
    assert db.execute("SELECT count(*) FROM outbox_subscription").fetchone()[0] == 1


def test_a_bad_network_in_the_setting_is_refused(db):
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        for bad in ("example.com", "10.0.0.0/33", "10.0.0.0/8,,nonsense"):
            with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
                admin.execute(f"ALTER SYSTEM SET outbox.allowed_networks = '{bad}'")
            assert "outbox.allowed_networks" in error.value.diag.message_primary
        with pytest.raises(psycopg.errors.InvalidParameterValue):
            admin.execute("ALTER SYSTEM SET outbox.endpoint_disable_after = 'soon'")


def test_an_operators_open_transaction_on_a_failing_endpoint_holds_back_no_other_endpoint(worker, receivers):
    """The worker records an endpoint's failures on its subscription (failing_since). An
    operator's open transaction on it (outbox_rotate_secret, say) held that write back, and
    with it the worker's whole step: every endpoint waited for the operator's commit (stop 43's
    second probe). The write is skipped instead, and made by a later answer."""
    db = worker
    failing, healthy = receivers(), receivers()
    failing.answer_by_default(503)
    failing_id = db.execute("SELECT outbox_subscribe('failing.topic', %s)", (failing.url,)).fetchone()[0]
    db.execute("SELECT outbox_subscribe('healthy.topic', %s)", (healthy.url,))
    with connect() as operator:
        operator.execute("SELECT outbox_rotate_secret(%s)", (failing_id,))  # not committed yet
        enqueue_many(db, 1, topic="failing.topic")
        failing.wait_for(1)
        time.sleep(0.3)  # its answer recorded, or waiting to be
        enqueue_many(db, 1, topic="healthy.topic")
        healthy.wait_for(1, timeout=5)
        operator.commit()
    # Its next failure records the run of failures.
    eventually(lambda: db.execute("SELECT failing_since IS NOT NULL FROM outbox_subscription WHERE id = %s", (failing_id,)).fetchone()[0],
               what="the endpoint recorded as failing")


def test_a_recovery_an_operators_transaction_held_back_is_recorded_after_its_commit(worker, receivers):
    """A failing endpoint that answers is no longer failing. While an operator's open transaction
    held its subscription, the worker left that unwritten for a later answer to write; with
    none, the subscription stayed failing, and its next single failure, once
    outbox.endpoint_disable_after had passed, disabled it at once (stop 44's probe). The write is
    tried again at the next steps."""
    db = worker
    configure_worker({"outbox.endpoint_disable_after": "2s"})
    receiver = receivers()
    receiver.answer(503)  # then 200s
    subscription = db.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,)).fetchone()[0]
    failing = "SELECT failing_since IS NOT NULL FROM outbox_subscription WHERE id = %s"
    with connect() as operator:
        enqueue_many(db, 1)
        eventually(lambda: db.execute(failing, (subscription,)).fetchone()[0], what="the endpoint recorded as failing")
        operator.execute("SELECT outbox_rotate_secret(%s)", (subscription,))  # not committed yet
        eventually(lambda: done(db) == 1, what="the retry delivered")
        time.sleep(0.5)
        operator.commit()
    # Recorded without a further answer.
    eventually(lambda: not db.execute(failing, (subscription,)).fetchone()[0], timeout=5, what="the recovery recorded")
    time.sleep(2.5)  # longer than outbox.endpoint_disable_after
    receiver.answer(503)
    enqueue_many(db, 1)
    eventually(lambda: db.execute(failing, (subscription,)).fetchone()[0], what="the new failure recorded")
    time.sleep(0.5)
    assert db.execute("SELECT enabled FROM outbox_subscription WHERE id = %s", (subscription,)).fetchone()[0], \
        "one failure disabled the endpoint"
    eventually(lambda: done(db) == 2, what="the second message delivered")


def test_a_worker_stopping_writes_the_failure_an_operators_transaction_held_once_it_commits(worker, receivers):
    """A worker stopping waited for its answers and hand-backs, not for the breaker's writes: an
    endpoint's failure that an operator's open transaction held back from its subscription was
    lost with the worker (the next one knows nothing of it, and records the run of failures only
    at the endpoint's next failure, a backoff later). The drain waits for it as for an answer."""
    db = worker
    configure_worker({"outbox.backoff_base": "1min", "outbox.backoff_max": "1min", "outbox.http_timeout": "5s"})
    receiver = receivers()
    receiver.answer_by_default(503)
    subscription = db.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,)).fetchone()[0]
    failing = "SELECT failing_since IS NOT NULL FROM outbox_subscription WHERE id = %s"
    with connect() as operator:
        operator.execute("SELECT outbox_rotate_secret(%s)", (subscription,))  # not committed yet
        enqueue_many(db, 1)
        eventually(lambda: db.execute("SELECT count(*) FROM outbox_delivery_attempts").fetchone()[0] == 1,
                   what="the failure recorded for the delivery")
        pid = worker_pid(db.info.dbname)
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        time.sleep(0.3)
        assert not db.execute(failing, (subscription,)).fetchone()[0], "written through the operator's transaction"
        operator.commit()
    eventually(lambda: db.execute(failing, (subscription,)).fetchone()[0], timeout=5, what="the failure written by the worker stopping")
    eventually(lambda: worker_pid(db.info.dbname) not in (None, pid), what="a new worker")


# -- 2. rate limits ----------------------------------------------------------------------------


def test_a_rate_limit_holds_at_the_receiver_while_another_endpoint_runs_at_full_speed(worker, receivers):
    db = worker
    limited, free = receivers(), receivers()
    db.execute("SELECT outbox_subscribe('booking.created', %s, rate_limit => 50)", (limited.url,))
    db.execute("SELECT outbox_subscribe('booking.created', %s)", (free.url,))
    enqueue_many(db, 250)
    free.wait_for(250, timeout=30)
    free_span = free.requests[-1]["arrived_at"] - free.requests[0]["arrived_at"]
    limited.wait_for(250, timeout=30)
    arrivals = sorted(r["arrived_at"] for r in limited.requests)
    rate = (len(arrivals) - 1) / (arrivals[-1] - arrivals[0])
    assert 40 <= rate <= 60, f"{rate:.1f} requests/s under a limit of 50/s"
    assert free_span < (arrivals[-1] - arrivals[0]) / 2, "the endpoint without a limit was held back"


def test_endpoints_with_work_take_turns_when_they_outnumber_the_slots(worker, receivers):
    """With more endpoints with work than outbox.max_in_flight, one endpoint kept the only slot
    for its whole backlog: after each success its helper thread went on with its next delivery
    (found by stop 42's probe: the second endpoint's first request came after the first's 300)."""
    db = worker
    configure_worker({**FAST, "outbox.max_in_flight": "1"})
    first, second = receivers(), receivers()
    for receiver in (first, second):
        receiver.answer_by_default(200, delay=0.02)
        db.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    enqueue_many(db, 150)
    # Each takes 20 ms a request: alone, the first would be done after 3 s.
    first.wait_for(20, timeout=30)
    second.wait_for(20, timeout=30)
    started = min(first.requests[0]["arrived_at"], second.requests[0]["arrived_at"])
    twentieth = max(first.requests[19]["arrived_at"], second.requests[19]["arrived_at"])
    assert twentieth - started < 2.0, "one endpoint waited for the other's backlog"
    first.wait_for(150, timeout=30)
    second.wait_for(150, timeout=30)


def test_an_endpoint_that_gets_work_while_others_hold_the_slots_gets_the_next_one(worker, receivers):
    """Two slots, two endpoints answering after 5 s working through backlogs: a third
    endpoint's message waited until both backlogs were done (stop 54's probe: more than 25 s).
    Its leased delivery could not start within its lease's time to start (2.5 s) and was
    handed back each time a slot freed, which then went to another. The slot now waits for its
    claim."""
    db = worker
    configure_worker({"outbox.max_in_flight": "2"})
    first, second, third = receivers(), receivers(), receivers()
    for topic, receiver in (("first.topic", first), ("second.topic", second), ("third.topic", third)):
        if receiver is not third:
            receiver.answer_by_default(200, delay=5)
        db.execute("SELECT outbox_subscribe(%s, %s, timeout => interval '10 seconds')", (topic, receiver.url))
    with db.transaction():
        enqueue_many(db, 6, topic="first.topic")
        enqueue_many(db, 6, topic="second.topic")
    first.wait_for(1, timeout=10)
    time.sleep(1)
    sent = time.time()  # (the receiver's clock)
    enqueue_many(db, 1, topic="third.topic")
    third.wait_for(1, timeout=25)  # (the backlogs take 30 s)
    waited = third.requests[0]["arrived_at"] - sent
    assert waited < 6.0, f"the third endpoint's message waited {waited:.1f} s for a slot (a request takes 5 s)"


def test_two_slow_endpoints_leave_a_slot_for_a_third(worker, receivers):
    """Two endpoints that answer slowly, each with a backlog, took 4 of the 8 slots each, and
    a third endpoint's message waited for one of their requests to end (stop 53's probe: up to
    18.7 s behind answers after 19 s). The endpoints with work now keep a slot free together
    for the one without."""
    db = worker
    slow_a, slow_b, quick = receivers(), receivers(), receivers()
    db.execute("SELECT outbox_subscribe('quick.done', %s)", (quick.url,))
    for topic, slow in (("slow.a", slow_a), ("slow.b", slow_b)):
        slow.answer_by_default(200, delay=4)
        db.execute("SELECT outbox_subscribe(%s, %s, timeout => interval '10 seconds')", (topic, slow.url))
    for topic in ("slow.a", "slow.b"):
        enqueue_many(db, 8, topic=topic)
    eventually(lambda: slow_a.concurrent + slow_b.concurrent >= 7, timeout=10, what="the slow endpoints to hold 7 requests")
    time.sleep(0.5)  # (time to take the last slot, had they been let)
    sent = time.time()  # (the receiver's clock)
    enqueue_many(db, 1, topic="quick.done")
    quick.wait_for(1, timeout=10)
    waited = quick.requests[0]["arrived_at"] - sent
    slow_a.wait_for(8, timeout=30)
    slow_b.wait_for(8, timeout=30)
    assert waited < 2.0, f"the third endpoint's message waited {waited:.1f} s for a slot"


def test_endpoints_that_hang_as_many_as_the_slots_leave_one_to_a_healthy_endpoint(worker, receivers):
    """8 endpoints that never answer within their timeout, failing (one probe each at a time,
    again soon after each timeout), and outbox.max_in_flight 8. Until 0.5.34 a probe, its
    endpoint's first request each time, could take a slot kept for endpoints with nothing in
    flight: the 8 probes held every slot, and a healthy endpoint got about one request per
    timeout (stop 57's probe of hostile receivers: 4 of 79 messages in 20 s). The probes now
    leave the kept slots to healthy endpoints."""
    db = worker
    hanging, healthy = receivers(), receivers()
    hanging.answer_by_default(200, delay=20)
    for n in range(8):
        db.execute("SELECT outbox_subscribe('report.ready', %s, timeout => interval '8 seconds')", (f"{hanging.url}?n={n}",))
    db.execute("SELECT outbox_subscribe('quick.done', %s)", (healthy.url,))
    enqueue_many(db, 4, topic="report.ready")
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_subscription WHERE failing_since IS NOT NULL").fetchone()[0] == 8,
               timeout=30, what="the 8 hanging endpoints recorded as failing")
    eventually(lambda: hanging.concurrent >= 6, timeout=10, what="their probes in flight")
    sent = time.monotonic()
    enqueue_many(db, 20, topic="quick.done")
    healthy.wait_for(20, timeout=30)
    took = time.monotonic() - sent
    # (Under the 8 s of a probe's timeout: until 0.5.34 the 20 needed several.)
    assert took < 6, f"the healthy endpoint's 20 messages took {took:.1f} s"


def test_endpoints_that_alternate_an_answer_and_a_hang_leave_the_kept_slots_to_a_healthy_endpoint(worker, receivers):
    """8 endpoints of which every other request hangs past its timeout, outbox.max_in_flight 8.
    Until 0.5.35 an answer that succeeded made an endpoint healthy again, and its next request
    took a slot kept for endpoints with nothing in flight: the 8 took every slot with requests
    that hung, round after round, and a healthy endpoint's messages waited up to a timeout
    each time (stop 58's probe of hostile receivers: p50 4.3 - 5.3 s with a 3 s timeout). After
    a failure an endpoint is not trusted with a kept slot for a while."""
    db = worker
    flapping, healthy = receivers(), receivers()
    answered = itertools.count()
    flapping.answer_with(lambda: (200, 0, {}, b"") if next(answered) % 2 else (200, 20, {}, b""))
    for n in range(8):
        db.execute("SELECT outbox_subscribe('flaky.report', %s, timeout => interval '6 seconds')", (f"{flapping.url}?n={n}",))
    db.execute("SELECT outbox_subscribe('quick.done', %s)", (healthy.url,))
    enqueue_many(db, 200, topic="flaky.report")
    eventually(lambda: len(flapping.requests) >= 16, timeout=40, what="the flapping endpoints through a few rounds")
    sent_at = {}
    for n in range(16):
        sent_at[str(n)] = time.time()
        db.execute("SELECT outbox_enqueue('quick.done', jsonb_build_object('n', %s::text))", (str(n),))
        time.sleep(0.5)
    healthy.wait_for(16, timeout=30)
    waits = sorted(r["arrived_at"] - sent_at[json.loads(r["body"])["n"]] for r in healthy.requests)
    # (Under the 6 s of a hanging request's timeout: until 0.5.35 some waited most of one.)
    assert waits[-1] < 3, f"the healthy endpoint's messages waited up to {waits[-1]:.1f} s (median {waits[8]:.1f} s)"


def test_a_failing_endpoint_leaves_the_slots_it_cannot_use_to_another(worker, receivers):
    """A failing endpoint gets one request at a time; the other endpoint with work got only
    half of the 8 slots beside it, 3 of them unused. It gets the other 7."""
    db = worker
    down, slow = receivers(), receivers()
    down.answer_by_default(503, delay=1)  # (slow to fail: it has work all along)
    slow.answer_by_default(200, delay=1)
    down_id = db.execute("SELECT outbox_subscribe('down.topic', %s)", (down.url,)).fetchone()[0]
    db.execute("SELECT outbox_subscribe('slow.topic', %s)", (slow.url,))
    enqueue_many(db, 40, topic="down.topic")
    eventually(lambda: db.execute("SELECT failing_since IS NOT NULL FROM outbox_subscription WHERE id = %s", (down_id,)).fetchone()[0],
               what="the endpoint recorded as failing")
    enqueue_many(db, 21, topic="slow.topic")
    slow.wait_for(21, timeout=30)
    assert slow.max_concurrent == 7, f"{slow.max_concurrent} requests at once beside a failing endpoint"


def seconds_to_send_beside_failing_endpoints(db, healthy, failing_urls, timeout, count):
    """Subscribes `failing_urls` (with `timeout`) to one topic and `healthy` to another, gives
    the failing ones work until every one is recorded as failing, then returns how long
    `count` messages to the healthy endpoint took to arrive."""
    for url in failing_urls:
        db.execute("SELECT outbox_subscribe('report.ready', %s, timeout => %s::interval)", (url, timeout))
    db.execute("SELECT outbox_subscribe('quick.done', %s)", (healthy.url,))
    enqueue_many(db, 40, topic="report.ready")
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_subscription WHERE failing_since IS NOT NULL").fetchone()[0] == len(failing_urls),
               timeout=30, what=f"the {len(failing_urls)} endpoints recorded as failing")
    sent = time.monotonic()
    enqueue_many(db, count, topic="quick.done")
    healthy.wait_for(count, timeout=60)
    return time.monotonic() - sent


def test_many_failing_endpoints_leave_half_of_the_slots_to_a_healthy_one(worker, receivers):
    """60 failing endpoints, half of them hanging past their timeout and half refusing
    connections, each probed one request at a time, beside a healthy endpoint that answers in
    50 ms, outbox.max_in_flight 16. Until 0.5.36 each probe was an equal share of the slots:
    the healthy endpoint got one in 61, a request at a time (stop 59's probe of many endpoints:
    22 requests/s beside 100, its messages' latency p50 2.8 s). The probes now hold half of the
    slots at most."""
    configure_worker({"outbox.max_in_flight": "16"})
    hanging, healthy = receivers(), receivers()
    hanging.answer_by_default(200, delay=20)
    healthy.answer_by_default(200, delay=0.05)
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused_url = f"http://127.0.0.1:{closed.getsockname()[1]}/"
    failing = [f"{url}?n={n}" for n in range(30) for url in (hanging.url, refused_url)]
    took = seconds_to_send_beside_failing_endpoints(worker, healthy, failing, "2 seconds", 200)
    # (Generous: 8 slots send the 200 in about 1.3 s; one slot needs 10 s.)
    assert took < 5, f"the healthy endpoint's 200 messages took {took:.1f} s beside 60 failing endpoints (at most {healthy.max_concurrent} at once)"


def test_with_one_slot_failing_endpoints_wait_while_a_healthy_one_has_work(worker, receivers):
    """outbox.max_in_flight 1 has no half to leave: the probes of 6 failing endpoints that hang
    past their timeout took the slot in turn with a healthy endpoint's requests, which got one
    request per round of probes (the probe of 0.5.36's change: one every 10 s beside 30). They
    now wait while a healthy endpoint has work, and go on after."""
    configure_worker({"outbox.max_in_flight": "1"})
    hanging, healthy = receivers(), receivers()
    hanging.answer_by_default(200, delay=20)
    healthy.answer_by_default(200, delay=0.05)
    failing = [f"{hanging.url}?n={n}" for n in range(6)]
    took = seconds_to_send_beside_failing_endpoints(worker, healthy, failing, "1 second", 20)
    probed_before = hanging.started
    # (Generous: 20 requests of 50 ms after one probe's timeout at most; a round of 6 probes, 6 s,
    # stood before each until 0.5.36.)
    assert took < 6, f"the healthy endpoint's 20 messages took {took:.1f} s beside 6 failing endpoints and one slot"
    hanging.wait_for(probed_before + 2, timeout=10, started=True)  # (the failing endpoints probed again)


def test_max_in_flight_caps_one_endpoint(worker, receivers):
    db = worker
    slow = receivers()
    slow.answer_by_default(200, delay=0.2)
    db.execute("SELECT outbox_subscribe('booking.created', %s, max_in_flight => 2)", (slow.url,))
    enqueue_many(db, 12)
    slow.wait_for(12, timeout=20)
    assert slow.max_concurrent == 2


# -- 3. secret rotation ------------------------------------------------------------------------


def test_a_rotated_secret_signs_beside_the_old_one_during_the_overlap_then_alone(worker, receivers):
    db = worker
    receiver = receivers()
    old = db.execute("SELECT outbox_generate_secret()").fetchone()[0]
    subscription = db.execute("SELECT outbox_subscribe('booking.created', %s, %s)", (receiver.url, old)).fetchone()[0]
    new = db.execute("SELECT outbox_rotate_secret(%s)", (subscription,)).fetchone()[0]  # generated, 24 h overlap
    assert new.startswith("whsec_") and new != old
    assert db.execute("SELECT previous_secret_until > now() + interval '23 hours' FROM outbox_subscriptions").fetchone()[0]
    enqueue_many(db, 1)
    (request,) = receiver.wait_for(1)
    assert len(request["headers"]["webhook-signature"].split(" ")) == 2
    for secret in (old, new):  # a receiver holding either secret verifies it
        assert Webhook(secret).verify(request["body"], request["headers"]) == {"n": 1}

    newest = db.execute("SELECT outbox_generate_secret()").fetchone()[0]
    assert db.execute("SELECT outbox_rotate_secret(%s, %s, overlap => '0')", (subscription, newest)).fetchone()[0] == newest
    time.sleep(0.5)  # the worker reads the subscription again when woken
    enqueue_many(db, 1)
    request = receiver.wait_for(2)[1]
    assert Webhook(newest).verify(request["body"], request["headers"]) == {"n": 1}
    with pytest.raises(WebhookVerificationError):
        Webhook(new).verify(request["body"], request["headers"])


def test_a_secret_rotated_during_a_backlog_signs_from_the_next_step(worker, receivers):
    """The worker, busy with a backlog, waited for the rotation's lock; the wake-up sent at its
    commit was spent ending that wait, and the worker read the subscription again only at its
    next poll: for up to a second, thousands of requests signed with the old secret alone
    (stop 42's probe). (Since 0.5.20 the worker's step no longer waits for the rotation's lock;
    the receiver answers in 5 ms, so that the backlog outlasts the rotation.)"""
    db = worker
    receiver = receivers()
    receiver.answer_by_default(200, delay=0.005)
    old = db.execute("SELECT outbox_generate_secret()").fetchone()[0]
    subscription = db.execute("SELECT outbox_subscribe('booking.created', %s, %s)", (receiver.url, old)).fetchone()[0]
    configure_worker({**FAST, "outbox.poll_interval": "5s"})
    enqueue_many(db, 4000)
    receiver.wait_for(200, timeout=30)
    newest = db.execute("SELECT outbox_generate_secret()").fetchone()[0]
    with db.transaction():
        db.execute("SELECT outbox_rotate_secret(%s, %s, overlap => '0')", (subscription, newest))
        time.sleep(0.5)  # (before 0.5.20, the worker's step waited for this transaction meanwhile)
    committed = time.time()
    receiver.wait_for(4000, timeout=60)
    late = [r for r in receiver.requests if r["arrived_at"] > committed + 0.3]
    assert late, "the backlog ended before the rotation could be seen"
    old_only = 0
    for request in late:
        try:
            Webhook(newest).verify(request["body"], request["headers"])
        except WebhookVerificationError:
            old_only += 1
    assert old_only == 0, f"{old_only} of {len(late)} requests 0.3 s after the rotation not signed with the new secret"


# -- 4. the SSRF guard -------------------------------------------------------------------------


def test_internal_destinations_are_refused_by_default_and_opened_by_the_setting(worker, receivers):
    db = worker
    configure_worker({"outbox.allowed_networks": ""})
    receiver = receivers()
    notices = []
    db.add_notice_handler(lambda diag: notices.append(diag.message_primary))
    metadata = db.execute("SELECT outbox_subscribe('cloud.probe', 'http://169.254.169.254/latest/meta-data')").fetchone()[0]
    assert any("destination 169.254.169.254 is not allowed (outbox.allowed_networks)" in n for n in notices), notices
    # The same address written as the resolver also reads it (the C library's inet_aton): the
    # worker refused it, but subscribing warned of nothing (a bad-input audit).
    for disguised in ("0xa9fea9fe", "2852039166", "169.254.43518"):
        notices.clear()
        db.execute("SELECT outbox_subscribe('cloud.probe.disguised', %s)", (f"http://{disguised}/latest/meta-data",))
        assert any("destination 169.254.169.254 is not allowed" in n for n in notices), (disguised, notices)
    # A host name that resolves to loopback: judged by the address it resolves to.
    assert socket.gethostbyname("localhost") == "127.0.0.1"
    local_url = f"http://localhost:{receiver.port}/hooks"
    local = db.execute("SELECT outbox_subscribe('booking.created', %s)", (local_url,)).fetchone()[0]
    enqueue_many(db, 1, "cloud.probe")
    enqueue_many(db, 1, "booking.created")

    def last_error(subscription):
        return db.execute("SELECT last_error FROM outbox_delivery WHERE subscription_id = %s", (subscription,)).fetchone()

    eventually(lambda: (last_error(metadata) or [None])[0], what="the metadata delivery to fail")
    assert last_error(metadata)[0] == "destination 169.254.169.254 is not allowed (outbox.allowed_networks)"
    eventually(lambda: (last_error(local) or [None])[0], what="the localhost delivery to fail")
    assert "is not allowed (outbox.allowed_networks)" in last_error(local)[0]
    assert receiver.requests == []
    # The attempts count like any failure.
    assert db.execute("SELECT min(attempts) FROM outbox_delivery").fetchone()[0] >= 1

    configure_worker({"outbox.allowed_networks": "127.0.0.1/32, 169.254.169.254/32"})
    receiver.wait_for(1, timeout=10)
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE topic = 'booking.created'").fetchone()[0] == "DONE")
    # Allowed, the metadata address is tried for real (nothing answers there in this sandbox).
    eventually(lambda: "not allowed" not in (last_error(metadata)[0] or "not allowed"), timeout=15,
               what="the metadata address to be tried")

    # No notice for a public host, nor for an address the setting opens.
    notices.clear()
    db.execute("SELECT outbox_subscribe('booking.created', 'https://hooks.example.com/')")
    with psycopg.connect(dbname="outbox_integration", autocommit=True) as fresh:  # sees the reloaded setting
        fresh.add_notice_handler(lambda diag: notices.append(diag.message_primary))
        fresh.execute("SELECT outbox_subscribe('booking.created', 'http://127.0.0.1:9/')")
    assert notices == []


# -- 5. per-message headers --------------------------------------------------------------------


def test_a_producers_headers_travel_with_the_message_to_consumers_and_endpoints(worker, receivers):
    db = worker
    receiver = receivers()
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "x-tenant": "7"}
    db.execute("SELECT outbox_enqueue('audit.exported', '{}', headers => %s::jsonb)", (json.dumps(headers),))
    assert db.execute("SELECT headers FROM outbox_claim(1)").fetchone()[0] == headers
    db.execute("SELECT outbox_subscribe('booking.created', %s, headers => '{\"x-tenant\": \"admin-set\"}')", (receiver.url,))
    enqueue_many(db, 1, headers=headers)
    (request,) = receiver.wait_for(1)
    assert request["headers"]["traceparent"] == headers["traceparent"]
    # The subscription's own header wins over a producer's of the same name.
    assert request["headers"]["x-tenant"] == "admin-set"


def test_a_header_a_proxy_routes_by_stored_before_it_was_refused_is_not_sent(worker, receivers):
    """Since 0.5.35 a message may not set X-Forwarded-Host and the like (a producer could
    re-route a delivery behind the receiver's proxy: stop 58's probe of privileges); a message
    enqueued before keeps them in its row, and the worker leaves them out."""
    db = worker
    receiver = receivers()
    db.execute("SELECT outbox_subscribe('audit.routed', %s)", (receiver.url,))
    db.execute("""INSERT INTO outbox (topic, payload, headers)
                  VALUES ('audit.routed', '{}', '{"X-Forwarded-Host": "internal.admin", "x-tenant": "7"}')""")
    (request,) = receiver.wait_for(1)
    assert request["headers"]["x-tenant"] == "7"
    assert "x-forwarded-host" not in request["headers"]


@pytest.mark.parametrize(
    "headers",
    [
        {"webhook-signature": "v1,forged"},
        {"Content-Type": "text/plain"},
        {f"x-h{i}": "v" for i in range(17)},
        {"x-big": "v" * 9000},
        {"x-nested": {"a": 1}},
    ],
    ids=["signature", "content-type", "too-many", "too-big", "not-a-string"],
)
def test_headers_the_worker_sets_or_too_many_are_refused(db, headers):
    with pytest.raises(psycopg.errors.InvalidParameterValue) as error:
        db.execute("SELECT outbox_enqueue('booking.created', '{}', headers => %s::jsonb)", (json.dumps(headers),))
    assert "outbox_enqueue" in error.value.diag.message_primary and "headers" in error.value.diag.message_primary
    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0


def test_disabling_an_endpoint_hands_back_what_the_worker_leased_ahead(worker, receivers):
    """A healthy endpoint is leased rounds ahead (docs/worker.md). Disabled meanwhile, the
    deliveries the worker holds but has not sent are handed back: parked, no longer leased, and
    their attempt not counted; nothing more is sent."""
    db = worker
    configure_worker({"outbox.max_in_flight": "1"})
    receiver = receivers()
    receiver.answer_by_default(200, delay=0.3)
    subscription = db.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,)).fetchone()[0]
    enqueue_many(db, 20)
    # More deliveries leased than the one request out at a time: some queued behind it. (As
    # soon as that is seen: waiting for all 20 to be leased let up to 16 be sent first on a
    # slow machine, and then there was little left to hand back.)
    eventually(lambda: db.execute("""SELECT count(*) = 20 AND count(*) FILTER (WHERE in_flight) >= 2
                                         FROM outbox_deliveries""").fetchone()[0],
               interval=0.01, what="the deliveries leased: one request out, more queued behind it")
    db.execute("SELECT outbox_disable_subscription(%s)", (subscription,))
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_deliveries WHERE in_flight").fetchone()[0] == 0,
               what="the queued deliveries handed back (and the request out answered)")
    sent = len(receiver.requests)
    time.sleep(1)
    assert len(receiver.requests) == sent, "nothing sent to a disabled endpoint"
    assert 1 <= sent < 15
    assert db.execute("SELECT count(*) FROM outbox_deliveries WHERE status = 'DONE'").fetchone()[0] == sent
    parked = db.execute("SELECT count(*), max(attempts), bool_and(available_at <= clock_timestamp()) FROM outbox_deliveries WHERE status = 'PENDING'").fetchone()
    assert parked == (20 - sent, 0, True), "due again, the attempt they were leased for not counted"
    db.execute("SELECT outbox_enable_subscription(%s)", (subscription,))
    receiver.answer_by_default(200)
    eventually(lambda: done(db) == 20, timeout=20, what="all 20 delivered once enabled")
    assert len(receiver.requests) == 20
