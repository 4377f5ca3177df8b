"""Compaction of the hot tables (0.5.7): while a transaction holds the xmin horizon back, every
claim and completion leaves a row version no vacuum may remove, and outbox grows with the
traffic. outbox_compact empties outbox and outbox_delivery (each over 2 MB, not their history
tables) with TRUNCATE and writes their few live rows back; the delivery worker calls it every
second (docs/storage.md)."""
import os
import re
import subprocess
import time
from contextlib import contextmanager

import psycopg
import pytest

from conftest import configure_worker, connect, pg_program, reset_worker_settings
from support import ServerLog, disabled_endpoint, eventually
from support.cluster import ScratchCluster, as_server_user

CLEAN = 2 * 1024 * 1024  # below this, outbox_compact leaves the tables alone unless forced
LARGE = 8 * 1024 * 1024  # above this, it compacts them even with no horizon held back
PAYLOAD = "x" * 1000
# What every compaction writes to the server log (LOG), whoever called it.
COMPACTED = re.compile(r"outbox_compact: compacted (?:outbox and outbox_delivery|outbox|outbox_delivery) "
                       r"from \d+ \w+ to \d+ \w+ \((\d+) live rows kept\)")


def hot_size(conn):
    return conn.execute("SELECT pg_relation_size('outbox') + pg_relation_size('outbox_delivery')").fetchone()[0]


def churn(conn, messages):
    """messages enqueued, claimed and completed, 500 a transaction: each leaves dead versions."""
    for _ in range(0, messages, 500):
        with conn.transaction():
            conn.execute("SELECT outbox_enqueue('compaction.churn', jsonb_build_object('pad', %s::text)) "
                         "FROM generate_series(1, 500)", (PAYLOAD,))
        with conn.transaction():
            done = conn.execute("SELECT count(*) FILTER (WHERE outbox_complete(id)) "
                                "FROM outbox_claim(500, '{compaction.churn}', lease => NULL)").fetchone()[0]
            assert done == 500


def worker_compactions(conn):
    """(compactions, last_compaction_at) of the database's delivery worker."""
    return conn.execute("SELECT compactions, last_compaction_at FROM outbox_worker_status() "
                        "WHERE database = current_database() AND pid IS NOT NULL").fetchone()


def compactions_counted_after(conn, before):
    """(compactions, last_compaction_at) once the worker counts more than `before`: it counts a
    compaction just after committing it, so a test that saw the tables shrink may read first."""
    return eventually(lambda: (counted := worker_compactions(conn))[0] > before and counted,
                      timeout=10, interval=0.05, what="the worker's count of its compactions")


def wait_for_the_worker_to_compact(conn, compacted_during_the_churn, timeout=30):
    """Waits for the tables to be given back. After a compaction during the churn, the rest of
    the churn may leave them up to 2 MB, where none is due: below that, then."""
    small = CLEAN if compacted_during_the_churn else CLEAN / 4
    eventually(lambda: hot_size(conn) < small, timeout=timeout, interval=0.5, what="the worker's compaction")


def live_rows(conn):
    """Every row of the hot tables and of the deliveries' history, whole, and how many rows
    outbox shows with its history."""
    messages = conn.execute("SELECT o::text FROM ONLY outbox o ORDER BY id").fetchall()
    deliveries = conn.execute("SELECT d::text FROM ONLY outbox_delivery d ORDER BY message_id, subscription_id").fetchall()
    ended_deliveries = conn.execute("SELECT d::text, d.tableoid::regclass::text FROM outbox_delivery d "
                                    "WHERE d.tableoid <> 'outbox_delivery'::regclass ORDER BY 1").fetchall()
    return messages, deliveries, ended_deliveries, conn.execute("SELECT count(*) FROM outbox").fetchone()[0]


