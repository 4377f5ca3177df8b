"""Databases that are not UTF-8: text is converted at the edges, never a crash.

The HTTP body is the payload as JSON in UTF-8, whatever the database's encoding; arguments with
non-ASCII characters get the same checks (and SQLSTATEs) as in a UTF-8 database. In SQL_ASCII,
where PostgreSQL does not know what the bytes mean, bytes that are not UTF-8 are sent as U+FFFD.
"""

import json

import psycopg
import pytest

from support import eventually, recreate_database, wait_for_worker, worker_pid
from support.receiver import Receiver

# Both served by the delivery worker (scripts/test.sh).
DATABASES = {"LATIN1": "outbox_latin1", "SQL_ASCII": "outbox_sqlascii"}


@pytest.fixture(params=sorted(DATABASES))
def encoded_db(request, database):
    name = DATABASES[request.param]
    recreate_database(name, encoding=request.param)
    with psycopg.connect(dbname=name, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION outbox_ext")
        conn.execute("SET client_encoding = 'UTF8'")
        yield request.param, conn
    recreate_database(name)


@pytest.fixture()
def receiver():
    receiver = Receiver().start()
    yield receiver
    receiver.stop()


def test_a_non_ascii_payload_is_delivered_as_utf8_json(encoded_db, receiver):
    encoding, db = encoded_db
    database = db.info.dbname
    db.execute("SELECT outbox_subscribe('enc.bad', %s)", (receiver.url + "/bad",))
    db.execute("SELECT outbox_subscribe('enc.ok', %s)", (receiver.url + "/ok",))
    wait_for_worker(database)
    pid = worker_pid(database)
    db.execute("""SELECT outbox_enqueue('enc.bad', '{"name": "Müller"}')""")
    db.execute("""SELECT outbox_enqueue('enc.ok', '{"n": 2}')""")
    requests = receiver.wait_for(2)
    bodies = {r["headers"]["outbox-topic"]: json.loads(r["body"]) for r in requests}
    assert bodies == {"enc.bad": {"name": "Müller"}, "enc.ok": {"n": 2}}
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 2,
               what="both recorded")
    assert worker_pid(database) == pid, "the worker restarted"


def test_an_ordering_key_that_is_not_ascii_is_handed_on_at_its_endpoint(encoded_db, receiver):
    """The worker hands a key on at an endpoint by the key's bytes. Until 0.5.34 it read them
    as UTF-8 and wrote that back: in LATIN1 another key (ü became Ã¼), in SQL_ASCII bytes that
    are not UTF-8 became U+FFFD. Nothing matched, and the key's second message waited for ever
    without a word (in EUC_JP every step of the database failed). Found by stop 57's probe of
    encodings."""
    encoding, db = encoded_db
    database = db.info.dbname
    key = "'Müller-ü'" if encoding == "LATIN1" else "'raw-' || convert_from('\\xff'::bytea, 'SQL_ASCII')"
    db.execute("SELECT outbox_subscribe('enc.keyed', %s)", (receiver.url,))
    wait_for_worker(database)
    db.execute(f"SELECT (outbox_enqueue('enc.keyed', jsonb_build_object('n', n), ordering_key => {key})).id FROM generate_series(1, 3) n")
    requests = receiver.wait_for(3)
    assert [json.loads(r["body"])["n"] for r in requests] == [1, 2, 3]
    eventually(lambda: db.execute("SELECT count(*) FROM outbox WHERE status = 'DONE'").fetchone()[0] == 3,
               what="all three recorded")


@pytest.mark.parametrize(
    "encoding,name,character",
    [
        ("SQL_ASCII", DATABASES["SQL_ASCII"], "convert_from('\\xff'::bytea, 'SQL_ASCII')"),
        ("WIN1252", "outbox_win1252", "convert_from('\\x81'::bytea, 'WIN1252')"),
    ],
)
def test_bytes_without_a_utf8_meaning_arrive_as_replacement_characters(database, receiver, encoding, name, character):
    """In SQL_ASCII PostgreSQL does not know what the bytes mean: those that are not UTF-8 have
    no UTF-8 equivalent. WIN1252 takes byte 0x81, which means no character: PostgreSQL stores it,
    and has no UTF-8 for it. Both are sent as U+FFFD. Until 0.5.34 converting WIN1252's raised an
    error that failed the worker's step, every time: no message of the database was delivered
    again (found by stop 57's probe of encodings)."""
    recreate_database(name, encoding=encoding)
    try:
        with psycopg.connect(dbname=name, autocommit=True) as db:
            db.execute("SET client_encoding = 'UTF8'")
            db.execute("CREATE EXTENSION outbox_ext")
            db.execute("SELECT outbox_subscribe('enc.raw', %s)", (receiver.url,))
            wait_for_worker(name)
            # (Its id only: the row's payload has no UTF-8 for this client either.)
            db.execute(f"""SELECT (outbox_enqueue('enc.raw', ('{{"name": "x' || {character} || 'y €"}}')::jsonb)).id""")
            db.execute("""SELECT outbox_enqueue('enc.raw', '{"n": 2}')""")
            requests = receiver.wait_for(2)
            assert sorted(r["body"] for r in requests) == sorted(['{"name": "x\ufffdy €"}', '{"n": 2}'])
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_an_endpoints_error_is_recorded_in_the_databases_encoding(encoded_db, fast_worker, receiver):
    """The worker records an endpoint's error in the database's encoding: LATIN1 holds `ü`, and
    only `€`, which it cannot hold, is escaped. Until 0.5.35 every character outside ASCII was
    escaped in a database that is not UTF-8 (`M\\u{fc}ller`, stop 57's probe of encodings).
    The delivery's error, the attempt log's and the dead message's all read the same."""
    encoding, db = encoded_db
    receiver.answer_by_default(500, headers={"Content-Type": "text/plain; charset=utf-8"}, body="Müller: 5 €".encode())
    db.execute("SELECT outbox_subscribe('enc.refused', %s)", (receiver.url,))
    wait_for_worker(db.info.dbname)
    message_id = db.execute("SELECT (outbox_enqueue('enc.refused', '{}')).id").fetchone()[0]
    eventually(lambda: db.execute("SELECT status FROM outbox WHERE id = %s", (message_id,)).fetchone()[0] == "DEAD",
               what="the message dead after outbox.max_attempts")
    expected = "HTTP 500: Müller: 5 " + ("\\u{20ac}" if encoding == "LATIN1" else "€")
    assert db.execute("SELECT last_error FROM outbox_deliveries WHERE message_id = %s", (message_id,)).fetchone()[0] == expected
    logged = db.execute("SELECT DISTINCT error FROM outbox_delivery_attempts WHERE message_id = %s", (message_id,)).fetchall()
    assert logged == [(expected,)]
    assert db.execute("SELECT last_error FROM outbox WHERE id = %s", (message_id,)).fetchone()[0].endswith(expected)


