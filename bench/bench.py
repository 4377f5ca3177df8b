#!/usr/bin/env python3
"""outbox_ext's benchmark harness. Run it through bench/run.sh, which builds and installs the
extension first.

It starts its own scratch cluster (127.0.0.1, durable settings) and an nginx receiver, measures
outbox_ext side by side with a reference in the same run, writes bench/results/latest.md and
latest.png, and cleans up. Every headline figure is a ratio against its reference, because
absolute numbers drift on a shared 2-core machine.

  --smoke    seconds instead of minutes: proves the harness still works (the test command runs it)
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import tempfile
import threading
import time

import psycopg

ROOT = pathlib.Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def pg_config(option: str) -> str:
    """A setting of the PostgreSQL version chosen by PG, from its pg_config, whose path
    scripts/common.sh exports as OUTBOX_PG_CONFIG (bench/run.sh and scripts/test.sh source it)."""
    path = os.environ.get("OUTBOX_PG_CONFIG")
    if not path:
        raise SystemExit("OUTBOX_PG_CONFIG is not set: run this through bench/run.sh or scripts/test.sh (PG=15|16|17|18)")
    return subprocess.run([path, option], check=True, capture_output=True, text=True).stdout.strip()


# The server's programs (pg_ctl, pgbench): OUTBOX_PG_BIN, exported with OUTBOX_PG_CONFIG.
PG_BIN = pathlib.Path(os.environ.get("OUTBOX_PG_BIN") or pg_config("--bindir"))
DATABASE = "outbox_bench"
PAYLOAD = json.dumps(
    {
        "bookingId": "5f0c6a53-2f7e-4a8e-9a3e-0d4c1c1f2b11",
        "guestEmail": "ada.lovelace@example.test",
        "propertyTitle": "Sea view loft",
        "checkIn": "2026-12-01",
        "checkOut": "2026-12-05",
        "total": "640.00",
        "idempotencyKey": "booking-created:5f0c6a53",
    },
    separators=(",", ":"),
)

CLUSTER_CONF = """
fsync = on
synchronous_commit = on
shared_buffers = 512MB
max_wal_size = 4GB
checkpoint_timeout = 15min
max_connections = 100
outbox.worker_databases = 'outbox_bench'
outbox.worker_batch_size = 100
"""

REFERENCE_TABLES = """
DROP TABLE IF EXISTS plain_queue, essay_outbox, minimal_outbox;
CREATE TABLE plain_queue (id bigserial PRIMARY KEY, payload jsonb NOT NULL);
-- The least an outbox can be and still claim at a flat cost: a key to complete messages by
-- and a partial index of the ready ones (no public_id, no attempts, no history columns).
CREATE TABLE minimal_outbox (
    id           bigserial     PRIMARY KEY,
    topic        varchar(64)   NOT NULL,
    payload      jsonb         NOT NULL,
    status       outbox_status NOT NULL DEFAULT 'PENDING',
    available_at timestamptz   NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON minimal_outbox (available_at, id) WHERE status = 'PENDING';
-- The essay's table, verbatim, with its index.
CREATE TABLE essay_outbox (
    id           BIGSERIAL PRIMARY KEY,
    public_id    UUID        NOT NULL UNIQUE,
    topic        VARCHAR(64) NOT NULL,
    payload      JSONB       NOT NULL,
    status       VARCHAR(16) NOT NULL,
    attempts     INTEGER     NOT NULL DEFAULT 0,
    available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    processed_at TIMESTAMPTZ,
    last_error   TEXT,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX ix_outbox_pending ON essay_outbox (status, available_at);
"""


class Settings:
    def __init__(self, smoke: bool):
        self.smoke = smoke
        self.enqueue_seconds = 3 if smoke else 15
        self.enqueue_rounds = 1 if smoke else 2
        self.drain_seconds = 2 if smoke else 8
        self.drain_rounds = 1 if smoke else 2
        self.drain_backlog = 20_000 if smoke else 500_000
        self.drain_points = [(1, 20), (4, 100)] if smoke else [(c, b) for c in (1, 4, 8) for b in (1, 20, 100)]
        self.history_rows = 20_000 if smoke else 2_000_000
        self.flat_seconds = 2 if smoke else 10
        self.long_txn_phases = (3, 4, 3) if smoke else (30, 60, 30)
        self.long_txn_rate = 300 if smoke else 1000
        self.delivery_messages = 2_000 if smoke else 20_000
        self.delivery_in_flight = [8] if smoke else [1, 8, 32]
        self.generator_seconds = 2 if smoke else 8
        self.latency_messages = 20 if smoke else 300
        self.churn_seconds = 5 if smoke else 90
        self.decay_seconds = 20 if smoke else 300
        self.decay_interval = 5 if smoke else 15
        self.decay_backlog = 10_000 if smoke else 100_000
        self.pinned_phases = (2, 2, 2) if smoke else (60, 60, 60)


# --------------------------------------------------------------------------------------------
# Processes: the cluster and the receiver
# --------------------------------------------------------------------------------------------


class Cluster:
    """A scratch cluster (scripts/cluster.sh) with the extension created in `database`, whose
    delivery worker serves that database."""

    def __init__(self, port: int, database: str = DATABASE, conf: str = CLUSTER_CONF, setup_sql: str = REFERENCE_TABLES):
        self.port = port
        self.database = database
        self.conf = conf
        self.setup_sql = setup_sql
        self.dir = tempfile.mkdtemp(prefix="outbox_ext-scratch.")
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")

    def start(self):
        env = dict(os.environ, OUTBOX_WORKER_DATABASES=self.database, OUTBOX_CLUSTER_CONF=self.conf)
        subprocess.run([ROOT / "scripts/cluster.sh", "start", self.dir, str(self.port)], check=True, env=env)
        os.environ.update(PGHOST="127.0.0.1", PGPORT=str(self.port), PGUSER="postgres")
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {self.database}")
            admin.execute(f"CREATE DATABASE {self.database}")
        with self.connect() as conn:
            conn.execute("CREATE EXTENSION outbox_ext")
            if self.setup_sql:
                conn.execute(self.setup_sql)

    def stop(self):
        subprocess.run([ROOT / "scripts/cluster.sh", "stop", self.dir], check=False)
        shutil.rmtree(self.dir, ignore_errors=True)

    @property
    def server_log(self) -> pathlib.Path:
        return pathlib.Path(self.dir) / "server.log"

    def pg_ctl(self, *args):
        """Runs pg_ctl on the cluster as the server's user (e.g. an immediate stop)."""
        user = ["sudo", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run(user + [PG_BIN / "pg_ctl", "-D", f"{self.dir}/data", "-l", f"{self.dir}/server.log", "-w", *args],
                       check=True, capture_output=True)

    def connect(self, **kwargs):
        return psycopg.connect(dbname=self.database, autocommit=True, **kwargs)

    def configure(self, **settings):
        """ALTER SYSTEM + reload: how the worker's settings are changed."""
        with self.connect() as conn:
            for name, value in settings.items():
                conn.execute(f"ALTER SYSTEM SET outbox.{name} = '{value}'")
            conn.execute("SELECT pg_reload_conf()")
        time.sleep(1.2)  # an idle worker applies a reload at its next poll (1 s)


class Nginx:
    """A receiver that answers 200 at once and logs each request's webhook-id and arrival."""

    def __init__(self, port: int):
        self.port = port
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="outbox_ext-nginx."))
        self.dir.chmod(0o777)
        self.log = self.dir / "access.log"
        (self.dir / "nginx.conf").write_text(
            f"""
daemon off;
worker_processes 1;
pid {self.dir}/nginx.pid;
error_log {self.dir}/error.log;
events {{ worker_connections 1024; }}
http {{
    log_format hooks '$http_webhook_id $msec';
    access_log {self.log} hooks buffer=64k flush=100ms;
    client_body_temp_path {self.dir}/body;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        location /hook {{ return 200 "ok"; }}
    }}
}}
"""
        )
        self.process = None

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self):
        self.process = subprocess.Popen(["nginx", "-c", str(self.dir / "nginx.conf"), "-p", str(self.dir)])
        deadline = time.monotonic() + 10
        while not (self.dir / "nginx.pid").exists():
            if time.monotonic() > deadline:
                raise RuntimeError("nginx did not start: " + (self.dir / "error.log").read_text())
            time.sleep(0.05)

    def arrivals(self):
        """webhook-id -> first arrival time (seconds since the epoch)."""
        seen = {}
        if self.log.exists():
            for line in self.log.read_text().splitlines():
                hook_id, _, at = line.partition(" ")
                if hook_id != "-":
                    seen.setdefault(hook_id, float(at))
        return seen

    def stop(self):
        if self.process:
            self.process.terminate()
            self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


# --------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------


