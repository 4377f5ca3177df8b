-- The life of a message through the SQL API: what each function returns and what the row
-- looks like after it. (Run by pg_regress; the output is compared with expected/.)
CREATE EXTENSION outbox_ext;
SET outbox.backoff_jitter = 0;
SET outbox.backoff_base = '2s';
SET outbox.max_attempts = 3;
\pset null '(null)'

-- enqueue: PENDING, no attempt yet; a delay makes it ready later; a dedupe key once per topic.
SELECT id, topic, status, attempts, payload, last_error FROM outbox_enqueue('booking.created', '{"bookingId": 1}');
SELECT id, status, available_at > clock_timestamp() + interval '59 minutes' AS later
  FROM outbox_enqueue('reminder.due', '{}', interval '1 hour');
SELECT id, payload FROM outbox_enqueue('booking.created', '{"bookingId": 2}', dedupe_key => 'booking:2');
-- the same key and topic again: a duplicate (only id, public_id, topic and key come back)
SELECT id, public_id IS NOT NULL AS has_public_id, topic, dedupe_key, payload, status
  FROM outbox_enqueue('booking.created', '{"bookingId": 99}', dedupe_key => 'booking:2');
-- the same key on another topic: another message
SELECT id, topic FROM outbox_enqueue('invoice.paid', '{}', dedupe_key => 'booking:2');
SELECT count(*) FROM outbox_enqueue_batch('order.shipped', ARRAY['{"n": 1}', '{"n": 2}']::jsonb[]);

-- claim with a lease: attempts 1, a token, ready again when the lease runs out; oldest first.
SELECT id, attempts, lease_token IS NOT NULL AS leased FROM outbox_claim(2, ARRAY['booking.created']);
SELECT count(*) AS claimed_again FROM outbox_claim(10, ARRAY['booking.created']);

-- complete with a stale token changes nothing; with the right one, DONE; twice, false.
SELECT outbox_complete(1, gen_random_uuid()) AS stale;
SELECT outbox_complete(1, (SELECT lease_token FROM outbox WHERE id = 1)) AS completed;
SELECT outbox_complete(1, (SELECT lease_token FROM outbox WHERE id = 1)) AS again;
SELECT id, status, processed_at IS NOT NULL AS processed FROM outbox WHERE id = 1;

-- fail: back to PENDING after the backoff (2 s, then 4 s), DEAD at outbox.max_attempts.
SELECT outbox_fail(3, 'HTTP 503', (SELECT lease_token FROM outbox WHERE id = 3)) AS status;
SELECT attempts, round(extract(epoch FROM available_at - clock_timestamp())) AS ready_in, last_error FROM outbox WHERE id = 3;
UPDATE outbox SET available_at = clock_timestamp() WHERE id = 3;
SELECT id, attempts FROM outbox_claim(1, ARRAY['booking.created']);
SELECT outbox_fail(3, 'HTTP 500', (SELECT lease_token FROM outbox WHERE id = 3), retry_in => '1 minute') AS status;
SELECT attempts, round(extract(epoch FROM available_at - clock_timestamp())) AS ready_in FROM outbox WHERE id = 3;
UPDATE outbox SET available_at = clock_timestamp() WHERE id = 3;
SELECT id, attempts FROM outbox_claim(1, ARRAY['booking.created']);
SELECT outbox_fail(3, 'HTTP 500: gone', (SELECT lease_token FROM outbox WHERE id = 3)) AS status;
SELECT id, status, attempts, last_error FROM outbox WHERE id = 3;
SELECT id, topic, attempts, last_error FROM outbox_dead_letters;

-- claim without a lease writes nothing; fail counts the attempt itself.
BEGIN;
SELECT id, attempts, lease_token FROM outbox_claim(1, ARRAY['order.shipped'], NULL);
SELECT outbox_fail(id, 'smtp 451', retry_in => '1 hour') FROM outbox_claim(1, ARRAY['order.shipped'], NULL);
COMMIT;
SELECT id, status, attempts, last_error FROM outbox WHERE topic = 'order.shipped' ORDER BY id;

-- a message whose leases keep running out is dead-lettered by the claim.
-- (A duplicate enqueue above used up a sequence value: invoice.paid is message 5.)
UPDATE outbox SET attempts = 3, lease_token = gen_random_uuid(), available_at = clock_timestamp() WHERE topic = 'invoice.paid';
SELECT count(*) FROM outbox_claim(10, ARRAY['invoice.paid']);
SELECT id, status, last_error FROM outbox WHERE topic = 'invoice.paid';

-- the batch forms of complete.
SELECT outbox_complete_batch(array_agg(id), array_agg(lease_token)) FROM outbox_claim(5, ARRAY['order.shipped']);

-- the dead-letter tools.
SELECT outbox_requeue(3::bigint) AS requeued;
SELECT id, status, attempts, last_error FROM outbox WHERE id = 3;
SELECT outbox_discard_all() AS discarded;

-- the numbers.
SELECT topic, pending, ready, dead, completed_last_minute FROM outbox_stats() ORDER BY topic NULLS FIRST;
SELECT outbox_backoff(3), outbox_max_attempts(), outbox_topic_is_valid('booking.created'), outbox_topic_is_valid('not valid');
DROP EXTENSION outbox_ext;
