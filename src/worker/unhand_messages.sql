-- Messages $1 whose every endpoint was unsubscribed before it took them are no longer the
-- worker's: PENDING as a message of a topic nobody delivers (a new subscription, or a SQL
-- consumer, takes them), queued behind their ordering key if they have one. Run over every row
-- committed before it starts, so that a delivery a redelivery just added counts; a message
-- another transaction holds (a redelivery not yet committed) is skipped rather than waited for,
-- for a later step. Returns the keys of those unhanded (released by the caller: src/ordering),
-- and the ids of those held (the key NULL).
WITH candidates AS (
    SELECT o.id
      FROM ONLY @extschema@.outbox o
     WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
       AND o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
       AND o.waiting_for OPERATOR(pg_catalog.=) 'deliveries'::@extschema@.outbox_wait
       AND NOT EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id OPERATOR(pg_catalog.=) o.id)
), free AS (
    SELECT o.id
      FROM ONLY @extschema@.outbox o
     WHERE o.id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT c.id FROM candidates c))
       AND o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
       AND o.waiting_for OPERATOR(pg_catalog.=) 'deliveries'::@extschema@.outbox_wait
       FOR NO KEY UPDATE SKIP LOCKED
), unhanded AS (
    UPDATE ONLY @extschema@.outbox o
       SET waiting_for = CASE WHEN o.ordering_key IS NOT NULL THEN 'ordering_key'::@extschema@.outbox_wait END
     WHERE o.id OPERATOR(pg_catalog.=) ANY (ARRAY(SELECT f.id FROM free f))
    RETURNING o.id, o.ordering_key
)
SELECT u.ordering_key, NULL::pg_catalog.int8 FROM unhanded u
UNION ALL
SELECT NULL, h.id FROM (SELECT c.id FROM candidates c EXCEPT SELECT u.id FROM unhanded u) h  -- (hashed or sorted)
