-- The worker claims through the same function as every other consumer: $1 batch size,
-- $2 the subscribed topics, $3 the lease.
SELECT id, public_id::text, topic::text, payload::text, attempts, lease_token::text
  FROM outbox_claim($1, $2, $3)
