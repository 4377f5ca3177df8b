"""Operating it: the numbers (outbox_stats), dead letters (requeue, discard), housekeeping
(outbox_purge and the worker's retention)."""


import psycopg
import pytest

from conftest import configure_worker, connect, enqueue_many
from support import disabled_endpoint, eventually
from support.plans import nodes, plan_of, planned_on_empty_tables_then_bulk_loaded


def stats(conn):
    rows = conn.execute("SELECT * FROM outbox_stats()").fetchall()
    columns = ["topic", "pending", "ready", "in_flight", "retrying", "dead", "oldest_ready_age",
               "oldest_pending_age", "completed_last_minute"]
    return {row[0]: dict(zip(columns, row)) for row in rows}


def make_dead(conn, topic="booking.created", error="HTTP 500: boom"):
    [message_id] = enqueue_many(conn, 1, topic)
    # Make it the first in line, whatever else is pending. (A connection that claimed before
    # would find a message set back by hand only at its next read from the start, within a
    # second: src/claim/head.rs. A new one reads from the start.)
    conn.execute("UPDATE outbox SET available_at = clock_timestamp() - interval '1 day' WHERE id = %s", (message_id,))
    with connect(autocommit=True, options="-c outbox.max_attempts=1") as consumer:
        token = consumer.execute("SELECT lease_token FROM outbox_claim(1, ARRAY[%s])", (topic,)).fetchone()[0]
        assert consumer.execute("SELECT outbox_fail(%s, %s, %s)", (message_id, error, token)).fetchone()[0] == "DEAD"
    return message_id


def test_stats_count_every_state_per_topic_and_in_total(db):
    ready_ids = enqueue_many(db, 3, "booking.created")
    db.execute("UPDATE outbox SET available_at = clock_timestamp() - interval '90 seconds' WHERE id = %s", (ready_ids[0],))
    db.execute("SELECT outbox_enqueue('booking.created', '{}', interval '1 hour')")  # pending, not ready
    db.execute("SELECT * FROM outbox_claim(1, ARRAY['booking.created'])")  # in flight (the oldest)
    retrying = enqueue_many(db, 1, "invoice.paid")[0]
    token = db.execute("SELECT lease_token FROM outbox_claim(1, ARRAY['invoice.paid'])").fetchone()[0]
    db.execute("SELECT outbox_fail(%s, 'HTTP 503', %s)", (retrying, token))
    make_dead(db, "invoice.paid")
    done = enqueue_many(db, 2, "invoice.paid")
    db.execute("SELECT outbox_complete(%s::bigint[])", (done,))

    by_topic = stats(db)
    booking, invoice, total = by_topic["booking.created"], by_topic["invoice.paid"], by_topic[None]
    assert (booking["pending"], booking["ready"], booking["in_flight"], booking["retrying"], booking["dead"]) == (4, 2, 1, 0, 0)
    assert (invoice["pending"], invoice["ready"], invoice["in_flight"], invoice["retrying"], invoice["dead"]) == (1, 0, 0, 1, 1)
    assert invoice["completed_last_minute"] == 2 and booking["completed_last_minute"] == 0
    assert total["pending"] == 5 and total["dead"] == 1 and total["completed_last_minute"] == 2
    # The oldest ready message became ready 90 s ago, but it is in flight now; the next one is new.
    assert booking["oldest_ready_age"].total_seconds() < 30
    assert booking["oldest_pending_age"].total_seconds() < 30
    assert invoice["oldest_ready_age"] is None


