"""The history of DONE messages (0.5.3): a minute after a message is DONE, outbox_archive moves
it, with its deliveries, out of the table the claims and the worker read into the history
table of its day, where readers of outbox still see it and outbox_purge empties whole days
(docs/storage.md)."""
import subprocess
import tempfile
import time
import uuid

import psycopg

from conftest import DATABASE, connect, enqueue_many, pg_program
from support import ServerLog, disabled_endpoint, eventually, fresh_database
from support.plans import planned_on_empty_tables_then_bulk_loaded


def completed(conn, count, processed_ago="2 minutes", delivered=False, **enqueue):
    """count messages enqueued, claimed and made DONE in outbox itself, processed_ago before now
    (and, when delivered, each with a delivery), as the delivery worker leaves the messages it
    settles, or 0.5.3 left every completed one: what outbox_archive moves."""
    ids = [
        row[0]
        for row in conn.execute(
            "SELECT (outbox_enqueue('history.test', jsonb_build_object('n', n), dedupe_key => %s)).id FROM generate_series(1, %s) n",
            (enqueue.get("dedupe_key"), count),
        )
    ]
    claimed = [row[0] for row in conn.execute("SELECT id FROM outbox_claim(%s, topics => '{history.test}')", (count,))]
    assert sorted(claimed) == sorted(ids)
    if delivered:  # (First: the worker's archive may move a DONE message at any moment.)
        with_delivery(conn, ids)
    done = conn.execute("UPDATE ONLY outbox SET status = 'DONE', processed_at = now() - %s::interval WHERE id = ANY (%s)",
                        (processed_ago, ids))
    assert done.rowcount == count
    return ids


def with_delivery(conn, ids, status="DONE"):
    """A delivery of each message to an endpoint the worker leaves alone (disabled)."""
    subscription = disabled_endpoint(conn)
    conn.execute(
        """INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, processed_at)
           SELECT id, %s, %s, 1, COALESCE(processed_at, now()) FROM ONLY outbox WHERE id = ANY (%s)""",
        (subscription, status, ids),
    )
    return subscription


def archive(conn):
    """outbox_archive until nothing due to move is left in outbox (the worker's own archive may
    hold some rows for a moment: a call skips those)."""
    due = """SELECT NOT EXISTS (SELECT FROM ONLY outbox WHERE status = 'DONE' AND dedupe_key IS NULL
                                  AND processed_at < now() - interval '1 minute')"""
    eventually(lambda: conn.execute("SELECT outbox_archive()") and conn.execute(due).fetchone()[0], what="the archive")


def where(conn, table, ids):
    """{id: the table (outbox or one of its history tables) that holds it}, for the ids."""
    rows = conn.execute(f"SELECT id, tableoid::regclass::text FROM {table} WHERE id = ANY (%s)", (ids,)).fetchall()
    assert len(rows) == len({row[0] for row in rows}), f"a message in two places: {rows}"
    return dict(rows)


def history_of_today(conn):
    return conn.execute("SELECT 'outbox_history_' || outbox_attempt_log_slot(now() - interval '2 minutes')").fetchone()[0]


def test_done_messages_move_to_the_history_of_their_day_and_outbox_still_shows_them(db):
    done = completed(db, 20, delivered=True)
    subscription = with_delivery(db, [])
    before = db.execute("SELECT * FROM outbox WHERE id = ANY (%s) ORDER BY id", (done,)).fetchall()
    just_done = completed(db, 2, processed_ago="0 seconds")
    kept_by_key = completed(db, 1, dedupe_key="once")
    pending = enqueue_many(db, 3, topic="history.test")

    archive(db)

    history = history_of_today(db)
    assert set(where(db, "outbox", done).values()) == {history}
    assert db.execute("SELECT * FROM outbox WHERE id = ANY (%s) ORDER BY id", (done,)).fetchall() == before, "unchanged"
    # (Only the moved messages' deliveries: the worker may meanwhile have given the pending
    # messages below theirs, parked for the disabled endpoint, in outbox_delivery.)
    deliveries = db.execute(
        "SELECT tableoid::regclass::text, count(*) FROM outbox_delivery WHERE subscription_id = %s AND message_id = ANY (%s) GROUP BY 1",
        (subscription, done),
    ).fetchall()
    assert deliveries == [(history.replace("outbox_", "outbox_delivery_"), 20)], "deliveries go with their message"
    # What stays where the claims and the worker read: pending work, the last minute's
    # completions in place, messages holding a dedupe_key.
    assert set(where(db, "outbox", just_done + kept_by_key + pending).values()) == {"outbox"}
    assert db.execute("SELECT completed_last_minute FROM outbox_stats() WHERE topic = 'history.test'").fetchone()[0] == 2
    # The key still holds: a second enqueue records nothing.
    assert db.execute("SELECT (outbox_enqueue('history.test', '{}', dedupe_key => 'once')).payload").fetchone()[0] is None
    # A reader's query for pending work leaves the history out (its CHECK constraint).
    plan = db.execute("EXPLAIN (FORMAT JSON) SELECT * FROM outbox WHERE status = 'PENDING'").fetchone()[0]
    assert "outbox_history" not in str(plan)


