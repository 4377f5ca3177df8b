-- outbox_fail, the message will be tried again: $1 id, $2 attempts made, $3 the wait before the
-- next attempt (policy.rs), $4 the error (kept up to $5 characters). The holder's token dies
-- with the attempt: a late outbox_complete cannot undo this.
UPDATE ONLY @extschema@.outbox o
   SET attempts = $2,
       available_at = pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $3,
       last_error = pg_catalog."left"($4, $5),
       lease_token = NULL
 WHERE o.id OPERATOR(pg_catalog.=) $1
