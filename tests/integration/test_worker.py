"""The delivery worker end to end: a real local HTTP receiver, the worker inside the scratch
cluster (preloaded, serving the test database), and the outcomes recorded in the outbox."""

import datetime
import json
import os
import signal
import socket
import threading
import time
import pathlib
import uuid

import psycopg
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from conftest import configure_worker, connect
from support import PausedAt, ServerLog, cpu_share, eventually

from support.receiver import Receiver

# Fast retries and short timeouts for the worker while these tests run, applied the way an
# operator would: ALTER SYSTEM and a reload (the worker's settings are SIGHUP).
WORKER_SETTINGS = {
    "outbox.backoff_base": "200ms",
    "outbox.backoff_jitter": "0",
    "outbox.max_attempts": "8",
    "outbox.http_timeout": "1s",
    "outbox.poll_interval": "200ms",
    "outbox.worker_batch_size": "10",
    "outbox.max_in_flight": "8",
}


def worker_pid(conn):
    row = conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_ext delivery worker' AND datname = current_database()"
    ).fetchone()
    return row and row[0]


@pytest.fixture()
def worker(db):
    """The test database with the extension and a worker that serves it."""
    configure_worker(WORKER_SETTINGS)
    eventually(lambda: worker_pid(db), what="the delivery worker")
    # The worker notices a (re)created extension at its next poll.
    eventually(
        lambda: db.execute("SELECT state FROM outbox_worker_status() WHERE database = current_database()").fetchone() in [("idle",), ("delivering",)],
        what="the worker to find the extension",
    )
    yield db
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute("ALTER SYSTEM RESET ALL")
        admin.execute("SELECT pg_reload_conf()")


@pytest.fixture()
def receiver():
    receiver = Receiver().start()
    yield receiver
    receiver.stop()


def message(conn, message_id):
    return conn.execute(
        "SELECT status, attempts, last_error, public_id::text FROM outbox WHERE id = %s", (message_id,)
    ).fetchone()


def enqueue(conn, topic="booking.created", payload=None):
    with conn.transaction():
        return conn.execute(
            "SELECT id, public_id::text FROM outbox_enqueue(%s, %s::jsonb)",
            (topic, json.dumps(payload or {"bookingId": 1})),
        ).fetchone()


def status_is(conn, message_id, status):
    return lambda: message(conn, message_id)[0] == status


def delivery(conn, message_id):
    """(status, attempts, last_error) of the message's one delivery (one endpoint)."""
    row = conn.execute(
        "SELECT status, attempts, last_error FROM outbox_deliveries WHERE message_id = %s", (message_id,)
    ).fetchone()
    return row or (None, None, None)


def test_delivers_with_every_header_and_a_verifiable_signature(worker, receiver):
    secret = worker.execute("SELECT outbox_generate_secret()").fetchone()[0]
    worker.execute(
        "SELECT outbox_subscribe('booking.created', %s, %s, '{\"X-Team\": \"7\"}')", (receiver.url, secret)
    )
    payload = {"bookingId": 42, "guestEmail": "ada@example.test", "total": "180.00"}
    with worker.transaction():
        worker.execute("CREATE TEMP TABLE bookings (id int)")  # the business change ...
        worker.execute("INSERT INTO bookings VALUES (42)")
        message_id, public_id = worker.execute(  # ... and the webhook it owes
            "SELECT id, public_id::text FROM outbox_enqueue('booking.created', %s::jsonb)", (json.dumps(payload),)
        ).fetchone()

    [request] = receiver.wait_for(1)
    headers = request["headers"]
    assert headers["content-type"] == "application/json"
    assert headers["webhook-id"] == public_id
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60
    assert headers["outbox-topic"] == "booking.created"
    assert headers["outbox-attempt"] == "1"
    assert headers["x-team"] == "7"
    assert json.loads(request["body"]) == payload
    # An independent implementation (the standardwebhooks package) verifies the signature.
    assert Webhook(secret).verify(request["body"], headers) == payload
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(request["body"].replace("42", "43"), headers)

    eventually(status_is(worker, message_id, "DONE"), what="DONE")


def test_an_endpoint_whose_scheme_is_written_in_capitals_gets_its_messages(worker, receiver):
    # RFC 3986: a scheme ignores case. outbox_subscribe refused "HTTP://" until 0.5.32.
    url = receiver.url.replace("http://", "HTTP://", 1)
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (url,))
    message_id, public_id = enqueue(worker)
    [request] = receiver.wait_for(1)
    assert request["headers"]["webhook-id"] == public_id
    eventually(status_is(worker, message_id, "DONE"), what="DONE")


def test_a_503_then_a_200_is_delivered_on_the_retry(worker, receiver):
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    receiver.answer(503, body=b"upstream unavailable", headers={"Retry-After": "1"})
    message_id, public_id = enqueue(worker)

    first, second = receiver.wait_for(2)
    assert [first["status"], second["status"]] == [503, 200]
    assert first["headers"]["webhook-id"] == second["headers"]["webhook-id"] == public_id
    assert [first["headers"]["outbox-attempt"], second["headers"]["outbox-attempt"]] == ["1", "2"]
    # Retry-After: 1 was honoured (the configured backoff would have retried after 200 ms).
    assert second["received_at"] - first["received_at"] >= 0.9
    eventually(status_is(worker, message_id, "DONE"), what="DONE")
    assert delivery(worker, message_id) == ("DONE", 2, "HTTP 503: upstream unavailable")
    attempts = worker.execute("SELECT attempt, http_status, error FROM outbox_delivery_attempts "
                              "WHERE message_id = %s ORDER BY attempt", (message_id,)).fetchall()
    assert attempts == [(1, 503, "HTTP 503: upstream unavailable"), (2, 200, None)]