def pgbench(script: str, clients: int, seconds: int, variables=None, options: str = "", rate=None,
            protocol: str = "simple"):
    """Runs one pgbench script (`protocol`: pgbench's -M); returns (transactions per second, mean
    latency in ms)."""
    command = [PG_BIN / "pgbench", "-n", "-M", protocol, "-c", str(clients), "-j", str(min(clients, 2)), "-T", str(seconds),
               "-f", BENCH / "pgbench" / script, "-D", f"payload={PAYLOAD}"]
    for name, value in (variables or {}).items():
        command += ["-D", f"{name}={value}"]
    if rate:
        command += ["-R", str(rate)]
    command.append(DATABASE)
    env = dict(os.environ, PGOPTIONS=options)
    run = subprocess.run(command, capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"pgbench {script} failed:\n{run.stdout}\n{run.stderr}")
    output = run.stdout
    tps = float(re.search(r"tps = ([\d.]+)", output).group(1))
    latency = float(re.search(r"latency average = ([\d.]+) ms", output).group(1))
    return tps, latency


def truncate(conn, tables):
    """TRUNCATE … CASCADE, retried when it deadlocks with the delivery worker (some of whose
    statements lock the delivery table before the message table; TRUNCATE goes the other way).
    The deliveries go with the messages (since 0.5.3 no foreign key takes them along)."""
    if "outbox" in (table.strip() for table in tables.split(",")):
        tables += ", outbox_delivery"
    for attempt in range(10):
        try:
            conn.execute(f"TRUNCATE {tables} CASCADE")
            return
        except psycopg.errors.DeadlockDetected:
            if attempt == 9:
                raise
            time.sleep(0.2)


def enqueue_cost(cluster, s):
    """1. outbox_enqueue vs a plain INSERT (and the essay's insert, and the batch path), 8 clients:
    each statement sent as text (pgbench's simple protocol, as psql, or a driver's first runs of
    a statement, send it), and with synchronous_commit off also prepared once per connection, the
    payload a bound parameter (as JDBC, pgx, or psycopg after five runs send a statement run
    often): there the server parses and plans neither statement again."""
    targets = (("plain", "plain_queue", 1), ("minimal", "minimal_outbox", 1), ("essay", "essay_outbox", 1),
               ("outbox", "outbox", 1), ("outbox_batch", "outbox", 10))
    rows = []
    for synchronous_commit, protocol in (("on", "simple"), ("off", "simple"), ("off", "prepared")):
        rates = {name: [] for name, _, _ in targets}
        script_suffix = "" if protocol == "simple" else f"_{protocol}"
        for round_ in range(s.enqueue_rounds):
            # (Every other round in reverse order: a drift of the shared machine during a round
            # then favours no variant.)
            for name, table, per_statement in (targets if round_ % 2 == 0 else targets[::-1]):
                with cluster.connect() as conn:
                    truncate(conn, table)
                    conn.execute("CHECKPOINT")
                tps = pgbench(f"enqueue_{name}{script_suffix}.sql", 8, s.enqueue_seconds,
                              options=f"-c synchronous_commit={synchronous_commit}", protocol=protocol)[0]
                rates[name].append(tps * per_statement)
        median = {k: statistics.median(v) for k, v in rates.items()}
        rows.append({
            "synchronous_commit": synchronous_commit,
            "protocol": protocol,
            "plain_per_s": median["plain"],
            "minimal_per_s": median["minimal"],
            "essay_per_s": median["essay"],
            "outbox_per_s": median["outbox"],
            "batch_per_s": median["outbox_batch"],
            "ratio": median["outbox"] / median["plain"],
            "minimal_ratio": median["minimal"] / median["plain"],
            "essay_ratio": median["essay"] / median["plain"],
            "batch_ratio": median["outbox_batch"] / median["plain"],
        })
    return rows


def top_up(conn, table, backlog, keep_done=False):
    """Brings the number of ready PENDING rows of `table` back to `backlog` (direct inserts:
    setting up, not measuring), and deletes its DONE rows unless they are the history being
    measured. Every row gets its own available_at (clock_timestamp), as enqueued messages do:
    with one now() for all, the essay's (status, available_at) index deduplicates into a few
    posting lists and its drain looks faster than it would be."""
    missing = backlog - conn.execute(f"SELECT count(*) FROM {table} WHERE status = 'PENDING'").fetchone()[0]
    if missing > 0:
        if table == "outbox":
            conn.execute(
                "INSERT INTO outbox (topic, payload, available_at) SELECT 'booking.created', %s::jsonb, "
                "clock_timestamp() - interval '1 hour' FROM generate_series(1, %s)", (PAYLOAD, missing))
        else:
            conn.execute(
                "INSERT INTO essay_outbox (public_id, topic, payload, status, available_at) SELECT gen_random_uuid(), "
                "'booking.created', %s::jsonb, 'PENDING', clock_timestamp() - interval '1 hour' FROM generate_series(1, %s)",
                (PAYLOAD, missing))
    if not keep_done:
        conn.execute(f"DELETE FROM {table} WHERE status = 'DONE'")
    conn.execute(f"VACUUM ANALYZE {table}")
    conn.execute("CHECKPOINT")


def done_count(conn, table):
    return conn.execute(f"SELECT count(*) FROM {table} WHERE status = 'DONE'").fetchone()[0]


def drain_throughput(cluster, s):
    """2. Burn-down: consumers claim and complete batches from a large backlog, each batch in
    one transaction: the essay's SQL, outbox_claim without a lease (the same work: lock, then
    mark DONE) and with one (the default: the claim also records the delivery). Each point is
    measured s.drain_rounds times, in the reverse order every other round, so that a drift of
    the shared machine during a point does not favour whichever variant ran first; the rate
    is the mean over the rounds."""
    scripts = (("essay", "essay_outbox", "drain_essay.sql"), ("no_lease", "outbox", "drain_outbox_nolease.sql"),
               ("lease", "outbox", "drain_outbox.sql"))
    rows = []
    with cluster.connect() as conn:
        for consumers, batch in s.drain_points:
            measured = {name: [] for name, _, _ in scripts}
            busy = {name: [] for name, _, _ in scripts}
            for round_ in range(s.drain_rounds):
                for name, table, script in (scripts if round_ % 2 == 0 else scripts[::-1]):
                    top_up(conn, table, s.drain_backlog)
                    before = done_count(conn, table)
                    started, cpu_before = time.monotonic(), cpu_times()
                    pgbench(script, consumers, s.drain_seconds, {"batch": batch})
                    measured[name].append((done_count(conn, table) - before) / (time.monotonic() - started))
                    busy[name].append(cpu_busy_since(cpu_before))
            rates = {name: statistics.mean(values) for name, values in measured.items()}
            rows.append({
                "consumers": consumers, "batch": batch,
                "essay_per_s": rates["essay"], "no_lease_per_s": rates["no_lease"], "lease_per_s": rates["lease"],
                "essay_cpu_busy": statistics.mean(busy["essay"]), "no_lease_cpu_busy": statistics.mean(busy["no_lease"]),
                "ratio": rates["no_lease"] / rates["essay"], "lease_ratio": rates["lease"] / rates["essay"],
            })
        truncate(conn, "outbox, essay_outbox")
    return rows


def move_to_history(conn):
    """outbox_archive until it has moved every DONE message it may: what the worker does, a
    minute after each ends, for history inserted in bulk here (docs/storage.md)."""
    while conn.execute("SELECT outbox_archive(100000)").fetchone()[0] == 100_000:
        pass


def flat_cost(cluster, s):
    """3. Claim latency with no history, then with s.history_rows DONE rows behind it (moved
    to their day's history first, as the worker does: measured while the worker moved them,
    the part measured that move), then with none again (the history purged): the two runs
    without history bracket the one with it, so drift of the shared machine during the part
    does not pass for an effect."""
    def measure():
        return pgbench("drain_outbox.sql", 1, s.flat_seconds, {"batch": 10})[1]

    with cluster.connect() as conn:
        truncate(conn, "outbox")
        top_up(conn, "outbox", 50_000)
        empty_before = measure()
        conn.execute(
            "INSERT INTO outbox (topic, payload, status, attempts, processed_at) SELECT 'booking.created', %s::jsonb, "
            "'DONE', 1, now() - interval '1 day' FROM generate_series(1, %s)", (PAYLOAD, s.history_rows))
        conn.execute("DELETE FROM outbox WHERE status = 'DONE' AND processed_at > now() - interval '1 hour'")
        move_to_history(conn)
        top_up(conn, "outbox", 50_000, keep_done=True)
        history = measure()
        top_up(conn, "outbox", 50_000)  # deletes the DONE rows, vacuums
        empty_after = measure()
        truncate(conn, "outbox")
    empty = (empty_before + empty_after) / 2
    return {"history_rows": s.history_rows, "latency_ms_empty": empty, "latency_ms_history": history,
            "latency_ms_empty_before": empty_before, "latency_ms_empty_after": empty_after, "ratio": history / empty}


