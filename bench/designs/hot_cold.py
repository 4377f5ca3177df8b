#!/usr/bin/env python3
"""A design experiment, not part of `make bench`: what moving ended messages out of the table
that claims read (a hot table and a cold one, as awa does) would cost and buy, measured side by
side with today's one table, before building it (docs/storage.md quotes the results).

Two stand-ins with the columns and indexes of `outbox` that matter here:
  one table  spike_one: every message, ended ones included (today's design); a claim and its
             completion is one UPDATE to DONE.
  hot/cold   spike_hot holds the pending messages only; a completion DELETEs the row there and
             INSERTs it into spike_cold, partitioned by day like the attempt log
             (outbox_attempt_log_slot(processed_at)), with indexes on id and public_id.

1. Drain: 4 clients, each claims 100 ready messages (FOR UPDATE SKIP LOCKED) and completes them
   in the same statement (the shape of a claim with lease => NULL); alternating rounds, msg/s.
2. Pinned horizon: 1,000 msg/s enqueued and drained by 2 clients (batches of 20) for 30 s, then
   30 s with a REPEATABLE READ session idle in its transaction, then 60 s after it ends; the size
   of what the claims read (the table with the pending messages and its ready index) every 5 s.

  OUTBOX_PG_CONFIG=/usr/lib/postgresql/15/bin/pg_config bench/designs/hot_cold.py [--drain-only]
"""
import json
import pathlib
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from bench import PAYLOAD, Cluster  # noqa: E402
from bench import pgbench as run_pgbench  # noqa: E402 (an absolute script path is used as it is)

COLUMNS = """
    id           bigint        NOT NULL,
    public_id    uuid          NOT NULL DEFAULT gen_random_uuid(),
    topic        varchar(64)   NOT NULL,
    payload      jsonb         NOT NULL,
    status       outbox_status NOT NULL DEFAULT 'PENDING',
    attempts     integer       NOT NULL DEFAULT 0,
    available_at timestamptz   NOT NULL DEFAULT clock_timestamp(),
    processed_at timestamptz,
    last_error   text,
    created_at   timestamptz   NOT NULL DEFAULT now()
"""
QUEUE_SETTINGS = """(autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02, autovacuum_vacuum_cost_delay = 1)"""
SETUP = f"""
DROP TABLE IF EXISTS spike_one, spike_hot, spike_cold;
DROP SEQUENCE IF EXISTS spike_id;
CREATE SEQUENCE spike_id;
CREATE TABLE spike_one ({COLUMNS}, PRIMARY KEY (id), UNIQUE (public_id)) WITH {QUEUE_SETTINGS};
ALTER TABLE spike_one ALTER id SET DEFAULT nextval('spike_id');
CREATE INDEX spike_one_ready ON spike_one (available_at, id) WHERE status = 'PENDING';
CREATE INDEX spike_one_processed ON spike_one (status, processed_at) WHERE status <> 'PENDING';
CREATE TABLE spike_hot ({COLUMNS}, PRIMARY KEY (id), UNIQUE (public_id)) WITH {QUEUE_SETTINGS};
ALTER TABLE spike_hot ALTER id SET DEFAULT nextval('spike_id');
CREATE INDEX spike_hot_ready ON spike_hot (available_at, id) WHERE status = 'PENDING';
CREATE TABLE spike_cold ({COLUMNS}) PARTITION BY LIST (outbox_attempt_log_slot(processed_at));
CREATE INDEX ON spike_cold (id);
CREATE INDEX ON spike_cold (public_id);
CREATE INDEX ON spike_cold USING brin (processed_at);
DO $$ BEGIN
    FOR slot IN 0..31 LOOP
        EXECUTE format('CREATE TABLE spike_cold_%s PARTITION OF spike_cold FOR VALUES IN (%s)', slot, slot);
    END LOOP;
END $$;
"""
CLAIM = """SELECT id FROM {table} WHERE status = 'PENDING' AND available_at <= clock_timestamp()
            ORDER BY available_at, id LIMIT {batch} FOR UPDATE SKIP LOCKED"""
