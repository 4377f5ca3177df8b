-- The due deliveries of endpoint $1 ($2: the clock), oldest first, at most $3, locked, read
-- from $4: where the last claim found the endpoint's head (src/claim/head.rs; -infinity: from
-- the start). A leased one is due when its lease ran out by $5, when the worker last took its
-- answers (claim.rs, Room): one that ran out since may have an answer waiting to be recorded.
-- Returns each one's message, attempts so far, the size of its payload as JSON text (each
-- computed and let go row by row: the worker chooses what fits its memory before it fetches),
-- and its available_at.
SELECT d.message_id, d.attempts, pg_catalog.octet_length(m.payload::pg_catalog.text), d.available_at
  FROM ONLY @extschema@.outbox_delivery d
  JOIN ONLY @extschema@.outbox m ON m.id OPERATOR(pg_catalog.=) d.message_id
 WHERE d.subscription_id OPERATOR(pg_catalog.=) $1
   AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND d.waiting_for IS NULL
   AND d.available_at OPERATOR(pg_catalog.<=) $2
   AND (NOT d.leased OR d.available_at OPERATOR(pg_catalog.<=) $5)
   AND (d.available_at, d.message_id) OPERATOR(pg_catalog.>=) ($4, 0::pg_catalog.int8)
 ORDER BY d.available_at, d.message_id
 LIMIT $3
   FOR UPDATE OF d SKIP LOCKED