def messages_in_every_state(conn):
    """Pending, keyed (a head and one waiting behind it), leased, DEAD and DONE-with-a-dedupe_key
    messages, and deliveries: what must survive a compaction unchanged. Returns the lease."""
    conn.execute("SELECT outbox_enqueue('compaction.kept', jsonb_build_object('n', n)) FROM generate_series(1, 20) n")
    conn.execute("SELECT outbox_enqueue('compaction.keyed', jsonb_build_object('n', n), ordering_key => 'booking:1') "
                 "FROM generate_series(1, 2) n")
    conn.execute("SELECT outbox_enqueue('compaction.dead', '{}')")
    dead = conn.execute("SELECT id FROM outbox_claim(1, '{compaction.dead}', lease => NULL)").fetchone()[0]
    conn.execute("SELECT outbox_fail(%s, 'gone', retry_in => NULL) FROM generate_series(1, 10)", (dead,))
    conn.execute("SELECT outbox_enqueue('compaction.once', '{}', dedupe_key => 'order-7')")
    once = conn.execute("SELECT id FROM outbox_claim(1, '{compaction.once}', lease => NULL)").fetchone()[0]
    assert conn.execute("SELECT outbox_complete(%s)", (once,)).fetchone()[0]
    conn.execute("SELECT outbox_enqueue('compaction.leased', '{}')")
    leased = conn.execute("SELECT id, lease_token FROM outbox_claim(1, '{compaction.leased}')").fetchone()
    subscription = disabled_endpoint(conn, "compaction.elsewhere")  # (not the topic: no fan-out meanwhile)
    conn.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts)
                    SELECT id, %s, 'PENDING', 0 FROM ONLY outbox WHERE topic = 'compaction.kept' LIMIT 5""",
                 (subscription,))
    # Delivered and ended two minutes ago: outbox_archive moves it, with its delivery, to the
    # history of its day (the history tables inherit from outbox and outbox_delivery).
    conn.execute("SELECT outbox_enqueue('compaction.archived', '{}')")
    archived = conn.execute("SELECT id FROM outbox_claim(1, '{compaction.archived}', lease => NULL)").fetchone()[0]
    conn.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, processed_at)
                    VALUES (%s, %s, 'DONE', 1, now() - interval '2 minutes')""", (archived, subscription))
    conn.execute("UPDATE ONLY outbox SET status = 'DONE', processed_at = now() - interval '2 minutes' WHERE id = %s",
                 (archived,))
    eventually(lambda: conn.execute("SELECT outbox_archive()")
               and conn.execute("SELECT count(*) FROM outbox_delivery d WHERE d.message_id = %s "
                                "AND d.tableoid <> 'outbox_delivery'::regclass", (archived,)).fetchone()[0] == 1,
               what="the archive of a delivered message")
    assert conn.execute("SELECT status FROM outbox WHERE id = %s", (dead,)).fetchone()[0] == "DEAD"
    return leased


def test_compaction_writes_every_live_row_back_unchanged_and_the_api_goes_on(db):
    leased_id, token = messages_in_every_state(db)
    churn(db, 2000)  # (history too: outbox_complete moved them to their day's table)
    before = live_rows(db)
    log = ServerLog()

    kept = db.execute("SELECT outbox_compact(force => true)").fetchone()[0]

    assert kept == len(before[0]) + len(before[1]), "returns how many rows it wrote back"
    assert [int(n) for n in COMPACTED.findall(log.since())] == [kept], "the server log says what it did"
    assert before[2], "a delivery in the history"
    assert live_rows(db) == before, "every message and delivery whole, the history untouched"
    assert hot_size(db) < 64 * 1024, "the space of the dead versions is given back"
    # The indexes were rebuilt with the tables: the lease, the key order and the dedupe key hold.
    assert db.execute("SELECT outbox_complete(%s, %s)", (leased_id, token)).fetchone()[0]
    head = db.execute("SELECT id FROM outbox_claim(10, '{compaction.keyed}', lease => NULL)").fetchall()
    assert len(head) == 1, "the key's second message still waits behind its first"
    assert db.execute("SELECT outbox_complete(%s)", (head[0][0],)).fetchone()[0]
    assert len(db.execute("SELECT id FROM outbox_claim(10, '{compaction.keyed}', lease => NULL)").fetchall()) == 1
    db.execute("SELECT outbox_enqueue('compaction.once', '{}', dedupe_key => 'order-7')")
    assert db.execute("SELECT count(*) FROM ONLY outbox WHERE dedupe_key = 'order-7'").fetchone()[0] == 1
    assert db.execute("SELECT outbox_requeue_all()").fetchone()[0] == 1, "the DEAD message is still there"