def test_a_failed_message_whose_retry_is_due_counts_as_ready_not_retrying(db):
    """ready, in_flight and retrying are parts of pending: a message or delivery whose retry has
    fallen due is ready, no longer retrying (0.5.15 counted it in both; found by stop 39's
    probe of the docs)."""
    [message_id] = enqueue_many(db, 1, "invoice.paid")
    token = db.execute("SELECT lease_token FROM outbox_claim(1, ARRAY['invoice.paid'])").fetchone()[0]
    db.execute("SELECT outbox_fail(%s, 'HTTP 503', %s, interval '0')", (message_id, token))
    invoice = stats(db)["invoice.paid"]
    assert (invoice["pending"], invoice["ready"], invoice["in_flight"], invoice["retrying"]) == (1, 1, 0, 0)

    # The same per endpoint (disabled: the worker leaves it alone), with one delivery not due yet.
    db.execute("INSERT INTO outbox_subscription (topic, url, enabled) VALUES ('audit.exported', 'http://127.0.0.1:9/', false)")
    db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, available_at)
                  SELECT (outbox_enqueue('audit.exported', '{}')).id, (SELECT id FROM outbox_subscription), 'PENDING', 1,
                         clock_timestamp() + d
                    FROM unnest(ARRAY[interval '-1 second', interval '1 hour']) d""")
    db.execute("UPDATE outbox SET waiting_for = 'deliveries' WHERE topic = 'audit.exported'")
    assert db.execute("SELECT pending, ready, in_flight, retrying FROM outbox_endpoint_stats()").fetchone() == (2, 1, 0, 1)


def test_a_delivery_whose_lease_ran_out_is_ready_not_in_flight(db):
    """A lease that ran out (its worker stopped during the request, or handed the delivery back
    too late) leaves the delivery due again. outbox_endpoint_stats() and outbox_deliveries
    showed it in flight for good: 395 requests in flight to disabled endpoints, 4.5 minutes
    after their leases ran out, with the worker's in_flight at 0 (stop 59's probe of many
    endpoints)."""
    with db.transaction():  # (uncommitted: a worker starting would release the leases)
        db.execute("INSERT INTO outbox_subscription (topic, url, enabled) VALUES ('audit.exported', 'http://127.0.0.1:9/', false)")
        db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, leased, available_at)
                      SELECT (outbox_enqueue('audit.exported', '{}')).id, (SELECT id FROM outbox_subscription), 'PENDING', 1, true,
                             clock_timestamp() + d
                        FROM unnest(ARRAY[interval '-1 minute', interval '1 minute']) d""")
        db.execute("UPDATE outbox SET waiting_for = 'deliveries' WHERE topic = 'audit.exported'")
        assert db.execute("SELECT pending, ready, in_flight, retrying FROM outbox_endpoint_stats()").fetchone() == (2, 1, 1, 0)
        in_flight = db.execute("SELECT available_at > clock_timestamp(), in_flight FROM outbox_deliveries ORDER BY available_at").fetchall()
        assert in_flight == [(False, False), (True, True)]


def test_a_disabled_endpoint_of_a_quiet_topic_has_its_topics_row(db):
    """An endpoint disabled on a topic with no message (parked by hand for a migration) is
    counted in its topic's row, which the shipped alert reads. Until 0.5.34 outbox_stats() made
    a row only for topics with messages: it counted the endpoint in the total alone (found by
    stop 57's probe of the monitoring)."""
    disabled_endpoint(db, "audit.exported")
    enqueue_many(db, 1, "booking.created")
    rows = {row[0]: row[1:] for row in db.execute("SELECT topic, pending, ready, disabled_endpoints FROM outbox_stats()")}
    assert rows["audit.exported"] == (0, 0, 1), rows
    assert rows["booking.created"] == (1, 1, 0) and rows[None] == (1, 1, 1), rows


