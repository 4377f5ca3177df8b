-- Endpoints $1 (their latest errors $2, pairwise) that have failed every attempt for at least
-- $3 (outbox.endpoint_disable_after) are disabled, with the reason. One an operator's open
-- transaction is changing is skipped, not waited for (as in breaker_recovered.sql): the worker
-- tries again at its next step. Returns those it disabled.
UPDATE @extschema@.outbox_subscription s
   SET enabled = false,
       disabled_reason = pg_catalog.format(
           'every attempt failed since %s (outbox.endpoint_disable_after = %s); last error: %s',
           s.failing_since, $3, f.error)
  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS f(id, error)
 WHERE s.id OPERATOR(pg_catalog.=) f.id
   AND s.id OPERATOR(pg_catalog.=) ANY (ARRAY(
           SELECT l.id
             FROM @extschema@.outbox_subscription l
            WHERE l.id OPERATOR(pg_catalog.=) ANY ($1)
              FOR NO KEY UPDATE SKIP LOCKED))
   AND s.enabled
   AND s.failing_since OPERATOR(pg_catalog.<=) (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) $3)
RETURNING s.id, s.topic::pg_catalog.text, s.url, s.disabled_reason
