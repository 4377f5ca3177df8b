-- An operator's function releasing keys at endpoints ($1 endpoint, $2 ordering key, pairwise)
-- whose next delivery another transaction holds: waits for that transaction, locking the
-- deliveries queued behind those keys, so that release_deliveries.sql then releases the next.
SELECT
  FROM ONLY @extschema@.outbox_delivery d,
       ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS e(subscription_id, key)
 WHERE d.subscription_id OPERATOR(pg_catalog.=) e.subscription_id
   AND d.ordering_key OPERATOR(pg_catalog.=) e.key
   AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND d.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait
   FOR NO KEY UPDATE OF d
