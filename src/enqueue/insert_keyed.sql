-- outbox_enqueue with an ordering_key ($6), once the producer holds the key (src/ordering,
-- hold_key_for_producer): when the key has a head (its claimable message), the new message
-- waits behind it; without one, the new message is the head. Nothing is inserted when another
-- transaction made a head meanwhile (outbox_key_head_idx: the caller tries again, and queues
-- behind it) or when the dedupe_key ($5) is taken. Used with a dedupe_key, outside READ
-- COMMITTED, and for a table with triggers: otherwise src/enqueue/direct_insert.rs writes the
-- same row without a statement.
INSERT INTO @extschema@.outbox AS o (topic, payload, available_at, headers, dedupe_key, ordering_key, waiting_for)
SELECT $1, $2, $3, $4, $5, $6,
       CASE WHEN EXISTS (SELECT FROM ONLY @extschema@.outbox h
                          WHERE h.ordering_key OPERATOR(pg_catalog.=) $6
                            AND h.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                            AND h.waiting_for IS NULL)
            THEN 'ordering_key'::@extschema@.outbox_wait END
ON CONFLICT DO NOTHING
RETURNING o
