-- Endpoints $1 answered: they are no longer failing. An endpoint an operator's open transaction
-- is changing (outbox_rotate_secret, ...) is skipped rather than waited for, which would hold
-- back the whole step, every endpoint's: the worker tries again at its next step. Returns the
-- endpoints it could write.
WITH free AS MATERIALIZED (
    SELECT l.id
      FROM @extschema@.outbox_subscription l
     WHERE l.id OPERATOR(pg_catalog.=) ANY ($1)
       FOR NO KEY UPDATE SKIP LOCKED
), cleared AS (
    UPDATE @extschema@.outbox_subscription s
       SET failing_since = NULL
     WHERE s.id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT f.id FROM free f))
       AND s.failing_since IS NOT NULL
)
SELECT f.id FROM free f
