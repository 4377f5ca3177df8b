-- outbox_claim, first step: lock up to $3 ready messages (of the topics $2, or all), oldest
-- ready first, skipping rows other consumers hold. Messages waiting behind their ordering key
-- or for their deliveries are not ready (and not in outbox_ready_idx). $1 is the claim's reading
-- of the clock and $4 where this connection's last claim found the head of the queue (head.rs;
-- -infinity: from the start): as parameters they let the scan of outbox_ready_idx start and end
-- at the right places (the lower bound as a row comparison: a pair of inequalities on one
-- column would be estimated as a narrow range, and the generic plan of a small table would then
-- sort a sequential scan). Returns each row whole, its id, its attempts, whether a lease still
-- names a holder, and its available_at. With many topics the topic filter is matched by hash
-- instead (src/topic.rs, with_topics_matched_by_hash: compared in turn, a claim of thousands of
-- topics behind another topic's backlog took seconds).
SELECT o, o.id, o.attempts, o.lease_token IS NOT NULL, o.available_at
  FROM ONLY @extschema@.outbox o
 WHERE o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND o.waiting_for IS NULL
   AND o.available_at OPERATOR(pg_catalog.<=) $1
   AND (o.available_at, o.id) OPERATOR(pg_catalog.>=) ($4, 0::pg_catalog.int8)
   AND ($2::pg_catalog.text[] IS NULL OR o.topic::pg_catalog.text OPERATOR(pg_catalog.=) ANY ($2))
 ORDER BY o.available_at, o.id
 LIMIT $3
   FOR UPDATE SKIP LOCKED
