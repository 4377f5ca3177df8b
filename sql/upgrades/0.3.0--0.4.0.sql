-- What changes 0.3.0's objects on the way to 0.4.0 (the rest of the update script comes from
-- the sources, run again: see scripts/make-upgrade-script.sh).

-- A dedupe_key is held per topic (it was global, and a hit returned another producer's message).
DROP INDEX outbox_dedupe_key_idx;
CREATE UNIQUE INDEX outbox_dedupe_key_idx ON outbox (topic, dedupe_key) WHERE dedupe_key IS NOT NULL;

-- The dead-letter rule's text moved into src/policy.rs.
DROP FUNCTION outbox_exhausted_error(integer, integer, uuid, text);

-- outbox_stats() gains the deliveries' numbers: a new result type, so it and the view over it
-- are made again (sql/operations.sql); the users' grants on them are kept.
DROP VIEW outbox_monitoring;
DROP FUNCTION outbox_stats();
