-- A first session with outbox_ext: the same steps as the README's "First session".
\set ON_ERROR_STOP on
\pset footer off
CREATE EXTENSION IF NOT EXISTS outbox_ext;
CREATE EXTENSION IF NOT EXISTS btree_gist;
DROP TABLE IF EXISTS bookings;
CREATE TABLE bookings (
    id    serial PRIMARY KEY,
    room  int NOT NULL,
    stay  daterange NOT NULL,
    guest text NOT NULL,
    EXCLUDE USING gist (room WITH =, stay WITH &&)   -- no double bookings
);

\echo '\n== 1. A booking and the email it owes, in one transaction'
BEGIN;
INSERT INTO bookings (room, stay, guest) VALUES (7, '[2026-12-01,2026-12-05)', 'ada@example.test');
SELECT id, public_id, topic, status FROM outbox_enqueue(
    'booking.created',
    jsonb_build_object('bookingId', currval('bookings_id_seq'), 'guestEmail', 'ada@example.test',
                       'checkIn', '2026-12-01', 'checkOut', '2026-12-05'),
    dedupe_key => 'booking-created:' || currval('bookings_id_seq'));
COMMIT;

\echo '\n== 2. A double booking is rejected: its outbox row goes with it'
BEGIN;
SELECT id AS enqueued_id FROM outbox_enqueue('booking.created', '{"guestEmail": "bob@example.test"}');
\set ON_ERROR_STOP off
INSERT INTO bookings (room, stay, guest) VALUES (7, '[2026-12-03,2026-12-04)', 'bob@example.test');
\set ON_ERROR_STOP on
ROLLBACK;
SELECT count(*) AS messages_in_the_outbox FROM outbox;

\echo '\n== 3. A consumer claims a batch (FOR UPDATE SKIP LOCKED, with a lease) and completes it'
SELECT id, topic, payload->>'guestEmail' AS guest, attempts, lease_token IS NOT NULL AS leased
  FROM outbox_claim(batch_size => 10, topics => ARRAY['booking.created']);
SELECT outbox_complete(id) AS completed FROM outbox WHERE topic = 'booking.created';

\echo '\n== 4. A webhook that keeps failing: retried with backoff, then dead-lettered'
SET outbox.max_attempts = 3;
SET outbox.backoff_jitter = 0;
SELECT id FROM outbox_enqueue('invoice.paid', '{"invoiceId": 12}') \gset
SELECT lease_token AS token FROM outbox_claim(1, ARRAY['invoice.paid']) \gset
SELECT outbox_fail(:id, 'HTTP 503: upstream unavailable', :'token') AS status;
SELECT status, attempts, round(extract(epoch FROM available_at - clock_timestamp())) AS retry_in_s FROM outbox WHERE id = :id;
-- (pretend the backoff has passed)
UPDATE outbox SET available_at = clock_timestamp() WHERE id = :id;
SELECT lease_token AS token FROM outbox_claim(1, ARRAY['invoice.paid']) \gset
SELECT outbox_fail(:id, 'HTTP 503: upstream unavailable', :'token') AS status;
SELECT status, attempts, round(extract(epoch FROM available_at - clock_timestamp())) AS retry_in_s FROM outbox WHERE id = :id;
UPDATE outbox SET available_at = clock_timestamp() WHERE id = :id;
SELECT lease_token AS token FROM outbox_claim(1, ARRAY['invoice.paid']) \gset
SELECT outbox_fail(:id, 'HTTP 500: boom', :'token') AS status;

\echo '\n== 5. The table'
SELECT id, topic, status, attempts, processed_at IS NOT NULL AS processed, last_error FROM outbox ORDER BY id;

\echo '\n== 6. The delivery worker: the booking webhook, POSTed to a local receiver that answers 503 twice, then 200'
SELECT outbox_subscribe('booking.created', :'receiver_url', secret => outbox_generate_secret()) AS subscription;
SELECT * FROM outbox_topics();
BEGIN;
INSERT INTO bookings (room, stay, guest) VALUES (8, '[2026-12-10,2026-12-12)', 'grace@example.test');
SELECT id AS enqueued_id FROM outbox_enqueue('booking.created',
    jsonb_build_object('bookingId', currval('bookings_id_seq'), 'guestEmail', 'grace@example.test'));
COMMIT;
-- Wait (at most 20 s) for the worker to get it through: two failures, backoff, success.
DO $$
BEGIN
    FOR i IN 1..200 LOOP
        EXIT WHEN (SELECT status FROM outbox WHERE payload->>'guestEmail' = 'grace@example.test') = 'DONE';
        PERFORM pg_sleep(0.1);
    END LOOP;
END
$$;
SELECT id, topic, status FROM outbox WHERE payload->>'guestEmail' = 'grace@example.test';
-- Its delivery to the endpoint, and every request the worker made for it.
SELECT d.url, d.status, d.attempts, d.delivered_at IS NOT NULL AS delivered
  FROM outbox_deliveries d JOIN outbox o ON o.id = d.message_id
 WHERE o.payload->>'guestEmail' = 'grace@example.test';
SELECT a.attempt, a.http_status, a.error
  FROM outbox_delivery_attempts a JOIN outbox o ON o.id = a.message_id
 WHERE o.payload->>'guestEmail' = 'grace@example.test' ORDER BY a.attempt;
SELECT database, state, delivered, failed FROM outbox_worker_status() WHERE database = current_database();