def test_stats_read_only_live_rows_through_indexes(db):
    enqueue_many(db, 100)
    make_dead(db)
    db.execute(
        """INSERT INTO outbox (topic, payload, status, attempts, processed_at)
           SELECT 'booking.created', '{}', 'DONE', 1, now() - interval '1 hour' FROM generate_series(1, 300000)"""
    )
    # ... and 30k dead letters, a year's worth of a topic that fails now and then.
    db.execute(
        """INSERT INTO outbox (topic, payload, status, attempts, processed_at, last_error)
           SELECT 'audit.exported', '{}', 'DEAD', 8, now() - interval '1 hour', 'HTTP 500' FROM generate_series(1, 30000)"""
    )
    # ... and as many DONE and DEAD deliveries (to an endpoint the worker leaves alone).
    db.execute("INSERT INTO outbox_subscription (topic, url, enabled) VALUES ('audit.exported', 'http://127.0.0.1:9/', false)")
    db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, processed_at)
                  SELECT id, (SELECT id FROM outbox_subscription), status, 1, processed_at FROM outbox
                   WHERE status = 'DONE' OR topic = 'audit.exported'""")
    # The worker moves the DONE messages (and their deliveries) to their day's history.
    eventually(lambda: db.execute("SELECT NOT EXISTS (SELECT FROM ONLY outbox WHERE status = 'DONE')").fetchone()[0],
               timeout=60, what="the DONE messages moved to the history")
    db.execute("VACUUM ANALYZE outbox")
    db.execute("VACUUM ANALYZE outbox_delivery")
    plan = plan_of(db, "SELECT * FROM outbox_stats()", "GROUPING SETS")["Plan"]
    # (The subscriptions are a handful of rows: read whole.)
    scanned = [(n.get("Relation Name"), n.get("Filter")) for n in nodes(plan) if n["Node Type"] == "Seq Scan"]
    assert all(relation == "outbox_subscription" for relation, _ in scanned), scanned
    touched = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    # Reading the dead letters' rows would touch 30k heap tuples; their topics come from
    # outbox_dead_idx and outbox_delivery_dead_idx alone.
    assert touched < 300, f"the statistics read {touched} pages with 300k DONE and 30k DEAD rows behind them"
    total = stats(db)[None]
    assert total["pending"] == 100 and total["dead"] == 30001
    assert db.execute("SELECT dead_deliveries FROM outbox_stats() WHERE topic = 'audit.exported'").fetchone()[0] == 30000


def test_dead_letters_are_listed_requeued_and_discarded(db):
    first = make_dead(db, "booking.created", "HTTP 500: template missing")
    second = make_dead(db, "booking.created")
    third = make_dead(db, "invoice.paid")
    listed = db.execute("SELECT id, topic, attempts, last_error FROM outbox_dead_letters ORDER BY id").fetchall()
    assert listed[0] == (first, "booking.created", 1, "HTTP 500: template missing")
    assert len(listed) == 3

    assert db.execute("SELECT outbox_requeue(%s)", (first,)).fetchone()[0] == 1
    assert db.execute("SELECT outbox_requeue(%s)", (first,)).fetchone()[0] == 0, "no longer dead"
    row = db.execute("SELECT status, attempts, processed_at, last_error FROM outbox WHERE id = %s", (first,)).fetchone()
    assert row == ("PENDING", 0, None, "HTTP 500: template missing"), "a fresh start, the old error kept"
    assert [r[0] for r in db.execute("SELECT id FROM outbox_claim(10)")] == [first]

    assert db.execute("SELECT outbox_requeue('invoice.paid')").fetchone()[0] == 1
    assert db.execute("SELECT outbox_discard(%s)", (second,)).fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM outbox WHERE id = %s", (second,)).fetchone()[0] == 0
    assert db.execute("SELECT outbox_discard(%s)", (third,)).fetchone()[0] == 0, "requeued: not dead any more"

    make_dead(db, "a.b")
    make_dead(db, "c.d")
    assert db.execute("SELECT outbox_requeue_all()").fetchone()[0] == 2
    make_dead(db, "e.f")
    assert db.execute("SELECT outbox_discard_all()").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM outbox WHERE status = 'DEAD'").fetchone()[0] == 0


@pytest.mark.parametrize(
    "call,status,remaining",
    [
        ("SELECT outbox_requeue_all()", "DEAD", "SELECT count(*) FROM outbox_delivery WHERE status = 'PENDING'"),
        ("SELECT outbox_requeue('history.test')", "DEAD", "SELECT count(*) FROM outbox_delivery WHERE status = 'PENDING'"),
        ("SELECT outbox_discard_all()", "DEAD", "SELECT 30000 - count(*) FROM outbox_delivery"),
        ("SELECT outbox_redeliver({subscription})", "DONE", "SELECT count(*) FROM outbox_delivery WHERE status = 'PENDING'"),
    ],
)
def test_the_dead_letter_tools_stay_linear_when_their_session_began_on_empty_tables(db, call, status, remaining):
    # A session that ran them while there was nothing to do (a job every few minutes on a
    # pooled connection) kept plans made on empty tables; an outage's 30,000 dead letters then
    # took over a minute, each row joined to its deliveries by reading them all. Half a second
    # with plans made for the tables as they are: 15 s leaves a wide margin.
    call = planned_on_empty_tables_then_bulk_loaded(db, call, status=status)
    db.execute("SET statement_timeout = '15s'")
    assert db.execute(call).fetchone()[0] == 30000
    db.execute("RESET statement_timeout")
    assert db.execute(remaining).fetchone()[0] == 30000, "each message's delivery was requeued, discarded or scheduled with it"


@pytest.mark.parametrize(
    "call,sqlstate",
    [
        ("outbox_requeue(NULL::bigint)", "22004"),
        ("outbox_requeue('not a topic')", "22023"),
        ("outbox_discard(NULL::bigint)", "22004"),
        ("outbox_purge(NULL)", "22004"),
        ("outbox_purge(interval '-1 day')", "22023"),
        ("outbox_purge(interval '1 day', NULL)", "22004"),
        ("outbox_purge(interval '1 day', false, 0)", "22023"),
    ],
)
def test_operations_refuse_bad_arguments(db, call, sqlstate):
    with pytest.raises(psycopg.Error) as caught:
        db.execute(f"SELECT {call}")
    assert caught.value.sqlstate == sqlstate
    assert caught.value.diag.message_primary.startswith(call.split("(")[0])


def test_purge_deletes_old_finished_rows_in_bounded_batches(db):
    # The worker's own purge (outbox.retention, 7 days) takes rows this old at most once a
    # minute: a pass that fell between the inserts and the calls below took them first (once,
    # in a full run). Off for this test.
    configure_worker({"outbox.retention": "0"})
    try:
        purge_in_bounded_batches(db)
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET outbox.retention")
            admin.execute("SELECT pg_reload_conf()")


def purge_in_bounded_batches(db):
    # Dead letters stay in outbox (they are never moved to the history): deleted row by row,
    # max_rows at a time.
    db.execute(
        """INSERT INTO outbox (topic, payload, status, attempts, processed_at, last_error)
           SELECT 'booking.created', '{}', 'DEAD', 8, now() - interval '8 days', 'HTTP 500' FROM generate_series(1, 2500)"""
    )
    db.execute(
        """INSERT INTO outbox (topic, payload, status, attempts, processed_at)
           SELECT 'booking.created', '{}', 'DONE', 1, now() - interval '8 days' FROM generate_series(1, 2500)"""
    )
    db.execute(
        """INSERT INTO outbox (topic, payload, status, attempts, processed_at)
           SELECT 'booking.created', '{}', 'DONE', 1, now() - interval '1 day' FROM generate_series(1, 10)"""
    )
    recent_dead = make_dead(db)
    enqueue_many(db, 5)

    # DONE messages: those still in outbox row by row, those in the history with their day.
    while db.execute("SELECT outbox_purge(interval '7 days', max_rows => 1000)").fetchone()[0] == 1000:
        pass
    assert db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE' AND processed_at < now() - interval '7 days'").fetchone()[0] == 0
    counts = dict(db.execute("SELECT status, count(*) FROM outbox GROUP BY status").fetchall())
    assert counts == {"DONE": 10, "DEAD": 2501, "PENDING": 5}, "recent DONE, dead letters and pending stay"

    assert db.execute("SELECT outbox_purge(interval '7 days', include_dead => true, max_rows => 1000)").fetchone()[0] == 1000
    assert db.execute("SELECT outbox_purge(interval '7 days', include_dead => true, max_rows => 1000)").fetchone()[0] == 1000
    assert db.execute("SELECT outbox_purge(interval '7 days', include_dead => true, max_rows => 1000)").fetchone()[0] == 500
    assert db.execute("SELECT outbox_purge(interval '7 days', include_dead => true)").fetchone()[0] == 0
    assert [r[0] for r in db.execute("SELECT id FROM outbox WHERE status = 'DEAD'")] == [recent_dead]


@pytest.fixture
def no_worker_purge():
    """The worker's own purge (outbox.retention) off, so that only the test's calls purge."""
    configure_worker({"outbox.retention": "0"})
    yield
    with psycopg.connect(dbname="postgres", autocommit=True) as admin:
        admin.execute("ALTER SYSTEM RESET outbox.retention")
        admin.execute("SELECT pg_reload_conf()")


def log_attempts(conn, count, started_at, subscription=1):
    """count rows of the attempt log (answered 200), started at the SQL expression started_at
    (of n, 1 to count)."""
    conn.execute(f"""INSERT INTO outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration, http_status)
                     SELECT n, %s, 1, {started_at}, interval '20 ms', 200 FROM generate_series(1, %s) n""",
                 (subscription, count))


def attempt_log_days(conn):
    """How many rows of the attempt log started how many days ago (UTC days)."""
    return dict(conn.execute(
        """SELECT (date_trunc('day', now() AT TIME ZONE 'UTC') - date_trunc('day', started_at AT TIME ZONE 'UTC'))::text, count(*)
             FROM outbox_delivery_attempt GROUP BY 1""").fetchall())


def attempt_log_deletes(conn):
    """Rows deleted from the attempt log's tables, and dead tuples left in them, as the
    statistics have them once this session's counters are flushed."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_clear_snapshot()")
    return conn.execute("""SELECT coalesce(sum(n_tup_del), 0), coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
                            WHERE relname LIKE 'outbox_delivery_attempt%'""").fetchone()


