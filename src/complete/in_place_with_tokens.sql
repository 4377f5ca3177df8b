-- outbox_complete with lease tokens, second step (only when the first, with_tokens.sql, did not
-- complete every id): the same arguments, $1 ids, $2 tokens, $3 the completion time. What is
-- still PENDING and held by its token stays in outbox, DONE, because its dedupe_key must keep
-- holding or it has (or is getting) deliveries; outbox_archive moves it later. Returns how many
-- and their ordering keys.
WITH wanted AS (
    SELECT w.id, w.lease_token FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS w(id, lease_token)
), done_in_place AS (
    UPDATE ONLY @extschema@.outbox o
       SET status = 'DONE', processed_at = $3
      FROM wanted
     WHERE o.id OPERATOR(pg_catalog.=) ANY ($1) AND o.id OPERATOR(pg_catalog.=) wanted.id
       AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
       AND (wanted.lease_token IS NULL OR o.lease_token OPERATOR(pg_catalog.=) wanted.lease_token)
    RETURNING o.ordering_key
)
SELECT pg_catalog.count(*), pg_catalog.array_agg(DISTINCT p.ordering_key) FILTER (WHERE p.ordering_key IS NOT NULL)
  FROM done_in_place p
