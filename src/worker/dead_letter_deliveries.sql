-- Deliveries of endpoint $1 to messages $2 are out of attempts without an outcome (policy.rs
-- decided; $3: why, one reason each): DEAD, keeping the previous error after the reason.
UPDATE @extschema@.outbox_delivery d
   SET status = 'DEAD'::@extschema@.outbox_status,
       processed_at = pg_catalog.clock_timestamp(),
       leased = false,
       last_error = exhausted.reason OPERATOR(pg_catalog.||)
                    COALESCE('; last error: ' OPERATOR(pg_catalog.||) d.last_error, '')
  FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS exhausted(message_id, reason)
 WHERE d.subscription_id OPERATOR(pg_catalog.=) $1
   AND d.message_id OPERATOR(pg_catalog.=) exhausted.message_id