def test_purge_empties_whole_days_of_the_attempt_log_without_deleting_rows(db, no_worker_purge):
    log_attempts(db, 3000, "now() - interval '3 days'")
    log_attempts(db, 20, "now() - interval '1 day'")
    log_attempts(db, 20, "now()")

    # Three days ago ended before the cutoff: emptied whole (not counted: no row is deleted).
    # Yesterday has not ended a day ago yet, today neither: they wait.
    assert db.execute("SELECT outbox_purge(interval '1 day')").fetchone()[0] == 0
    assert attempt_log_days(db) == {"1 day": 20, "00:00:00": 20}
    assert attempt_log_deletes(db) == (0, 0), "no row deleted, no dead tuple left for vacuum"


def test_purge_deletes_attempts_older_than_the_day_their_partition_holds(db, no_worker_purge):
    # A retention over 31 days: the partition of yesterday also holds the rows of 33 days ago.
    log_attempts(db, 5, "now() - interval '33 days'")
    log_attempts(db, 7, "now() - interval '1 day'")
    # A row newer than the cutoff in the partition of a day that ended before it (a clock set
    # back, a started_at written by hand) is never lost with its partition.
    log_attempts(db, 1, "now() - interval '3 days' + interval '32 days'")

    assert db.execute("SELECT outbox_purge(interval '32 days')").fetchone()[0] == 5
    assert db.execute("SELECT outbox_purge(interval '1 day')").fetchone()[0] == 0
    days = attempt_log_days(db)
    assert days["1 day"] == 7 and days["-29 days"] == 1 and "33 days" not in days


