-- Deliveries ($1 message, $2 endpoint, $3 the attempt sent) the endpoint took: DONE. Only while
-- that attempt still holds them (an operator may have redelivered one meanwhile). Returns their
-- messages, and the endpoints and ordering keys of those with a key (for src/ordering).
WITH done AS (
    UPDATE ONLY @extschema@.outbox_delivery d
       SET status = 'DONE'::@extschema@.outbox_status,
           processed_at = pg_catalog.clock_timestamp(),
           leased = false
      FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3)) AS done(message_id, subscription_id, attempt)
     WHERE d.message_id OPERATOR(pg_catalog.=) done.message_id
       AND d.subscription_id OPERATOR(pg_catalog.=) done.subscription_id
       AND d.leased
       AND d.attempts OPERATOR(pg_catalog.=) done.attempt
    RETURNING d.message_id, d.subscription_id, d.ordering_key
)
SELECT pg_catalog.array_agg(e.message_id),
       pg_catalog.array_agg(e.subscription_id) FILTER (WHERE e.ordering_key IS NOT NULL),
       pg_catalog.array_agg(e.ordering_key) FILTER (WHERE e.ordering_key IS NOT NULL)
  FROM done e
