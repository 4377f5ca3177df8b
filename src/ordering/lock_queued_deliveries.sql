-- An operator's function releasing keys at endpoints ($1 endpoint, $2 ordering key, pairwise)
-- whose next delivery another transaction holds: waits for that transaction, locking the oldest
-- delivery queued behind each key, so that release_deliveries.sql can then release it. Run over
-- every row committed before it starts, as release_deliveries.sql is.
SELECT
  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS e(subscription_id, key),
       LATERAL (SELECT
                  FROM ONLY @extschema@.outbox_delivery d
                 WHERE d.subscription_id OPERATOR(pg_catalog.=) e.subscription_id
                   AND d.ordering_key OPERATOR(pg_catalog.=) e.key
                   AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                   AND d.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait
                 ORDER BY d.message_id
                 LIMIT 1
                   FOR NO KEY UPDATE) q
