-- outbox_claim, first step: lock up to $3 ready messages (of the topics $2, or all), oldest
-- ready first, skipping rows other consumers hold. Messages waiting behind their ordering key
-- or for their deliveries are not ready (and not in outbox_ready_idx). $1 is the claim's reading of the clock: as
-- a parameter it lets the seek on outbox_ready_idx start at the right place. Returns each row
-- whole, its id, its attempts and whether a lease still names a holder.
SELECT o, o.id, o.attempts, o.lease_token IS NOT NULL
  FROM @extschema@.outbox o
 WHERE o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND o.waiting_for IS NULL
   AND o.available_at OPERATOR(pg_catalog.<=) $1
   AND ($2::pg_catalog.text[] IS NULL OR o.topic::pg_catalog.text OPERATOR(pg_catalog.=) ANY ($2))
 ORDER BY o.available_at, o.id
 LIMIT $3
   FOR UPDATE SKIP LOCKED