def test_compaction_leaves_the_tables_alone_when_it_must(db):
    messages_in_every_state(db)
    before = live_rows(db)
    log = ServerLog()
    assert db.execute("SELECT outbox_compact()").fetchone()[0] is None, "small tables, no horizon held back"
    assert db.execute("SELECT outbox_compact(true, max_live_rows => 10)").fetchone()[0] is None, "too many live rows"

    with connect() as consumer:  # a consumer inside its transaction holds a lock on outbox
        consumer.execute("SELECT id FROM outbox_claim(1, '{compaction.kept}', lease => NULL)").fetchone()
        started = time.monotonic()
        assert db.execute("SELECT outbox_compact(force => true)").fetchone()[0] is None
        assert time.monotonic() - started < 2, "it does not queue behind the consumer"
        consumer.rollback()

    db.execute("CREATE PUBLICATION compaction_cdc FOR TABLE outbox")
    try:
        assert db.execute("SELECT outbox_compact(force => true)").fetchone()[0] is None, "a subscriber would see it"
    finally:
        db.execute("DROP PUBLICATION compaction_cdc")
    assert live_rows(db) == before
    assert not COMPACTED.search(log.since()), "nothing logged when nothing was done"

    with pytest.raises(psycopg.errors.InvalidParameterValue, match="outbox_compact: max_live_rows"):
        db.execute("SELECT outbox_compact(max_live_rows => -1)")
    with pytest.raises(psycopg.errors.NullValueNotAllowed, match="outbox_compact: force"):
        db.execute("SELECT outbox_compact(NULL)")


@pytest.mark.parametrize("holder_reads_outbox", [False, True])
@pytest.mark.parametrize("compaction", ["on", "off"])
def test_the_worker_gives_the_space_back_while_a_transaction_holds_vacuum_back(db, compaction, holder_reads_outbox):
    """The holder idles with a REPEATABLE READ snapshot. One that has read outbox holds a lock
    that keeps the compaction out until it ends; then the worker compacts what it left."""
    configure_worker({"outbox.compaction": compaction})
    try:
        messages_in_every_state(db)
        compactions_before, _ = worker_compactions(db)
        started = db.execute("SELECT now()").fetchone()[0]
        with connect() as holder:
            holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            holder.execute("SELECT count(*) FROM outbox" if holder_reads_outbox else "SELECT count(*) FROM pg_class")
            held_since = time.monotonic()
            # About 5 MB of versions no vacuum may remove while the holder stays (over 10 MB
            # when it keeps the compaction out, so that it is due once the holder leaves).
            churn(db, 10000 if holder_reads_outbox else 4000)
            # Live rows at the end of the file too, as steady traffic leaves them: vacuum may
            # not just cut off the empty pages behind the first ones once the holder leaves.
            db.execute("SELECT outbox_enqueue('compaction.tail', '{}') FROM generate_series(1, 5)")
            before = live_rows(db)
            grown = hot_size(db)
            # (Where the worker may compact, it may do so during a churn that took over 10 s.)
            compacted_during_the_churn = worker_compactions(db)[0] > compactions_before
            assert grown > (LARGE if holder_reads_outbox else CLEAN) or compacted_during_the_churn, \
                f"the churn left {grown} bytes"
            if compaction == "on" and not holder_reads_outbox:
                # Once the horizon has been held for 10 s, the worker compacts within a second or so.
                wait_for_the_worker_to_compact(db, compacted_during_the_churn)
            else:
                time.sleep(max(0.0, held_since + 14 - time.monotonic()))
                assert hot_size(db) >= grown, "the worker left the tables alone"
            holder.rollback()
        if holder_reads_outbox:
            if compaction == "on":  # over 8 MB: due without a horizon held back
                wait_for_the_worker_to_compact(db, compacted_during_the_churn=False)
            else:
                time.sleep(3)
                assert hot_size(db) >= grown, "outbox.compaction = off: the worker leaves the tables alone"
        after = live_rows(db)
        assert after[:3] == before[:3], [set(a) ^ set(b) for a, b in zip(after[:3], before[:3])]
        # outbox_worker_status() shows the worker's compactions.
        if compaction == "on":
            assert compactions_counted_after(db, compactions_before)[1] > started
        else:
            assert worker_compactions(db)[0] == compactions_before
    finally:
        reset_worker_settings()


