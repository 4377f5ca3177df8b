"""A worker no endpoint can stall: each request is independent, leases cover one request,
shutdown starts nothing new and waits only for what is in flight, a crashed worker's deliveries
come back in seconds, memory is bounded. Each measurement of the hostile test of 0.3.0,
repeated with its target. These tests run their own cluster (they stop and crash it)."""

import json
import os
import signal
import statistics
import threading
import time

import pytest

from support import eventually
from support.cluster import ScratchCluster
from support.receiver import Receiver

PORT = 25341
DATABASE = "rounds"


@pytest.fixture(scope="module")
def cluster():
    cluster = ScratchCluster(PORT, conf="outbox.backoff_jitter = 0\noutbox.poll_interval = '200ms'").start()
    yield cluster
    cluster.remove()


@pytest.fixture()
def db(cluster):
    cluster.create_database(DATABASE)
    eventually(lambda: DATABASE in cluster.worker_pids(), what="the database's worker")
    with cluster.connect(DATABASE) as conn:
        yield conn


@pytest.fixture()
def receivers():
    started = []

    def start(**answer):
        receiver = Receiver().start()
        if answer:
            receiver.answer_by_default(**answer)
        started.append(receiver)
        return receiver

    yield start
    for receiver in started:
        receiver.stop()


class Hanging:
    """An endpoint that accepts connections and never answers."""

    def __init__(self):
        import socket
        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(256)
        self.accepted = []
        self.accepted_at = []
        self.running = True
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while self.running:
            try:
                connection, _ = self.server.accept()
                self.accepted.append(connection)
                self.accepted_at.append(time.time())
            except OSError:
                return

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server.getsockname()[1]}/hang"

    def close(self):
        self.running = False
        for connection in self.accepted:
            connection.close()
        self.server.close()


@pytest.fixture()
def hanging():
    endpoint = Hanging()
    yield endpoint
    endpoint.close()


def enqueue(conn, topic, n=1):
    conn.execute("SELECT outbox_enqueue(%s, jsonb_build_object('n', g)) FROM generate_series(1, %s) g", (topic, n))


def test_a_hanging_endpoint_does_not_hold_up_a_healthy_topic(db, receivers, hanging):
    """0.3.0: one hanging endpoint delayed a healthy topic's webhook from 0.014 s to 9.05 s."""
    healthy = receivers()
    db.execute("SELECT outbox_subscribe('hol.slow', %s, timeout => '10 seconds')", (hanging.url,))
    db.execute("SELECT outbox_subscribe('hol.fast', %s)", (healthy.url,))
    enqueue(db, "hol.slow", 40)  # more than every in-flight slot
    time.sleep(1)
    latencies = []
    for n in range(40):
        committed = time.time()
        db.execute("SELECT outbox_enqueue('hol.fast', %s::jsonb)", (json.dumps({"n": n}),))
        request = healthy.wait_for(n + 1)[-1]
        latencies.append(request["received_at"] - committed)
        time.sleep(0.02)
    p99 = statistics.quantiles(latencies, n=100)[98]
    assert p99 < 0.050, f"commit -> receiver p99 {p99 * 1000:.1f} ms with an endpoint hanging"
    in_flight = db.execute("SELECT in_flight FROM outbox_worker_status() WHERE database = current_database()").fetchone()[0]
    assert in_flight >= 1, "the hanging requests are counted in flight"


def test_in_flight_shows_the_requests_that_hang(db, hanging):
    """0.3.0: outbox_worker_status().in_flight showed 0 while 8 requests hung."""
    db.execute("SELECT outbox_subscribe('hang.x', %s, timeout => '30 seconds')", (hanging.url,))
    enqueue(db, "hang.x", 20)
    eventually(lambda: db.execute("SELECT in_flight FROM outbox_worker_status() WHERE database = current_database()").fetchone()[0] == 8,
               what="8 requests in flight (outbox.max_in_flight)")
    # The deliveries in the worker's hands: the 8 sent and the 12 queued behind them (a healthy
    # endpoint is leased rounds ahead), each leased for the rounds ahead of it.
    assert db.execute("SELECT count(*) FROM outbox_deliveries WHERE in_flight").fetchone()[0] == 20
    time.sleep(0.5)
    assert len(hanging.accepted) == 8, "no more than outbox.max_in_flight requests at once"
    leases = [row[0] for row in db.execute("SELECT extract(epoch FROM available_at - clock_timestamp()) FROM outbox_deliveries ORDER BY 1")]
    assert len(leases) == 20 and 30 + 5 < leases[-1] and all(lease <= 3 * 30 + 5 for lease in leases), leases


