-- The worker picks up ready messages of the topics it delivers ($2), oldest ready first, at
-- most $3, skipping rows a SQL consumer holds; $1 is the clock. Each gets one delivery per
-- enabled subscription of its topic, which starts where the message stood (its attempts and
-- last error: a message that was backing off keeps its schedule). The message then waits for
-- its deliveries: an available_at in the year 9999 takes it out of every claim. Returns how
-- many messages it picked up and the endpoints that got new deliveries.
WITH ready AS (
    SELECT o.id, o.topic, o.attempts, o.last_error
      FROM @extschema@.outbox o
     WHERE o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
       AND o.available_at OPERATOR(pg_catalog.<=) $1
       AND o.topic::pg_catalog.text OPERATOR(pg_catalog.=) ANY ($2)
     ORDER BY o.available_at, o.id
     LIMIT $3
       FOR UPDATE SKIP LOCKED
), made AS (
    INSERT INTO @extschema@.outbox_delivery AS d (message_id, subscription_id, attempts, last_error, available_at)
    SELECT r.id, s.id, r.attempts, r.last_error, $1
      FROM ready r
      JOIN @extschema@.outbox_subscription s
        ON s.topic OPERATOR(pg_catalog.=) r.topic AND s.enabled
    ON CONFLICT (message_id, subscription_id) DO NOTHING
    RETURNING d.message_id, d.subscription_id
), waiting AS (
    UPDATE @extschema@.outbox o
       SET available_at = '9999-12-31 00:00:00+00', lease_token = NULL
      FROM ready r
     WHERE o.id OPERATOR(pg_catalog.=) r.id
       AND (EXISTS (SELECT FROM made m WHERE m.message_id OPERATOR(pg_catalog.=) r.id)
            OR EXISTS (SELECT FROM @extschema@.outbox_delivery d WHERE d.message_id OPERATOR(pg_catalog.=) r.id))
)
SELECT (SELECT pg_catalog.count(*) FROM ready), ARRAY(SELECT DISTINCT m.subscription_id FROM made m)