def test_a_compaction_leaves_alone_and_unlocked_a_table_that_has_not_grown(db):
    """Only a table over 2 MB is compacted, and only it is locked: a session idle in its
    transaction after reading outbox_delivery (an operator's report) holds the horizon back and
    a lock on that table, and outbox is compacted all the same; outbox_delivery keeps its file."""
    messages_in_every_state(db)
    delivery_file = db.execute("SELECT pg_relation_filenode('outbox_delivery')").fetchone()[0]
    log = ServerLog()
    with connect() as holder:
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT count(*) FROM ONLY outbox_delivery")
        churn_under_8_mb_and_see_the_worker_compact(db)
        holder.rollback()
    assert db.execute("SELECT pg_relation_filenode('outbox_delivery')").fetchone()[0] == delivery_file
    assert "outbox_compact: compacted outbox from" in log.since()


def test_a_table_over_8_mb_is_compacted_alone_while_the_other_is_in_use(db):
    """Over 8 MB a table is compacted with no horizon held back, and alone: outbox, small, is
    neither locked (a report reading it does not keep the compaction out) nor emptied."""
    configure_worker({"outbox.compaction": "off"})  # (this test's call is the only one)
    try:
        messages_in_every_state(db)
        subscription = disabled_endpoint(db, "compaction.elsewhere")
        # Deliveries of messages that never were (no key ties them), all deleted but the last:
        # over 8 MB of dead versions whose last page vacuum may not cut off.
        db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts)
                      SELECT -g, %s, 'PENDING', 0 FROM generate_series(1, 150001) g""", (subscription,))
        db.execute("DELETE FROM ONLY outbox_delivery WHERE message_id BETWEEN -150000 AND -1")
        db.execute("SELECT pg_stat_force_next_flush()")  # (it counts the live rows in the statistics first)
        assert db.execute("SELECT pg_relation_size('outbox_delivery')").fetchone()[0] > LARGE
        before = live_rows(db)
        message_file = db.execute("SELECT pg_relation_filenode('outbox')").fetchone()[0]
        log = ServerLog()
        with connect() as report:
            report.execute("SELECT count(*) FROM ONLY outbox")  # (its lock on outbox lasts until it ends)
            # (An autovacuum of outbox_delivery may hold its lock past the 20 ms a call waits.)
            kept = eventually(lambda: db.execute("SELECT outbox_compact()").fetchone()[0], timeout=10,
                              interval=0.2, what="the compaction of outbox_delivery")
            report.rollback()
        assert kept == len(before[1]), "the deliveries written back, only them"
        assert [int(n) for n in re.findall(r"compacted outbox_delivery from \S+ \w+ to \S+ \w+ \((\d+) live", log.since())] == [kept]
        assert live_rows(db) == before
        assert db.execute("SELECT pg_relation_size('outbox_delivery')").fetchone()[0] < 64 * 1024
        assert db.execute("SELECT pg_relation_filenode('outbox')").fetchone()[0] == message_file
    finally:
        reset_worker_settings()


def churn_under_8_mb_and_see_the_worker_compact(db, timeout=30):
    """Churn that leaves the tables between 2 and 8 MB (due only while vacuum is held back);
    the worker compacts them within `timeout` seconds, every live row kept. When the horizon
    is already held for long enough, the worker may compact while the churn goes on, as soon
    as the tables pass 2 MB: then they may end the churn under 2 MB, and that compaction counts."""
    compactions_before, _ = worker_compactions(db)
    kept = live_rows(db)  # (the churn's messages all end in the history: the hot tables keep these)
    churn(db, 4000)
    db.execute("SELECT outbox_enqueue('compaction.tail', '{}') FROM generate_series(1, 5)")
    before = live_rows(db)
    grown = hot_size(db)
    compacted_during_the_churn = worker_compactions(db)[0] > compactions_before
    assert grown < LARGE and (grown > CLEAN or compacted_during_the_churn), f"the churn left {grown} bytes"
    wait_for_the_worker_to_compact(db, compacted_during_the_churn, timeout)
    assert live_rows(db)[:3] == before[:3]
    assert set(kept[0]) < set(before[0]) and kept[1:3] == before[1:3], "a compaction during the churn kept every row too"
    compactions_counted_after(db, compactions_before)


STANDBY_PORT = 25347
SLOT = "outbox_test_gone_standby"


def start_a_standby(db, standby, slot=None):
    """A streaming standby of the test cluster (`db`'s) in `standby` (its directory not yet a
    cluster), with hot_standby_feedback = on, replicating through the physical slot `slot` if
    given; returns once its first feedback holds an xmin on the primary."""
    data = f"{standby.dir}/data"
    with_slot = ["-C", "-S", slot] if slot else []
    subprocess.run(as_server_user([pg_program("pg_basebackup"), "-h", "127.0.0.1", "-p", os.environ["PGPORT"], "-U", "postgres",
                                   "-D", data, "-X", "stream", "-c", "fast", *with_slot, "-R"]),
                   check=True, capture_output=True, timeout=180)
    subprocess.run(as_server_user(["sh", "-c", f"""cat >> {data}/postgresql.conf <<CONF
