-- The ordering keys $1 of messages that just ended (DONE or DEAD) or went to the delivery
-- worker: for each key without a head (a claimable message) now, the oldest message waiting
-- behind it becomes the head. Run once key_locks.rs holds the keys' locks, and over every row
-- committed before it starts (not the transaction's snapshot: under REPEATABLE READ a
-- producer's message committed since would be missed, and wait for ever behind a head that is
-- gone). Returns how many.
WITH next AS (
    SELECT (SELECT q.id
              FROM ONLY @extschema@.outbox q
             WHERE q.ordering_key OPERATOR(pg_catalog.=) k.key
               AND q.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
               AND q.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait
             ORDER BY q.id
             LIMIT 1) AS id
      FROM pg_catalog.unnest($1) AS k(key)
     WHERE NOT EXISTS (SELECT FROM ONLY @extschema@.outbox h
                        WHERE h.ordering_key OPERATOR(pg_catalog.=) k.key
                          AND h.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                          AND h.waiting_for IS NULL)
), released AS (
    -- Ready from now on (or from its delay's end): a claim reads the ready queue from where it
    -- found its head (src/claim/head.rs), and a message queued behind its key since before
    -- that would lie behind it.
    UPDATE ONLY @extschema@.outbox o
       SET waiting_for = NULL,
           available_at = GREATEST(o.available_at, pg_catalog.clock_timestamp())
      FROM next
     WHERE o.id OPERATOR(pg_catalog.=) next.id
    RETURNING o.id
)
SELECT pg_catalog.count(*)::pg_catalog.int4 FROM released
