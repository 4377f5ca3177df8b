"""The row a plain outbox_enqueue writes (0.5.8): without keys it is written without a plan, with
the table's own defaults and indexes and what it keeps of them for the session
(src/enqueue/direct_insert.rs). It must be the row an INSERT would write, follow changes to the
table made while the session lives, and leave the indexes agreeing with the table."""
import datetime
import json
import secrets
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
    finally:
        db.execute("DROP TRIGGER direct_row ON outbox")
        db.execute("DROP TRIGGER direct_statement ON outbox")
    # Without them, the direct write again (and the session's kept state follows).
    _, stored = enqueue_row(db, "direct.untriggered", "{}")
    assert stored["last_error"] is None
    assert db.execute("SELECT count(*) FROM direct_trigger_log").fetchone()[0] == 2


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
    assert db.execute("SELECT count(*) FROM outbox WHERE topic = 'direct.refused'").fetchone()[0] == 0
    assert indexes_agree_with_the_table(db) == 10
