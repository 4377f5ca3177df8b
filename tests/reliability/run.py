#!/usr/bin/env python3
"""The reliability suite: faults, load and hostile input, with nothing lost.

Run it with scripts/reliability.sh (`make reliability`); `--short` is the version inside the
test command. It starts its own scratch cluster (the worker preloaded) and a local receiver on
127.0.0.1, runs every scenario, prints one table (what was tried, how many messages, how many
lost, how many duplicated, how long recovery took) and exits non-zero if anything was lost or
any check failed.
"""

import argparse
import os
import pathlib
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

import psycopg

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))  # run as a script: the shared test support
from support.cluster import ScratchCluster, pg_program  # noqa: E402
from support.receiver import Receiver  # noqa: E402

DATABASE = "outbox_reliability"
CONF = """
fsync = on
outbox.worker_databases = 'outbox_reliability'
outbox.backoff_base = '100ms'
outbox.backoff_jitter = 0.1
outbox.max_attempts = 10
outbox.http_timeout = '500ms'
outbox.poll_interval = '200ms'
outbox.worker_batch_size = 50
"""
SETUP = """
CREATE TABLE handled (message_id bigint NOT NULL, handled_at timestamptz NOT NULL DEFAULT clock_timestamp());
"""


class Scale:
    def __init__(self, short: bool):
        self.consumer_messages = 400 if short else 5_000
        self.consumer_kills = 6 if short else 40
        self.delivery_messages = 300 if short else 4_000
        self.worker_kills = 1 if short else 4
        self.fault_messages = 300 if short else 3_000
        self.fault_phase_seconds = 2 if short else 8
        self.lock_seconds = 12  # longer than the worker's lock_timeout (10 s)
        self.soak_seconds = 20 if short else 240
        self.million = 30_000 if short else 1_000_000
        self.hostile_examples = 150 if short else 3_000
        self.purge_rows = 20_000 if short else 500_000


# --------------------------------------------------------------------------------------------


def wait_until(check, timeout, interval=0.1, what="condition"):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except psycopg.OperationalError:
            pass  # the server is restarting
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def count(cluster, sql, *args):
    with cluster.connect() as conn:
        return conn.execute(sql, args).fetchone()[0]


def reset(cluster, subscribe_url=None):
    with cluster.connect() as conn:
        conn.execute("TRUNCATE outbox, outbox_delivery, handled CASCADE")
        conn.execute("DELETE FROM outbox_subscription")
        if subscribe_url:
            conn.execute("SELECT outbox_subscribe('booking.created', %s)", (subscribe_url,))


def enqueue(cluster, n, topic="booking.created"):
    with cluster.connect() as conn:
        conn.execute(
            "SELECT count(*) FROM outbox_enqueue_batch(%s, ARRAY(SELECT jsonb_build_object('n', g) FROM generate_series(1, %s) g))",
            (topic, n))


class Cluster(ScratchCluster):
    """The suite's scratch cluster: CONF, and the database DATABASE with the extension and the
    SETUP tables; connect() goes there, and pgbench finds it through PGHOST/PGPORT/PGUSER."""

    def __init__(self, port: int):
        super().__init__(port, CONF)

    def start(self):
        super().start()
        os.environ.update(PGHOST="127.0.0.1", PGPORT=str(self.port), PGUSER="postgres")
        self.create_database(DATABASE)
        with self.connect() as conn:
            conn.execute(SETUP)
        return self

    def connect(self, dbname: str = DATABASE, **kwargs) -> psycopg.Connection:
        return super().connect(dbname, **kwargs)

    def stop(self):
        super().stop()
        shutil.rmtree(self.dir, ignore_errors=True)


def worker_pid(cluster):
    with cluster.connect() as conn:
        row = conn.execute("SELECT pid FROM pg_stat_activity WHERE backend_type = 'outbox_ext delivery worker'").fetchone()
        return row and row[0]


def rss_kb(pid):
    """Private resident memory (RssAnon): shared buffers a process touches are not its own."""
    try:
        for line in open(f"/proc/{pid}/status"):
            if line.startswith("RssAnon:"):
                return int(line.split()[1])
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------------------------
# Consumers that crash
# --------------------------------------------------------------------------------------------

