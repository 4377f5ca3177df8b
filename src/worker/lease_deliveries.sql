-- Leases the locked deliveries of endpoint $1 to messages $2 (in that order) for one request
-- each: one more attempt, and due again only when the lease $4 (from the clock $3) runs out.
-- Their payloads (as JSON text, converted to UTF-8 by the worker) come back too, but only as
-- many as fit in $5 bytes (the first one anyway when $6: nothing else is in flight): the others
-- stay due, untouched, for a later round. Returns message id, attempt, public_id, topic, body.
WITH wanted AS (
    SELECT w.message_id, w.n, m.public_id, m.topic,
           m.payload::pg_catalog.text AS body
      FROM pg_catalog.unnest($2) WITH ORDINALITY AS w(message_id, n)
      JOIN @extschema@.outbox m ON m.id OPERATOR(pg_catalog.=) w.message_id
), fitting AS (
    SELECT w.*, pg_catalog.sum(pg_catalog.octet_length(w.body)) OVER (ORDER BY w.n) AS running
      FROM wanted w
), leased AS (
    UPDATE @extschema@.outbox_delivery d
       SET attempts = d.attempts OPERATOR(pg_catalog.+) 1,
           available_at = $3 OPERATOR(pg_catalog.+) $4,
           leased = true
      FROM fitting f
     WHERE d.subscription_id OPERATOR(pg_catalog.=) $1
       AND d.message_id OPERATOR(pg_catalog.=) f.message_id
       AND (($6 AND f.n OPERATOR(pg_catalog.=) 1) OR f.running OPERATOR(pg_catalog.<=) $5)
    RETURNING d.message_id, d.attempts
)
SELECT l.message_id, l.attempts, f.public_id::pg_catalog.text, f.topic::pg_catalog.text, f.body
  FROM leased l JOIN fitting f ON f.message_id OPERATOR(pg_catalog.=) l.message_id
 ORDER BY f.n