def test_non_ascii_arguments_get_the_usual_checks(encoded_db):
    encoding, db = encoded_db
    first = db.execute("SELECT id, payload FROM outbox_enqueue('enc.ok', '{\"v\": 1}', dedupe_key => 'kunde-müller')").fetchone()
    again = db.execute("SELECT id FROM outbox_enqueue('enc.ok', '{\"v\": 2}', dedupe_key => 'kunde-müller')").fetchone()
    assert again[0] == first[0]
    assert db.execute("SELECT count(*) FROM outbox").fetchone()[0] == 1
    # 255 characters is the limit, counted in characters as PostgreSQL counts them (in
    # SQL_ASCII every byte is a character).
    letter = "ü" if encoding != "SQL_ASCII" else "u"
    db.execute("SELECT outbox_enqueue('enc.ok', '{}', dedupe_key => %s)", (letter * 255,))
    with pytest.raises(psycopg.errors.StringDataRightTruncation):
        db.execute("SELECT outbox_enqueue('enc.ok', '{}', dedupe_key => %s)", (letter * 256,))
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        db.execute("SELECT outbox_enqueue('encé.ok', '{}')")
    assert "outbox_enqueue: topic" in str(refused.value)
    with pytest.raises(psycopg.errors.InvalidParameterValue) as refused:
        db.execute("SELECT outbox_subscribe('enc.ok', 'http://127.0.0.1:9/', headers => '{\"X-Name\": \"Müller\"}')")
    assert "outbox_subscribe: headers" in str(refused.value)
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        db.execute("SELECT outbox_subscribe('enc.ok', 'http://bücher.example/')")
    with pytest.raises(psycopg.errors.InvalidParameterValue):
        db.execute("SELECT outbox_claim(1, ARRAY['encé.ok'])")
    # A failure with a non-ASCII error is recorded (a consumer's message).
    message_id = db.execute("SELECT (outbox_enqueue('enc.fail', '{}')).id").fetchone()[0]
    assert db.execute("SELECT outbox_fail(%s, 'Empfänger unbekannt')", (message_id,)).fetchone()[0] == "PENDING"
    assert db.execute("SELECT last_error FROM outbox WHERE id = %s", (message_id,)).fetchone()[0] == "Empfänger unbekannt"


@pytest.mark.parametrize("encoding", ["EUC_JP", "LATIN1"])
def test_the_extension_installs_and_reads_right_in_any_encoding(database, encoding):
    """PostgreSQL reads an extension's script in the database's encoding. Ours had '…' (U+2026)
    in comments, a COMMENT and the monitoring function: CREATE EXTENSION failed in EUC_JP or
    EUC_KR (22021, invalid byte sequence), and LATIN1 showed monitoring roles 'â\\x80¦' (stop
    48's review of bad input). The script is ASCII now."""
    name = "outbox_encoded"
    recreate_database(name, encoding=encoding)
    try:
        with psycopg.connect(dbname=name, autocommit=True) as db:
            db.execute("SET client_encoding = 'UTF8'")
            db.execute("CREATE EXTENSION outbox_ext")
            db.execute("SELECT outbox_subscribe('enc.topic', 'https://hooks.example.test/secret/path')")
            db.execute("DROP ROLE IF EXISTS encoded_monitor")
            db.execute("CREATE ROLE encoded_monitor IN ROLE pg_monitor")
            try:
                db.execute("SET SESSION AUTHORIZATION encoded_monitor")
                (url,) = db.execute("SELECT url FROM outbox_endpoint_stats()").fetchone()
                db.execute("RESET SESSION AUTHORIZATION")
            finally:
                db.execute("RESET SESSION AUTHORIZATION")
                db.execute("DROP ROLE encoded_monitor")
            assert url == "https://hooks.example.test/..."
            (comment,) = db.execute("SELECT obj_description('outbox_subscribe'::regproc, 'pg_proc')").fetchone()
            assert "whsec_... form" in comment
    finally:
        with psycopg.connect(dbname="postgres", autocommit=True) as admin:
            admin.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
