"""The row outbox_enqueue writes without a dedupe_key: without a plan (0.5.8; with an ordering key
0.5.9), with the table's own defaults and indexes and what it keeps of them for the session
(src/enqueue/direct_insert.rs). It must be the row an INSERT would write (with a key, the row
insert_keyed.sql would write), follow changes to the table made while the session lives, and
leave the indexes agreeing with the table."""
import datetime
import json
import secrets
import threading
import time
import uuid

import psycopg
import pytest

from conftest import connect


def indexes_agree_with_the_table(conn):
    """amcheck: every index of outbox has exactly the rows of the table its predicate admits."""
    conn.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
    indexes = conn.execute("SELECT indexrelid::regclass::text FROM pg_index WHERE indrelid = 'outbox'::regclass").fetchall()
    for (index,) in indexes:
        conn.execute("SELECT bt_index_check(%s::regclass, heapallindexed => true)", (index,))
    return len(indexes)


def enqueue_row(conn, *arguments):
    """What outbox_enqueue returned, and the row in the table, each as a dict."""
    placeholders = ", ".join(["%s"] * len(arguments))
    cursor = conn.execute(f"SELECT * FROM outbox_enqueue({placeholders})", arguments)
    names = [column.name for column in cursor.description]
    returned = dict(zip(names, cursor.fetchone()))
    stored = dict(zip(names, conn.execute("SELECT * FROM ONLY outbox WHERE id = %s", (returned["id"],)).fetchone()))
    return returned, stored


def test_a_plain_enqueue_writes_the_row_an_insert_would(db):
    with connect() as producer:
        started = producer.execute("SELECT now(), clock_timestamp()").fetchone()
        first, first_stored = enqueue_row(producer, "direct.plain", '{"n": 1}')
        later, later_stored = enqueue_row(producer, "direct.later", '{"n": 2}', "1 hour", None, None, '{"trace": "t-1"}')
        producer.commit()

    assert first == first_stored and later == later_stored, "it returns the row it wrote"
    assert later["id"] == first["id"] + 1, "ids from the sequence"
    for row in (first, later):
        assert uuid.UUID(str(row["public_id"])).version == 7
        assert (row["status"], row["attempts"], row["processed_at"], row["last_error"]) == ("PENDING", 0, None, None)
        assert row["created_at"] == started[0], "created_at is the transaction's now()"
        assert (row["dedupe_key"], row["lease_token"], row["ordering_key"], row["waiting_for"]) == (None,) * 4
    assert first["public_id"] != later["public_id"]
    assert (first["topic"], first["payload"], first["headers"]) == ("direct.plain", {"n": 1}, None)
    assert started[1] <= first["available_at"] < started[1] + datetime.timedelta(seconds=5)
    assert later["headers"] == {"trace": "t-1"}
    assert later["available_at"] - first["available_at"] >= datetime.timedelta(hours=1), "delay"

    # A payload large enough to be stored out of line comes back whole.
    large = {"blob": secrets.token_hex(100_000)}
    returned, stored = enqueue_row(db, "direct.large", json.dumps(large))
    assert returned["payload"] == stored["payload"] == large

    # The rows go on through their life; the indexes hold every row their predicates admit.
    claimed = db.execute("SELECT id FROM outbox_claim(10, '{direct.plain}', lease => NULL)").fetchall()
    assert claimed == [(first["id"],)]
    assert indexes_agree_with_the_table(db) == 10


