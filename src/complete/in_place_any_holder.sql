-- outbox_complete without lease tokens, second step (only when any_holder.sql did not complete
-- every id): $1 ids, $2 the completion time. What is still PENDING stays in outbox, DONE,
-- because its dedupe_key must keep holding or it has (or is getting) deliveries;
-- outbox_archive moves it later. Returns how many and their ordering keys.
WITH done_in_place AS (
    UPDATE ONLY @extschema@.outbox o
       SET status = 'DONE', processed_at = $2
     WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
       AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
    RETURNING o.ordering_key
)
SELECT pg_catalog.count(*), pg_catalog.array_agg(DISTINCT p.ordering_key) FILTER (WHERE p.ordering_key IS NOT NULL)
  FROM done_in_place p
