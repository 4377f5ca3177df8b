"""pg_dump / pg_restore keep the messages and their state (the table is registered with
pg_extension_config_dump), the subscriptions, the deliveries, the attempt log (each of its day
partitions is registered), and the id sequence."""

import subprocess
import tempfile

from conftest import DATABASE, pg_program
from support import STATE, fresh_database


def test_a_dump_and_restore_round_trip_keeps_pending_and_dead_messages(db):
    db.execute("SET outbox.max_attempts = 1")
    db.execute("SELECT outbox_enqueue('booking.created', jsonb_build_object('n', n), dedupe_key => 'k' || n) FROM generate_series(1, 4) n")
    db.execute("SELECT outbox_enqueue('reminder.due', '{}', interval '1 day')")
    db.execute("SELECT outbox_fail(id, 'HTTP 500: boom', lease_token) FROM outbox_claim(1)")  # DEAD
    db.execute("SELECT * FROM outbox_claim(1, lease => '1 hour')")  # in flight
    db.execute("SELECT outbox_complete(id) FROM outbox_claim(1)")  # DONE
    # A subscription (of a topic without messages: the delivery worker leaves this test alone)
    # and deliveries of the ended messages to it (written directly: a DONE one and a DEAD one).
    subscription = db.execute("SELECT outbox_subscribe('audit.exported', 'https://hooks.example.test/', "
                              "outbox_generate_secret(), enabled => false)").fetchone()[0]
    db.execute("""INSERT INTO outbox_delivery (message_id, subscription_id, status, attempts, last_error, processed_at)
                  SELECT id, %s, status, attempts, last_error, processed_at FROM outbox WHERE status <> 'PENDING'""",
               (subscription,))
    # The attempt log of three days, in three of its partitions.
    db.execute("""INSERT INTO outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration, http_status)
                  SELECT id, %s, 1, now() - (id %% 3) * interval '1 day', interval '20 ms', 500 FROM outbox""", (subscription,))
    attempts = db.execute("SELECT message_id, started_at, tableoid::regclass::text FROM outbox_delivery_attempt ORDER BY 1").fetchall()
    assert len({partition for _, _, partition in attempts}) == 3
    before = db.execute(STATE).fetchall()
    deliveries = db.execute("SELECT message_id, subscription_id, status::text, attempts FROM outbox_delivery ORDER BY 1, 2").fetchall()
    timing = db.execute("SELECT available_at, processed_at, created_at FROM outbox ORDER BY id").fetchall()
    subscriptions = db.execute("SELECT topic, url, secret FROM outbox_subscription").fetchall()

    with tempfile.NamedTemporaryFile(suffix=".dump") as dump:
        subprocess.run([pg_program("pg_dump"), "-Fc", "-f", dump.name, DATABASE], check=True)
        with fresh_database("outbox_restored") as restored:
            subprocess.run([pg_program("pg_restore"), "--exit-on-error", "-d", "outbox_restored", dump.name], check=True)
            assert restored.execute(STATE).fetchall() == before
            assert restored.execute("SELECT available_at, processed_at, created_at FROM outbox ORDER BY id").fetchall() == timing
            assert restored.execute("SELECT topic, url, secret FROM outbox_subscription").fetchall() == subscriptions
            assert restored.execute("SELECT message_id, subscription_id, status::text, attempts FROM outbox_delivery "
                                    "ORDER BY 1, 2").fetchall() == deliveries
            assert restored.execute("SELECT message_id, started_at, tableoid::regclass::text FROM outbox_delivery_attempt "
                                    "ORDER BY 1").fetchall() == attempts
            assert restored.execute("SELECT status::text, count(*) FROM outbox GROUP BY 1 ORDER BY 1").fetchall() == [
                ("DEAD", 1), ("DONE", 1), ("PENDING", 3)
            ]
            # New messages continue the sequence; dedupe keys still hold.
            assert restored.execute("SELECT (outbox_enqueue('a.b', '{}')).id").fetchone()[0] == 6
            assert restored.execute("SELECT (outbox_enqueue('booking.created', '{}', dedupe_key => 'k1')).id").fetchone()[0] == 1
            # The message leased before the dump is still leased; the dead one can be requeued.
            assert restored.execute("SELECT count(*) FROM outbox_claim(10, ARRAY['booking.created'])").fetchone()[0] == 1
            assert restored.execute("SELECT outbox_requeue_all()").fetchone()[0] == 1