def long_transaction(cluster, s):
    """4. A paced produce/consume run; in the middle phase an idle-in-transaction session
    holds a snapshot (and so holds back vacuum)."""
    before, during, after = s.long_txn_phases
    total = before + during + after
    samples = []
    with cluster.connect() as conn:
        truncate(conn, "outbox")
        conn.execute("VACUUM ANALYZE outbox")
    producer = threading.Thread(target=pgbench, args=("produce_paced.sql", 4, total), kwargs={"rate": s.long_txn_rate})
    consumer = threading.Thread(target=pgbench, args=("drain_outbox.sql", 2, total, {"batch": 20}))
    holder = psycopg.connect(dbname=DATABASE)
    producer.start()
    consumer.start()
    started = time.monotonic()
    with cluster.connect() as monitor:
        held = False
        while (elapsed := time.monotonic() - started) < total:
            if not held and elapsed >= before:
                holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
                holder.execute("SELECT count(*) FROM outbox")  # takes the snapshot, then idles
                held = True
            if held and elapsed >= before + during and holder.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                holder.commit()
            row = monitor.execute(
                """SELECT (SELECT count(*) FROM outbox WHERE status = 'DONE'),
                          n_dead_tup, pg_table_size('outbox'), pg_indexes_size('outbox')
                     FROM pg_stat_user_tables WHERE relname = 'outbox'"""
            ).fetchone()
            samples.append((elapsed, *row))
            time.sleep(1)
    producer.join()
    consumer.join()
    holder.close()

    def phase(start, end):
        points = [p for p in samples if start <= p[0] < end]
        rate = (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0]) if len(points) > 1 else 0
        return {"done_per_s": rate, "dead_tuples": points[-1][2], "table_mb": points[-1][3] / 2**20,
                "indexes_mb": points[-1][4] / 2**20}

    phases = {"before": phase(0, before), "during": phase(before, before + during), "after": phase(before + during, total)}
    phases["dip"] = 1 - phases["during"]["done_per_s"] / phases["before"]["done_per_s"]
    with cluster.connect() as conn:
        truncate(conn, "outbox")
    return phases


def churn(cluster, s):
    """7. Table and index sizes after a churn run (1,000 msg/s in, consumers draining, DONE rows
    purged every 5 s), with PostgreSQL's default storage settings for the table and with the
    queue-tuned ones outbox_ext installs (sql/operations.sql)."""
    tuned = ("fillfactor", "autovacuum_vacuum_scale_factor", "autovacuum_vacuum_threshold",
             "autovacuum_vacuum_insert_scale_factor", "autovacuum_analyze_scale_factor", "autovacuum_vacuum_cost_delay")
    with cluster.connect() as conn:
        installed = conn.execute("SELECT reloptions FROM pg_class WHERE oid = 'outbox'::regclass").fetchone()[0]
    rows = []
    for name in ("default", "tuned"):
        with cluster.connect() as conn:
            truncate(conn, "outbox")
            if name == "default":
                conn.execute(f"ALTER TABLE outbox RESET ({', '.join(tuned)})")
            else:
                conn.execute(f"ALTER TABLE outbox SET ({', '.join(installed)})")
        producer = threading.Thread(target=pgbench, args=("produce_paced.sql", 4, s.churn_seconds), kwargs={"rate": 1000})
        consumer = threading.Thread(target=pgbench, args=("drain_outbox_nolease.sql", 2, s.churn_seconds, {"batch": 20}))
        producer.start()
        consumer.start()
        started = time.monotonic()
        with cluster.connect() as conn:
            while time.monotonic() - started < s.churn_seconds:
                conn.execute("SELECT outbox_purge(interval '0', max_rows => 100000)")
                time.sleep(5)
            producer.join()
            consumer.join()
            table_mb, indexes_mb, dead = conn.execute(
                "SELECT pg_table_size('outbox') / 1048576.0, pg_indexes_size('outbox') / 1048576.0, n_dead_tup"
                "  FROM pg_stat_user_tables WHERE relname = 'outbox'").fetchone()
        rows.append({"settings": name, "table_mb": float(table_mb), "indexes_mb": float(indexes_mb), "dead_tuples": dead})
    with cluster.connect() as conn:
        conn.execute(f"ALTER TABLE outbox SET ({', '.join(installed)})")
        truncate(conn, "outbox")
    return rows


def lease_decay(cluster, s):
    """11. Leases over time: 16 consumers, each cycle enqueueing a batch of 10, claiming 10 with
    a lease (committed) and completing them (committed), for s.decay_seconds; the backlog stays
    level. Every s.decay_interval: messages claimed per second, the ready index's blocks read per
    claim and the table's per message (pg_statio, hits and reads), the ready index's size and the
    table's dead tuples. Goal: the last minute at ≥ 0.8 of the first, whatever autovacuum does."""
    batch = 10
    with cluster.connect() as conn:
        truncate(conn, "outbox")
        top_up(conn, "outbox", s.decay_backlog)
    sample_sql = """SELECT t.n_tup_ins, i.idx_blks_hit + i.idx_blks_read, h.heap_blks_hit + h.heap_blks_read,
                           pg_relation_size('outbox_ready_idx'), t.n_dead_tup, t.autovacuum_count
                      FROM pg_stat_user_tables t, pg_statio_user_indexes i, pg_statio_user_tables h
                     WHERE t.relname = 'outbox' AND i.indexrelname = 'outbox_ready_idx' AND h.relname = 'outbox'"""
    consumers = threading.Thread(target=pgbench, args=("lease_cycle.sql", 16, s.decay_seconds, {"batch": batch}))
    samples = []
    with cluster.connect() as monitor:
        monitor.execute("SELECT pg_stat_clear_snapshot()")
        consumers.start()
        started = time.monotonic()
        while True:
            samples.append((time.monotonic() - started, *monitor.execute(sample_sql).fetchone()))
            monitor.execute("SELECT pg_stat_clear_snapshot()")
            if samples[-1][0] >= s.decay_seconds:
                break
            time.sleep(min(s.decay_interval, s.decay_seconds - samples[-1][0] + 0.5))
        consumers.join()
        truncate(monitor, "outbox")
    intervals = []
    for (t0, ins0, idx0, heap0, *_), (t1, ins1, idx1, heap1, index_bytes, dead, autovacuums) in zip(samples, samples[1:]):
        messages = ins1 - ins0
        claims = messages / batch
        intervals.append({
            "at_s": round(t1), "claimed_per_s": messages / (t1 - t0),
            "index_blocks_per_claim": (idx1 - idx0) / claims if claims else None,
            "heap_blocks_per_message": (heap1 - heap0) / messages if messages else None,
            "ready_index_mb": index_bytes / 2**20, "dead_tuples": dead, "autovacuums": autovacuums,
        })

    def window(start, end):
        """Messages claimed per second between two times of the run, from the samples within."""
        points = [p for p in samples if start <= p[0] <= end]
        return (points[-1][1] - points[0][1]) / (points[-1][0] - points[0][0])

    minute = min(60, s.decay_seconds / 3)
    first, last = window(0, minute), window(s.decay_seconds - minute - s.decay_interval, s.decay_seconds + 1)
    return {"consumers": 16, "batch": batch, "seconds": s.decay_seconds, "first_minute_per_s": first,
            "last_minute_per_s": last, "ratio": last / first, "intervals": intervals}


# What each consumer style of part 12 runs, and on which table.
PINNED_STYLES = (
    ("essay's SQL", "essay_outbox", "enqueue_essay.sql", "drain_essay.sql", "ix_outbox_pending"),
    ("outbox_claim, in the transaction", "outbox", "produce_paced.sql", "drain_outbox_nolease.sql", "outbox_ready_idx"),
    ("outbox_claim with a lease", "outbox", "produce_paced.sql", "drain_outbox_lease_split.sql", "outbox_ready_idx"),
)


