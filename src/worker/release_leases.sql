-- A worker starting: every delivery leased by its predecessor (which is gone: one worker per
-- database, started only after the last one ended) is due again now. The attempt it used
-- stays counted.
UPDATE ONLY @extschema@.outbox_delivery d
   SET leased = false, available_at = pg_catalog.clock_timestamp()
 WHERE d.leased
