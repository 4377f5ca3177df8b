-- outbox_complete without lease tokens: $1 ids, completed while PENDING, whoever holds them.
-- (The consumer that claimed with lease => NULL holds their row locks: nobody else can.)
-- Returns how many it completed and their ordering keys (for src/ordering).
WITH done AS (
    UPDATE ONLY @extschema@.outbox o
       SET status = 'DONE', processed_at = pg_catalog.clock_timestamp()
     WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
       -- (As text: matched against the partial index of ready rows, the plan kept for the
       -- session could walk that whole index instead of looking the rows up by id.)
       AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
    RETURNING o.ordering_key
)
SELECT pg_catalog.count(*), pg_catalog.array_agg(DISTINCT d.ordering_key) FILTER (WHERE d.ordering_key IS NOT NULL)
  FROM done d