CONSUMER = r"""
import sys, time, psycopg
style = sys.argv[1]
conn = psycopg.connect(dbname=sys.argv[2], autocommit=True)
while True:
    if style == "transaction":
        # claim, record the effect and complete in one transaction: a crash undoes all of it
        with conn.transaction():
            ids = [r[0] for r in conn.execute("SELECT id FROM outbox_claim(20, lease => NULL)")]
            time.sleep(0.005 * len(ids))  # the work
            conn.execute("INSERT INTO handled (message_id) SELECT unnest(%s::bigint[])", (ids,))
            conn.execute("SELECT outbox_complete(%s::bigint[])", (ids,))
    else:
        # commit the claim with a lease, do the effect, complete later: a crash in between
        # leaves the effect done and the message to be delivered again
        rows = conn.execute("SELECT id, lease_token FROM outbox_claim(20, lease => '2 seconds')").fetchall()
        for message_id, token in rows:
            conn.execute("INSERT INTO handled (message_id) VALUES (%s)", (message_id,))
            time.sleep(0.005)  # the work, done: a crash from here on means a duplicate
            conn.execute("SELECT outbox_complete(%s, %s)", (message_id, token))
        ids = rows
    if not ids:
        time.sleep(0.05)
"""


def consumer_crashes(cluster, scale, style):
    reset(cluster)
    enqueue(cluster, scale.consumer_messages)
    command = [sys.executable, "-c", CONSUMER, style, DATABASE]
    start = lambda: subprocess.Popen(command, stderr=subprocess.DEVNULL)  # they die noisily, on purpose
    consumers = [start() for _ in range(4)]
    kills = 0
    rng = random.Random(7)
    try:
        while kills < scale.consumer_kills and count(cluster, "SELECT count(*) FROM outbox WHERE status = 'PENDING'") > 0:
            time.sleep(rng.uniform(0.05, 0.3))
            victim = rng.randrange(len(consumers))
            if rng.random() < 0.5:
                consumers[victim].kill()  # the process dies
                consumers[victim].wait()
            else:  # the connection is dropped under it
                with cluster.connect() as conn:
                    conn.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                        " AND backend_type = 'client backend' AND query LIKE '%%outbox_c%%' LIMIT 1", (DATABASE,))
                consumers[victim].kill()
                consumers[victim].wait()
            consumers[victim] = start()
            kills += 1
        last_fault = time.monotonic()
        wait_until(lambda: count(cluster, "SELECT count(*) FROM outbox WHERE status = 'DONE'") == scale.consumer_messages,
                   timeout=120, what="every message DONE")
        recovery = time.monotonic() - last_fault
    finally:
        for c in consumers:
            c.kill()
            c.wait()
    with cluster.connect() as conn:
        handled, distinct = conn.execute("SELECT count(*), count(DISTINCT message_id) FROM handled").fetchone()
    lost = scale.consumer_messages - distinct
    duplicated = handled - distinct
    # In one transaction, effect and outcome commit together: no duplicate is possible. With
    # leases, at most what was in flight at each crash (20 per consumer) comes again.
    bound = 0 if style == "transaction" else kills * 20
    return {"scenario": f"consumers killed ×{kills} ({'claim+complete in one transaction' if style == 'transaction' else 'lease, complete later'})",
            "messages": scale.consumer_messages, "lost": lost, "duplicated": duplicated, "recovery_s": recovery,
            "ok": lost == 0 and duplicated <= bound, "note": f"duplicates allowed: ≤ {bound}"}


# --------------------------------------------------------------------------------------------
# The worker and the server crash
# --------------------------------------------------------------------------------------------


def delivered_ids(receiver):
    return [r["headers"].get("webhook-id") for r in receiver.requests if r["status"] == 200]


def expected_ids(cluster):
    with cluster.connect() as conn:
        return {r[0] for r in conn.execute("SELECT public_id::text FROM outbox")}


def worker_killed(cluster, scale, receiver):
    receiver.requests.clear()
    receiver.answer_by_default(200, delay=0.01)
    reset(cluster, receiver.url)
    enqueue(cluster, scale.delivery_messages)
    rng = random.Random(11)
    for _ in range(scale.worker_kills):
        wait_until(lambda: worker_pid(cluster), 30, what="the worker")
        time.sleep(rng.uniform(0.2, 1.0))
        os.kill(worker_pid(cluster), signal.SIGKILL)  # the postmaster resets the whole cluster
        time.sleep(1)
    last_fault = time.monotonic()
    wait_until(lambda: count(cluster, "SELECT count(*) FROM outbox WHERE status = 'DONE'") == scale.delivery_messages,
               timeout=180, interval=0.5, what="every message delivered")
    recovery = time.monotonic() - last_fault
    got = delivered_ids(receiver)
    lost = len(expected_ids(cluster) - set(got))
    return {"scenario": f"delivery worker kill -9 ×{scale.worker_kills}", "messages": scale.delivery_messages,
            "lost": lost, "duplicated": len(got) - len(set(got)), "recovery_s": recovery, "ok": lost == 0,
            "note": "duplicates: deliveries whose outcome died with the worker"}


