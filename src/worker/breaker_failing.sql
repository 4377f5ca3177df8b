-- Endpoints $1 failed after answering before: their run of failures started at $2 (pairwise,
-- the worker's clock when it recorded the first failure). One an operator's open transaction
-- is changing is skipped, not waited for (as in breaker_recovered.sql): the worker tries again
-- at its next step. Returns the endpoints it could write.
WITH free AS MATERIALIZED (
    SELECT l.id
      FROM @extschema@.outbox_subscription l
     WHERE l.id OPERATOR(pg_catalog.=) ANY ($1)
       FOR NO KEY UPDATE SKIP LOCKED
), failing AS (
    UPDATE @extschema@.outbox_subscription s
       SET failing_since = f.since
      FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS f(id, since)
     WHERE s.id OPERATOR(pg_catalog.=) f.id
       AND s.id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT free.id FROM free))
       AND s.failing_since IS DISTINCT FROM f.since
)
SELECT free.id FROM free
