-- outbox_fail, out of attempts (policy.rs): $1 id, $2 attempts made, $3 the error (kept up to
-- $4 characters). The message is DEAD: evidence for the operator, never claimed again. Returns
-- its ordering key, if any, in an array (for src/ordering: a dead letter releases its key).
WITH dead AS (
    UPDATE ONLY @extschema@.outbox o
       SET attempts = $2,
           status = 'DEAD'::@extschema@.outbox_status,
           processed_at = pg_catalog.clock_timestamp(),
           last_error = pg_catalog."left"($3, $4),
           lease_token = NULL
     WHERE o.id OPERATOR(pg_catalog.=) $1
    RETURNING o.ordering_key
)
SELECT pg_catalog.array_agg(d.ordering_key) FILTER (WHERE d.ordering_key IS NOT NULL) FROM dead d