def test_an_endpoint_that_always_fails_dead_letters_the_message(worker, receiver):
    configure_worker({"outbox.max_attempts": "3"})
    # (A token in the URL, as some receivers take one: the message's last_error, which SQL
    # consumers read once it is requeued, names the endpoint without it; 0.5.32 wrote the URL.)
    url = receiver.url + "/T0001?token=not-for-consumers"
    endpoint = worker.execute("SELECT outbox_subscribe('booking.created', %s)", (url,)).fetchone()[0]
    receiver.answer_by_default(500, body=b"internal error: template missing " + b"x" * 5000)
    message_id, _ = enqueue(worker)

    eventually(status_is(worker, message_id, "DEAD"), what="DEAD")
    status, attempts, last_error = delivery(worker, message_id)
    assert (status, attempts) == ("DEAD", 3)
    assert last_error.startswith("HTTP 500: internal error: template missing")
    assert len(last_error) < 300, "the response body is capped"
    # The message says which endpoint gave up, and why.
    origin = receiver.url.removesuffix("/hooks")
    assert message(worker, message_id)[2] == f"1 of 1 deliveries dead: subscription {endpoint} ({origin}): {last_error}"
    time.sleep(1)
    assert len(receiver.requests) == 3, "a dead letter is not delivered again"


def test_a_failing_bodys_control_characters_are_not_kept(worker, receiver):
    """The start of a failing answer's body is the delivery's last_error, an attempt's error
    and, through the breaker, a disabled endpoint's reason: an endpoint's text, read by
    operators in psql. Its NUL went into the text as it was (a byte no PostgreSQL text may
    hold: read as text, the error ended there), its escape sequences reached the operator's
    terminal (a bad-input audit)."""
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    receiver.answer(500, body=b"no\x00such\x1b[2Jthing\r\n")
    message_id, _ = enqueue(worker)
    receiver.wait_for(2)
    eventually(status_is(worker, message_id, "DONE"), what="DONE")
    # Read as text, as psql reads it.
    (error,) = worker.execute("SELECT error FROM outbox_delivery_attempts WHERE message_id = %s AND attempt = 1",
                              (message_id,)).fetchone()
    assert error == "HTTP 500: no\ufffdsuch\ufffd[2Jthing"


def test_an_answer_beyond_the_header_bounds_fails_whatever_its_status(worker, receiver):
    """The worker reads at most 128 header lines and 64 KiB of an answer's head (its HTTP
    client's bounds: a hostile receiver cannot make it hold more). Beyond them the attempt fails
    even with a 2xx, and says why (docs/worker.md, "The answer"; found by stop 61's probe of the
    worker's memory, where a receiver's 200 with 200 headers tripped the circuit breaker)."""
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))

    def first_attempt(headers):
        receiver.answer(200, headers=headers)
        message_id, _ = enqueue(worker)
        eventually(status_is(worker, message_id, "DONE"), what="DONE")
        return worker.execute("SELECT http_status, error FROM outbox_delivery_attempts WHERE message_id = %s AND attempt = 1",
                              (message_id,)).fetchone()

    assert first_attempt({f"x-within-{n}": "v" for n in range(100)}) == (200, None)
    status, error = first_attempt({f"x-beyond-{n}": "v" for n in range(130)})
    assert "too many headers" in (error or ""), (status, error)
    status, error = first_attempt({f"x-large-{n}": "v" * 8000 for n in range(10)})
    assert "response header is too big" in (error or ""), (status, error)


def test_autovacuum_sees_what_the_worker_writes(worker, receiver):
    """The worker's inserts and updates reach the statistics autovacuum decides by (a
    background worker must report them itself; a backend does it when it goes idle): before,
    the delivery table's counts stayed at zero while the worker ran, so autovacuum never came."""
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    worker.execute("SELECT outbox_enqueue_batch('booking.created', array_fill('{}'::jsonb, ARRAY[50]))")
    receiver.wait_for(50)
    eventually(lambda: worker.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 50,
               what="every message settled")

    def counted():
        # (Each read in a transaction of its own: no cached snapshot of the statistics.)
        return worker.execute("""SELECT n_tup_ins, n_tup_upd FROM pg_stat_user_tables
                                   WHERE relname = 'outbox_delivery'""").fetchone()

    eventually(lambda: counted()[0] >= 50 and counted()[1] >= 50, timeout=10,
               what="the worker's 50 deliveries made and ended, in the statistics")


def test_deliveries_reuse_their_connections(worker, receiver):
    """Each answer is read to its end, so its connection goes back to the worker's pool: a
    stream of deliveries needs about max_in_flight connections, not one each."""
    configure_worker({"outbox.max_in_flight": "2"})
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    receiver.answer_by_default(200, body=b'{"received": true}')
    ids = [enqueue(worker)[0] for _ in range(40)]
    receiver.wait_for(40)
    for message_id in ids:
        eventually(status_is(worker, message_id, "DONE"), what=f"message {message_id} delivered")
    connections = {request["client_port"] for request in receiver.requests}
    assert len(connections) <= 4, f"{len(connections)} connections for 40 deliveries"


def test_a_topic_nobody_subscribes_to_stays_pending_and_is_reported(worker, receiver):
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    assert worker.execute("SELECT topic, endpoints FROM outbox_topics()").fetchall() == [("booking.created", 1)]
    orphan_topic = f"invoice.paid.{uuid.uuid4().hex[:8]}"  # one the worker has not warned about yet
    orphan_id, _ = enqueue(worker, topic=orphan_topic)
    delivered_id, _ = enqueue(worker)

    eventually(status_is(worker, delivered_id, "DONE"), what="the subscribed message to be delivered")
    time.sleep(1)
    assert message(worker, orphan_id)[:3] == ("PENDING", 0, None), "no attempt used, never dead-lettered"
    assert all(r["headers"]["outbox-topic"] == "booking.created" for r in receiver.requests)

    log = pathlib.Path(os.environ["OUTBOX_TEST_SERVER_LOG"])
    warning = f'no subscription for topic "{orphan_topic}"'
    eventually(lambda: warning in log.read_text(errors="replace"), timeout=15, what="the worker's warning")
    [line] = [l for l in log.read_text(errors="replace").splitlines() if warning in l]
    assert "WARNING" in line and "topics with subscriptions: booking.created" in line, line


def test_a_database_only_sql_consumers_use_gets_no_warning_about_its_topics(worker, receiver):
    """With the library preloaded, a database without a single subscription got a WARNING every
    minute for each of its topics, though SQL consumers take them (stop 41's docs probe)."""
    worker.execute("DELETE FROM outbox_subscription")
    topic = f"sql.only.{uuid.uuid4().hex[:8]}"
    enqueue(worker, topic=topic)
    worker.execute("SELECT outbox_wake_worker_at_commit()")
    time.sleep(7)  # the check for unsubscribed topics runs at most every 5 s
    log = pathlib.Path(os.environ["OUTBOX_TEST_SERVER_LOG"])
    warning = f'no subscription for topic "{topic}"'
    assert warning not in log.read_text(errors="replace")
    # Once the database delivers webhooks, a topic without a subscription may be a mistake.
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    eventually(lambda: warning in log.read_text(errors="replace"), timeout=15, what="the worker's warning")