def test_a_reader_of_the_attempt_log_delays_its_purge_not_the_purge(db, no_worker_purge):
    log_attempts(db, 100, "now() - interval '3 days'")
    with connect() as reader:
        # A report reading the attempt log holds its partitions until it commits.
        reader.execute("SELECT count(*) FROM outbox_delivery_attempts")
        db.execute("SET statement_timeout = '30s'")
        db.execute("SET lock_timeout = '7s'")
        assert db.execute("SELECT outbox_purge(interval '1 day')").fetchone()[0] == 0
        assert attempt_log_days(db) == {"3 days": 100}, "left for the next purge"
        reader.rollback()
    with db.transaction():
        db.execute("SELECT outbox_purge(interval '1 day')")
        # The purge's own short wait for the lock does not stay with the caller's transaction.
        assert db.execute("SHOW lock_timeout").fetchone()[0] == "7s"
    assert attempt_log_days(db) == {}


def test_endpoint_stats_read_the_attempt_log_of_the_last_minute_only(db, no_worker_purge):
    db.execute("INSERT INTO outbox_subscription (topic, url, enabled) VALUES ('audit.exported', 'http://127.0.0.1:9/', false)")
    subscription = db.execute("SELECT id FROM outbox_subscription").fetchone()[0]
    # 100k requests of an earlier day (in the partition of one: they span 2.8 hours from its
    # UTC midnight, so they never spill into the next day's, whatever the time the test runs), 3
    # answered with 2xx just now.
    log_attempts(db, 100000, "date_trunc('day', now(), 'UTC') - interval '3 days' + n * interval '100 ms'", subscription)
    log_attempts(db, 3, "clock_timestamp() - interval '5 seconds'", subscription)
    db.execute("VACUUM ANALYZE outbox_delivery_attempt")
    plan = plan_of(db, "SELECT * FROM outbox_endpoint_stats()", "http_status BETWEEN 200 AND 299")["Plan"]
    # (Partitions without rows may be read whole: there is nothing in them.)
    walked = {n["Relation Name"]: n.get("Rows Removed by Filter", 0) for n in nodes(plan)
              if n["Node Type"] == "Seq Scan" and n["Relation Name"].startswith("outbox_delivery_attempt")}
    assert sum(walked.values()) == 0, f"older requests walked past: {walked}"
    touched = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    assert touched < 300, f"the endpoint's numbers read {touched} pages with 100k older requests behind them"
    assert db.execute("SELECT delivered_last_minute FROM outbox_endpoint_stats()").fetchone()[0] == 3