def server_crashed(cluster, scale, receiver):
    """Producers keep enqueueing while the server is stopped with pg_ctl -m immediate and
    restarted (crash recovery): every enqueue whose COMMIT returned is delivered."""
    receiver.requests.clear()
    receiver.answer_by_default(200, delay=0.005)
    reset(cluster, receiver.url)
    committed, stop = [], threading.Event()

    def produce():
        while not stop.is_set():
            try:
                with cluster.connect() as conn:
                    while not stop.is_set():
                        with conn.transaction():
                            public_id = conn.execute("SELECT public_id::text FROM outbox_enqueue('booking.created', '{}')").fetchone()[0]
                        committed.append(public_id)  # only after COMMIT returned
            except psycopg.OperationalError:
                time.sleep(0.2)  # the server is down: try again

    producers = [threading.Thread(target=produce) for _ in range(2)]
    for p in producers:
        p.start()
    time.sleep(2)
    cluster.pg_ctl("stop", "-m", "immediate")
    time.sleep(1)
    cluster.pg_ctl("start")
    last_fault = time.monotonic()
    time.sleep(2)
    stop.set()
    for p in producers:
        p.join()
    wait_until(lambda: count(cluster, "SELECT count(*) FROM outbox WHERE status = 'PENDING'") == 0,
               timeout=180, interval=0.5, what="the backlog to drain after crash recovery")
    recovery = time.monotonic() - last_fault
    got = delivered_ids(receiver)
    lost = len(set(committed) - set(got))
    return {"scenario": "server crash (pg_ctl stop -m immediate) during enqueue and delivery", "messages": len(committed),
            "lost": lost, "duplicated": len(got) - len(set(got)), "recovery_s": recovery, "ok": lost == 0 and len(committed) > 0,
            "note": "every committed enqueue delivered"}


# A count of what the purge must keep or remove, per kind and age: attempt-log rows and DONE
# messages, by the UTC day they started (ended) on, days ago.
HISTORY = """
SELECT 'attempts ' || (current_date - (started_at AT TIME ZONE 'UTC')::date), count(*) FROM outbox_delivery_attempt GROUP BY 1
UNION ALL
SELECT 'done ' || (current_date - (processed_at AT TIME ZONE 'UTC')::date), count(*) FROM outbox WHERE status = 'DONE' GROUP BY 1
"""


def restart_at_once(cluster):
    """The server crashes (pg_ctl -m immediate) and starts again."""
    cluster.pg_ctl("stop", "-m", "immediate")
    cluster.pg_ctl("start")


def back_after(crash, read):
    """crash(), then the seconds until read() answers again."""
    crash()
    began = time.monotonic()
    time.sleep(1)  # (after a kill -9, the postmaster resets the cluster)
    wait_until(lambda: read() is not None, timeout=60, what="the server back")
    return time.monotonic() - began


