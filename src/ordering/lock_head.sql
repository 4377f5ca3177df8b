-- A producer about to add a message to ordering key $1 under REPEATABLE READ or SERIALIZABLE:
-- lock the key's head, if it has one, FOR SHARE until the transaction ends. Whoever ends the
-- head waits for this transaction, then releases what it added; a head ended since this
-- transaction's snapshot fails this with a serialization failure (40001) instead of queuing the
-- message behind a head that is gone.
SELECT h.id
  FROM ONLY @extschema@.outbox h
 WHERE h.ordering_key OPERATOR(pg_catalog.=) $1
   AND h.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND h.waiting_for IS NULL
   FOR SHARE
