-- Messages whose deliveries have all ended ($1 id, $2 the status policy.rs gave them, $3 the
-- error for a DEAD one): they end too.
UPDATE ONLY @extschema@.outbox o
   SET status = ended.status::@extschema@.outbox_status,
       processed_at = pg_catalog.clock_timestamp(),
       last_error = COALESCE(ended.error, o.last_error)
  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3))
       AS ended(id, status, error)
 WHERE o.id OPERATOR(pg_catalog.=) ended.id
   -- (As text: matched against the partial index of ready rows, the plan kept for the session
   -- could walk that whole index instead of looking the rows up by id.)
   AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