def purge_crashed(cluster, scale):
    """outbox_purge empties a day of the attempt log (TRUNCATE of its partition) and deletes old
    DONE messages. The server crashes while that transaction is open, after the TRUNCATE (pg_ctl
    -m immediate; kill -9 of the purging backend), and right after it committed (pg_ctl -m
    immediate): what it had not committed is all there, what it committed stays purged, and the
    days it must keep are whole."""
    reset(cluster)
    n = scale.purge_rows
    with cluster.connect() as conn:
        conn.execute("TRUNCATE outbox_delivery_attempt")
        conn.execute("SET timezone = 'UTC'")
        # The attempt log is purged by the day (yesterday's stays until its day ended a day ago),
        # messages by their age (those that ended an hour ago stay).
        for days_ago, rows in ((3, n), (1, n // 10), (0, n // 10)):
            # Within the day (from its start), whatever the hour now.
            start = f"date_trunc('day', now()) - interval '{days_ago} days' + g * interval '1 ms'"
            conn.execute(f"""INSERT INTO outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration, http_status)
                             SELECT g, 1, 1, {start}, interval '20 ms', 200 FROM generate_series(1, {rows}) g""")
        for ended, rows in (("date_trunc('day', now()) - interval '3 days'", n), ("now() - interval '1 hour'", n // 10)):
            conn.execute(f"""INSERT INTO outbox (topic, payload, status, attempts, processed_at)
                             SELECT 'audit.exported', '{{}}', 'DONE', 1, {ended} + g * interval '1 ms' FROM generate_series(1, {rows}) g""")

    def history():
        with cluster.connect() as conn:
            conn.execute("SET timezone = 'UTC'")
            return dict(conn.execute(HISTORY).fetchall())

    def restart_immediately():
        restart_at_once(cluster)

    before = history()
    assert before["attempts 3"] == n and before["done 3"] == n, before
    purged = {k: v for k, v in before.items() if k.endswith(" 3")}
    kept = {k: v for k, v in before.items() if not k.endswith(" 3")}

    def lost_from(expected, now):
        return sum(max(count - now.get(key, 0), 0) for key, count in expected.items())

    def reconnect_after(crash):
        return back_after(crash, history)

    lost, resurrected, recovery, checks = 0, 0, 0.0, []
    for crash in (lambda pid: restart_immediately(), lambda pid: os.kill(pid, signal.SIGKILL)):
        purger = psycopg.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname=DATABASE)
        purger.execute("SELECT outbox_purge(interval '1 day', max_rows => 1000000)")
        # The moment: the day's partition truncated (as this transaction sees it), not committed.
        truncated = purger.execute("SELECT count(*) FROM outbox_delivery_attempt WHERE started_at < now() - interval '2 days'").fetchone()[0] == 0
        pid = purger.info.backend_pid
        recovery = max(recovery, reconnect_after(lambda: crash(pid)))
        purger.close()
        now = history()
        lost += lost_from(before, now)
        checks.append(truncated and now == before)
    with cluster.connect() as conn:
        conn.execute("SELECT outbox_purge(interval '1 day', max_rows => 1000000)")
    recovery = max(recovery, reconnect_after(restart_immediately))
    now = history()
    lost += lost_from(kept, now)
    resurrected = sum(now.get(key, 0) for key in purged)
    checks.append(now == kept)
    with cluster.connect() as conn:
        # The partitions are whole after it all: a request of today is recorded, and purged again.
        conn.execute("""INSERT INTO outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration)
                        VALUES (1, 1, 1, now(), interval '1 ms')""")
        checks.append(conn.execute("SELECT outbox_purge(interval '1 day')").fetchone()[0] == 0)
        conn.execute("TRUNCATE outbox_delivery_attempt")
    reset(cluster)
    return {"scenario": "server crash during outbox_purge (a day's TRUNCATE open: pg_ctl -m immediate, kill -9; committed: pg_ctl -m immediate)",
            "messages": sum(before.values()), "lost": lost, "duplicated": resurrected, "recovery_s": recovery,
            "ok": all(checks) and lost == 0 and resurrected == 0,
            "note": "messages: attempt-log rows and DONE messages; duplicated: purged rows back after recovery"}


# Where the archive's messages and their deliveries are: how many rows, how many distinct
# messages (a message in two places counts once), how many still in outbox itself.
PLACES = """
SELECT (SELECT count(*) FROM outbox WHERE topic = 'audit.exported'),
       (SELECT count(DISTINCT id) FROM outbox WHERE topic = 'audit.exported'),
       (SELECT count(*) FROM outbox_delivery),
       (SELECT count(DISTINCT message_id) FROM outbox_delivery),
       (SELECT count(*) FROM ONLY outbox WHERE topic = 'audit.exported')
"""


def archive_crashed(cluster, scale):
    """outbox_archive moves DONE messages, with their deliveries, out of outbox into the history
    of their day (DELETE and INSERT in one statement). The server crashes while a move of every
    one of them is open (pg_ctl -m immediate; kill -9 of its backend), and right after it
    committed (pg_ctl -m immediate): every message and delivery is in exactly one place. The
    worker is off meanwhile: its own moves would leave the scenario's transaction nothing to
    move (they did in a short run)."""
    return without_worker(cluster, lambda: archive_crashed_without_worker(cluster, scale))


def without_worker(cluster, scenario):
    """scenario() on emptied tables with the delivery worker turned off (and on again after)."""
    reset(cluster)
    cluster.configure(**{"outbox.worker_enabled": "off"})
    try:
        time.sleep(1)  # (the worker applies a reload at its next poll)
        return scenario()
    finally:
        cluster.configure(**{"outbox.worker_enabled": "on"})


def archive_crashed_without_worker(cluster, scale):
    n = scale.purge_rows
    with cluster.connect() as conn:
        subscription = conn.execute("""INSERT INTO outbox_subscription (topic, url, enabled)
                                       VALUES ('audit.exported', 'http://127.0.0.1:9/', false) RETURNING id""").fetchone()[0]
        with conn.transaction():
            for ended in ("now() - interval '1 day'", "now() - interval '1 hour'"):
                conn.execute(f"""INSERT INTO outbox (topic, payload, status, attempts, processed_at)
                                 SELECT 'audit.exported', '{{}}', 'DONE', 1, {ended} + g * interval '1 ms' FROM generate_series(1, {n // 2}) g""")
            conn.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, processed_at)
                            SELECT id, %s, 'DONE', 1, processed_at FROM ONLY outbox WHERE topic = 'audit.exported'""", (subscription,))

    def places():
        with cluster.connect() as conn:
            return conn.execute(PLACES).fetchone()

    def whole(now):
        rows, messages, deliveries, delivered, _ = now
        return rows == messages == deliveries == delivered == n

    recovery, checks, moved_at_crash = 0.0, [], []
    for crash in (lambda pid: restart_at_once(cluster), lambda pid: os.kill(pid, signal.SIGKILL)):
        archiver = psycopg.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname=DATABASE)
        moved_at_crash.append(archiver.execute("SELECT outbox_archive(1000000)").fetchone()[0])
        # The moment: nothing left in outbox as this transaction sees it, not committed.
        emptied = archiver.execute("SELECT NOT EXISTS (SELECT FROM ONLY outbox WHERE topic = 'audit.exported')").fetchone()[0]
        pid = archiver.info.backend_pid
        recovery = max(recovery, back_after(lambda: crash(pid), places))
        archiver.close()
        checks.append(emptied and whole(places()))
    with cluster.connect() as conn:
        wait_until(lambda: conn.execute("SELECT outbox_archive(1000000)") and places()[4] == 0, timeout=60, what="the archive")
    recovery = max(recovery, back_after(lambda: restart_at_once(cluster), places))
    now = places()
    checks.append(whole(now) and now[4] == 0)
    rows, messages, deliveries, delivered, _ = now
    reset(cluster)
    return {"scenario": "server crash during outbox_archive (a move open: pg_ctl -m immediate, kill -9; committed: pg_ctl -m immediate)",
            "messages": n, "lost": n - min(messages, delivered), "duplicated": (rows - messages) + (deliveries - delivered),
            "recovery_s": recovery, "ok": all(checks) and min(moved_at_crash) > 0,
            "note": f"messages: DONE ones with a delivery each; moved by the open transaction: {min(moved_at_crash)} or more"}


def compaction_crashed(cluster, scale):
    """outbox_compact empties outbox and outbox_delivery with TRUNCATE and writes their live rows
    back, in one transaction. The server crashes while a compaction is open (pg_ctl -m
    immediate; kill -9 of its backend), and right after one committed (pg_ctl -m immediate):
    every pending message and delivery is there exactly once, unchanged. The worker is off
    meanwhile, as for the archive."""
    return without_worker(cluster, lambda: compaction_crashed_without_worker(cluster, scale))


def compaction_crashed_without_worker(cluster, scale):
    n = scale.purge_rows // 4
    with cluster.connect() as conn:
        subscription = conn.execute("""INSERT INTO outbox_subscription (topic, url, enabled)
                                       VALUES ('audit.compacted', 'http://127.0.0.1:9/', false) RETURNING id""").fetchone()[0]
        with conn.transaction():
            conn.execute(f"""INSERT INTO outbox (topic, payload) SELECT 'audit.compacted', jsonb_build_object('n', g)
                             FROM generate_series(1, {n}) g""")
            conn.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts)
                            SELECT id, %s, 'PENDING', 0 FROM ONLY outbox WHERE topic = 'audit.compacted'""", (subscription,))

    def rows():
        with cluster.connect() as conn:
            return conn.execute("""SELECT (SELECT md5(string_agg(o::text, ',' ORDER BY id)) FROM ONLY outbox o),
                                          (SELECT md5(string_agg(d::text, ',' ORDER BY message_id)) FROM ONLY outbox_delivery d),
                                          (SELECT count(*) FROM ONLY outbox), (SELECT count(DISTINCT id) FROM ONLY outbox),
                                          (SELECT count(*) FROM ONLY outbox_delivery)""").fetchone()

    before = rows()
    recovery, checks, kept_at_crash = 0.0, [before[2:] == (n, n, n)], []
    for crash in (lambda pid: restart_at_once(cluster), lambda pid: os.kill(pid, signal.SIGKILL)):
        compactor = psycopg.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname=DATABASE)
        kept_at_crash.append(compactor.execute("SELECT outbox_compact(true, 1000000)").fetchone()[0] or 0)
        pid = compactor.info.backend_pid
        recovery = max(recovery, back_after(lambda: crash(pid), rows))
        compactor.close()
        checks.append(rows() == before)
    with cluster.connect() as conn:
        checks.append(conn.execute("SELECT outbox_compact(true, 1000000)").fetchone()[0] == 2 * n)
    recovery = max(recovery, back_after(lambda: restart_at_once(cluster), rows))
    now = rows()
    checks.append(now == before)
    reset(cluster)
    return {"scenario": "server crash during outbox_compact (open: pg_ctl -m immediate, kill -9; committed: pg_ctl -m immediate)",
            "messages": n, "lost": n - min(now[3], now[4]), "duplicated": now[2] - now[3],
            "recovery_s": recovery, "ok": all(checks) and min(kept_at_crash) == 2 * n,
            "note": f"messages: pending ones with a delivery each; written back by the open transaction: {min(kept_at_crash)}"}


