-- The ordering keys $1 of messages that just came back from the delivery worker, queued behind
-- their key (src/worker/unhand_messages.sql). Handing them over had let a newer message of the
-- key become its head: unless someone holds that head (a lease running, or a claim's row lock),
-- it steps back into the queue, so that release_messages.sql makes the oldest the head again.
-- A head someone holds keeps its place. Run once key_locks.rs holds the keys' locks. Returns
-- the heads stepped back.
UPDATE ONLY @extschema@.outbox h
   SET waiting_for = 'ordering_key'::@extschema@.outbox_wait
  FROM (SELECT c.id
          FROM ONLY @extschema@.outbox c
         WHERE c.ordering_key OPERATOR(pg_catalog.=) ANY ($1)
           AND c.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
           AND c.waiting_for IS NULL
           AND (c.lease_token IS NULL OR c.available_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp())
           AND EXISTS (SELECT FROM ONLY @extschema@.outbox q
                        WHERE q.ordering_key OPERATOR(pg_catalog.=) c.ordering_key
                          AND q.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                          AND q.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait
                          AND q.id OPERATOR(pg_catalog.<) c.id)
           FOR UPDATE SKIP LOCKED) newer
 WHERE h.id OPERATOR(pg_catalog.=) newer.id
RETURNING h.id
