-- The worker's pick-up, first statement: it locks up to $3 ready messages of the topics it
-- delivers ($2: with many, matched by hash, src/topic.rs), oldest ready first, skipping rows a
-- SQL consumer holds; $1 is the clock, $4 where its last pick-up found the head of the queue
-- (src/claim/head.rs; -infinity: from the start). fan_out.sql then makes their deliveries.
--
-- A message whose ordering key a producer's open transaction holds (queuing a message behind
-- it: src/ordering) is left alone: handing its key on waits for that commit, to see the new
-- message, and the worker would wait with its whole step. Its key's advisory lock ($5, the tag's
-- first half) is tried here and kept until the step ends (src/ordering releases the keys). (A
-- key left alone for long enough while producers kept committing to it, held_back.rs
-- KEY_PATIENCE, was waited for before this statement: its try here succeeds.) The keys are locked
-- in a statement of their own, before fan_out.sql reads their heads: an operator's requeue or
-- redelivery that made a head and held the key has then committed before that statement's
-- snapshot, which sees the head. (Read in the snapshot of this statement, taken before the key's
-- lock, a head committed in between was unseen, and the new delivery failed on the one-head-per-
-- key index.)
--
-- Returns how many messages it locked, the oldest locked's available_at, the ids of those it
-- picked up (those locked less those whose key was held), and the keys left alone with the
-- newest message queued behind each (0: none).
WITH ready AS (
    SELECT o.id, o.topic, o.attempts, o.last_error, o.ordering_key, o.available_at
      FROM ONLY @extschema@.outbox o
     WHERE o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
       AND o.waiting_for IS NULL
       AND o.available_at OPERATOR(pg_catalog.<=) $1
       AND (o.available_at, o.id) OPERATOR(pg_catalog.>=) ($4, 0::pg_catalog.int8)
       AND o.topic::pg_catalog.text OPERATOR(pg_catalog.=) ANY ($2)
     ORDER BY o.available_at, o.id
     LIMIT $3
       FOR UPDATE SKIP LOCKED
), picked AS MATERIALIZED (
    SELECT r.*
      FROM ready r
     WHERE r.ordering_key IS NULL
        OR pg_catalog.pg_try_advisory_xact_lock($5, pg_catalog.hashtext(r.ordering_key))
), left_alone AS MATERIALIZED (
    SELECT r.id, r.ordering_key,
           COALESCE((SELECT pg_catalog.max(q.id)
                       FROM ONLY @extschema@.outbox q
                      WHERE q.ordering_key OPERATOR(pg_catalog.=) r.ordering_key
                        AND q.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                        AND q.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait), 0) AS newest
      FROM ready r
     WHERE r.ordering_key IS NOT NULL
       AND NOT EXISTS (SELECT FROM picked p WHERE p.id OPERATOR(pg_catalog.=) r.id)
)
SELECT (SELECT pg_catalog.count(*) FROM ready),
       (SELECT pg_catalog.min(r.available_at) FROM ready r),
       ARRAY(SELECT p.id FROM picked p ORDER BY p.id),
       ARRAY(SELECT l.ordering_key::pg_catalog.text FROM left_alone l ORDER BY l.id),
       ARRAY(SELECT l.newest FROM left_alone l ORDER BY l.id)
