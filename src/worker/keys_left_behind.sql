-- A worker starting: the endpoints and ordering keys (pairwise) with deliveries queued behind
-- the key, for release_deliveries.sql to hand on those without a claimable one. A predecessor
-- that stopped while an operator's transaction held a key's next delivery left it so.
SELECT pg_catalog.array_agg(k.subscription_id), pg_catalog.array_agg(k.ordering_key)
  FROM (SELECT DISTINCT q.subscription_id, q.ordering_key
          FROM ONLY @extschema@.outbox_delivery q
         WHERE q.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
           AND q.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait) k