def test_a_lease_covers_one_request_and_never_more_than_ten_minutes(db, receivers, hanging):
    """0.3.0: one subscription with a 10-minute timeout gave every claimed message a lease of
    4 h 20 min."""
    db.execute("SELECT outbox_subscribe('lease.rare', %s, timeout => '10 minutes')", (hanging.url,))
    db.execute("SELECT outbox_subscribe('lease.fast', %s, timeout => '3 seconds')", (hanging.url + "/fast",))
    enqueue(db, "lease.rare", 2)
    enqueue(db, "lease.fast", 2)
    eventually(lambda: db.execute("SELECT count(*) FROM outbox_deliveries WHERE in_flight").fetchone()[0] == 4, what="4 in flight")
    leases = dict(db.execute("""SELECT topic, max(extract(epoch FROM available_at - clock_timestamp()))
                                  FROM outbox_deliveries WHERE in_flight GROUP BY topic""").fetchall())
    assert leases["lease.fast"] <= 3 + 5, "a lease is the request's own timeout plus a margin"
    assert leases["lease.rare"] <= 600, "no lease is longer than 10 minutes"


def test_memory_is_bounded_whatever_the_payloads(cluster, db, receivers):
    """0.3.0: five 30 MB payloads in one batch took the worker to 357 MB."""
    slow = receivers(delay=1.0)
    cluster.configure(**{"outbox.worker_memory": "40MB"})
    try:
        db.execute("SELECT outbox_subscribe('big.one', %s, timeout => '20 seconds')", (slow.url,))
        pid = cluster.worker_pids()[DATABASE]
        db.execute("SELECT outbox_enqueue('big.one', jsonb_build_object('blob', repeat('x', 30000000))) FROM generate_series(1, 5)")
        most_in_flight = 0
        deadline = time.monotonic() + 60
        while len(slow.requests) < 5 and time.monotonic() < deadline:
            in_flight = db.execute("SELECT in_flight FROM outbox_worker_status() WHERE database = current_database()").fetchone()[0]
            most_in_flight = max(most_in_flight, in_flight)
            time.sleep(0.05)
        assert len(slow.requests) == 5
        assert most_in_flight == 1, "a 30 MB request at a time within outbox.worker_memory = 40MB"
        peak_kb = int([line for line in open(f"/proc/{pid}/status") if line.startswith("VmHWM")][0].split()[1])
        assert peak_kb < 250_000, f"the worker peaked at {peak_kb // 1024} MB"
    finally:
        cluster.configure(**{"outbox.worker_memory": "64MB"})


def test_sigterm_starts_nothing_new_and_exits_within_the_requests_timeout(cluster, db, hanging):
    """0.3.0: after pg_terminate_backend the worker started 16 new requests and exited after 29 s."""
    db.execute("SELECT outbox_subscribe('stop.me', %s, timeout => '3 seconds')", (hanging.url,))
    enqueue(db, "stop.me", 24)
    eventually(lambda: len(hanging.accepted) == 8, what="8 requests in flight")
    pid = cluster.worker_pids()[DATABASE]
    terminated = time.time()
    db.execute("SELECT pg_terminate_backend(%s)", (pid,))
    stopped_line = f"[{pid}] LOG:  outbox_ext: delivery worker for database \"{DATABASE}\" stopped"
    line = eventually(lambda: next((l for l in cluster.server_log.read_text().splitlines() if stopped_line in l), None),
                      timeout=10, what="the worker to exit")
    # The log line's time (the server's clock, UTC, to the millisecond).
    stopped = time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) - time.timezone + float("0" + line[19:23])
    assert stopped - terminated < 3 + 1.5, "it exits once the requests in flight gave up"
    started_after = [at for at in hanging.accepted_at if terminated < at < stopped]
    assert started_after == [], "the terminated worker started no new request"
    failed = db.execute("SELECT count(*) FROM outbox_delivery_attempts WHERE error = 'timeout after 3s'").fetchone()[0]
    assert failed >= 8, "what finished (timed out) was recorded"