def test_a_keyed_enqueue_writes_the_rows_the_statements_would(db):
    """Per key: the first message is the head, the next ones wait behind it, in enqueue order,
    from single enqueues and batches alike; a head rolled back leaves the key free. A REPEATABLE
    READ producer (which takes the statements' way) writes the same rows."""
    with connect() as producer:
        head, head_stored = enqueue_row(producer, "direct.keyed", '{"n": 1}', "0", None, "direct:1", '{"trace": "t-1"}')
        behind, behind_stored = enqueue_row(producer, "direct.other", '{"n": 2}', "1 hour", None, "direct:1")
        other, _ = enqueue_row(producer, "direct.keyed", '{"n": 3}', "0", None, "direct:2")
        batch = producer.execute(
            "SELECT id, ordering_key, waiting_for FROM outbox_enqueue_batch('direct.keyed', %s::jsonb[], ordering_key => 'direct:3')",
            (['{"n": 4}', '{"n": 5}', '{"n": 6}'],),
        ).fetchall()
        producer.commit()
    assert head == head_stored and behind == behind_stored, "it returns the row it wrote"
    assert (head["ordering_key"], head["waiting_for"], head["headers"]) == ("direct:1", None, {"trace": "t-1"})
    assert (behind["ordering_key"], behind["waiting_for"]) == ("direct:1", "ordering_key"), "behind its key's head, across topics"
    assert behind["available_at"] - head["available_at"] >= datetime.timedelta(hours=1), "delay"
    assert (other["ordering_key"], other["waiting_for"]) == ("direct:2", None), "another key has its own head"
    assert [(key, waiting) for _, key, waiting in batch] == [("direct:3", None)] + [("direct:3", "ordering_key")] * 2
    assert [row[0] for row in batch] == sorted(row[0] for row in batch), "the batch in payload order"
    for row in (head, behind, other):
        assert uuid.UUID(str(row["public_id"])).version == 7
        assert (row["status"], row["attempts"], row["dedupe_key"], row["lease_token"]) == ("PENDING", 0, None, None)

    with connect() as producer:
        enqueue_row(producer, "direct.keyed", "{}", "0", None, "direct:4")
        producer.rollback()
        _, stored = enqueue_row(producer, "direct.keyed", "{}", "0", None, "direct:4")
        assert stored["waiting_for"] is None, "a head rolled back leaves the key free"
        producer.commit()
        producer.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        returned, stored = enqueue_row(producer, "direct.keyed", "{}", "0", None, "direct:4")
        assert returned == stored and stored["waiting_for"] == "ordering_key"
        producer.commit()

    # The heads are handed out, oldest first; what waits behind them is not.
    claimed = db.execute("SELECT payload->>'n' FROM outbox_claim(10, '{direct.keyed,direct.other}', lease => NULL) ORDER BY id").fetchall()
    assert claimed == [("1",), ("3",), ("4",), (None,)]
    assert indexes_agree_with_the_table(db) == 10