def test_a_topic_subscribed_while_the_worker_reads_the_subscriptions_is_not_reported(worker, receiver):
    """The worker read the subscriptions with one snapshot and looked for topics nobody
    subscribes to with a later one: a subscription committed in between, with a message of its
    topic, was reported as having no subscription (found by stop 38's probe)."""
    configure_worker({"outbox.poll_interval": "30s"})  # refreshes only when asked
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    time.sleep(6)  # the check for unsubscribed topics runs at most every 5 s
    topic = f"invoice.paid.{uuid.uuid4().hex[:8]}"
    with connect() as subscriber:
        # Holds the worker between its reading of the subscriptions and its check: it waits for
        # this lock when it looks for the endpoints' next due deliveries.
        subscriber.execute("LOCK TABLE outbox_delivery IN ACCESS EXCLUSIVE MODE")
        subscriber.execute("SELECT outbox_subscribe(%s, %s)", (topic, receiver.url))
        message_id, _ = enqueue(subscriber, topic=topic)
        worker.execute("SELECT outbox_wake_worker_at_commit()")  # read the subscriptions now
        eventually(
            lambda: worker.execute(
                "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (worker_pid(worker),)
            ).fetchone() == ("Lock",),
            what="the worker to wait for the lock",
        )
        subscriber.commit()
    eventually(status_is(worker, message_id, "DONE"), what="the new topic's message delivered")
    log = pathlib.Path(os.environ["OUTBOX_TEST_SERVER_LOG"]).read_text(errors="replace")
    assert f'no subscription for topic "{topic}"' not in log


def test_a_committed_enqueue_wakes_an_idle_worker(worker, receiver):
    """With a 30 s poll interval only the wake-up at commit explains a prompt delivery."""
    configure_worker({"outbox.poll_interval": "30s"})
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    time.sleep(0.5)  # let the worker go idle on its long poll
    latencies = []
    for n in range(5):
        enqueue(worker, payload={"n": n})
        committed = time.time()
        request = receiver.wait_for(n + 1, timeout=5)[-1]
        latencies.append(request["received_at"] - committed)
    assert max(latencies) < 2.0, latencies


def test_commits_of_topics_the_worker_does_not_deliver_leave_it_asleep(worker, receiver):
    """A topic only SQL consumers take may be busy: its commits must not wake the worker (each
    wake-up was a step, with the subscriptions read again), while a commit of a topic it
    delivers still does, at once."""
    configure_worker({"outbox.poll_interval": "30s"})
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))

    def last_poll():
        return worker.execute("SELECT last_poll_at FROM outbox_worker_status() WHERE database = current_database()").fetchone()[0]

    time.sleep(0.5)  # the subscription's wake-up is over; the worker sleeps on its long poll
    asleep_since = last_poll()
    for n in range(50):
        enqueue(worker, topic="report.requested", payload={"n": n})
    time.sleep(0.5)
    assert last_poll() == asleep_since, "a commit of a topic without subscriptions woke the worker"

    enqueue(worker)
    receiver.wait_for(1, timeout=5)
    assert last_poll() > asleep_since


def test_a_reload_applies_the_worker_settings(worker, receiver):
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    configure_worker({"outbox.worker_enabled": "off"})
    eventually(lambda: worker.execute("SELECT state FROM outbox_worker_status() WHERE database = current_database()").fetchone()[0].startswith("disabled"))
    message_id, _ = enqueue(worker)
    time.sleep(1.5)
    assert receiver.requests == [] and message(worker, message_id)[:2] == ("PENDING", 0)

    configure_worker({"outbox.worker_enabled": "on"})
    eventually(status_is(worker, message_id, "DONE"), what="delivery after re-enabling")


def test_a_paused_worker_sleeps(worker, receiver):
    """outbox.worker_enabled = off pauses delivery: the worker must then wait for a reload, not
    spin (it ran a transaction per loop, about 80,000 a second, a whole core). Idle and enabled
    it sleeps too. The bound is generous: a spinning worker uses the whole interval."""
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    pid = worker_pid(worker)
    for enabled in ("on", "off"):
        configure_worker({"outbox.worker_enabled": enabled})
        expected = "idle" if enabled == "on" else "disabled"
        eventually(lambda: worker.execute("SELECT state FROM outbox_worker_status() WHERE database = current_database()").fetchone()[0].startswith(expected))
        time.sleep(0.5)  # past the poll interval after the reload
        busy = cpu_share(pid)
        assert busy < 0.2, f"the worker used {busy:.0%} of a CPU while {expected}"
    message_id, _ = enqueue(worker)
    time.sleep(0.5)
    assert receiver.requests == [] and message(worker, message_id)[:2] == ("PENDING", 0)
    configure_worker({"outbox.worker_enabled": "on"})
    eventually(status_is(worker, message_id, "DONE"), what="delivery after re-enabling")


def test_a_rate_limited_backlog_leaves_the_worker_asleep_between_tokens(worker, receiver):
    """An endpoint with a rate limit and a backlog: the worker waits for the next token. It
    spun (its oldest due delivery, in the past, counted as a reason to wake at once)."""
    worker.execute("SELECT outbox_subscribe('booking.created', %s, rate_limit => 2)", (receiver.url,))
    worker.execute("SELECT count(*) FROM outbox_enqueue_batch('booking.created', array(SELECT '{}'::jsonb FROM generate_series(1, 300)))")
    receiver.wait_for(2, timeout=5)
    busy = cpu_share(worker_pid(worker))
    assert busy < 0.2, f"the worker used {busy:.0%} of a CPU waiting for its rate limit"
    assert 4 <= len(receiver.requests) <= 14, f"{len(receiver.requests)} requests at 2 a second"


