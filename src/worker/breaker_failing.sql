-- Endpoints $1 failed after answering before: their run of failures starts now. One an
-- operator's open transaction is changing is skipped, not waited for (as in
-- breaker_recovered.sql): its next failure tries again.
UPDATE @extschema@.outbox_subscription s
   SET failing_since = pg_catalog.clock_timestamp()
 WHERE s.id OPERATOR(pg_catalog.=) ANY (ARRAY(
           SELECT l.id
             FROM @extschema@.outbox_subscription l
            WHERE l.id OPERATOR(pg_catalog.=) ANY ($1)
              AND l.failing_since IS NULL
              FOR NO KEY UPDATE SKIP LOCKED))
   AND s.failing_since IS NULL
RETURNING s.id, s.failing_since