def test_a_fast_shutdown_waits_only_for_the_slowest_request_in_flight(cluster, db, receivers, hanging):
    """0.3.0: pg_ctl stop -m fast while an endpoint hung: "server does not shut down", 67 s."""
    db.execute("SELECT outbox_subscribe('stop.all', %s, timeout => '5 seconds')", (hanging.url,))
    enqueue(db, "stop.all", 24)
    eventually(lambda: len(hanging.accepted) == 8, what="8 requests in flight")
    time.sleep(1)
    took = cluster.pg_ctl("stop", "-m", "fast", "-t", "60")
    assert took < 4 + 1.5, f"pg_ctl stop -m fast took {took:.1f} s"
    cluster.pg_ctl("start")
    eventually(lambda: DATABASE in cluster.worker_pids(), what="the worker after the restart")


def test_after_kill_9_every_delivery_arrives_within_30_seconds(cluster, receivers):
    """0.3.0: after kill -9 mid-batch at the defaults, the last of 300 messages arrived 137 s
    later. Three endpoints: nothing lost; duplicates only for requests in flight at the kill."""
    cluster.configure(**{"outbox.poll_interval": "1s"})  # the default
    cluster.create_database(DATABASE)
    eventually(lambda: DATABASE in cluster.worker_pids(), what="the database's worker")
    endpoints = [receivers(delay=0.01) for _ in range(3)]
    with cluster.connect(DATABASE) as db:
        for endpoint in endpoints:
            db.execute("SELECT outbox_subscribe('crash.test', %s)", (endpoint.url,))
        enqueue(db, "crash.test", 300)
    endpoints[0].wait_for(30)
    os.kill(cluster.worker_pids()[DATABASE], signal.SIGKILL)  # the postmaster resets the cluster
    killed = time.monotonic()

    def all_delivered():
        return all(len({r["headers"]["webhook-id"] for r in e.requests if r["status"] == 200}) == 300 for e in endpoints)

    eventually(all_delivered, timeout=30, interval=0.2, what="all 300 at every endpoint within 30 s of the kill")
    recovered = time.monotonic() - killed
    for endpoint in endpoints:
        delivered = [r["headers"]["webhook-id"] for r in endpoint.requests if r["status"] == 200]
        duplicates = len(delivered) - len(set(delivered))
        assert duplicates <= 8, f"{duplicates} duplicates at one endpoint: more than the requests in flight"
    print(f"recovered in {recovered:.1f} s")
    cluster.configure(**{"outbox.poll_interval": "200ms"})


def test_drop_extension_mid_flight_stops_the_worker_at_once(cluster, db, hanging):
    """0.3.0: DROP EXTENSION mid-batch: the worker kept sending for 31 s with a transaction open."""
    db.execute("SELECT outbox_subscribe('drop.me', %s, timeout => '20 seconds')", (hanging.url,))
    enqueue(db, "drop.me", 30)
    eventually(lambda: len(hanging.accepted) == 8, what="8 requests in flight")
    pid = cluster.worker_pids()[DATABASE]
    dropped = time.monotonic()
    db.execute("DROP EXTENSION outbox_ext CASCADE")
    eventually(lambda: cluster.worker_pids().get(DATABASE) != pid, timeout=10, what="the worker to stop")
    assert time.monotonic() - dropped < 5
    assert len(hanging.accepted) == 8, "nothing sent after DROP EXTENSION"
    with cluster.connect() as admin:
        open_transactions = admin.execute("""SELECT count(*) FROM pg_stat_activity
                                              WHERE backend_type = 'outbox_ext delivery worker' AND xact_start IS NOT NULL""").fetchone()[0]
    assert open_transactions == 0