def test_a_worker_out_of_payload_memory_waits_for_an_answer(worker, receiver):
    """outbox.worker_memory spent by a slow request: the next payload waits for room, the
    worker for the answer. It ran a claim after another, each reading every due payload."""
    configure_worker({"outbox.worker_memory": "64kB"})
    receiver.answer_by_default(200, delay=3)
    worker.execute("SELECT outbox_subscribe('booking.created', %s, timeout => interval '10 seconds')", (receiver.url,))
    worker.execute("SELECT count(*) FROM outbox_enqueue_batch('booking.created', "
                   "array(SELECT jsonb_build_object('pad', repeat('x', 40000)) FROM generate_series(1, 5)))")
    eventually(lambda: receiver.started >= 1, what="the first request")
    busy = cpu_share(worker_pid(worker), 2.0)
    assert busy < 0.2, f"the worker used {busy:.0%} of a CPU while its payload memory was spent"
    assert receiver.max_concurrent == 1, "two 40 kB payloads at once within 64 kB"


def test_a_retry_falls_due_without_waiting_for_the_poll_interval(worker, receiver):
    """A failed attempt's retry is due after the backoff (200 ms here): the worker wakes then and
    sends it, asleep meanwhile. It woke, found no step to run, and spun until its next poll."""
    configure_worker({"outbox.poll_interval": "30s"})
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    time.sleep(0.5)
    receiver.answer(500)
    message_id, _ = enqueue(worker)
    receiver.wait_for(1, timeout=5)
    busy = cpu_share(worker_pid(worker), 2.0)
    receiver.wait_for(2, timeout=5)
    assert busy < 0.2, f"the worker used {busy:.0%} of a CPU while a retry fell due"
    eventually(status_is(worker, message_id, "DONE"), timeout=5, what="the retry's success")


