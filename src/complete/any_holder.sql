-- outbox_complete without lease tokens, first step: $1 ids, completed while PENDING, whoever
-- holds them; $2 the completion time. (The consumer that claimed with lease => NULL holds their
-- row locks: nobody else can.) Each leaves outbox at once for the history of its day, as in
-- with_tokens.sql, unless it must stay (in_place_any_holder.sql). Returns how many it moved and
-- their ordering keys (for src/ordering).
WITH moved AS (
    DELETE FROM ONLY @extschema@.outbox o
     WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
       -- (As text: matched against the partial index of ready rows, the plan kept for the
       -- session could walk that whole index instead of looking the rows up by id.)
       AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
       AND o.dedupe_key IS NULL AND o.waiting_for IS NULL
       AND NOT EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id OPERATOR(pg_catalog.=) o.id)
    RETURNING o.*
), archived AS (
    INSERT INTO @extschema@.outbox_history_@day@
           (id, public_id, topic, payload, status, attempts, available_at, processed_at, last_error, created_at,
            dedupe_key, lease_token, ordering_key, waiting_for, headers)
    SELECT m.id, m.public_id, m.topic, m.payload, 'DONE', m.attempts, m.available_at, $2, m.last_error, m.created_at,
           m.dedupe_key, m.lease_token, m.ordering_key, m.waiting_for, m.headers
      FROM moved m
    RETURNING ordering_key
)
SELECT pg_catalog.count(*), pg_catalog.array_agg(DISTINCT a.ordering_key) FILTER (WHERE a.ordering_key IS NOT NULL)
  FROM archived a
