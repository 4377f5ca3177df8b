// A producer and a consumer of outbox_ext with node-postgres (pg).
//
//   node outbox_example.js produce N    // N bookings, each with the email it owes
//   node outbox_example.js consume      // send the emails until SIGTERM
//
// Connection settings come from the usual PG* environment variables. A guest whose address
// contains "flaky" makes the first attempt fail, to show retries.
'use strict';
const { Client } = require('pg');

const BATCH_SIZE = 20;
let stopping = false;

async function inTransaction(client, work) {
  await client.query('BEGIN');
  try {
    const result = await work();
    await client.query('COMMIT');
    return result;
  } catch (error) {
    await client.query('ROLLBACK');
    throw error;
  }
}

async function produce(client, count) {
  for (let n = 0; n < count; n++) {
    const guest = n % 10 ? `guest${n}@example.test` : `flaky${n}@example.test`;
    // The booking and the email it owes: both, or neither.
    await inTransaction(client, async () => {
      const { rows } = await client.query(
        'INSERT INTO bookings (room, guest_email) VALUES ($1, $2) RETURNING id', [n, guest]);
      const bookingId = rows[0].id;
      await client.query(
        "SELECT id FROM outbox_enqueue('booking.created', $1, dedupe_key => $2)",
        [{ bookingId: Number(bookingId), guestEmail: guest }, `booking-created:${bookingId}`]);
    });
  }
}

// Idempotent: the email is recorded under the message's public_id in the same transaction as
// the outcome, so a redelivery finds it and sends nothing twice.
async function sendEmail(client, message) {
  const { bookingId, guestEmail } = message.payload;
  if (guestEmail.includes('flaky') && message.attempts === 0) {
    throw new Error('SMTP 451: try again later');
  }
  await client.query(
    `INSERT INTO sent_emails (message_id, booking_id, guest_email, sent_by) VALUES ($1, $2, $3, 'node')
     ON CONFLICT (message_id) DO NOTHING`, [message.public_id, bookingId, guestEmail]);
}

async function consume(client) {
  let idleMs = 100;
  while (!stopping) {
    const claimed = await inTransaction(client, async () => {
      // No lease: the rows stay locked until this transaction ends; other consumers skip them.
      const { rows } = await client.query(
        "SELECT id, public_id, payload, attempts FROM outbox_claim($1, ARRAY['booking.created'], lease => NULL)",
        [BATCH_SIZE]);
      for (const message of rows) {
        try {
          await client.query('SAVEPOINT message'); // one failure does not undo the others
          await sendEmail(client, message);
          await client.query('RELEASE SAVEPOINT message');
          // $1::bigint: with untyped parameters the batch form (bigint[]) is a candidate too.
          await client.query('SELECT outbox_complete($1::bigint)', [message.id]);
        } catch (error) {
          await client.query('ROLLBACK TO SAVEPOINT message');
          await client.query('SELECT outbox_fail($1::bigint, $2)', [message.id, String(error.message)]);
        }
      }
      return rows.length;
    });
    // The batch is committed; only now may a SIGTERM stop us. Back off while the queue is empty.
    idleMs = claimed ? 100 : Math.min(idleMs * 2, 2000);
    if (!claimed) await new Promise((resolve) => setTimeout(resolve, idleMs));
  }
}

async function main() {
  process.on('SIGTERM', () => { stopping = true; });
  process.on('SIGINT', () => { stopping = true; });
  const client = new Client();
  await client.connect();
  try {
    if (process.env.OUTBOX_BACKOFF_BASE) { // the retry delay, for demos and tests
      await client.query("SELECT set_config('outbox.backoff_base', $1, false)", [process.env.OUTBOX_BACKOFF_BASE]);
    }
    if (process.argv[2] === 'produce') {
      await produce(client, Number(process.argv[3]));
    } else {
      await consume(client);
    }
  } finally {
    await client.end();
  }
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
