-- Endpoints $1 failed after answering before: their run of failures starts now.
UPDATE @extschema@.outbox_subscription s
   SET failing_since = pg_catalog.clock_timestamp()
 WHERE s.id OPERATOR(pg_catalog.=) ANY ($1)
   AND s.failing_since IS NULL
RETURNING s.id, s.failing_since