port = {standby.port}
unix_socket_directories = '{standby.dir}'
shared_preload_libraries = ''
hot_standby_feedback = on
wal_receiver_status_interval = 1s
CONF"""]), check=True, capture_output=True)
    standby.pg_ctl("start")
    eventually(lambda: standby_xmin(db, slot), timeout=30, interval=0.2, what="the standby's feedback")


@contextmanager
def a_query_on(standby):
    """A long query on the standby: a REPEATABLE READ snapshot held until the block ends."""
    with standby.connect() as reader, reader.transaction():
        reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        reader.execute("SELECT count(*) FROM pg_class")
        yield


def standby_xmin(db, slot=None):
    """The xmin the standby's feedback holds on the primary: its slot's, or its walsender's."""
    if slot:
        return db.execute("SELECT xmin::text FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0]
    return db.execute("SELECT max(backend_xmin::text) FROM pg_stat_replication").fetchone()[0]


def leave_a_slot_of_a_gone_standby(db, standby):
    """A physical replication slot that holds the xmin horizon with no one using it: a standby
    that ran with hot_standby_feedback = on and stopped (the forgotten slot)."""
    try:
        start_a_standby(db, standby, SLOT)
    finally:
        standby.pg_ctl("-m", "fast", "stop")
    slot_no_longer_in_use(db, SLOT)


def slot_no_longer_in_use(db, slot):
    """Waits for the slot's walsender on this side to leave: it does a moment after its
    standby has stopped, and a slot in use can be neither seen as forgotten nor dropped."""
    eventually(lambda: db.execute("SELECT NOT active FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone()[0],
               timeout=10, interval=0.1, what="the slot no longer in use")


def drop_slot(db, slot):
    """Drops the slot, if the standby's base backup made it, once it is no longer in use."""
    if db.execute("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s", (slot,)).fetchone():
        slot_no_longer_in_use(db, slot)
        db.execute("SELECT pg_drop_replication_slot(%s)", (slot,))


def test_the_worker_gives_the_space_back_while_a_slot_no_one_uses_holds_vacuum_back(db):
    """A forgotten slot pins the horizon with no transaction in sight: the worker compacts the
    tables as it does while a session idles in a transaction, well before they reach 8 MB."""
    messages_in_every_state(db)
    standby = ScratchCluster(STANDBY_PORT)
    try:
        leave_a_slot_of_a_gone_standby(db, standby)
        assert db.execute("SELECT NOT active AND xmin IS NOT NULL FROM pg_replication_slots WHERE slot_name = %s",
                          (SLOT,)).fetchone()[0]
        churn_under_8_mb_and_see_the_worker_compact(db)
    finally:
        standby.remove()
        drop_slot(db, SLOT)


@pytest.mark.parametrize("slot", [SLOT, None], ids=["through a slot", "without a slot"])
def test_the_worker_gives_the_space_back_while_a_query_on_a_standby_holds_vacuum_back(db, slot):
    """A standby with hot_standby_feedback = on holds the horizon at its oldest query's
    snapshot. The primary cannot see that query, only the standby's xmin staying behind its own:
    once it has for 30 s, the worker compacts the tables as for a session idle in a transaction.
    A healthy standby's xmin keeps up, and the tables are left alone."""
    messages_in_every_state(db)
    standby = ScratchCluster(STANDBY_PORT)
    try:
        start_a_standby(db, standby, slot)
        if slot:
            # Healthy: the same churn, the worker watching for 35 s, nothing compacted (vacuum
            # may cut the empty pages off the end meanwhile: its count tells).
            compactions_before, _ = worker_compactions(db)
            churn(db, 4000)
            grown = hot_size(db)
            assert CLEAN < grown < LARGE, f"the churn left {grown} bytes"
            time.sleep(35)
            assert worker_compactions(db)[0] == compactions_before, "a standby that keeps up holds nothing back"
            db.execute("SELECT outbox_compact(force => true)")
        with a_query_on(standby):
            held_since = time.monotonic()
            churn_under_8_mb_and_see_the_worker_compact(db, timeout=75)
            assert time.monotonic() - held_since >= 30, "not before the standby held the horizon for 30 s"
    finally:
        standby.remove()
        if slot:
            drop_slot(db, slot)


def test_compaction_starts_again_from_a_malformed_standby_state(db):
    """outbox_compact keeps what it saw of the standbys in a setting of its session, which the
    session's role, or a database owner with ALTER DATABASE SET, can set to anything: it starts
    that state again rather than fail for the rest of the session."""
    messages_in_every_state(db)
    standby = ScratchCluster(STANDBY_PORT)
    try:
        start_a_standby(db, standby)
        with a_query_on(standby):  # (the standby's xmin stays behind)
            churn(db, 4000)  # (2 to 8 MB, no session holding vacuum back: it looks at the standbys)
            db.execute("SELECT outbox_enqueue('compaction.tail', '{}') FROM generate_series(1, 5)")
            assert CLEAN < hot_size(db) < LARGE
            walsender, xmin = db.execute("SELECT pid, backend_xmin FROM pg_stat_replication").fetchone()
            for state in ("not json", f'{{"walsender {walsender}": ["{xmin}", "soon"]}}', "[1, 2]", '"a string"'):
                db.execute("SELECT set_config('outbox_ext_compact.standby_xmins', %s, false)", (state,))
                assert db.execute("SELECT outbox_compact()").fetchone()[0] is None, f"{state}: not behind for 30 s yet"
                kept = db.execute("SELECT current_setting('outbox_ext_compact.standby_xmins')::jsonb").fetchone()[0]
                assert list(kept) == [f"walsender {walsender}"], "the standby behind, seen from now on"
                assert kept[f"walsender {walsender}"][0] == str(xmin) and isinstance(kept[f"walsender {walsender}"][1], (int, float))
    finally:
        standby.remove()


def test_the_worker_gives_the_space_back_while_a_prepared_transaction_holds_vacuum_back(db):
    """A prepared transaction nobody commits pins the horizon from no session at all: once it
    has for 10 s, the worker compacts the tables as for a session idle in its transaction."""
    messages_in_every_state(db)
    with connect(autocommit=True) as other:
        other.execute("BEGIN")
        other.execute("SELECT pg_current_xact_id()")  # (a transaction id: what pins the horizon)
        other.execute("PREPARE TRANSACTION 'outbox_test_forgotten'")
    prepared_at = time.monotonic()
    try:
        churn_under_8_mb_and_see_the_worker_compact(db)
        assert time.monotonic() - prepared_at >= 10, "not before the horizon was held for 10 s"
    finally:
        db.execute("ROLLBACK PREPARED 'outbox_test_forgotten'")