def pinned_horizon(cluster, s):
    """12. Under a pinned horizon: 1,000 msg/s produced, two consumers at batch 20, for three
    phases (clean, horizon pinned, recovery); the horizon pinned by a session idle in a
    REPEATABLE READ transaction, or by a query running for the whole phase. Per phase: the p99
    from enqueue to completion (created_at to processed_at, in the database's clock), and the
    size of what claims scan (the index they seek and the table) at the phase's end."""
    clean, pinned, recovery = s.pinned_phases
    total = clean + pinned + recovery
    rows = []
    for holder_kind in ("idle in transaction", "running query"):
        for style, table, produce, drain, index in PINNED_STYLES:
            with cluster.connect() as conn:
                truncate(conn, "outbox, essay_outbox")
                conn.execute(f"VACUUM ANALYZE {table}")
                conn.execute("CHECKPOINT")
            producer = threading.Thread(target=pgbench, args=(produce, 4, total), kwargs={"rate": 1000})
            consumer = threading.Thread(target=pgbench, args=(drain, 2, total, {"batch": 20}))
            holder = psycopg.connect(dbname=DATABASE, autocommit=True)
            query = threading.Thread(target=lambda: holder.execute(
                "SELECT count(*) FROM pg_class, pg_sleep(%s)", (pinned,)))
            sizes, blocks = {}, {}
            producer.start()
            consumer.start()
            started = time.monotonic()
            clock_at_start = holder.execute("SELECT clock_timestamp()").fetchone()[0]
            with cluster.connect() as monitor:
                phase = "clean"
                while (elapsed := time.monotonic() - started) < total:
                    if phase == "clean" and elapsed >= clean:
                        if holder_kind == "idle in transaction":
                            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                            holder.execute("SELECT count(*) FROM pg_class")  # takes the snapshot, then idles
                        else:
                            query.start()
                        phase = "pinned"
                    if phase == "pinned" and elapsed >= clean + pinned:
                        if holder_kind == "idle in transaction":
                            holder.execute("COMMIT")
                        phase = "recovery"
                    sample = monitor.execute(
                        f"""SELECT pg_relation_size('{index}'), pg_table_size('{table}'),
                                   (SELECT idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes WHERE indexrelname = '{index}'),
                                   (SELECT heap_blks_hit + heap_blks_read FROM pg_statio_user_tables WHERE relname = '{table}')""").fetchone()
                    sizes[phase] = sample[:2]
                    blocks.setdefault(phase, [sample[2:], None])[1] = sample[2:]
                    time.sleep(1)
                producer.join()
                consumer.join()
                if query.ident is not None:  # started
                    query.join()
                holder.close()
                latency = monitor.execute(
                    f"""SELECT CASE WHEN processed_at < %(start)s + %(clean)s * interval '1 second' THEN 'clean'
                                    WHEN processed_at < %(start)s + %(pin)s * interval '1 second' THEN 'pinned'
                                    ELSE 'recovery' END,
                               percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM processed_at - created_at) * 1000),
                               count(*)
                          FROM {table} WHERE status = 'DONE' GROUP BY 1""",
                    {"start": clock_at_start, "clean": clean, "pin": clean + pinned}).fetchall()
            p99 = {phase: (ms, count) for phase, ms, count in latency}
            row = {"holder": holder_kind, "style": style}
            for name in ("clean", "pinned", "recovery"):
                ms, count = p99.get(name, (None, 0))
                index_bytes, table_bytes = sizes.get(name, (0, 0))
                (index_first, heap_first), (index_last, heap_last) = blocks[name]
                row[name] = {"p99_ms": ms, "completed": count, "index_mb": index_bytes / 2**20, "table_mb": table_bytes / 2**20,
                             "index_blocks_per_message": (index_last - index_first) / max(count, 1),
                             "table_blocks_per_message": (heap_last - heap_first) / max(count, 1)}
            row["p99_pinned_over_clean"] = row["pinned"]["p99_ms"] / row["clean"]["p99_ms"]
            row["index_blocks_pinned_over_clean"] = (row["pinned"]["index_blocks_per_message"]
                                                     / max(row["clean"]["index_blocks_per_message"], 0.01))
            rows.append(row)
    with cluster.connect() as conn:
        truncate(conn, "outbox, essay_outbox")
    return rows