def test_producers_starting_the_same_keys_at_once_make_one_head_each(db):
    """Six producers enqueue to the same 150 new keys at once, each key in the same order: every
    key gets one head, its oldest message, and the others wait behind it; none fails. (Two
    producers that both find a key without a head meet on the unique head index, where the
    second waits for the first and then queues behind it.)"""
    producers, keys = 6, 150
    failures, start = [], threading.Barrier(producers)

    def produce(n):
        try:
            with connect(autocommit=True) as producer:
                start.wait()
                for key in range(keys):
                    producer.execute("SELECT outbox_enqueue('direct.race', %s, ordering_key => %s)", (json.dumps({"p": n}), f"race:{key}"))
        except Exception as failure:  # noqa: BLE001 (reported below)
            failures.append(failure)

    threads = [threading.Thread(target=produce, args=(n,)) for n in range(producers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    per_key = db.execute(
        """SELECT count(*), count(*) FILTER (WHERE waiting_for IS NULL),
                  bool_and(waiting_for IS NULL = (id = min_id))
             FROM (SELECT *, min(id) OVER (PARTITION BY ordering_key) AS min_id FROM outbox WHERE topic = 'direct.race') m
            GROUP BY ordering_key"""
    ).fetchall()
    assert len(per_key) == keys
    assert set(per_key) == {(producers, 1, True)}, "one head per key, its oldest message"
    assert indexes_agree_with_the_table(db) == 10


def test_the_session_follows_changes_to_the_table_made_while_it_lives(db):
    """The producer's session keeps the defaults and the partial indexes' predicates: an
    ALTER TABLE or a new index from another session must reach its next enqueue."""
    with connect(autocommit=True) as producer:
        enqueue_row(producer, "direct.before", "{}")  # (what it keeps is made here)

        # A default it had kept changes...
        db.execute("ALTER TABLE outbox ALTER COLUMN created_at SET DEFAULT '2000-01-01 00:00+00'")
        _, stored = enqueue_row(producer, "direct.after", "{}")
        assert stored["created_at"] == datetime.datetime(2000, 1, 1, tzinfo=datetime.timezone.utc)
        # ...and a column that had none gets one.
        db.execute("ALTER TABLE outbox ALTER COLUMN last_error SET DEFAULT 'from the new default'")
        _, stored = enqueue_row(producer, "direct.after", "{}")
        assert stored["last_error"] == "from the new default"

        # A default that calls a SQL function follows the function when it is replaced (the
        # table does not change: nothing but the function's own definition says so).
        db.execute("CREATE OR REPLACE FUNCTION direct_default() RETURNS text LANGUAGE sql AS $$ SELECT 'first' $$")
        db.execute("ALTER TABLE outbox ALTER COLUMN last_error SET DEFAULT direct_default()")
        _, stored = enqueue_row(producer, "direct.after", "{}")
        assert stored["last_error"] == "first"
        db.execute("CREATE OR REPLACE FUNCTION direct_default() RETURNS text LANGUAGE sql AS $$ SELECT 'second' $$")
        _, stored = enqueue_row(producer, "direct.after", "{}")
        assert stored["last_error"] == "second"

        db.execute("CREATE INDEX outbox_direct_test_idx ON outbox (id) WHERE topic = 'direct.indexed'")
        enqueue_row(producer, "direct.indexed", "{}")
        assert indexes_agree_with_the_table(db) == 11, "the new index has the new row"

        db.execute("DROP INDEX outbox_direct_test_idx")
        db.execute("ALTER TABLE outbox ALTER COLUMN last_error DROP DEFAULT, ALTER COLUMN created_at SET DEFAULT now()")
        started = producer.execute("SELECT now()").fetchone()[0]
        _, stored = enqueue_row(producer, "direct.indexed", "{}")
        assert stored["last_error"] is None and stored["created_at"] >= started
    assert indexes_agree_with_the_table(db) == 10


def test_an_index_built_concurrently_gets_every_row_of_a_session_that_lives_through_it(db):
    """CREATE INDEX CONCURRENTLY while a producer enqueues without a pause: the new index is
    first in the table's list but not ready for inserts, then ready. The producer's session keeps
    what it knows of each index (since 0.5.12): what it kept in the first phase must not keep
    its rows out of the index once the index is ready."""
    stop, failures, written = threading.Event(), [], [0]

    def produce():
        try:
            with connect(autocommit=True) as producer:
                while not stop.is_set():
                    producer.execute("SELECT outbox_enqueue('direct.concurrent', '{}')")
                    written[0] += 1
        except Exception as failure:  # noqa: BLE001 (reported below)
            failures.append(failure)

    def wait_for_rows(count):
        deadline = time.monotonic() + 30
        while written[0] < count and not failures:
            assert time.monotonic() < deadline, f"the producer wrote {written[0]} rows of {count}"
            time.sleep(0.01)

    producer = threading.Thread(target=produce)
    producer.start()
    try:
        wait_for_rows(50)
        db.execute("CREATE INDEX CONCURRENTLY outbox_direct_concurrent_idx ON outbox (id) WHERE topic = 'direct.concurrent'")
        wait_for_rows(written[0] + 50)
    finally:
        stop.set()
        producer.join()
    assert failures == []
    try:
        assert indexes_agree_with_the_table(db) == 11, "the new index has every row, before and after it was ready"
        rows = db.execute("SELECT count(*) FROM outbox WHERE topic = 'direct.concurrent'").fetchone()[0]
        assert rows == written[0], "one row for each enqueue"
    finally:
        db.execute("DROP INDEX outbox_direct_concurrent_idx")


def test_a_table_with_triggers_is_written_as_by_an_insert(db):
    """Triggers of a superuser's own on outbox fire as for an INSERT, row and statement ones."""
    db.execute("CREATE TABLE direct_trigger_log (level text, topic text)")
    db.execute("""CREATE FUNCTION direct_log_row() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN INSERT INTO direct_trigger_log VALUES ('row', NEW.topic); NEW.last_error := 'seen'; RETURN NEW; END $$""")
    db.execute("""CREATE FUNCTION direct_log_statement() RETURNS trigger LANGUAGE plpgsql AS $$
                  BEGIN INSERT INTO direct_trigger_log VALUES ('statement', NULL); RETURN NULL; END $$""")
    db.execute("CREATE TRIGGER direct_row BEFORE INSERT ON outbox FOR EACH ROW EXECUTE FUNCTION direct_log_row()")
    db.execute("CREATE TRIGGER direct_statement AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION direct_log_statement()")
    try:
        returned, stored = enqueue_row(db, "direct.triggered", "{}")
        assert returned == stored and stored["last_error"] == "seen", "the BEFORE trigger's change is written and returned"
        log = db.execute("SELECT level, topic FROM direct_trigger_log ORDER BY level").fetchall()
        assert log == [("row", "direct.triggered"), ("statement", None)]
        # With an ordering key as well (its head, then a message behind it).
        for waiting_for in (None, "ordering_key"):
            returned, stored = enqueue_row(db, "direct.triggered.keyed", "{}", "0", None, "direct:triggered")
            assert returned == stored and (stored["last_error"], stored["waiting_for"]) == ("seen", waiting_for)
        assert db.execute("SELECT count(*) FROM direct_trigger_log WHERE topic = 'direct.triggered.keyed'").fetchone()[0] == 2
    finally:
        db.execute("DROP TRIGGER direct_row ON outbox")
        db.execute("DROP TRIGGER direct_statement ON outbox")
    # Without them, the direct write again (and the session's kept state follows).
    _, stored = enqueue_row(db, "direct.untriggered", "{}")
    assert stored["last_error"] is None
    assert db.execute("SELECT count(*) FROM direct_trigger_log").fetchone()[0] == 6


def test_a_row_the_table_refuses_is_an_error_and_the_session_goes_on(db):
    """A constraint of a superuser's own refuses the row: the enqueue fails with its SQLSTATE,
    writes nothing, and the session's next enqueue works."""
    db.execute("ALTER TABLE outbox ADD CONSTRAINT direct_refused CHECK (topic <> 'direct.refused')")
    with connect(autocommit=True) as producer:
        enqueue_row(producer, "direct.accepted", "{}")
        with pytest.raises(psycopg.errors.CheckViolation, match="direct_refused"):
            producer.execute("SELECT outbox_enqueue('direct.refused', '{}')")
        returned, stored = enqueue_row(producer, "direct.accepted", "{}")
        assert returned == stored
        # With an ordering key: refused as its key's head, and behind a head.
        with pytest.raises(psycopg.errors.CheckViolation, match="direct_refused"):
            producer.execute("SELECT outbox_enqueue('direct.refused', '{}', ordering_key => 'direct:refused')")
        enqueue_row(producer, "direct.accepted", "{}", "0", None, "direct:refused")
        with pytest.raises(psycopg.errors.CheckViolation, match="direct_refused"):
            producer.execute("SELECT outbox_enqueue('direct.refused', '{}', ordering_key => 'direct:refused')")
        _, stored = enqueue_row(producer, "direct.accepted", "{}", "0", None, "direct:refused")
        assert stored["waiting_for"] == "ordering_key"
    assert db.execute("SELECT count(*) FROM outbox WHERE topic = 'direct.refused'").fetchone()[0] == 0
    assert indexes_agree_with_the_table(db) == 10