def test_endpoint_stats_read_the_last_minutes_requests_once_for_every_endpoint(db, no_worker_purge):
    """The log's BRIN index cannot pass over the pages autovacuum has not summarized yet (up to
    a fifth of the day's table): until 0.5.34 each endpoint's count read them again, and the
    numbers of 40 endpoints took a second (found by stop 57's probe of the monitoring). The
    last minute's requests are counted once, for every endpoint."""
    endpoints = [disabled_endpoint(db, f"audit.{n}") for n in range(20)]
    # 100k requests of earlier today, not summarized (no vacuum since), 1 to 4 minutes ago
    # (a test just past midnight puts some into yesterday's table, which it does not read).
    db.execute("""INSERT INTO outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration, http_status)
                  SELECT n, (%s::bigint[])[1 + n %% 20], 1, clock_timestamp() - interval '1 minute' - n * interval '1.8 ms',
                         interval '20 ms', 200
                    FROM generate_series(1, 100000) n""", (endpoints,))
    log_attempts(db, 3, "clock_timestamp() - interval '5 seconds'", endpoints[7])
    plan = plan_of(db, "SELECT * FROM outbox_endpoint_stats()", "http_status BETWEEN 200 AND 299")["Plan"]
    touched = plan["Shared Hit Blocks"] + plan["Shared Read Blocks"]
    log_pages = db.execute("""SELECT sum(pg_relation_size(c.oid)) / 8192 FROM pg_class c
                               WHERE c.relname LIKE 'outbox_delivery_attempt_%' AND c.relkind = 'r'""").fetchone()[0]
    assert touched < 2 * log_pages + 500, f"{len(endpoints)} endpoints' numbers read {touched} pages, the log has {log_pages}"
    delivered = dict(db.execute("SELECT subscription_id, delivered_last_minute FROM outbox_endpoint_stats()").fetchall())
    assert delivered == {e: (3 if e == endpoints[7] else 0) for e in endpoints}


def test_the_worker_purges_done_rows_past_the_retention(db):
    # (Moved to the history of their day, they go when that day is older than the retention: a
    # history is kept for the retention and up to a day more, docs/storage.md.)
    db.execute(
        """INSERT INTO outbox (topic, payload, status, attempts, processed_at)
           SELECT 'booking.created', '{}', 'DONE', 1, now() - interval '26 hours' FROM generate_series(1, 50)"""
    )
    enqueue_many(db, 3)
    try:
        configure_worker({"outbox.retention": "2s"})
        eventually(
            lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 0,
            timeout=90,
            what="the worker's purge",
        )
        assert db.execute("SELECT count(*) FROM outbox WHERE status = 'PENDING'").fetchone()[0] == 3
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute("ALTER SYSTEM RESET outbox.retention")
            admin.execute("SELECT pg_reload_conf()")