def stats_cost(cluster, s):
    """13. What the numbers cost: outbox_stats() and outbox_depth() with 10,000 pending messages
    and 1,000,000 ended ones (DONE and DEAD, with their deliveries), against a plain count of
    the pending messages; median of 20 calls each, in the database (EXPLAIN ANALYZE's time)."""
    ended = 20_000 if s.smoke else 1_000_000
    with cluster.connect() as conn:
        truncate(conn, "outbox, outbox_subscription")
        conn.execute("INSERT INTO outbox_subscription (topic, url, enabled) VALUES ('audit.exported', 'http://127.0.0.1:9/', false)")
        conn.execute("""INSERT INTO outbox (topic, payload, status, attempts, processed_at, available_at)
                        SELECT 'audit.exported', %s::jsonb, CASE WHEN g %% 100 = 0 THEN 'DEAD' ELSE 'DONE' END::outbox_status,
                               1, now() - interval '1 hour', now() - interval '1 hour'
                          FROM generate_series(1, %s) g""", (PAYLOAD, ended))
        conn.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, processed_at)
                        SELECT id, (SELECT id FROM outbox_subscription), status, 1, processed_at FROM outbox""")
        # Where a running system keeps them: outbox_archive moves the DONE ones (and their
        # deliveries) to the history of their day, and DEAD ones stay for an operator.
        move_to_history(conn)
        conn.execute("INSERT INTO outbox (topic, payload) SELECT 'booking.created', %s::jsonb FROM generate_series(1, 10000)", (PAYLOAD,))
        # (Every table, the history ones too: autovacuum would otherwise run on them while we measure.)
        conn.execute("VACUUM ANALYZE")

        def median_ms(query):
            times = []
            for _ in range(20):
                plan = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}").fetchone()[0][0]
                times.append(plan["Planning Time"] + plan["Execution Time"])
            return statistics.median(times)

        result = {
            "ended_rows": ended,
            "stats_ms": median_ms("SELECT * FROM outbox_stats()"),
            "depth_ms": median_ms("SELECT outbox_depth()"),
            "count_pending_ms": median_ms("SELECT count(*) FROM outbox WHERE status = 'PENDING'"),
        }
        truncate(conn, "outbox, outbox_subscription")
    return result


def bulk_load(cluster, s):
    """14. Bulk loads, one client, one transaction each: COPY of the payloads into the plain
    table, against the path docs/api.md gives a producer (it may not write the table itself):
    COPY into a temporary table, then one outbox_enqueue_batch of all of them. Alternating
    rounds, median rows/s."""
    rows = 10_000 if s.smoke else 200_000
    assert not any(c in PAYLOAD for c in "\\\t\n\r"), "the payload is written to COPY's text format as it is"
    data = (PAYLOAD + "\n").encode() * rows

    def plain(conn):
        with conn.cursor().copy("COPY plain_queue (payload) FROM STDIN") as copy:
            copy.write(data)

    def outbox(conn):
        conn.execute("CREATE TEMP TABLE staging (n bigserial, payload jsonb) ON COMMIT DROP")
        with conn.cursor().copy("COPY staging (payload) FROM STDIN") as copy:
            copy.write(data)
        loaded = conn.execute("SELECT count(*) FROM outbox_enqueue_batch('booking.imported', "
                              "ARRAY(SELECT payload FROM staging ORDER BY n))").fetchone()[0]
        assert loaded == rows

    rates = {"plain": [], "outbox": []}
    for _ in range(s.enqueue_rounds + 1):
        for name, table, load in (("plain", "plain_queue", plain), ("outbox", "outbox", outbox)):
            with cluster.connect() as conn:
                truncate(conn, table)
                conn.execute("CHECKPOINT")
            with cluster.connect() as conn:
                began = time.monotonic()
                with conn.transaction():
                    load(conn)
                rates[name].append(rows / (time.monotonic() - began))
    with cluster.connect() as conn:
        truncate(conn, "outbox, plain_queue")
    plain_per_s, outbox_per_s = statistics.median(rates["plain"]), statistics.median(rates["outbox"])
    return {"rows": rows, "plain_per_s": plain_per_s, "outbox_per_s": outbox_per_s, "ratio": outbox_per_s / plain_per_s}


def bulk_lines(b):
    """Part 14 of the report."""
    return [
        f"## 14. Bulk loads ({b['rows']:,} payloads in one transaction, one client)",
        "",
        f"COPY into the plain table {b['plain_per_s']:,.0f} rows/s; COPY into a temporary table, then one "
        f"`outbox_enqueue_batch` {b['outbox_per_s']:,.0f} msg/s: **{b['ratio']:.2f}** of the plain COPY.",
        "",
    ]


def retention(cluster, s):
    """15. Retention: outbox_purge emptying a day of the attempt log (rows started three days
    ago, purged with older_than 1 day), against a DELETE of the same rows from an unpartitioned
    copy of the table (what outbox_purge did before 0.5.2), at two sizes: the time, and the rows
    each leaves for vacuum. And the same for DONE messages (since 0.5.3 moved to the history of
    their day by outbox_archive, as the worker does a minute after they end: timed apart; then
    outbox_purge called until it returns less than its max_rows, as the worker does)."""
    sizes = (10_000, 100_000) if s.smoke else (100_000, 1_000_000)
    day = "(date_trunc('day', now() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC') - interval '3 days'"

    def dead_rows(conn, pattern):
        """Per table matching `pattern`: (n_tup_del, n_dead_tup)."""
        conn.execute("SELECT pg_stat_force_next_flush()")
        conn.execute("SELECT pg_stat_clear_snapshot()")
        return {name: (deleted, dead) for name, deleted, dead in conn.execute(
            "SELECT relname, n_tup_del, n_dead_tup FROM pg_stat_user_tables WHERE relname LIKE %s", (pattern,))}

    def measure(conn, fill, purge, pattern, then=None):
        truncate(conn, "outbox, outbox_delivery_attempt, attempt_log_unpartitioned")
        conn.execute(fill)
        began = time.monotonic()
        if then:
            then(conn)
        then_ms = (time.monotonic() - began) * 1000
        conn.execute("VACUUM ANALYZE")
        before = dead_rows(conn, pattern)
        began = time.monotonic()
        purge(conn)
        elapsed_ms = (time.monotonic() - began) * 1000
        after = dead_rows(conn, pattern)
        # What the purge left, table by table: dead tuples that VACUUM could not remove before it
        # (a snapshot held elsewhere) are not the purge's, nor are tables it dropped.
        left = {name: (deleted - before.get(name, (0, 0))[0], dead - before.get(name, (0, 0))[1])
                for name, (deleted, dead) in after.items()}
        return {"ms": elapsed_ms, "then_ms": then_ms,
                "deleted": int(sum(max(0, d) for d, _ in left.values())),
                "dead_tuples": int(sum(max(0, d) for _, d in left.values())),
                "dead_tuples_before": int(sum(dead for _, dead in before.values())),
                "dead_before_by_table": {name: int(dead) for name, (_, dead) in before.items() if dead},
                "by_table": {name: {"deleted": int(d), "dead_tuples": int(t)} for name, (d, t) in left.items() if d or t}}

    def purge_messages(conn):
        while conn.execute("SELECT outbox_purge(interval '1 day')").fetchone()[0] == 10_000:
            pass

    rows = []
    with cluster.connect() as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS attempt_log_unpartitioned (LIKE outbox_delivery_attempt)")
        conn.execute("CREATE INDEX IF NOT EXISTS attempt_log_unpartitioned_delivery ON attempt_log_unpartitioned (message_id, subscription_id)")
        conn.execute("CREATE INDEX IF NOT EXISTS attempt_log_unpartitioned_started ON attempt_log_unpartitioned USING brin (started_at)")
        for n in sizes:
            attempts = f"""SELECT g, 1, 1, {day} + g * interval '40 ms', interval '20 ms', 200 FROM generate_series(1, {n}) g"""
            rows.append({
                "rows": n,
                "attempt_log": measure(conn, f"INSERT INTO outbox_delivery_attempt {attempts}",
                                       lambda c: c.execute("SELECT outbox_purge(interval '1 day')"), "outbox_delivery_attempt%"),
                "attempt_log_delete": measure(conn, f"INSERT INTO attempt_log_unpartitioned {attempts}",
                                              lambda c: c.execute("DELETE FROM attempt_log_unpartitioned "
                                                                  "WHERE started_at < now() - interval '1 day'"),
                                              "attempt_log_unpartitioned"),
                "messages": measure(conn, f"""INSERT INTO outbox (topic, payload, status, attempts, processed_at)
                                              SELECT 'booking.created', '{{}}', 'DONE', 1, {day} + g * interval '40 ms'
                                                FROM generate_series(1, {n}) g""", purge_messages, "outbox%",
                                    then=move_to_history),
            })
        truncate(conn, "outbox, outbox_delivery_attempt")
        conn.execute("DROP TABLE attempt_log_unpartitioned")
    return rows


def retention_lines(rows):
    """Part 15 of the report."""
    lines = [
        "## 15. Retention: purging a day of history",
        "",
        "| rows of the day | attempt log, outbox_purge (ms) | left for vacuum | unpartitioned, DELETE (ms) | left for vacuum "
        "| DONE messages, outbox_purge (ms) | left for vacuum | (their move to the history, ms) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, d, m = r["attempt_log"], r["attempt_log_delete"], r["messages"]
        lines.append(f"| {r['rows']:,} | {a['ms']:.0f} | {a['dead_tuples']:,} dead, {a['deleted']:,} deleted | {d['ms']:.0f} "
                     f"| {d['dead_tuples']:,} dead, {d['deleted']:,} deleted | {m['ms']:.0f} "
                     f"| {m['dead_tuples']:,} dead, {m['deleted']:,} deleted | {m['then_ms']:.0f} |")
    lines += ["", "Left for vacuum: what each table's `n_tup_del` and `n_dead_tup` gained during the purge "
              "(a table the purge emptied or dropped gains nothing)."]
    for r in rows:
        for case in ("attempt_log", "attempt_log_delete", "messages"):
            m = r[case]
            if m["dead_tuples_before"] or m["by_table"]:
                tables = ", ".join(f"{name} {t['dead_tuples']:+,} dead, {t['deleted']:+,} deleted" for name, t in sorted(m["by_table"].items()))
                held = ", ".join(f"{name} {dead:,}" for name, dead in sorted(m["dead_before_by_table"].items()))
                lines.append(f"- {r['rows']:,} rows, {case}: {m['dead_tuples_before']:,} dead tuples before the purge, "
                             f"after VACUUM ({held or 'none'}); the purge's: {tables or 'none'}.")
    lines.append("")
    return lines


def protections(cluster, receiver, s):
    """9. The worker delivering a backlog to nginx (8 in flight) with a subscription as
    outbox_subscribe makes it by default, and with a rate limit and max_in_flight that never
    bind (1,000,000/s, 8): what the token bucket and the caps cost on the default path. The SSRF
    guard judges every connection in both (the cluster allows 127.0.0.1/32)."""
    variants = (("default", "NULL", "NULL"), ("limits set", "1000000", "8"))
    rates = {name: [] for name, _, _ in variants}
    with cluster.connect() as conn:
        cluster.configure(max_in_flight=8)
        for round_ in range(s.drain_rounds):
            for name, rate_limit, max_in_flight in (variants if round_ % 2 == 0 else variants[::-1]):
                truncate(conn, "outbox, outbox_subscription")
                conn.execute(f"SELECT outbox_subscribe('booking.created', %s, rate_limit => {rate_limit}, "
                             f"max_in_flight => {max_in_flight})", (receiver.url,))
                start_backlog(cluster, conn, s.delivery_messages)
                wait_for_count(conn, "SELECT count(*) FROM outbox WHERE status = 'DONE'", s.delivery_messages, "the drain")
                rates[name].append(settled_rate(conn, s.delivery_messages))
        truncate(conn, "outbox, outbox_subscription")
    mean = {name: statistics.mean(values) for name, values in rates.items()}
    return {"default_per_s": mean["default"], "limits_per_s": mean["limits set"], "ratio": mean["limits set"] / mean["default"]}


def ordering(cluster, s):
    """8. Ordering keys: enqueue with a key (one of 1,000) against without, 8 clients; the drain
    (4 consumers × 100, with leases) of a backlog whose messages have 1,000 keys, and one key,
    against the same backlog without keys. Rounds alternate the order of the variants."""
    scripts = {"plain": "enqueue_outbox.sql", "keyed": "enqueue_outbox_keyed.sql", "keyed_in_sql": "enqueue_outbox_keyed_in_sql.sql"}
    enqueue = {name: [] for name in scripts}
    for round_ in range(s.enqueue_rounds):
        for name in (list(scripts) if round_ % 2 == 0 else list(scripts)[::-1]):
            with cluster.connect() as conn:
                truncate(conn, "outbox")
                conn.execute("CHECKPOINT")
            enqueue[name].append(pgbench(scripts[name], 8, s.enqueue_seconds)[0])
    variants = (("no keys", None), ("1,000 keys", 1000), ("1 key", 1))
    drained = {name: [] for name, _ in variants}
    with cluster.connect() as conn:
        for round_ in range(s.drain_rounds):
            for name, keys in (variants if round_ % 2 == 0 else variants[::-1]):
                truncate(conn, "outbox")
                # As enqueued: per key, the first message claimable and the rest waiting behind it.
                conn.execute(
                    """INSERT INTO outbox (topic, payload, available_at, ordering_key, waiting_for)
                       SELECT 'booking.created', %s::jsonb, clock_timestamp() - interval '1 hour',
                              CASE WHEN %s::int IS NOT NULL THEN 'booking:' || (g %% %s::int) END,
                              CASE WHEN %s::int IS NOT NULL AND g > %s::int THEN 'ordering_key'::outbox_wait END
                         FROM generate_series(1, %s) g""",
                    (PAYLOAD, keys, keys, keys, keys, s.drain_backlog))
                conn.execute("VACUUM ANALYZE outbox")
                conn.execute("CHECKPOINT")
                started = time.monotonic()
                pgbench("drain_outbox.sql", 4, s.drain_seconds, {"batch": 100})
                drained[name].append(done_count(conn, "outbox") / (time.monotonic() - started))
        truncate(conn, "outbox")
    enqueue_rates = {k: statistics.mean(v) for k, v in enqueue.items()}
    drain_rates = {k: statistics.mean(v) for k, v in drained.items()}
    return {
        "enqueue_per_s": enqueue_rates["plain"], "enqueue_keyed_per_s": enqueue_rates["keyed"],
        "enqueue_ratio": enqueue_rates["keyed"] / enqueue_rates["plain"],
        "enqueue_keyed_in_sql_per_s": enqueue_rates["keyed_in_sql"],
        "enqueue_in_sql_ratio": enqueue_rates["keyed_in_sql"] / enqueue_rates["plain"],
        "drain": [{"keys": name, "per_s": rate, "ratio": rate / drain_rates["no keys"]} for name, rate in drain_rates.items()],
    }


def cpu_times():
    """(busy, total) jiffies of all CPUs since boot, from /proc/stat."""
    fields = [int(v) for v in pathlib.Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def cpu_busy_since(before):
    """The share of the machine's CPU time that was busy since `before` (a cpu_times())."""
    busy_after, total_after = cpu_times()
    return (busy_after - before[0]) / max(1, total_after - before[1])


