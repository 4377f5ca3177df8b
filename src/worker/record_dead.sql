-- Failed deliveries out of attempts (policy.rs; $1 message, $2 endpoint, $3 the attempt sent,
-- $4 the error): DEAD, which releases their ordering key at their endpoint. Returns their
-- messages, and the endpoints and ordering keys of those with a key (for src/ordering).
WITH dead AS (
    UPDATE ONLY @extschema@.outbox_delivery d
       SET status = 'DEAD'::@extschema@.outbox_status,
           processed_at = pg_catalog.clock_timestamp(),
           leased = false,
           last_error = failed.error
      FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4))
           AS failed(message_id, subscription_id, attempt, error)
     WHERE d.message_id OPERATOR(pg_catalog.=) failed.message_id
       AND d.subscription_id OPERATOR(pg_catalog.=) failed.subscription_id
       AND d.leased
       AND d.attempts OPERATOR(pg_catalog.=) failed.attempt
    RETURNING d.message_id, d.subscription_id, d.ordering_key
)
SELECT pg_catalog.array_agg(e.message_id),
       pg_catalog.array_agg(e.subscription_id) FILTER (WHERE e.ordering_key IS NOT NULL),
       pg_catalog.array_agg(e.ordering_key) FILTER (WHERE e.ordering_key IS NOT NULL)
  FROM dead e
