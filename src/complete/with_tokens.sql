-- outbox_complete with lease tokens, first step: $1 ids, $2 their tokens (an element NULL: any
-- holder), $3 the completion time. A message is completed only while PENDING and only while
-- its token still holds it. Here it leaves outbox at once for the history of its day,
-- outbox_history_N of its day (src/history.rs), unless a dedupe_key must keep holding or it
-- has (or is getting) deliveries: in_place_with_tokens.sql makes those DONE where they are, and
-- outbox_archive moves them later (docs/storage.md). Returns how many it moved and their
-- ordering keys (for src/ordering). (The rows are found by `id = ANY ($1)` in the primary key:
-- joined to the tokens alone, the plan kept for the session, made while outbox was small, read
-- the whole table at each call once it had grown.)
WITH wanted AS (
    SELECT w.id, w.lease_token FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS w(id, lease_token)
), moved AS (
    DELETE FROM ONLY @extschema@.outbox o
     USING wanted
     WHERE o.id OPERATOR(pg_catalog.=) ANY ($1) AND o.id OPERATOR(pg_catalog.=) wanted.id
       -- (As text: matched against the partial index of ready rows, the plan kept for the
       -- session could walk that whole index instead of looking the rows up by id.)
       AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
       AND (wanted.lease_token IS NULL OR o.lease_token OPERATOR(pg_catalog.=) wanted.lease_token)
       AND o.dedupe_key IS NULL AND o.waiting_for IS NULL
       AND NOT EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id OPERATOR(pg_catalog.=) o.id)
    RETURNING o.*
), archived AS (
    INSERT INTO @extschema@.outbox_history_@day@
           (id, public_id, topic, payload, status, attempts, available_at, processed_at, last_error, created_at,
            dedupe_key, lease_token, ordering_key, waiting_for, headers)
    SELECT m.id, m.public_id, m.topic, m.payload, 'DONE', m.attempts, m.available_at, $3, m.last_error, m.created_at,
           m.dedupe_key, m.lease_token, m.ordering_key, m.waiting_for, m.headers
      FROM moved m
    RETURNING ordering_key
)
SELECT pg_catalog.count(*), pg_catalog.array_agg(DISTINCT a.ordering_key) FILTER (WHERE a.ordering_key IS NOT NULL)
  FROM archived a
