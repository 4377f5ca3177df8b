-- Failed deliveries that will be tried again ($1 message, $2 endpoint, $3 the attempt sent,
-- $4 the wait before the next one, decided by policy.rs, $5 the error): due after the wait,
-- counted from $6, the worker's clock when it recorded them (the time it wakes up to claim
-- them: by clock_timestamp() here they would fall due a moment after that, and wait for the
-- next poll).
UPDATE ONLY @extschema@.outbox_delivery d
   SET available_at = $6 OPERATOR(pg_catalog.+) failed.wait,
       leased = false,
       last_error = failed.error
  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4), pg_catalog.unnest($5))
       AS failed(message_id, subscription_id, attempt, wait, error)
 WHERE d.message_id OPERATOR(pg_catalog.=) failed.message_id
   AND d.subscription_id OPERATOR(pg_catalog.=) failed.subscription_id
   AND d.leased
   AND d.attempts OPERATOR(pg_catalog.=) failed.attempt
