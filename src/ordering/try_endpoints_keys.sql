-- The worker, before handing on keys at endpoints ($1 endpoint, $2 ordering key, pairwise): tries
-- each endpoint's lock as lock_endpoints_keys.sql takes it ($3: outbox_delivery's oid as an
-- int4), keeping those it gets until the transaction ends. Returns each pair with whether it
-- got its endpoint's lock: an operator's function handing on keys there holds it until it
-- commits, and the worker hands those keys on later rather than wait for it with its whole step.
WITH endpoints AS MATERIALIZED (
    SELECT e.subscription_id, pg_catalog.pg_try_advisory_xact_lock($3, pg_catalog.hashint8(e.subscription_id)) AS got
      FROM (SELECT DISTINCT d.subscription_id FROM pg_catalog.unnest($1) AS d(subscription_id)) e
)
SELECT p.subscription_id, p.key, n.got
  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS p(subscription_id, key)
  JOIN endpoints n
    ON n.subscription_id OPERATOR(pg_catalog.=) p.subscription_id
