-- Deliveries of endpoint $1 to messages $2 are out of attempts without an outcome (policy.rs
-- decided; $3: why, one reason each): DEAD, keeping the previous error after the reason.
-- Returns the endpoints and ordering keys of those with a key (for src/ordering).
WITH dead AS (
    UPDATE ONLY @extschema@.outbox_delivery d
       SET status = 'DEAD'::@extschema@.outbox_status,
           processed_at = pg_catalog.clock_timestamp(),
           leased = false,
           last_error = exhausted.reason OPERATOR(pg_catalog.||)
                        COALESCE('; last error: ' OPERATOR(pg_catalog.||) d.last_error, '')
      FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS exhausted(message_id, reason)
     WHERE d.subscription_id OPERATOR(pg_catalog.=) $1
       AND d.message_id OPERATOR(pg_catalog.=) exhausted.message_id
    RETURNING d.message_id, d.subscription_id, d.ordering_key
)
SELECT pg_catalog.array_agg(e.message_id),
       pg_catalog.array_agg(e.subscription_id) FILTER (WHERE e.ordering_key IS NOT NULL),
       pg_catalog.array_agg(e.ordering_key) FILTER (WHERE e.ordering_key IS NOT NULL)
  FROM dead e