DRAIN = {
    "one table": """WITH claimed AS ({claim})
UPDATE spike_one o SET status = 'DONE', attempts = o.attempts + 1, processed_at = clock_timestamp()
  FROM claimed c WHERE o.id = c.id;""",
    "hot/cold": """WITH claimed AS ({claim}),
     ended AS (DELETE FROM spike_hot h USING claimed c WHERE h.id = c.id RETURNING h.*)
INSERT INTO spike_cold SELECT id, public_id, topic, payload, 'DONE', attempts + 1, available_at, clock_timestamp(),
                              last_error, created_at FROM ended;""",
}
TABLE = {"one table": "spike_one", "hot/cold": "spike_hot"}


def pgbench(sql, clients, seconds, rate=None):
    """bench.py's pgbench, on a script written here."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as script:
        script.write(sql)
    return run_pgbench(script.name, clients, seconds, rate=rate)[0]


def fill(conn, table, rows):
    conn.execute("TRUNCATE spike_one, spike_hot, spike_cold")
    conn.execute(f"INSERT INTO {table} (topic, payload) SELECT 'booking.created', %s::jsonb FROM generate_series(1, %s)",
                 (PAYLOAD, rows))
    conn.execute(f"VACUUM ANALYZE {table}")
    conn.execute("CHECKPOINT")


ENDED = {"one table": "SELECT count(*) FROM spike_one WHERE status = 'DONE'", "hot/cold": "SELECT count(*) FROM spike_cold"}


def drain(cluster, rounds=3, seconds=5, backlog=600_000):
    """Messages ended per second (counted, not pgbench's transactions: an empty claim is one)."""
    rates = {name: [] for name in DRAIN}
    with cluster.connect() as conn:
        for _ in range(rounds):
            for name, statement in DRAIN.items():
                fill(conn, TABLE[name], backlog)
                pgbench(statement.format(claim=CLAIM.format(table=TABLE[name], batch=100)), 4, seconds)
                ended = conn.execute(ENDED[name]).fetchone()[0]
                assert ended < backlog, "the backlog ran out: the rate would be too low"
                rates[name].append(ended / seconds)
    return {name: statistics.median(r) for name, r in rates.items()}


def scanned_mb(conn, table):
    return float(conn.execute(f"SELECT (pg_relation_size('{table}') + pg_relation_size('{table}_ready')) / 1048576.0").fetchone()[0])


def pinned(cluster, phases=(30, 30, 60), sample=5):
    results = {}
    for name, statement in DRAIN.items():
        table = TABLE[name]
        with cluster.connect() as conn:
            conn.execute("TRUNCATE spike_one, spike_hot, spike_cold")
            conn.execute(f"VACUUM {table}")
        total = sum(phases)
        enqueue = f"INSERT INTO {table} (topic, payload) VALUES ('booking.created', '{PAYLOAD}');"
        consume = statement.format(claim=CLAIM.format(table=table, batch=20)) + "\n\\sleep 5 ms"
        workers = [threading.Thread(target=pgbench, args=(enqueue, 2, total, 1000)),
                   threading.Thread(target=pgbench, args=(consume, 2, total))]
        for worker in workers:
            worker.start()
        sizes = []
        with cluster.connect() as conn, cluster.connect() as holder:
            began = time.monotonic()
            pinned_at, released_at = phases[0], phases[0] + phases[1]
            holding = False
            while (elapsed := time.monotonic() - began) < total:
                if not holding and pinned_at <= elapsed < released_at:
                    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
                    holder.execute("SELECT count(*) FROM pg_class")
                    holding = True
                if holding and elapsed >= released_at:
                    holder.execute("COMMIT")
                    holding = False
                sizes.append((round(elapsed), round(scanned_mb(conn, table), 1)))
                time.sleep(sample)
            if holding:
                holder.execute("COMMIT")
        for worker in workers:
            worker.join()
        results[name] = sizes
    return results


def main():
    cluster = Cluster(25392)
    try:
        cluster.start()
        with cluster.connect() as conn:
            conn.execute(SETUP)
        result = {"drain_msg_per_s": drain(cluster)}
        if "--drain-only" not in sys.argv:
            result["pinned_scanned_mb"] = pinned(cluster)
    finally:
        cluster.stop()
    print(json.dumps(result, indent=1, default=float))


if __name__ == "__main__":
    main()
