-- Deliveries that just ended ($1 endpoint, $2 ordering key, pairwise): for each endpoint and key
-- without a claimable delivery now, the oldest delivery waiting behind it becomes claimable. Run
-- over every row committed before it starts (not the transaction's snapshot), as
-- release_messages.sql is. Returns how many, and the endpoints and keys (pairwise) whose next
-- delivery another transaction holds (an operator's redelivery not yet committed): skipped
-- rather than waited for, to be released again later (src/ordering).
WITH next AS (
    -- Each statement below finds its rows by index or by row address, never by a join of two
    -- of these: a plan kept for a few keys must not turn quadratic when a worker starting
    -- passes every key there is (src/worker/keys_left_behind.sql).
    SELECT q.row_address, e.subscription_id, e.key
      FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS e(subscription_id, key)
      LEFT JOIN LATERAL (SELECT q.ctid AS row_address
                           FROM ONLY @extschema@.outbox_delivery q
                          WHERE q.subscription_id OPERATOR(pg_catalog.=) e.subscription_id
                            AND q.ordering_key OPERATOR(pg_catalog.=) e.key
                            AND q.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                            AND q.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait
                          ORDER BY q.message_id
                          LIMIT 1) q ON true
     WHERE NOT EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery h
                        WHERE h.subscription_id OPERATOR(pg_catalog.=) e.subscription_id
                          AND h.ordering_key OPERATOR(pg_catalog.=) e.key
                          AND h.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                          AND h.waiting_for IS NULL)
), free AS (
    -- (Still waiting behind its key, should a commit since have changed it; a row changed so is
    -- left for the next try.)
    SELECT d.ctid AS row_address
      FROM ONLY @extschema@.outbox_delivery d
     WHERE d.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT n.row_address FROM next n WHERE n.row_address IS NOT NULL))
       AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
       AND d.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait
       FOR NO KEY UPDATE OF d SKIP LOCKED
), released AS (
    -- Ready from now on, as in release_messages.sql (the worker's claims, too, read from where
    -- they last found the endpoint's head: src/claim/head.rs).
    UPDATE ONLY @extschema@.outbox_delivery d
       SET waiting_for = NULL,
           available_at = GREATEST(d.available_at, pg_catalog.clock_timestamp())
     WHERE d.ctid OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT f.row_address FROM free f))
    RETURNING d.subscription_id, d.ordering_key
), held AS (
    -- (EXCEPT: hashed or sorted, however many keys.)
    SELECT next.subscription_id, next.key FROM next WHERE next.row_address IS NOT NULL
    EXCEPT
    SELECT r.subscription_id, r.ordering_key FROM released r
)
SELECT (SELECT pg_catalog.count(*)::pg_catalog.int4 FROM released),
       pg_catalog.array_agg(held.subscription_id), pg_catalog.array_agg(held.key)
  FROM held
