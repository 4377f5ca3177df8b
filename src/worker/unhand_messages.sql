-- Messages $1 (locked: record.rs, lock_messages) whose every endpoint was unsubscribed before it took
-- them are no longer the worker's: PENDING as a message of a topic nobody delivers (a new
-- subscription, or a SQL consumer, takes them), queued behind their ordering key if they have
-- one. Run over every row committed before it starts: a delivery a redelivery committed before
-- the lock keeps its message (one that commits later locked the message first). Returns the keys
-- (released by the caller: src/ordering).
UPDATE ONLY @extschema@.outbox o
   SET waiting_for = CASE WHEN o.ordering_key IS NOT NULL THEN 'ordering_key'::@extschema@.outbox_wait END
 WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
   AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
   AND o.waiting_for OPERATOR(pg_catalog.=) 'deliveries'::@extschema@.outbox_wait
   AND NOT EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id OPERATOR(pg_catalog.=) o.id)
RETURNING o.ordering_key
