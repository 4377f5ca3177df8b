-- Messages $1 whose every endpoint was unsubscribed before it took them are no longer the
-- worker's: PENDING as a message of a topic nobody delivers (a new subscription, or a SQL
-- consumer, takes them), queued behind their ordering key if they have one. Returns the keys
-- (released by the caller: src/ordering).
UPDATE ONLY @extschema@.outbox o
   SET waiting_for = CASE WHEN o.ordering_key IS NOT NULL THEN 'ordering_key'::@extschema@.outbox_wait END
 WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
   AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
   AND o.waiting_for OPERATOR(pg_catalog.=) 'deliveries'::@extschema@.outbox_wait
RETURNING o.ordering_key