# --------------------------------------------------------------------------------------------
# Receiver faults
# --------------------------------------------------------------------------------------------


def enqueue_rate(cluster, seconds):
    done, deadline = 0, time.monotonic() + seconds
    with cluster.connect() as conn:
        while time.monotonic() < deadline:
            with conn.transaction():
                conn.execute("SELECT id FROM outbox_enqueue('booking.created', '{\"n\": 1}')")
            done += 1
    return done / seconds


def receiver_faults(cluster, scale, receiver):
    receiver.requests.clear()
    receiver.answer_by_default(200)
    reset(cluster, receiver.url)
    baseline = enqueue_rate(cluster, 2)
    phase = scale.fault_phase_seconds
    rng = random.Random(3)
    faults = [
        ("down", None),
        ("slow beyond the timeout", lambda: (200, 1.0, {}, b"")),
        ("500 at random, connections cut", lambda: rng.choice([(500, 0, {}, b"boom"), ("cut", 0, {}, b""), (200, 0, {}, b"")])),
    ]
    rates = []
    for name, decide in faults:
        if decide is None:
            receiver.stop()
        else:
            if receiver.stopped:
                receiver.start()  # the same endpoint comes back, on the same port
            receiver.answer_with(decide)
        rates.append(enqueue_rate(cluster, phase))
    receiver.answer_by_default(200)
    last_fault = time.monotonic()
    total = count(cluster, "SELECT count(*) FROM outbox")
    wait_until(lambda: count(cluster, "SELECT count(*) FROM outbox WHERE status = 'DONE'") == total,
               timeout=120, interval=0.5, what="the backlog to drain after the faults")
    recovery = time.monotonic() - last_fault
    dead = count(cluster, "SELECT count(*) FROM outbox WHERE status = 'DEAD'")
    got = delivered_ids(receiver)
    lost = len(expected_ids(cluster) - set(got))
    slowest = min(rates) / baseline
    errors = count(cluster, "SELECT count(*) FROM outbox_delivery WHERE last_error IS NOT NULL")
    return {"scenario": "receiver down, then slow, then failing at random", "messages": total, "lost": lost,
            "duplicated": len(got) - len(set(got)), "recovery_s": recovery,
            "ok": lost == 0 and dead == 0 and slowest > 0.5 and errors > 0,
            "note": f"enqueue rate during faults ≥ {slowest:.2f} of healthy; {errors} with last_error; 0 DEAD" if dead == 0 else f"{dead} DEAD"}


