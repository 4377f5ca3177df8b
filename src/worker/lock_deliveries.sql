-- The due deliveries of endpoint $1 ($2: the clock), oldest first, at most $3, locked.
-- Returns each one's message and attempts so far.
SELECT d.message_id, d.attempts
  FROM @extschema@.outbox_delivery d
 WHERE d.subscription_id OPERATOR(pg_catalog.=) $1
   AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND d.available_at OPERATOR(pg_catalog.<=) $2
 ORDER BY d.available_at, d.message_id
 LIMIT $3
   FOR UPDATE SKIP LOCKED