def trickling_receiver():
    """A receiver that reads 16 kB of each request every half second, and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)

    def trickle(connection):
        with connection:
            while True:
                try:
                    if not connection.recv(16384):
                        return
                except OSError:
                    return
                time.sleep(0.5)

    def accept():
        while True:
            try:
                connection, _ = listener.accept()
            except OSError:
                return  # closed
            connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
            threading.Thread(target=trickle, args=(connection,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener


def test_a_receiver_that_reads_a_large_body_slowly_is_cut_off_by_the_timeout(worker):
    """A receiver that takes a 5 MB body a little at a time: the request ends by its timeout,
    and the retry starts after it. ureq bounds each write by the time left when it starts, so
    every partial write waited that long again: a 2 s timeout took 4 s (the helper thread, and
    the delivery's lease, held twice as long as the endpoint's timeout says)."""
    listener = trickling_receiver()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/hook"
        worker.execute("SELECT outbox_subscribe('booking.created', %s, timeout => interval '2 seconds')", (url,))
        worker.execute("SELECT outbox_enqueue('booking.created', jsonb_build_object('pad', repeat('y', 5000000)))")
        attempts = "SELECT started_at, duration, error FROM outbox_delivery_attempts ORDER BY started_at"
        eventually(lambda: len(worker.execute(attempts).fetchall()) >= 2, timeout=30, what="two attempts")
        rows = worker.execute(attempts).fetchall()
    finally:
        listener.close()
    for started, duration, error in rows:
        assert duration < datetime.timedelta(seconds=3), f"an attempt with a 2 s timeout lasted {duration}"
        assert error == "timeout after 2s", error
    for (started, duration, _), (next_started, _, _) in zip(rows, rows[1:]):
        assert started + duration <= next_started, "the next attempt started while this one was out"


def test_a_database_setting_applies_to_the_worker_at_a_reload(worker, receiver):
    """ALTER DATABASE … SET outbox.backoff_base, then a reload: the worker's next retry waits
    the database's base (60 s), not the server's (200 ms here). It applied database settings
    only when it started."""
    database = worker.execute("SELECT current_database()").fetchone()[0]
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    worker.execute(f"ALTER DATABASE {database} SET outbox.backoff_base = '60s'")
    try:
        configure_worker({})  # a reload
        receiver.answer(500)
        message_id, _ = enqueue(worker)
        eventually(lambda: delivery(worker, message_id)[2] == "HTTP 500", what="the failed attempt")
        due_in = worker.execute("SELECT available_at - now() FROM outbox_delivery WHERE message_id = %s", (message_id,)).fetchone()[0]
        assert due_in > datetime.timedelta(seconds=30), f"the retry is due in {due_in}"
    finally:
        worker.execute(f"ALTER DATABASE {database} RESET outbox.backoff_base")


def test_a_slow_endpoint_is_cut_off_by_its_timeout(worker, receiver):
    worker.execute("SELECT outbox_subscribe('booking.created', %s, timeout => interval '500 milliseconds')", (receiver.url,))
    receiver.answer(200, delay=3)
    message_id, _ = enqueue(worker)

    eventually(lambda: delivery(worker, message_id)[2] is not None, what="the failed attempt to be recorded")
    assert delivery(worker, message_id)[2] == "timeout after 500ms"
    eventually(status_is(worker, message_id, "DONE"), what="the retry (answered at once) to succeed")


def test_receiver_down_enqueues_keep_committing_and_the_backlog_drains(worker, receiver):
    url = receiver.url
    receiver.stop()  # the endpoint is down: connections are refused
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (url,))
    started = time.monotonic()
    ids = [enqueue(worker, payload={"n": n})[0] for n in range(200)]
    elapsed = time.monotonic() - started
    assert elapsed < 10, f"200 enqueue transactions took {elapsed:.1f}s while the endpoint was down"

    eventually(
        lambda: worker.execute("SELECT count(*) FROM outbox_deliveries WHERE last_error = 'connection refused'").fetchone()[0] > 0,
        what="failed attempts",
    )
    assert worker.execute("SELECT count(*) FROM outbox WHERE status = 'DEAD'").fetchone()[0] == 0

    back = Receiver(port=receiver.port).start()  # the endpoint recovers on the same port
    try:
        eventually(
            lambda: worker.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == len(ids),
            timeout=60,
            what="the backlog to drain",
        )
        delivered = {r["headers"]["webhook-id"] for r in back.requests}
        expected = {row[0] for row in worker.execute("SELECT public_id::text FROM outbox")}
        assert delivered == expected
    finally:
        back.stop()


def test_sigterm_lets_the_deliveries_in_flight_finish_and_records_them(worker, receiver):
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    receiver.answer_by_default(200, delay=0.8)
    with worker.transaction():  # one commit: one batch
        worker.execute("SELECT outbox_enqueue('booking.created', jsonb_build_object('n', n)) FROM generate_series(1, 4) n")
    receiver.wait_for(4, started=True)  # all four requests are in flight
    pid = worker_pid(worker)
    os.kill(pid, signal.SIGTERM)

    eventually(lambda: worker_pid(worker) != pid, what="the worker to exit")
    done = worker.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0]
    assert done == 4, "the worker finished the requests in flight and recorded them before exiting"
    assert len(receiver.requests) == 4, "and started none after SIGTERM"
    # The launcher starts another, which goes on serving; the status shows it alone.
    eventually(lambda: worker_pid(worker), timeout=20, what="the worker to come back")
    statuses = worker.execute("SELECT pid FROM outbox_worker_status() WHERE database = current_database()").fetchall()
    assert statuses == [(worker_pid(worker),)], statuses


def test_a_stop_waits_for_a_slow_endpoint_ten_seconds_at_most(worker, receiver):
    """A fast shutdown waits for the worker, which waited for its slowest request in flight: with
    an endpoint's timeout of a minute, 56.5 s (stop 39's probe), near pg_ctl's 60 s and far
    from what a stop should take. It now waits 10 s at most; the next worker sends the
    unanswered request again."""
    worker.execute("SELECT outbox_subscribe('booking.created', %s, timeout => interval '60 seconds')", (receiver.url,))
    receiver.answer(200, delay=40)  # the first request; the next ones are answered at once
    message_id, _ = enqueue(worker)
    receiver.wait_for(1, started=True)
    pid = worker_pid(worker)
    signalled = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    eventually(lambda: worker_pid(worker) != pid, timeout=60, what="the worker to exit")
    waited = time.monotonic() - signalled
    assert waited < 25, f"the worker took {waited:.0f} s to stop (10 s at most, plus a wide margin)"
    eventually(status_is(worker, message_id, "DONE"), timeout=30, what="the next worker to send it again")


def read_once_recovered(read):
    """read(conn) on a new connection; None while the cluster recovers from a crash."""
    try:
        with connect(autocommit=True) as conn:
            return read(conn)
    except psycopg.OperationalError:
        return None  # still recovering


def test_a_worker_killed_mid_batch_loses_nothing(worker, receiver):
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    receiver.answer_by_default(200, delay=0.05)
    ids = [enqueue(worker, payload={"n": n})[0] for n in range(60)]
    receiver.wait_for(15)
    os.kill(worker_pid(worker), signal.SIGKILL)  # the postmaster resets the whole cluster

    def all_done(conn):
        return conn.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == len(ids)

    eventually(lambda: read_once_recovered(all_done), timeout=90, interval=0.5, what="every message to be delivered after the crash")
    with connect(autocommit=True) as conn:
        expected = {row[0] for row in conn.execute("SELECT public_id::text FROM outbox")}
    delivered = [r["headers"]["webhook-id"] for r in receiver.requests if r["status"] == 200]
    assert set(delivered) >= expected, "nothing lost"
    duplicates = len(delivered) - len(set(delivered))
    assert duplicates <= 10 + 8, f"{duplicates} duplicates: more than one batch in flight"


def kill_the_worker(after: float = 0.0):
    """SIGKILL to the test database's worker, `after` seconds once there is one (the
    postmaster resets the whole cluster)."""
    running = eventually(lambda: read_once_recovered(worker_pid), timeout=60, interval=0.2, what="the worker")
    time.sleep(after)
    os.kill(running, signal.SIGKILL)
    time.sleep(0.3)  # (the cluster's reset begins)


def dead_deliveries_once_every_message_ended(count):
    """Waits for the `count` messages to end; returns the dead deliveries as (subscription,
    message's public id, last error)."""

    def ended(conn):
        return conn.execute("SELECT count(*) FROM outbox WHERE status <> 'PENDING'").fetchone()[0] == count

    eventually(lambda: read_once_recovered(ended), timeout=90, interval=0.5, what="every message to end")
    with connect(autocommit=True) as conn:
        return conn.execute("SELECT subscription_id, public_id::text, last_error FROM outbox_deliveries WHERE status = 'DEAD'").fetchall()


def requested(receiver):
    """The webhook ids the receiver was sent, once every request it began has its answer."""
    return {r["headers"]["webhook-id"] for r in receiver.wait_for(receiver.started, timeout=30)}


def test_a_worker_killed_twice_dead_letters_no_delivery_it_never_sent(worker, receiver):
    """A lease counts an attempt, and a crash keeps it counted (a request in flight may have
    gone out). The worker leases rounds ahead of its slots, so a crash also counted an attempt
    for every delivery queued behind them, never sent: stop 55's probe saw 32 of 40 deliveries
    to a healthy endpoint dead-lettered after two kill -9 (max_attempts 2), none of them ever
    requested. A delivery's last attempt is now leased only to start at once."""
    configure_worker({"outbox.max_attempts": "2", "outbox.max_in_flight": "1"})
    worker.execute("SELECT outbox_subscribe('booking.created', %s, timeout => interval '10 seconds')", (receiver.url,))
    receiver.answer_by_default(200, delay=1.0)
    ids = [enqueue(worker, payload={"n": n})[0] for n in range(8)]
    receiver.wait_for(1, timeout=60, started=True)  # the others are leased, queued behind it
    kill_the_worker()
    receiver.wait_for(2, timeout=60, started=True)
    kill_the_worker()

    dead = dead_deliveries_once_every_message_ended(len(ids))
    unsent = {public_id for _, public_id, _ in dead} - requested(receiver)
    assert not unsent, f"{len(unsent)} of {len(ids)} deliveries dead-lettered without a request"
    assert len(dead) <= 2, "only those in flight at a kill may die"
    # (It said "did the consumer crash?" until 0.5.32, as for a SQL consumer's lease.)
    assert all("(did the delivery worker crash?)" in reason for _, _, reason in dead), dead


def test_a_worker_killed_beside_other_endpoints_dead_letters_no_delivery_it_never_sent(worker, receivers):
    """The same with two endpoints sharing the slots and a third one idle (a slot is kept for
    it). A claim leased a last attempt to start at once, in a slot it counted free, but the
    other endpoint's queue started in that slot first: the last attempt waited for a request
    to end, and died unsent at a crash meanwhile. Stop 58's probe of crashes: 2 of 80 deliveries
    per run after three kill -9 (max_attempts 2), never requested."""
    configure_worker({"outbox.max_attempts": "2", "outbox.worker_batch_size": "100"})  # (leases ahead)
    first, second, idle = receivers(), receivers(), receivers()
    subscriptions = {}
    for receiver in (first, second):
        receiver.answer_by_default(200, delay=0.5)
        subscription = worker.execute(
            "SELECT outbox_subscribe('booking.created', %s, timeout => interval '10 seconds')", (receiver.url,)
        ).fetchone()[0]
        subscriptions[subscription] = receiver
    worker.execute("SELECT outbox_subscribe('booking.other', %s)", (idle.url,))
    count = 40
    worker.execute("SELECT outbox_enqueue_batch('booking.created', array(SELECT jsonb_build_object('n', n) FROM generate_series(1, %s) n))", (count,))
    for _ in range(3):
        kill_the_worker(after=1.2)  # (requests in flight, others leased and queued)

    dead = dead_deliveries_once_every_message_ended(count)
    sent = {subscription: requested(receiver) for subscription, receiver in subscriptions.items()}
    unsent = [(subscription, public_id) for subscription, public_id, _ in dead if public_id not in sent[subscription]]
    assert unsent == [], f"{len(unsent)} of {2 * count} deliveries dead-lettered without a request ({len(dead)} dead)"


def attempts_counted_and_sent(conn, subscriptions):
    """(subscription, message, attempts counted, attempts sent) of each delivery to
    `subscriptions`: sent is what the attempt log recorded."""
    return conn.execute(
        """SELECT d.subscription_id, d.message_id, d.attempts,
                  (SELECT count(*) FROM outbox_delivery_attempts a
                    WHERE a.subscription_id = d.subscription_id AND a.message_id = d.message_id)
             FROM outbox_delivery d WHERE d.subscription_id = ANY (%s)""", (subscriptions,)
    ).fetchall()


def test_deliveries_queued_behind_requests_that_hang_are_handed_back_with_their_attempts_uncounted(worker, receiver):
    """New endpoints lease rounds ahead; once they hang, each gets a slot only now and then, and
    what they leased waits past its time to start. Found late only when its endpoint got a slot,
    such a delivery was past its lease's end: its attempt stayed counted, and a later lease
    counted another (stop 59's probe of many endpoints: 208 deliveries with 2 attempts counted
    and none sent, 57 dead after 4 counted and 3 sent). Every attempt counted is one sent."""
    configure_worker({"outbox.max_in_flight": "2", "outbox.worker_batch_size": "100", "outbox.max_attempts": "50"})
    receiver.answer_by_default(200, delay=30)  # every request hangs past its endpoint's timeout
    subscriptions = [
        worker.execute("SELECT outbox_subscribe('booking.created', %s, timeout => interval '1 second')", (f"{receiver.url}?endpoint={n}",)).fetchone()[0]
        for n in range(10)
    ]
    worker.execute("SELECT outbox_enqueue_batch('booking.created', array(SELECT jsonb_build_object('n', n) FROM generate_series(1, 3) n))")
    time.sleep(20)
    for subscription in subscriptions:
        worker.execute("SELECT outbox_disable_subscription(%s)", (subscription,))
    time.sleep(4)  # the requests in flight end by their timeout and are recorded; the queued are handed back
    counts = attempts_counted_and_sent(worker, subscriptions)
    assert len(counts) == 30
    assert sum(sent for *_, sent in counts) >= 10, "each endpoint was tried"
    uncounted = [(subscription, message, counted, sent) for subscription, message, counted, sent in counts if counted > sent]
    assert uncounted == [], f"{len(uncounted)} of 30 deliveries with attempts counted and never sent"


def test_deliveries_queued_behind_long_requests_are_handed_back_in_time_whatever_the_poll_interval(worker, receiver):
    """The slots are held by requests to slow endpoints (a 15 s timeout) and nothing else wakes
    the worker (a 1 h poll interval, no answers, no commits): the deliveries queued for other
    endpoints (a 1 s timeout) must be handed back by their time to start, before their leases
    end 2.5 s later. Until 0.5.38 the worker slept until the next answer, 15 s on: their leases
    had run out, and the attempts they were leased for stayed counted, never sent."""
    configure_worker({"outbox.max_in_flight": "2", "outbox.poll_interval": "1h", "outbox.max_attempts": "50"})
    receiver.answer_by_default(200, delay=30)  # every request hangs past its endpoint's timeout
    for n in range(2):
        worker.execute("SELECT outbox_subscribe('slow.created', %s, timeout => interval '15 seconds')", (f"{receiver.url}?slow={n}",))
    quick = [
        worker.execute("SELECT outbox_subscribe('booking.created', %s, timeout => interval '1 second')", (f"{receiver.url}?quick={n}",)).fetchone()[0]
        for n in range(4)
    ]
    worker.execute("SELECT outbox_enqueue('slow.created', '{}')")
    eventually(lambda: receiver.started == 2, what="both slots taken by the slow endpoints' requests")
    worker.execute("SELECT outbox_enqueue_batch('booking.created', array(SELECT jsonb_build_object('n', n) FROM generate_series(1, 3) n))")
    time.sleep(8)  # the quick endpoints' first leases (6 s) have ended; the slow requests are still out
    for subscription in quick:
        worker.execute("SELECT outbox_disable_subscription(%s)", (subscription,))
    eventually(lambda: worker.execute("SELECT count(*) FROM outbox_delivery_attempts").fetchone()[0] >= 2,
               what="the slow requests ended by their timeout (the worker woke, handed back what it held)")
    counts = attempts_counted_and_sent(worker, quick)
    assert len(counts) == 12
    assert all(sent == 0 for *_, sent in counts), "no slot was free for the quick endpoints"
    counted = [(subscription, message, attempts) for subscription, message, attempts, _ in counts if attempts > 0]
    assert counted == [], f"{len(counted)} of 12 deliveries with attempts counted and never sent"


def test_a_failed_step_forgets_nothing_it_knew_was_due(worker, receiver):
    """A step that fails (a lock timeout, a serialization failure: here a trigger that fails
    the first lease) rolls back its pick-up and its leases, and the worker tries again 100 ms
    later. What the step had learnt on the way (no more messages ready, nothing more due at the
    endpoint) was kept: until 0.5.38 the message waited for the next poll, up to
    outbox.poll_interval (1 h here), or another producer's commit."""
    configure_worker({"outbox.poll_interval": "1h"})
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    worker.execute("""
        CREATE SEQUENCE public.leases_seen;
        CREATE FUNCTION public.fail_the_first_lease() RETURNS trigger LANGUAGE plpgsql
            SECURITY DEFINER SET search_path = pg_catalog AS $$
        BEGIN
            IF nextval('public.leases_seen') = 1 THEN
                RAISE EXCEPTION 'the first lease fails';
            END IF;
            RETURN NEW;
        END $$;
        CREATE TRIGGER fail_the_first_lease BEFORE UPDATE ON outbox_delivery
            FOR EACH ROW EXECUTE FUNCTION public.fail_the_first_lease()""")
    try:
        log = ServerLog()
        message_id, _ = enqueue(worker)
        eventually(lambda: "the first lease fails" in log.since(), timeout=10, what="the step that failed")
        receiver.wait_for(1, timeout=10)
        eventually(status_is(worker, message_id, "DONE"), timeout=10)
    finally:
        worker.execute("DROP TRIGGER fail_the_first_lease ON outbox_delivery; DROP FUNCTION public.fail_the_first_lease(); DROP SEQUENCE public.leases_seen")


def test_only_administrators_manage_subscriptions(worker):
    worker.execute("DROP ROLE IF EXISTS outbox_app")
    worker.execute("CREATE ROLE outbox_app LOGIN")
    worker.execute("SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/x', outbox_generate_secret())")
    try:
        with connect(user="outbox_app", autocommit=True) as app:
            for statement in (
                "SELECT outbox_subscribe('booking.created', 'https://evil.example.test/')",
                "SELECT outbox_unsubscribe('booking.created')",
                "SELECT secret FROM outbox_subscription",
                "SELECT * FROM outbox_subscriptions",
            ):
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    app.execute(statement)
            # Which topics are delivered is no secret.
            assert app.execute("SELECT topic FROM outbox_topics()").fetchall() == [("booking.created",)]
    finally:
        worker.execute("DROP ROLE outbox_app")


@pytest.mark.parametrize(
    "url",
    ["ftp://example.test/x", "file:///etc/passwd", "example.test/hook", "http://", "https://u:p@example.test/", "http://a b/",
     "http://hooks..example.test/", "http://%68ooks.example.test/", "http://" + "h" * 64 + ".example.test/"],
)
def test_subscriptions_refuse_urls_that_are_not_http_endpoints(db, url):
    with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
        db.execute("SELECT outbox_subscribe('booking.created', %s)", (url,))
    assert "outbox_subscribe: url" in str(caught.value)
    assert db.execute("SELECT count(*) FROM outbox_subscription").fetchone()[0] == 0


def test_subscriptions_refuse_bad_secrets_headers_and_timeouts(db):
    for args, needle in [
        ("secret => 'hunter2'", "secret"),
        ("headers => '{\"Webhook-Signature\": \"x\"}'", "headers"),
        ("headers => '[1]'", "headers"),
        ("timeout => interval '1 hour'", "timeout"),
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue) as caught:
            db.execute(f"SELECT outbox_subscribe('booking.created', 'https://hooks.example.test/', {args})")
        assert f"outbox_subscribe: {needle}" in str(caught.value)


def test_the_worker_is_visible(worker):
    row = worker.execute(
        "SELECT backend_type, application_name FROM pg_stat_activity WHERE pid = %s", (worker_pid(worker),)
    ).fetchone()
    assert row == ("outbox_ext delivery worker", "outbox_ext delivery worker")
    status = worker.execute("SELECT database, pid, started_at <= now(), last_poll_at IS NOT NULL FROM outbox_worker_status() WHERE database = current_database()").fetchone()
    assert status == ("outbox_integration", worker_pid(worker), True, True)


def test_drop_and_create_extension_end_and_start_the_worker_quietly(worker, receiver):
    """Without the extension a database has no worker; CREATE EXTENSION starts one within
    moments (no restart, no setting), and nothing is logged as an error either way."""
    log = pathlib.Path(os.environ["OUTBOX_TEST_SERVER_LOG"])
    log_before = log.stat().st_size
    worker.execute("DROP EXTENSION outbox_ext CASCADE")
    eventually(lambda: worker_pid(worker) is None, timeout=10, what="the worker to stop")
    time.sleep(2)
    assert worker_pid(worker) is None, "no worker comes back without the extension"

    created = time.monotonic()
    worker.execute("CREATE EXTENSION outbox_ext")
    eventually(lambda: worker_pid(worker), timeout=10, what="a worker after CREATE EXTENSION")
    assert time.monotonic() - created < 5
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    message_id, _ = enqueue(worker)
    eventually(status_is(worker, message_id, "DONE"), what="delivery once the extension is back")
    written = log.read_bytes()[log_before:].decode(errors="replace")
    assert "ERROR" not in written and "FATAL" not in written, written


def test_a_worker_stopped_beside_a_lock_leaves_at_its_steps_lock_timeout(worker, receiver):
    """A SIGTERM while a step waited for a lock let the worker go on to its housekeeping,
    whose three statements each waited their lock_timeout (10 s) too: it took 27 - 28 s to stop
    where the docs say 10 s at most (stop 58's probe of crashes). Once asked to stop it starts
    none of them."""
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    pid = worker_pid(worker)
    with connect() as locker:
        locker.execute("LOCK TABLE outbox_delivery IN ACCESS EXCLUSIVE MODE")
        worker.execute("SELECT outbox_enqueue_batch('booking.created', ARRAY['{}'::jsonb, '{}'::jsonb])")
        eventually(lambda: worker.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == "Lock",
                   what="the worker's step waiting for the lock")
        worker.execute("SELECT pg_terminate_backend(%s)", (pid,))
        asked = time.monotonic()
        eventually(lambda: worker.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()[0] == 0,
                   timeout=60, interval=0.1, what="the worker to stop")
        took = time.monotonic() - asked
    # (Its step's statement waits out lock_timeout, 10 s; before, three more did.)
    assert took < 18, f"the worker took {took:.1f} s to stop"
    eventually(lambda: receiver.requests, timeout=30, what="delivery by the next worker")


def test_a_worker_whose_steps_fail_says_so_in_its_state(worker, receiver):
    """A lock held past the worker's lock_timeout fails every step, and it said `idle` all
    along (stop 58's probe of crashes)."""
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))

    def state():
        return worker.execute("SELECT state FROM outbox_worker_status() WHERE database = current_database()").fetchone()[0]

    with connect() as locker:
        locker.execute("LOCK TABLE outbox_delivery IN ACCESS EXCLUSIVE MODE")
        worker.execute("SELECT outbox_enqueue('booking.created', '{}')")
        eventually(lambda: state() == "retrying: its last step failed (see the server log)", timeout=30,
                   what="the worker's state to say its steps fail")
    eventually(lambda: receiver.requests, timeout=30, what="the delivery once the lock is gone")
    eventually(lambda: state() in ("idle", "delivering"), what="the state back to normal")