def table_locked(cluster, scale, receiver):
    """An administrator holds the outbox in an ACCESS EXCLUSIVE lock (a long ALTER): the worker
    gives up after lock_timeout, says so in the log, and recovers when the lock goes."""
    receiver.requests.clear()
    receiver.answer_by_default(200)
    reset(cluster, receiver.url)
    log_start = cluster.server_log.stat().st_size
    admin = psycopg.connect(dbname=DATABASE)
    admin.execute("LOCK TABLE outbox IN ACCESS EXCLUSIVE MODE")
    threading.Thread(target=lambda: enqueue(cluster, 100), daemon=True).start()  # waits for the lock too
    time.sleep(scale.lock_seconds)
    admin.commit()
    admin.close()
    last_fault = time.monotonic()
    wait_until(lambda: count(cluster, "SELECT count(*) FROM outbox WHERE status = 'DONE'") == 100,
               timeout=60, what="delivery after the lock")
    recovery = time.monotonic() - last_fault
    log = cluster.server_log.read_bytes()[log_start:].decode(errors="replace")
    said_so = "lock timeout" in log
    return {"scenario": f"outbox locked by an administrator for {scale.lock_seconds} s", "messages": 100, "lost": 0,
            "duplicated": len(receiver.requests) - 100, "recovery_s": recovery, "ok": said_so,
            "note": "worker logged the lock timeout and recovered" if said_so else "no lock timeout in the log"}