def test_the_exporter_queries_run_for_a_monitoring_role(db):
    """examples/monitoring/postgres_exporter_queries.yaml works as a pg_monitor member and
    yields every metric it declares."""
    import pathlib

    import yaml

    from conftest import connect

    queries = yaml.safe_load(
        (pathlib.Path(__file__).resolve().parents[2] / "examples/monitoring/postgres_exporter_queries.yaml").read_text()
    )
    enqueue_many(db, 3)
    make_dead(db, "invoice.paid")
    db.execute("DROP ROLE IF EXISTS exporter")
    db.execute("CREATE ROLE exporter LOGIN IN ROLE pg_monitor")
    try:
        with connect(user="exporter", autocommit=True) as exporter:
            for name, spec in queries.items():
                cursor = exporter.execute(spec["query"])
                columns = [c.name for c in cursor.description]
                assert columns == [next(iter(m)) for m in spec["metrics"]], name
                rows = {row[0]: dict(zip(columns, row)) for row in cursor.fetchall()}
                assert rows["(all)"]["pending"] == 3 and rows["(all)"]["dead"] == 1
                assert rows["invoice.paid"]["dead"] == 1
    finally:
        db.execute("DROP ROLE exporter")


def test_depth_counts_what_a_consumer_can_take_now(db):
    enqueue_many(db, 3, "booking.created")
    enqueue_many(db, 2, "invoice.paid")
    db.execute("SELECT outbox_enqueue('booking.created', '{}', delay => '1 hour')")  # not due
    db.execute("SELECT outbox_enqueue('invoice.paid', '{}', ordering_key => 'k')")
    db.execute("SELECT outbox_enqueue('invoice.paid', '{}', ordering_key => 'k')")  # waits behind the first
    make_dead(db, "booking.created")
    assert db.execute("SELECT outbox_depth(ARRAY['booking.created'])").fetchone()[0] == 3
    assert db.execute("SELECT outbox_depth(ARRAY['booking.created', 'invoice.paid'])").fetchone()[0] == 6
    assert db.execute("SELECT outbox_depth()").fetchone()[0] == 6
    assert db.execute("SELECT outbox_depth(ARRAY[]::text[])").fetchone()[0] == 0
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="outbox_depth: topics must not contain NULL"):
        db.execute("SELECT outbox_depth(ARRAY['booking.created', NULL])")


def test_a_purge_leaves_alone_what_an_open_unsubscribe_holds(db, no_worker_purge):
    """A purge deletes old DONE messages still in outbox with their deliveries. An unsubscribe
    not yet committed, deleting an endpoint's deliveries, made it wait for that transaction: the
    worker's purge (outbox.retention) with its whole loop, every endpoint's (stop 47's list of
    waits left). It leaves those messages to a later purge now."""
    endpoint = db.execute("SELECT outbox_subscribe('leaving.topic', 'https://hooks.example.test/')").fetchone()[0]
    # Messages with a dedupe_key stay in outbox once DONE (the history takes the others).
    held, free = (
        db.execute("INSERT INTO outbox (topic, payload, status, attempts, processed_at, dedupe_key)"
                   " VALUES (%s, '{}', 'DONE', 1, now() - interval '8 days', %s) RETURNING id", (topic, topic)).fetchone()[0]
        for topic in ("leaving.topic", "staying.topic")
    )
    db.execute("INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, processed_at)"
               " VALUES (%s, %s, 'DONE', 1, now() - interval '8 days')", (held, endpoint))
    with connect() as operator:
        operator.execute("SELECT outbox_unsubscribe('leaving.topic')")  # not committed yet
        db.execute("SET lock_timeout = '3s'")
        assert db.execute("SELECT outbox_purge(interval '7 days')").fetchone()[0] == 1
        assert db.execute("SELECT array_agg(id) FROM outbox").fetchone()[0] == [held]
        operator.commit()
    assert db.execute("SELECT outbox_purge(interval '7 days')").fetchone()[0] == 1
    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 0
