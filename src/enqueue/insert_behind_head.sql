-- outbox_enqueue with an ordering_key ($6) that has a head: the message waits behind it. The
-- head is locked (FOR SHARE) until this transaction ends, so that whoever ends it meanwhile
-- waits and then releases this message (src/ordering). Nothing is inserted when the head has
-- gone (the caller tries again) or the dedupe_key ($5) is taken.
WITH head AS (
    SELECT h.id
      FROM @extschema@.outbox h
     WHERE h.ordering_key OPERATOR(pg_catalog.=) $6
       AND h.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
       AND h.waiting_for IS NULL
       FOR SHARE
)
INSERT INTO @extschema@.outbox AS o (topic, payload, available_at, headers, dedupe_key, ordering_key, waiting_for)
SELECT $1, $2, pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $3, $4, $5, $6, 'ordering_key'::@extschema@.outbox_wait
 WHERE EXISTS (SELECT FROM head)
ON CONFLICT (topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
RETURNING o