def test_complete_moves_a_message_to_the_history_of_its_day_at_once_unless_it_must_stay(db):
    """outbox_complete writes the DONE message into the history of the day of its processed_at
    in the same statement; a message whose dedupe_key must keep holding, or with deliveries,
    becomes DONE in place (outbox_archive moves it later)."""
    plain = enqueue_many(db, 3, topic="history.now")
    keyed = db.execute("SELECT (outbox_enqueue('history.now', '{}', dedupe_key => 'held')).id").fetchone()[0]
    first, second = (db.execute("SELECT (outbox_enqueue('history.now', '{}', ordering_key => 'k')).id").fetchone()[0] for _ in range(2))
    [delivered] = enqueue_many(db, 1, topic="history.now")
    with_delivery(db, [delivered])
    [wrong_token] = enqueue_many(db, 1, topic="history.now")
    before = {row[0]: row[1:] for row in db.execute("SELECT id, public_id, payload, attempts, created_at FROM outbox")}

    claimed = dict(db.execute("SELECT id, lease_token FROM outbox_claim(20, topics => '{history.now}')").fetchall())
    assert second not in claimed, "behind its ordering key"
    tokens = {**claimed, wrong_token: uuid.UUID(int=1)}
    ids = sorted(tokens)
    completed_count = db.execute("SELECT outbox_complete_batch(%s::bigint[], %s::uuid[])",
                                 (ids, [tokens[i] for i in ids])).fetchone()[0]
    assert completed_count == len(ids) - 1

    rows = {row[0]: row[1:] for row in db.execute(
        """SELECT id, tableoid::regclass::text, 'outbox_history_' || outbox_attempt_log_slot(processed_at), status::text,
                  public_id, payload, attempts, created_at
             FROM outbox WHERE id = ANY (%s)""", (ids,))}
    assert len(rows) == len(ids), "each message once"
    for moved in plain + [first]:
        table, its_day, status, *kept = rows[moved]
        assert (table, status) == (its_day, "DONE")
        assert tuple(kept) == before[moved][:2] + (1,) + before[moved][3:], "the same message, its one attempt"
    assert {rows[i][0:3:2] for i in (keyed, delivered)} == {("outbox", "DONE")}
    assert rows[wrong_token][0:3:2] == ("outbox", "PENDING")
    # The ordering key went on, the last minute's completions count wherever they are.
    assert second in [row[0] for row in db.execute("SELECT id FROM outbox_claim(20, topics => '{history.now}')")]
    assert db.execute("SELECT completed_last_minute FROM outbox_stats() WHERE topic = 'history.now'").fetchone()[0] == 6

    # Without lease tokens, in the transaction that claimed (lease => NULL), the same.
    [unleased] = enqueue_many(db, 1, topic="history.now")
    with db.transaction():
        assert [row[0] for row in db.execute("SELECT id FROM outbox_claim(1, topics => '{history.now}', lease => NULL)")] == [unleased]
        assert db.execute("SELECT outbox_complete(%s)", (unleased,)).fetchone()[0] is True
    assert where(db, "outbox", [unleased])[unleased].startswith("outbox_history_")