def test_a_serializable_default_does_not_break_the_worker(worker, receiver):
    """0.3.0 ran its transactions at the database's default isolation: with `serializable`
    and SQL consumers beside it, it hit 40001, exited and restarted every 5 s."""
    worker.execute("ALTER DATABASE outbox_integration SET default_transaction_isolation = 'serializable'")
    try:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                          "WHERE backend_type = 'outbox_ext delivery worker' AND datname = 'outbox_integration'")
        eventually(lambda: worker_pid(worker), timeout=30, what="the worker to start again")
        eventually(lambda: worker.execute("SELECT state FROM outbox_worker_status() WHERE database = current_database()").fetchone() in [("idle",), ("delivering",)],
                   what="the worker to find the extension")
        pid = worker_pid(worker)
        worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
        stop = time.monotonic() + 8
        consumed = 0
        with connect(autocommit=True) as producer, connect(autocommit=True) as consumer:
            assert consumer.execute("SHOW transaction_isolation").fetchone()[0] == "serializable"
            while time.monotonic() < stop:
                producer.execute("SELECT outbox_enqueue('booking.created', '{}')")
                producer.execute("SELECT outbox_enqueue('report.due', '{}')")
                try:
                    with consumer.transaction():
                        for id, token in consumer.execute("SELECT id, lease_token FROM outbox_claim(5, ARRAY['report.due'])").fetchall():
                            consumer.execute("SELECT outbox_complete(%s::bigint, %s::uuid)", (id, token))
                            consumed += 1
                except psycopg.errors.SerializationFailure:
                    pass  # the SQL consumer's own conflict, retried by its next round
        assert consumed > 0
        eventually(lambda: worker.execute("SELECT count(*) FROM outbox WHERE topic = 'booking.created' AND status <> 'DONE'").fetchone()[0] == 0,
                   what="every webhook delivered")
        assert worker_pid(worker) == pid, "the worker exited and was restarted"
    finally:
        worker.execute("ALTER DATABASE outbox_integration RESET default_transaction_isolation")


