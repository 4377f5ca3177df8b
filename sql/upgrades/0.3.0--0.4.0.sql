-- What changes 0.3.0's objects on the way to 0.4.0 (the rest of the update script comes from
-- the sources, run again: see scripts/make-upgrade-script.sh).

-- A dedupe_key is held per topic (it was global, and a hit returned another producer's message).
DROP INDEX outbox_dedupe_key_idx;
CREATE UNIQUE INDEX outbox_dedupe_key_idx ON outbox (topic, dedupe_key) WHERE dedupe_key IS NOT NULL;

-- Ordering keys, and why a due message waits (sql/schema.sql). The ready index leaves out the
-- messages that wait: made again (which reads the table once).
CREATE TYPE outbox_wait AS ENUM ('ordering_key', 'deliveries');
ALTER TABLE outbox ADD COLUMN ordering_key text, ADD COLUMN waiting_for outbox_wait, ADD COLUMN headers jsonb;
DROP INDEX outbox_ready_idx;
CREATE INDEX outbox_ready_idx ON outbox (available_at, id)
    WHERE status OPERATOR(pg_catalog.=) 'PENDING'::outbox_status AND waiting_for IS NULL;

-- The dead-letter rule's text moved into src/policy.rs.
DROP FUNCTION outbox_exhausted_error(integer, integer, uuid, text);

-- outbox_stats() gains the deliveries' numbers: a new result type, so it and the view over it
-- are made again (sql/operations.sql); the users' grants on them are kept.
DROP VIEW outbox_monitoring;
DROP FUNCTION outbox_stats();

-- outbox_enqueue gains ordering_key and headers, outbox_enqueue_batch ordering_key: new
-- signatures, made in sql/api.sql (the grants users gave on the old ones move to the new).
DROP FUNCTION outbox_enqueue(text, jsonb, interval, text);
DROP FUNCTION outbox_enqueue_batch(text, jsonb[], interval);
-- outbox_subscribe gains rate_limit and max_in_flight (sql/subscriptions.sql).
DROP FUNCTION outbox_subscribe(text, text, text, jsonb, interval, boolean);