# --------------------------------------------------------------------------------------------
# Load
# --------------------------------------------------------------------------------------------

DRAIN_ONCE = """
WITH claimed AS (SELECT id FROM outbox_claim(100, lease => NULL)),
     recorded AS (INSERT INTO handled (message_id) SELECT id FROM claimed)
SELECT outbox_complete(coalesce(array_agg(id), '{}')) FROM claimed;
"""


def million_exactly_once(cluster, scale):
    reset(cluster)
    with cluster.connect() as conn:
        conn.execute("INSERT INTO outbox (topic, payload) SELECT 'booking.created', jsonb_build_object('n', g) FROM generate_series(1, %s) g",
                     (scale.million,))
        conn.execute("VACUUM ANALYZE outbox")
    script = pathlib.Path("/tmp/outbox_ext-reliability-drain.sql")
    script.write_text(DRAIN_ONCE)
    while count(cluster, "SELECT count(*) FROM outbox WHERE status = 'PENDING'") > 0:
        subprocess.run([pg_program("pgbench"), "-n", "-c", "8", "-j", "2", "-T", "10", "-f", script, DATABASE],
                       check=True, capture_output=True)
    with cluster.connect() as conn:
        handled, distinct = conn.execute("SELECT count(*), count(DISTINCT message_id) FROM handled").fetchone()
        # From the first completion to the last (pgbench runs in 10-second slices).
        elapsed = float(conn.execute("SELECT extract(epoch FROM max(processed_at) - min(processed_at)) FROM outbox").fetchone()[0])
    return {"scenario": f"{scale.million:,} messages, 8 consumers", "messages": scale.million,
            "lost": scale.million - distinct, "duplicated": handled - distinct, "recovery_s": None,
            "ok": handled == distinct == scale.million, "note": f"{scale.million / elapsed:,.0f} msg/s, exactly once each"}