def test_untyped_parameters_call_the_batch_complete_unambiguously(db):
    """node-postgres and tokio-postgres send parameters untyped: outbox_complete($1) with the
    batch form beside it was ambiguous. outbox_complete_batch has a name of its own."""
    ids = [db.execute("SELECT (outbox_enqueue('booking.created', '{}')).id").fetchone()[0] for _ in range(3)]
    tokens = [db.execute("SELECT lease_token FROM outbox_claim(1)").fetchone()[0] for _ in ids]
    # PREPARE without parameter types is what those drivers do (over the simple protocol here).
    untyped = psycopg.ClientCursor(db)
    with pytest.raises(psycopg.errors.AmbiguousFunction):
        untyped.execute("PREPARE complete_one AS SELECT outbox_complete($1)")
    untyped.execute("PREPARE complete_them AS SELECT outbox_complete_batch($1, $2)")
    untyped.execute("EXECUTE complete_them(%s, %s)", ("{" + ",".join(map(str, ids)) + "}", "{" + ",".join(map(str, tokens)) + "}"))
    assert untyped.fetchone()[0] == 3
    # The old name still works for a release (deprecated).
    db.execute("SELECT outbox_enqueue('booking.created', '{}')")
    assert db.execute("SELECT outbox_complete(ARRAY[4]::bigint[])").fetchone()[0] == 1


