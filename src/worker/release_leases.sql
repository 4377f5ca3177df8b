-- A worker starting: every delivery leased by its predecessor (which is gone: one worker per
-- database, started only after the last one ended) is due again now. The attempt it used
-- stays counted.
--
-- One that an operator's open transaction holds (an unsubscribe deleting it, a redelivery) is
-- skipped rather than waited for, which would hold up the worker's start, every endpoint's:
-- that transaction deletes it or schedules it afresh; rolled back, it leaves the delivery to its
-- lease, which runs out.
UPDATE ONLY @extschema@.outbox_delivery d
   SET leased = false, available_at = pg_catalog.clock_timestamp()
  FROM (SELECT l.message_id, l.subscription_id
          FROM ONLY @extschema@.outbox_delivery l
         WHERE l.leased
           FOR NO KEY UPDATE SKIP LOCKED) free
 WHERE d.message_id OPERATOR(pg_catalog.=) free.message_id
   AND d.subscription_id OPERATOR(pg_catalog.=) free.subscription_id
