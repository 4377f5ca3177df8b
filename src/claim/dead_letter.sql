-- outbox_claim: the locked messages $1 are out of attempts without an outcome (policy.rs
-- decided, and why: $3, one reason per message): dead-letter them instead of delivering them
-- again. The previous error is kept after the reason. $2 is the claim's clock. Returns their
-- ordering keys (for src/ordering: a dead letter releases its key).
WITH dead AS (
    UPDATE ONLY @extschema@.outbox o
       SET status = 'DEAD'::@extschema@.outbox_status,
           processed_at = $2,
           lease_token = NULL,
           last_error = exhausted.reason OPERATOR(pg_catalog.||)
                        COALESCE('; last error: ' OPERATOR(pg_catalog.||) o.last_error, '')
      FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($3)) AS exhausted(id, reason)
     WHERE o.id OPERATOR(pg_catalog.=) exhausted.id
    RETURNING o.ordering_key
)
SELECT pg_catalog.array_agg(DISTINCT d.ordering_key) FILTER (WHERE d.ordering_key IS NOT NULL) FROM dead d