def soak(cluster, scale, receiver):
    """Producers and consumers at a sustained rate with the history growing: throughput and
    claim latency per window, and the memory of the worker and the backends, start vs end."""
    receiver.requests.clear()
    receiver.answer_by_default(200)
    reset(cluster)  # booking.created: no endpoint, the SQL consumers' alone
    with cluster.connect() as conn:
        conn.execute("SELECT outbox_subscribe('invoice.paid', %s)", (receiver.url,))
    produce = pathlib.Path("/tmp/outbox_ext-reliability-produce.sql")
    produce.write_text("SELECT id FROM outbox_enqueue('booking.created', '{\"n\": 1}');\n")
    consume = pathlib.Path("/tmp/outbox_ext-reliability-consume.sql")
    consume.write_text(DRAIN_ONCE)
    seconds = scale.soak_seconds
    # booking.created is drained by SQL consumers; invoice.paid goes through the worker.
    runs = [
        subprocess.Popen([pg_program("pgbench"), "-n", "-c", "2", "-R", "800", "-T", str(seconds), "-f", produce, DATABASE],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
        subprocess.Popen([pg_program("pgbench"), "-n", "-c", "2", "-R", "20", "-T", str(seconds), "-f", consume, DATABASE],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
    ]
    windows, memory = [], []
    started = time.monotonic()
    with cluster.connect() as monitor:
        while (elapsed := time.monotonic() - started) < seconds:
            enqueue(cluster, 20, topic="invoice.paid")
            # A claim, given back: its latency as the history grows. The median of five in a row,
            # so that one claim that waited for a core (two, shared with the load) does not
            # stand for the second (a single claim per second made the check flaky).
            claims = []
            for _ in range(5):
                t0 = time.perf_counter()
                with monitor.transaction():
                    monitor.execute("SELECT count(*) FROM outbox_claim(1, ARRAY['booking.created'], lease => NULL)")
                    claims.append((time.perf_counter() - t0) * 1000)
                    raise psycopg.Rollback()
            claim_ms = statistics.median(claims)
            done = monitor.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0]
            pids = [r[0] for r in monitor.execute(
                "SELECT pid FROM pg_stat_activity WHERE datname = %s AND backend_type IN ('client backend', 'outbox_ext delivery worker')",
                (DATABASE,))]
            memory.append(sum(filter(None, (rss_kb(p) for p in pids))))
            worker = worker_pid(cluster)
            windows.append((elapsed, done, claim_ms, rss_kb(worker) if worker else None))
            time.sleep(1)
    for run in runs:
        run.wait()
    half = len(windows) // 2
    rate = lambda ws: (ws[-1][1] - ws[0][1]) / (ws[-1][0] - ws[0][0])
    first, second = rate(windows[:half]), rate(windows[half:])
    latency_first = sorted(w[2] for w in windows[:half])[half // 2]
    latency_second = sorted(w[2] for w in windows[half:])[(len(windows) - half) // 2]
    worker_rss = [w[3] for w in windows if w[3]]
    flat = second >= 0.8 * first and latency_second <= 2 * latency_first + 1
    return {"scenario": f"soak {seconds} s: 800 msg/s in, SQL consumers and the worker out", "messages": windows[-1][1],
            "lost": 0, "duplicated": 0, "recovery_s": None, "ok": flat,
            "note": (f"done/s {first:.0f} → {second:.0f}; claim p50 {latency_first:.2f} → {latency_second:.2f} ms; "
                     f"worker private RSS {worker_rss[0] // 1024 if worker_rss else '?'} → {worker_rss[-1] // 1024 if worker_rss else '?'} MB; "
                     f"backends+worker private RSS {memory[0] // 1024} → {memory[-1] // 1024} MB")}


# --------------------------------------------------------------------------------------------
# Hostile input
# --------------------------------------------------------------------------------------------


def hostile_input(cluster, scale):
    from hostile import run_hostile

    reset(cluster)
    result = run_hostile(cluster, scale.hostile_examples)
    return {"scenario": f"hostile input: {result['calls']} generated calls", "messages": result["rows"], "lost": 0,
            "duplicated": 0, "recovery_s": None, "ok": not result["problems"],
            "note": "; ".join(result["problems"][:3]) or f"errors by SQLSTATE: {result['sqlstates']}"}


# --------------------------------------------------------------------------------------------


def table(rows):
    lines = ["| scenario | messages | lost | duplicated | recovery (s) | ok | notes |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        recovery = "" if r["recovery_s"] is None else f"{r['recovery_s']:.1f}"
        lines.append(f"| {r['scenario']} | {r['messages']:,} | {r['lost']} | {r['duplicated']} | {recovery} | "
                     f"{'yes' if r['ok'] else '**NO**'} | {r['note']} |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--short", action="store_true")
    parser.add_argument("--port", type=int, default=25380)
    parser.add_argument("--output", type=pathlib.Path)
    parser.add_argument("--only", nargs="*", help="run only these (hostile consumers worker server purge archive compact receiver locked million soak)")
    args = parser.parse_args()
    scale = Scale(args.short)
    cluster = Cluster(args.port)
    receiver = Receiver()
    rows = []
    scenarios = [
        ("hostile", lambda: hostile_input(cluster, scale)),
        ("consumers", lambda: consumer_crashes(cluster, scale, "transaction")),
        ("consumers", lambda: consumer_crashes(cluster, scale, "lease")),
        ("worker", lambda: worker_killed(cluster, scale, receiver)),
        ("server", lambda: server_crashed(cluster, scale, receiver)),
        ("purge", lambda: purge_crashed(cluster, scale)),
        ("archive", lambda: archive_crashed(cluster, scale)),
        ("compact", lambda: compaction_crashed(cluster, scale)),
        ("receiver", lambda: receiver_faults(cluster, scale, receiver)),
        ("locked", lambda: table_locked(cluster, scale, receiver)),
        ("million", lambda: million_exactly_once(cluster, scale)),
        ("soak", lambda: soak(cluster, scale, receiver)),
    ]
    scenarios = [run for name, run in scenarios if not args.only or name in args.only]
    started = time.monotonic()
    try:
        cluster.start()
        receiver.start()
        for scenario in scenarios:
            began = time.monotonic()
            row = scenario()
            rows.append(row)
            print(f"reliability: {row['scenario']}: {'ok' if row['ok'] else 'FAILED'} in {time.monotonic() - began:.0f}s", flush=True)
    finally:
        receiver.stop()
        cluster.stop()
    report = f"{table(rows)}\n\nTotal {time.monotonic() - started:.0f} s ({'short' if args.short else 'full'} run).\n"
    print(report)
    if args.output:
        args.output.write_text(report)
    failed = [r for r in rows if not r["ok"] or r["lost"]]
    print(f"{len(rows) - len(failed)} passed, {len(failed)} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