def test_purge_empties_a_day_of_history_whole_with_its_deliveries(db):
    old = completed(db, 30, processed_ago="3 days", delivered=True)
    archive(db)
    history = set(where(db, "outbox", old).values())
    assert len(history) == 1 and history != {"outbox"}
    [history] = history
    delivery_history = history.replace("outbox_", "outbox_delivery_")
    deleted_before = {
        table: db.execute("SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = %s", (table,)).fetchone()[0]
        for table in (history, delivery_history)
    }

    db.execute("SELECT outbox_purge(interval '1 day')")

    assert db.execute("SELECT count(*) FROM outbox WHERE id = ANY (%s)", (old,)).fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM outbox_delivery WHERE message_id = ANY (%s)", (old,)).fetchone()[0] == 0
    db.execute("SELECT pg_stat_force_next_flush()")
    for table, before in deleted_before.items():
        after = db.execute("SELECT n_tup_del FROM pg_stat_user_tables WHERE relname = %s", (table,)).fetchone()[0]
        assert after == before, f"{table}: rows deleted one by one instead of the day emptied"


def test_the_workers_archive_waits_for_no_unsubscribe_not_yet_committed(fast_worker, receivers):
    """The worker moves DONE messages to the history every second. One whose deliveries an
    unsubscribe not yet committed is deleting made it wait for the commit (up to its 10 s
    lock_timeout, then again a second later), and every endpoint with it. It now leaves that
    message for a later pass."""
    db = fast_worker
    log = ServerLog()
    other = receivers()
    db.execute("SELECT outbox_subscribe('other.topic', %s)", (other.url,))
    ids = completed(db, 3, processed_ago="0 minutes", delivered=True)  # not due to move for a minute
    with connect() as operator:
        operator.execute("SELECT outbox_unsubscribe('history.test')")  # not committed yet
        db.execute("UPDATE ONLY outbox SET processed_at = now() - interval '2 minutes' WHERE id = ANY (%s)", (ids,))
        time.sleep(1.5)  # the worker's archive has run since
        db.execute("SELECT outbox_enqueue('other.topic', '{}')")
        other.wait_for(1, timeout=5)
        assert set(where(db, "outbox", ids).values()) == {"outbox"}, "moved from under the unsubscribe"
        operator.commit()
    eventually(lambda: "outbox" not in where(db, "outbox", ids).values(), what="the messages moved after the commit")
    assert "moving DONE messages to the history failed" not in log.since()


def test_redeliver_brings_a_message_back_from_the_history(db):
    [message] = completed(db, 1, delivered=True)
    subscription = with_delivery(db, [])
    archive(db)
    assert where(db, "outbox", [message])[message] != "outbox"

    assert db.execute("SELECT outbox_redeliver(%s, message_ids => %s)", (subscription, [message])).fetchone()[0] == 1

    assert where(db, "outbox", [message]) == {message: "outbox"}
    assert db.execute("SELECT status, waiting_for FROM outbox WHERE id = %s", (message,)).fetchone() == ("PENDING", "deliveries")
    rows = db.execute("SELECT tableoid::regclass::text, status FROM outbox_delivery WHERE message_id = %s", (message,)).fetchall()
    assert rows == [("outbox_delivery", "PENDING")], "one delivery, back where the worker reads, to send again"


def test_archive_leaves_alone_what_a_redelivery_is_reading(db):
    [message] = completed(db, 1, processed_ago="0 seconds", delivered=True)  # (not due to move yet)
    subscription = with_delivery(db, [])
    with psycopg.connect(db.info.dsn, autocommit=False) as operator:
        # outbox_redeliver chose its messages (none here) and holds them until it commits.
        operator.execute("SELECT outbox_redeliver(%s, since => now() + interval '1 day')", (subscription,))
        db.execute("UPDATE ONLY outbox SET processed_at = now() - interval '2 minutes' WHERE id = %s", (message,))
        assert db.execute("SELECT outbox_archive()").fetchone()[0] == 0
        assert where(db, "outbox", [message]) == {message: "outbox"}
    archive(db)
    assert where(db, "outbox", [message])[message] != "outbox"


