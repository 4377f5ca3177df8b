-- Deliveries that just ended ($1 endpoint, $2 ordering key, pairwise): for each endpoint and key
-- without a claimable delivery now, the oldest delivery waiting behind it becomes claimable. Run
-- over every row committed before it starts (not the transaction's snapshot), as
-- release_messages.sql is. Returns how many, and the endpoints and keys (pairwise) whose next
-- delivery another transaction holds (an operator's redelivery not yet committed): skipped
-- rather than waited for, to be released again later (src/ordering).
WITH next AS (
    SELECT (SELECT q.message_id
              FROM ONLY @extschema@.outbox_delivery q
             WHERE q.subscription_id OPERATOR(pg_catalog.=) e.subscription_id
               AND q.ordering_key OPERATOR(pg_catalog.=) e.key
               AND q.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
               AND q.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait
             ORDER BY q.message_id
             LIMIT 1) AS message_id,
           e.subscription_id, e.key
      FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS e(subscription_id, key)
     WHERE NOT EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery h
                        WHERE h.subscription_id OPERATOR(pg_catalog.=) e.subscription_id
                          AND h.ordering_key OPERATOR(pg_catalog.=) e.key
                          AND h.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                          AND h.waiting_for IS NULL)
), free AS (
    -- (Still waiting behind its key, should a commit since have changed it.)
    SELECT d.message_id, d.subscription_id
      FROM ONLY @extschema@.outbox_delivery d, next
     WHERE d.message_id OPERATOR(pg_catalog.=) next.message_id
       AND d.subscription_id OPERATOR(pg_catalog.=) next.subscription_id
       AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
       AND d.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait
       FOR NO KEY UPDATE OF d SKIP LOCKED
), released AS (
    -- Ready from now on, as in release_messages.sql (the worker's claims, too, read from where
    -- they last found the endpoint's head: src/claim/head.rs).
    UPDATE ONLY @extschema@.outbox_delivery d
       SET waiting_for = NULL,
           available_at = GREATEST(d.available_at, pg_catalog.clock_timestamp())
      FROM free
     WHERE d.message_id OPERATOR(pg_catalog.=) free.message_id
       AND d.subscription_id OPERATOR(pg_catalog.=) free.subscription_id
    RETURNING d.message_id, d.subscription_id
), held AS (
    SELECT next.subscription_id, next.key
      FROM next
     WHERE next.message_id IS NOT NULL
       AND NOT EXISTS (SELECT FROM released r
                        WHERE r.message_id OPERATOR(pg_catalog.=) next.message_id
                          AND r.subscription_id OPERATOR(pg_catalog.=) next.subscription_id)
)
SELECT (SELECT pg_catalog.count(*)::pg_catalog.int4 FROM released),
       pg_catalog.array_agg(held.subscription_id), pg_catalog.array_agg(held.key)
  FROM held