def wrk_rate(url, connections, seconds):
    """wrk's requests/s, and the share of the machine's CPU time that was busy meanwhile."""
    threads = min(2, connections)
    cpu_before = cpu_times()
    output = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s", "-s", BENCH / "wrk_post.lua", url],
        check=True, capture_output=True, text=True, env=dict(os.environ, OUTBOX_BENCH_PAYLOAD=PAYLOAD),
    ).stdout
    return float(re.search(r"Requests/sec:\s+([\d.]+)", output).group(1)), cpu_busy_since(cpu_before)


def delivery(cluster, receiver, s):
    """5. The worker delivering a backlog to nginx, against wrk at the same concurrency."""
    rows = []
    with cluster.connect() as conn:
        conn.execute("SELECT outbox_subscribe('booking.created', %s)", (receiver.url,))
        for in_flight in s.delivery_in_flight:
            cluster.configure(worker_enabled="off", max_in_flight=in_flight)
            truncate(conn, "outbox")
            conn.execute(
                "INSERT INTO outbox (topic, payload) SELECT 'booking.created', %s::jsonb FROM generate_series(1, %s)",
                (PAYLOAD, s.delivery_messages))
            conn.execute("VACUUM ANALYZE outbox")
            cluster.configure(worker_enabled="on")
            started = time.monotonic()
            while done_count(conn, "outbox") < s.delivery_messages:
                if time.monotonic() - started > 600:
                    raise RuntimeError("the worker did not drain the backlog in 10 minutes")
                time.sleep(0.05)
            # From the first completion to the last: the reload's delay does not count.
            span = conn.execute("SELECT extract(epoch FROM max(processed_at) - min(processed_at)) FROM outbox").fetchone()[0]
            worker_rate = (s.delivery_messages - 1) / float(span)
            generator, generator_cpu_busy = wrk_rate(receiver.url, in_flight, s.generator_seconds)
            rows.append({"in_flight": in_flight, "worker_per_s": worker_rate, "wrk_per_s": generator,
                         "wrk_cpu_busy": generator_cpu_busy, "ratio": worker_rate / generator})
        cluster.configure(worker_enabled="on", max_in_flight=8)
        truncate(conn, "outbox")
    return rows


# Messages for the variants whose endpoints answer after 50 ms (8 in flight: 160 a second).
SLOW_MESSAGES = 400


class Slow:
    """An endpoint that answers 200 after `delay` seconds, each request in its own thread."""

    def __init__(self, delay):
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                self.rfile.read(int(self.headers.get("content-length", 0)))
                time.sleep(delay)
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()
        self.server.server_close()


class Hanging:
    """An endpoint that accepts connections and never answers (the worker's timeout ends each
    request)."""

    def __init__(self):
        import socket

        self.server = socket.socket()
        self.server.bind(("127.0.0.1", 0))
        self.server.listen(64)
        self.held = []
        self.url = f"http://127.0.0.1:{self.server.getsockname()[1]}/hook"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                connection, _ = self.server.accept()
            except OSError:
                return
            self.held.append(connection)

    def stop(self):
        self.server.close()
        for connection in self.held:
            connection.close()


def start_backlog(cluster, conn, messages, keys=None):
    """`messages` ready messages for the worker, put there while it is off, then it is on. With
    `keys`, enqueued as a producer does with one of that many ordering keys each, in turn."""
    cluster.configure(worker_enabled="off")
    # (The attempt log has no foreign key: emptied apart, or answered_rate would count old runs.)
    truncate(conn, "outbox, outbox_delivery_attempt")
    if keys:
        conn.execute("SELECT count(outbox_enqueue('booking.created', %s::jsonb, ordering_key => 'booking:' || g %% %s)) "
                     "FROM generate_series(1, %s) g", (PAYLOAD, keys, messages))
    else:
        conn.execute("INSERT INTO outbox (topic, payload) SELECT 'booking.created', %s::jsonb FROM generate_series(1, %s)",
                     (PAYLOAD, messages))
    conn.execute("VACUUM ANALYZE outbox")
    cluster.configure(worker_enabled="on")


def wait_for_count(conn, query, goal, what):
    started = time.monotonic()
    while conn.execute(query).fetchone()[0] < goal:
        if time.monotonic() - started > 600:
            raise RuntimeError(f"{what} did not happen in 10 minutes")
        time.sleep(0.05)


def answered_rate(conn):
    """Deliveries answered 200 per second, from the first request to the last answer."""
    delivered, span = conn.execute(
        """SELECT count(*), extract(epoch FROM max(a.started_at + a.duration) - min(a.started_at))
             FROM outbox_delivery_attempt a WHERE a.http_status = 200""").fetchone()
    return (delivered - 1) / float(span)


def settled_rate(conn, messages):
    """Messages settled (DONE) per second, from the first to the last."""
    span = conn.execute("SELECT extract(epoch FROM max(processed_at) - min(processed_at)) FROM outbox").fetchone()[0]
    return (messages - 1) / float(span)


def fan_out(cluster, receiver, s):
    """10. Fan-out through the worker (8 in flight, to nginx): deliveries/s with 1, 2 and 4
    endpoints per topic; with 1 endpoint and messages of 1,000 ordering keys; with 2 endpoints,
    nginx or a receiver answering after 50 ms, alone and beside 6 subscriptions of a topic
    without messages (for which they keep slots free); with 4 of which one hangs (its timeout
    1 s), the healthy ones' rate; and the attempt log's cost: 1 endpoint with the log discarded
    by a trigger, beside the same with it, rounds alternating."""
    messages = s.delivery_messages // 2
    rates = {}
    subscribe = lambda urls: [conn.execute("SELECT outbox_subscribe('booking.created', %s)", (url,)) for url in urls]
    with cluster.connect() as conn:
        cluster.configure(max_in_flight=8, http_timeout="1s")
        slow = Slow(0.05)
        # (name, receiver, endpoints, ordering keys, subscriptions without work, messages)
        variants = (("1 endpoint(s)", receiver.url, 1, None, 0, messages),
                    ("2 endpoint(s)", receiver.url, 2, None, 0, messages),
                    ("4 endpoint(s)", receiver.url, 4, None, 0, messages),
                    # (Per key and endpoint one delivery at a time: with 1,000 keys, 8 in flight still fill.)
                    ("1 endpoint, 1,000 ordering keys", receiver.url, 1, 1000, 0, messages),
                    ("2 endpoints beside 6 without work", receiver.url, 2, None, 6, messages),
                    ("2 endpoints answering after 50 ms", slow.url, 2, None, 0, SLOW_MESSAGES),
                    ("2 endpoints answering after 50 ms beside 6 without work", slow.url, 2, None, 6, SLOW_MESSAGES))
        try:
            for name, url, endpoints, keys, without_work, count in variants:
                truncate(conn, "outbox_subscription")
                subscribe(f"{url}/{n}" for n in range(endpoints))
                for n in range(without_work):
                    conn.execute("SELECT outbox_subscribe('bench.quiet', %s)", (f"{receiver.url}/quiet/{n}",))
                start_backlog(cluster, conn, count, keys)
                wait_for_count(conn, "SELECT count(*) FROM outbox WHERE status = 'DONE'", count, "the fan-out")
                rates[name] = answered_rate(conn)
        finally:
            slow.stop()
        hanging = Hanging()
        try:
            truncate(conn, "outbox_subscription")
            subscribe([*(f"{receiver.url}/{n}" for n in range(3)), hanging.url])
            start_backlog(cluster, conn, messages)
            # (The messages end only once the hanging endpoint's deliveries are dead.)
            wait_for_count(conn, "SELECT count(*) FROM outbox_delivery WHERE status = 'DONE'", 3 * messages,
                           "the healthy endpoints' deliveries")
            rates["4 endpoints, 1 of them hanging (the 3 healthy ones)"] = answered_rate(conn)
        finally:
            hanging.stop()
        truncate(conn, "outbox, outbox_subscription")
        subscribe([receiver.url])
        conn.execute("CREATE OR REPLACE FUNCTION bench_discard() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$")
        logged = {True: [], False: []}
        for round_ in range(s.drain_rounds):
            for with_log in ((True, False) if round_ % 2 == 0 else (False, True)):
                conn.execute("DROP TRIGGER IF EXISTS bench_discard ON outbox_delivery_attempt")
                if not with_log:
                    conn.execute("CREATE TRIGGER bench_discard BEFORE INSERT ON outbox_delivery_attempt "
                                 "FOR EACH ROW EXECUTE FUNCTION bench_discard()")
                start_backlog(cluster, conn, messages)
                wait_for_count(conn, "SELECT count(*) FROM outbox WHERE status = 'DONE'", messages, "the drain")
                logged[with_log].append(settled_rate(conn, messages))
        conn.execute("DROP TRIGGER IF EXISTS bench_discard ON outbox_delivery_attempt")
        conn.execute("DROP FUNCTION bench_discard()")
        truncate(conn, "outbox, outbox_subscription")
        cluster.configure(http_timeout="5s")
    with_log, without_log = statistics.mean(logged[True]), statistics.mean(logged[False])
    return {"rates": rates, "with_log_per_s": with_log, "without_log_per_s": without_log, "log_ratio": with_log / without_log}