def test_the_archive_does_not_walk_past_the_messages_that_stay(db):
    # DONE messages holding a dedupe_key stay in outbox until purged: a week of them.
    db.execute("""INSERT INTO outbox (topic, payload, status, attempts, processed_at, dedupe_key)
                  SELECT 'history.test', '{}', 'DONE', 1, now() - interval '1 hour', 'key ' || g FROM generate_series(1, 50000) g""")
    db.execute("VACUUM ANALYZE outbox")
    archive(db)
    plan = db.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT outbox_archive()").fetchone()[0][0]
    touched = plan["Plan"]["Shared Hit Blocks"] + plan["Plan"].get("Shared Read Blocks", 0)
    assert touched < 200, f"an archive with nothing to move read {touched} pages with 50k DONE messages that stay"
    assert db.execute("SELECT count(*) FROM ONLY outbox WHERE dedupe_key IS NOT NULL").fetchone()[0] == 50000


def test_the_archive_stays_linear_when_its_session_began_on_empty_tables(db):
    # A table with children gets no 10-page floor from the planner, so a plan made while outbox
    # and outbox_delivery were empty expects one row. A bulk load then came (an import, a
    # backlog, this benchmark's part 13): with that plan, each message looked for its
    # deliveries by reading the whole delivery table, and the archive of 30,000 messages ran
    # for minutes, holding back vacuum and blocking TRUNCATE.
    planned_on_empty_tables_then_bulk_loaded(db, "SELECT outbox_archive(100000)")

    # The worker moves some of them side by side (each call skips the other's rows); 15 s is
    # over forty times what the whole move takes with a plan that seeks the deliveries by index.
    db.execute("SET statement_timeout = '15s'")
    db.execute("SELECT outbox_archive(100000)")
    db.execute("RESET statement_timeout")
    archive(db)
    assert db.execute("SELECT count(*) FROM ONLY outbox").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM outbox_delivery").fetchone()[0] == 30000


def test_the_purge_stays_linear_when_its_session_began_on_empty_tables(db):
    # The same for outbox_purge, which the worker calls too: DONE messages that keep their
    # dedupe_key stay in outbox until purged, with their deliveries.
    planned_on_empty_tables_then_bulk_loaded(db, "SELECT outbox_purge(interval '0', max_rows => 100000)", dedupe_keys=True)

    db.execute("SET statement_timeout = '15s'")
    assert db.execute("SELECT outbox_purge(interval '0', max_rows => 100000)").fetchone()[0] == 30000
    db.execute("RESET statement_timeout")
    assert db.execute("SELECT count(*) FROM outbox_delivery").fetchone()[0] == 0


def test_a_dump_and_restore_keeps_the_history_once_in_the_tables_of_its_days(db):
    """pg_dump writes each history table's rows once (COPY of a parent does not include its
    children's), and pg_restore puts them back in the table of their day, where purge finds
    them."""
    moved = completed(db, 5, processed_ago="3 days", delivered=True)
    archive(db)
    pending = [db.execute("SELECT (outbox_enqueue('history.unsubscribed', '{}')).id").fetchone()[0]]
    messages = "SELECT id, status::text, processed_at, tableoid::regclass::text FROM outbox ORDER BY id"
    deliveries = "SELECT message_id, status::text, tableoid::regclass::text FROM outbox_delivery ORDER BY 1"
    before, delivered = db.execute(messages).fetchall(), db.execute(deliveries).fetchall()
    history = set(where(db, "outbox", moved).values())
    assert len(history) == 1 and history != {"outbox"}
    assert where(db, "outbox", pending) == {pending[0]: "outbox"}

    with tempfile.NamedTemporaryFile(suffix=".dump") as dump:
        subprocess.run([pg_program("pg_dump"), "-Fc", "-f", dump.name, DATABASE], check=True)
        with fresh_database("outbox_restored_history") as restored:
            subprocess.run([pg_program("pg_restore"), "--exit-on-error", "-d", "outbox_restored_history", dump.name], check=True)
            assert restored.execute(messages).fetchall() == before
            assert restored.execute(deliveries).fetchall() == delivered
            # The restored history is a day's history like any other: purge empties it whole.
            restored.execute("SELECT outbox_purge(interval '1 day')")
            assert restored.execute("SELECT count(*) FROM outbox WHERE id = ANY (%s)", (moved,)).fetchone()[0] == 0
