-- outbox_claim: the locked messages $1 are out of attempts ($3 = outbox.max_attempts) without
-- an outcome: dead-letter them instead of delivering them again. $2 is the claim's clock.
UPDATE @extschema@.outbox o
   SET status = 'DEAD',
       processed_at = $2,
       lease_token = NULL,
       last_error = @extschema@.outbox_exhausted_error(o.attempts, $3, o.lease_token, o.last_error)
 WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
