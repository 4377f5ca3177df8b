-- Leases the locked deliveries of endpoint $1 to messages $2 for one request each: one more
-- attempt, and due again only when the lease $4 (from the clock $3) runs out. Returns message
-- id, attempt, public_id, topic, payload (as JSON text; the worker converts it to UTF-8) and
-- the message's headers flattened to [name, value, name, value, ...], and when the lease runs out.
WITH leased AS (
    UPDATE ONLY @extschema@.outbox_delivery d
       SET attempts = d.attempts OPERATOR(pg_catalog.+) 1,
           available_at = $3 OPERATOR(pg_catalog.+) $4,
           leased = true
     WHERE d.subscription_id OPERATOR(pg_catalog.=) $1
       AND d.message_id OPERATOR(pg_catalog.=) ANY ($2)
    RETURNING d.message_id, d.attempts, d.available_at
)
SELECT l.message_id, l.attempts, m.public_id::pg_catalog.text, m.topic::pg_catalog.text, m.payload::pg_catalog.text,
       ARRAY(SELECT pg_catalog.unnest(ARRAY[h.key, h.value]) FROM pg_catalog.jsonb_each_text(m.headers) h),
       l.available_at
  FROM leased l JOIN ONLY @extschema@.outbox m ON m.id OPERATOR(pg_catalog.=) l.message_id
