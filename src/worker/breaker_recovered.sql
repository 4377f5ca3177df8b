-- Endpoints $1 answered: they are no longer failing.
UPDATE @extschema@.outbox_subscription s
   SET failing_since = NULL
 WHERE s.id OPERATOR(pg_catalog.=) ANY ($1)
   AND s.failing_since IS NOT NULL
