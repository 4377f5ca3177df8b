"""A producer and a consumer of outbox_ext with psycopg 3.

    python outbox_example.py produce N    # N bookings, each with the email it owes
    python outbox_example.py consume      # send the emails until SIGTERM

Connection settings come from the usual PG* environment variables. A guest whose address
contains "flaky" makes the first attempt fail, to show retries.
"""

import os
import signal
import sys
import time

import psycopg
from psycopg.types.json import Jsonb

BATCH_SIZE = 20
stopping = False


def produce(conn, count):
    for n in range(count):
        guest = f"guest{n}@example.test" if n % 10 else f"flaky{n}@example.test"
        with conn.transaction():  # the booking and the email it owes: both, or neither
            booking_id = conn.execute(
                "INSERT INTO bookings (room, guest_email) VALUES (%s, %s) RETURNING id", (n, guest)
            ).fetchone()["id"]
            conn.execute(
                "SELECT id FROM outbox_enqueue('booking.created', %s, dedupe_key => %s)",
                (Jsonb({"bookingId": booking_id, "guestEmail": guest}), f"booking-created:{booking_id}"),
            )


def send_email(conn, message):
    """Idempotent: the email is recorded under the message's public_id in the same transaction
    as the outcome, so a redelivery finds it and sends nothing twice."""
    payload = message["payload"]
    if "flaky" in payload["guestEmail"] and message["attempts"] == 0:
        raise RuntimeError("SMTP 451: try again later")
    conn.execute(
        "INSERT INTO sent_emails (message_id, booking_id, guest_email, sent_by) VALUES (%s, %s, %s, 'python')"
        " ON CONFLICT (message_id) DO NOTHING",
        (message["public_id"], payload["bookingId"], payload["guestEmail"]),
    )


def consume(conn):
    idle = 0.1
    while not stopping:
        with conn.transaction():
            # No lease: the rows stay locked until this transaction ends; other consumers skip them.
            messages = conn.execute(
                "SELECT id, public_id, payload, attempts FROM outbox_claim(%s, ARRAY['booking.created'], lease => NULL)",
                (BATCH_SIZE,),
            ).fetchall()
            for message in messages:
                try:
                    with conn.transaction():  # a savepoint: one failure does not undo the others
                        send_email(conn, message)
                    conn.execute("SELECT outbox_complete(%s)", (message["id"],))
                except Exception as error:
                    conn.execute("SELECT outbox_fail(%s, %s)", (message["id"], str(error)))
        # The batch is committed; only now may a SIGTERM stop us.
        idle = 0.1 if messages else min(idle * 2, 2.0)  # back off while the queue is empty
        if not messages:
            time.sleep(idle)


def main():
    def stop(signum, frame):
        global stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with psycopg.connect(autocommit=True, row_factory=psycopg.rows.dict_row) as conn:
        if os.environ.get("OUTBOX_BACKOFF_BASE"):  # the retry delay, for demos and tests
            conn.execute("SELECT set_config('outbox.backoff_base', %s, false)", (os.environ["OUTBOX_BACKOFF_BASE"],))
        if sys.argv[1] == "produce":
            produce(conn, int(sys.argv[2]))
        else:
            consume(conn)


if __name__ == "__main__":
    main()
