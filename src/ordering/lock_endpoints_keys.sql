-- Before handing on keys at the endpoints $1 (release_deliveries.sql):
-- take the advisory lock of the keys of each endpoint exclusively, until the transaction ends,
-- waiting for whoever holds it. Whoever hands on keys at an endpoint holds it so: the operators'
-- functions (this) and the worker (it only tries, try_endpoints_keys.sql). Otherwise two of them
-- could each make a different delivery a key's head there, neither seeing the other's before
-- it committed, and the second waited on outbox_delivery_key_head_idx for the first's commit
-- and failed there. One lock per endpoint, not per key: a function handing on thousands of keys
-- would fill PostgreSQL's lock table. The lock is (outbox_delivery's oid as an int4, $2;
-- hashint8 of the endpoint). Taken in the hashes' order, so that two such functions never wait
-- for each other in a circle.
SELECT pg_catalog.pg_advisory_xact_lock($2, h.hash)
  FROM (SELECT DISTINCT pg_catalog.hashint8(e.subscription_id) AS hash
          FROM pg_catalog.unnest($1) AS e(subscription_id)
         ORDER BY 1) h
