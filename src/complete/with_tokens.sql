-- outbox_complete with lease tokens: $1 ids, $2 their tokens (an element NULL: any holder). A
-- message is completed only while PENDING and only while its token still holds it. Returns how
-- many it completed and their ordering keys (for src/ordering).
WITH done AS (
    UPDATE ONLY @extschema@.outbox o
       SET status = 'DONE', processed_at = pg_catalog.clock_timestamp()
      FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS wanted(id, lease_token)
     WHERE o.id OPERATOR(pg_catalog.=) wanted.id
       -- (As text: matched against the partial index of ready rows, the plan kept for the
       -- session could walk that whole index instead of looking the rows up by id.)
       AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
       AND (wanted.lease_token IS NULL OR o.lease_token OPERATOR(pg_catalog.=) wanted.lease_token)
    RETURNING o.ordering_key
)
SELECT pg_catalog.count(*), pg_catalog.array_agg(DISTINCT d.ordering_key) FILTER (WHERE d.ordering_key IS NOT NULL)
  FROM done d