def test_many_subscribed_topics_behind_a_backlog_of_another_topic_do_not_stall_the_worker(worker, receiver):
    """The worker's pick-up walks past the ready rows of topics no endpoint takes (an SQL
    consumer's). It compared each of them with every subscribed topic: with 2,000 topics
    subscribed behind 100,000 such rows, a message took over a minute and a half to go out,
    and in one run its delivery's lease ran out during the step until it was dead, never sent
    (a bad-input audit). The topics are hashed once per statement now."""
    worker.execute("SELECT count(*) FROM outbox_enqueue_batch('sql.consumers.topic', "
                   "(SELECT array_agg(jsonb_build_object('n', n)) FROM generate_series(1, 100000) n))")
    worker.execute("SELECT count(outbox_subscribe('t' || n, %s)) FROM generate_series(1, 2000) n", (receiver.url,))
    worker.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
    message_id, _ = enqueue(worker)
    receiver.wait_for(1, timeout=20)
    eventually(status_is(worker, message_id, "DONE"), timeout=10)


def test_a_step_longer_than_a_lease_sends_no_delivery_a_second_time(worker, receiver):
    """A delivery is leased for one request: its timeout and 5 s. The answer of a request that
    came back while a step ran waits for the next step to be recorded; the step's own claim,
    reading leases run out by its clock, took a step that lasted past the lease (a slow disk, a
    wait for a lock) for a lease nobody held: it leased the delivery again and sent it a second
    time, and the first answer was never recorded. The claim reads the leases run out by the
    time the answers were last taken. The worker's main thread is stopped in a step here while
    its helper thread's request comes back."""
    worker.execute("SELECT outbox_subscribe('booking.created', %s, timeout => '3 seconds')", (receiver.url,))
    receiver.answer(200, delay=2)
    message_id, _ = enqueue(worker)
    receiver.wait_for(1, timeout=10, started=True)
    with PausedAt(worker_pid(worker), "SPI_connect", only_that_thread=True) as paused:
        paused.wait()  # in a step, whose answers were taken before the request came back
        assert receiver.requests == [], "paused before the answer (else this tests nothing)"
        time.sleep(8.5)  # past the lease: 3 s and 5 s from the request's start
    eventually(status_is(worker, message_id, "DONE"), timeout=10)
    time.sleep(1)
    assert len(receiver.requests) == 1, [r["headers"].get("webhook-id") for r in receiver.requests]
    assert delivery(worker, message_id)[:2] == ("DONE", 1)