def latency(cluster, receiver, s):
    """6. From the enqueueing transaction's commit to the receiver, idle worker."""
    committed = {}
    with cluster.connect() as conn:
        truncate(conn, "outbox")
        time.sleep(1.5)
        for _ in range(s.latency_messages):
            with conn.transaction():
                public_id = conn.execute("SELECT public_id::text FROM outbox_enqueue('booking.created', %s::jsonb)",
                                         (PAYLOAD,)).fetchone()[0]
            committed[public_id] = time.time()
            time.sleep(0.05)  # the worker goes idle again between messages
        deadline = time.monotonic() + 30
        while done_count(conn, "outbox") < s.latency_messages and time.monotonic() < deadline:
            time.sleep(0.1)
        # Unsubscribed: the parts that follow drain with SQL consumers only (a subscription left
        # behind had the worker deliver their messages too, and deadlock with their TRUNCATEs).
        truncate(conn, "outbox, outbox_subscription")
    time.sleep(0.5)  # nginx flushes its log every 100 ms
    arrivals = receiver.arrivals()
    delays = sorted((arrivals[i] - t) * 1000 for i, t in committed.items() if i in arrivals)
    if len(delays) < len(committed):
        raise RuntimeError(f"only {len(delays)} of {len(committed)} messages reached the receiver")
    return {"messages": len(delays), "p50_ms": delays[len(delays) // 2],
            "p99_ms": delays[min(len(delays) - 1, int(len(delays) * 0.99))], "max_ms": delays[-1]}


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def machine():
    model = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
    postgres = re.match(r"PostgreSQL \S+", pg_config("--version")).group(0)
    return f"{os.cpu_count()} cores ({model}), {platform.system()} {platform.release()}, {postgres}"


def lease_decay_lines(ld):
    """Part 11 of the report: the rate and the blocks read per claim over the run."""
    return [
        f"## 11. Claims with a lease over {ld['seconds']} s ({ld['consumers']} consumers × {ld['batch']}, backlog kept level)",
        "",
        f"First minute {ld['first_minute_per_s']:.0f} msg/s, last minute {ld['last_minute_per_s']:.0f} msg/s: "
        f"**{ld['ratio']:.2f}** (goal ≥ 0.8).",
        "",
        "| at s | claimed msg/s | ready-index blocks per claim | table blocks per message | ready index MB | dead tuples | autovacuums so far |",
        "|---|---|---|---|---|---|---|",
        *[f"| {i['at_s']} | {i['claimed_per_s']:.0f} | {i['index_blocks_per_claim'] or 0:.0f} | {i['heap_blocks_per_message'] or 0:.1f} "
          f"| {i['ready_index_mb']:.1f} | {i['dead_tuples']} | {i['autovacuums']} |" for i in ld["intervals"]],
        "",
    ]


def pinned_lines(rows, phases):
    """Part 12 of the report: p99 and blocks per message per phase, per holder and style."""
    def cell(phase):
        return (f"{phase['p99_ms']:.1f} ms, {phase['index_blocks_per_message']:.1f} / {phase['table_blocks_per_message']:.1f}, "
                f"{phase['index_mb']:.1f} / {phase['table_mb']:.1f} MB")
    return [
        f"## 12. Under a pinned horizon (1,000 msg/s, 2 consumers × 20, phases {phases} s)",
        "",
        "Each cell: p99 from enqueue to completion; blocks read per message of the index claims seek / of the table; "
        "their sizes at the phase's end.",
        "",
        "| horizon held by | consumer | clean | pinned | recovery | **p99 pinned / clean** | index blocks per message, pinned / clean |",
        "|---|---|---|---|---|---|---|",
        *[f"| {r['holder']} | {r['style']} | {cell(r['clean'])} | {cell(r['pinned'])} | {cell(r['recovery'])} "
          f"| **{r['p99_pinned_over_clean']:.2f}** | {r['index_blocks_pinned_over_clean']:.2f} |" for r in rows],
        "",
    ]


def stats_lines(st):
    """Part 13 of the report."""
    return [
        f"## 13. What the numbers cost (10,000 pending, {st['ended_rows']:,} ended messages)",
        "",
        f"`outbox_stats()` **{st['stats_ms']:.1f} ms**, `outbox_depth()` {st['depth_ms']:.1f} ms; a plain count of the "
        f"pending messages {st['count_pending_ms']:.1f} ms (goal for outbox_stats: under 10 ms).",
        "",
    ]


def report(results, s, path_md, path_png):
    e, d, f, l, w, t, c, o, p, fo = (results[k] for k in ("enqueue", "drain", "flat", "long_txn", "delivery", "latency", "churn",
                                                       "ordering", "protections", "fan_out"))
    cores = os.cpu_count()
    # CPU seconds per message of the cheapest drain of part 2 (SQL only, no HTTP).
    database_cpu = min(r[f"{v}_cpu_busy"] * cores / r[f"{v}_per_s"] for r in d for v in ("essay", "no_lease"))

    def ceiling(row):
        """Deliveries/s when each costs database_cpu plus the CPU of one wrk request (wrk and
        nginx together), on all the cores: what no worker on this machine can exceed."""
        return 1 / (database_cpu + row["wrk_cpu_busy"] * cores / row["wrk_per_s"])

    lines = [
        f"# outbox_ext benchmark results{' (smoke run: too short to quote)' if s.smoke else ''}",
        "",
        f"Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC. Machine: {machine()}.",
        "",
        "## 1. Enqueue cost (8 clients, ~220-byte booking snapshot)",
        "",
        "| synchronous_commit, protocol | plain INSERT msg/s | minimal outbox INSERT | essay's outbox INSERT | outbox_enqueue | **outbox_enqueue / plain** | minimal / plain | essay / plain | outbox_enqueue_batch (10) | batch / plain |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[f"| {r['synchronous_commit']}, {r['protocol']} | {r['plain_per_s']:.0f} | {r['minimal_per_s']:.0f} | {r['essay_per_s']:.0f} | {r['outbox_per_s']:.0f} | **{r['ratio']:.2f}** | {r['minimal_ratio']:.2f} | {r['essay_ratio']:.2f} | {r['batch_per_s']:.0f} | {r['batch_ratio']:.2f} |" for r in e],
        "",
        "The minimal outbox is a direct INSERT into the least a table needs to be claimed at a flat cost "
        "(a key and a partial index of ready rows): no function, no public_id, no attempts or history columns.",
        "",
        f"## 2. Drain throughput (burn-down from a backlog of {s.drain_backlog:,})",
        "",
        "| consumers | batch | essay's SQL msg/s | outbox_claim(lease => NULL) | **/ essay** | outbox_claim (30 s lease) | / essay |",
        "|---|---|---|---|---|---|---|",
        *[f"| {r['consumers']} | {r['batch']} | {r['essay_per_s']:.0f} | {r['no_lease_per_s']:.0f} | **{r['ratio']:.2f}** | {r['lease_per_s']:.0f} | {r['lease_ratio']:.2f} |" for r in d],
        "",
        "## 3. Flat cost as history grows (claim + complete of 10, one client)",
        "",
        "| DONE rows | mean latency (ms) |",
        "|---|---|",
        f"| 0 (first run) | {f['latency_ms_empty_before']:.3f} |",
        f"| {f['history_rows']:,} | {f['latency_ms_history']:.3f} |",
        f"| 0 (after the purge) | {f['latency_ms_empty_after']:.3f} |",
        f"| ratio to the mean of the runs without | **{f['ratio']:.2f}** |",
        "",
        f"## 4. A long transaction holding back vacuum ({s.long_txn_rate} msg/s produced, phases {s.long_txn_phases} s)",
        "",
        "| phase | completed msg/s | dead tuples at end | table MB | indexes MB |",
        "|---|---|---|---|---|",
        *[f"| {name} | {p['done_per_s']:.0f} | {p['dead_tuples']} | {p['table_mb']:.1f} | {p['indexes_mb']:.1f} |"
          for name, p in ((k, l[k]) for k in ("before", "during", "after"))],
        f"| dip during | **{l['dip'] * 100:.1f}%** | | | |",
        "",
        "## 5. Delivery through the worker to a local nginx (200 at once)",
        "",
        "| in flight | worker deliveries/s | wrk requests/s (same concurrency) | **worker / wrk** | ceiling estimate, / wrk |",
        "|---|---|---|---|---|",
        *[f"| {r['in_flight']} | {r['worker_per_s']:.0f} | {r['wrk_per_s']:.0f} | **{r['ratio']:.2f}** | {ceiling(r):,.0f}/s = {min(ceiling(r), r['wrk_per_s']) / r['wrk_per_s']:.2f} |" for r in w],
        "",
        f"Ceiling estimate: a delivery costs at least the CPU time of one message of the cheapest drain of part 2 "
        f"({database_cpu * 1e6:.0f} µs, SQL only) plus that of one wrk request (wrk and nginx together, measured from "
        f"/proc/stat during the wrk run), on {cores} cores shared by all of them. The ratio is capped at 1 (the worker "
        f"cannot outrun wrk's round trips at the same concurrency).",
        "",
        "## 6. Latency from commit to the receiver (idle worker)",
        "",
        f"{t['messages']} messages: p50 **{t['p50_ms']:.1f} ms**, p99 **{t['p99_ms']:.1f} ms**, max {t['max_ms']:.1f} ms.",
        "",
        f"## 7. Table size after {s.churn_seconds} s of churn (1,000 msg/s, DONE purged every 5 s)",
        "",
        "| storage settings | table MB | indexes MB | dead tuples |",
        "|---|---|---|---|",
        *[f"| {r['settings']} | {r['table_mb']:.1f} | {r['indexes_mb']:.1f} | {r['dead_tuples']} |" for r in c],
        "",
        "## 8. Ordering keys",
        "",
        f"Enqueue, 8 clients: without a key {o['enqueue_per_s']:.0f} msg/s, with one of 1,000 keys "
        f"{o['enqueue_keyed_per_s']:.0f} msg/s: **{o['enqueue_ratio']:.2f}** (goal ≥ 0.9); with the key built in the "
        f"statement (`'booking:' || n`, as until 0.5.9) {o['enqueue_keyed_in_sql_per_s']:.0f} msg/s: {o['enqueue_in_sql_ratio']:.2f}.",
        "",
        f"Drain of a backlog of {s.drain_backlog:,}, 4 consumers × 100, with leases (goal with 1,000 keys: ≥ 0.8 of no keys):",
        "",
        "| messages' keys | msg/s | **/ no keys** |",
        "|---|---|---|",
        *[f"| {r['keys']} | {r['per_s']:.0f} | **{r['ratio']:.2f}** |" for r in o["drain"]],
        "",
        "## 9. Endpoint protections on the default path (worker to nginx, 8 in flight)",
        "",
        f"Default subscription {p['default_per_s']:.0f} deliveries/s; with a rate limit and max_in_flight that never bind "
        f"{p['limits_per_s']:.0f}/s: **{p['ratio']:.2f}** (goal: within 5%). The SSRF guard judges every connection in both.",
        "",
        "## 10. Fan-out through the worker (8 in flight, to nginx)",
        "",
        "| endpoints per topic | deliveries/s |",
        "|---|---|",
        *[f"| {name} | {rate:.0f} |" for name, rate in fo["rates"].items()],
        "",
        f"The attempt log: {fo['with_log_per_s']:.0f} messages/s with it, {fo['without_log_per_s']:.0f}/s with its rows discarded "
        f"by a trigger: **{fo['log_ratio']:.2f}** (goal: within 10%).",
        "",
        *lease_decay_lines(results["lease_decay"]),
        *pinned_lines(results["pinned"], s.pinned_phases),
        *stats_lines(results["stats"]),
        *bulk_lines(results["bulk"]),
        *retention_lines(results["retention"]),
    ]
    path_md.write_text("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    x = range(len(e))
    ax.bar([i - 0.3 for i in x], [r["ratio"] for r in e], 0.2, label="outbox_enqueue")
    ax.bar([i - 0.1 for i in x], [r["minimal_ratio"] for r in e], 0.2, label="minimal outbox insert")
    ax.bar([i + 0.1 for i in x], [r["essay_ratio"] for r in e], 0.2, label="essay's insert")
    ax.bar([i + 0.3 for i in x], [r["batch_ratio"] for r in e], 0.2, label="outbox_enqueue_batch")
    ax.set_xticks(list(x), [f"synchronous_commit={r['synchronous_commit']}, {r['protocol']}" for r in e])
    ax.axhline(0.9, color="gray", linestyle="--", label="target 0.90")
    ax.set_title("Enqueue msg/s / plain INSERT")
    ax.legend()
    ax = axes[0][1]
    labels = [f"{r['consumers']}c×{r['batch']}" for r in d]
    x = range(len(d))
    ax.bar([i - 0.27 for i in x], [r["essay_per_s"] for r in d], 0.27, label="essay's SQL")
    ax.bar([i for i in x], [r["no_lease_per_s"] for r in d], 0.27, label="outbox_claim, no lease")
    ax.bar([i + 0.27 for i in x], [r["lease_per_s"] for r in d], 0.27, label="outbox_claim, lease")
    ax.set_xticks(list(x), labels, rotation=45)
    ax.set_title("Drain throughput (msg/s): consumers × batch")
    ax.legend()
    ax = axes[1][0]
    x = range(len(w))
    ax.bar([i - 0.2 for i in x], [r["wrk_per_s"] for r in w], 0.4, label="wrk")
    ax.bar([i + 0.2 for i in x], [r["worker_per_s"] for r in w], 0.4, label="worker")
    ax.set_xticks(list(x), [f"{r['in_flight']} in flight" for r in w])
    ax.set_title("HTTP deliveries/s to a local nginx")
    ax.legend()
    ax = axes[1][1]
    ax.bar(["p50", "p99"], [t["p50_ms"], t["p99_ms"]], color="tab:green")
    ax.set_title("Commit → receiver latency (ms)")
    figure.suptitle(f"outbox_ext benchmark, {datetime.date.today()} ({'smoke' if s.smoke else 'full'})")
    figure.tight_layout()
    figure.savefig(path_png, dpi=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--port", type=int, default=25390)
    parser.add_argument("--receiver-port", type=int, default=25391)
    parser.add_argument("--output", type=pathlib.Path, default=BENCH / "results")
    parser.add_argument("--only", nargs="*", help="run only these parts (enqueue drain flat long_txn delivery latency churn ordering protections fan_out lease_decay pinned stats bulk retention)")
    args = parser.parse_args()
    s = Settings(args.smoke)
    cluster, receiver = Cluster(args.port), Nginx(args.receiver_port)
    results = {}
    parts = [
        ("enqueue", lambda: enqueue_cost(cluster, s)),
        ("drain", lambda: drain_throughput(cluster, s)),
        ("flat", lambda: flat_cost(cluster, s)),
        ("long_txn", lambda: long_transaction(cluster, s)),
        ("delivery", lambda: delivery(cluster, receiver, s)),
        ("latency", lambda: latency(cluster, receiver, s)),
        ("churn", lambda: churn(cluster, s)),
        ("ordering", lambda: ordering(cluster, s)),
        ("protections", lambda: protections(cluster, receiver, s)),
        ("fan_out", lambda: fan_out(cluster, receiver, s)),
        ("lease_decay", lambda: lease_decay(cluster, s)),
        ("pinned", lambda: pinned_horizon(cluster, s)),
        ("stats", lambda: stats_cost(cluster, s)),
        ("bulk", lambda: bulk_load(cluster, s)),
        ("retention", lambda: retention(cluster, s)),
    ]
    try:
        cluster.start()
        receiver.start()
        for name, run in parts:
            if args.only and name not in args.only:
                continue
            began = time.monotonic()
            results[name] = run()
            print(f"bench: {name} done in {time.monotonic() - began:.0f}s: {json.dumps(results[name], default=str)}", flush=True)
    finally:
        receiver.stop()
        cluster.stop()
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / ("smoke.json" if s.smoke else "latest.json")).write_text(json.dumps(results, indent=2))
    if not args.only:
        stem = "smoke" if s.smoke else "latest"
        report(results, s, args.output / f"{stem}.md", args.output / f"{stem}.png")
        print((args.output / f"{stem}.md").read_text())


if __name__ == "__main__":
    main()
