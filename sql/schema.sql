-- Every table, type, index and view of outbox_ext, in one place. (The functions are in
-- sql/api.sql, sql/subscriptions.sql and sql/operations.sql; who may use what, in
-- sql/privileges.sql.) Operators that compare the extension's types are written
-- OPERATOR(pg_catalog.=): a look-alike in the extension's schema could otherwise be bound into
-- an index predicate or a view for good.

-- A message's life: PENDING until a consumer completes it (DONE) or it runs out of attempts
-- (DEAD). An enum rather than the essay's varchar + CHECK: it admits nothing else, at no cost
-- per row written (see the note on constraints below).
CREATE TYPE outbox_status AS ENUM ('PENDING', 'DONE', 'DEAD');

-- Why a PENDING message (or delivery) that is due is not claimable: it waits behind an earlier
-- message of its ordering_key, or (a message only) for its deliveries. NULL: claimable.
CREATE TYPE outbox_wait AS ENUM ('ordering_key', 'deliveries');

-- The outbox table: one row per piece of work the application owes.
--
-- Column order follows the essay; the columns after created_at are what the design adds:
-- dedupe_key lets a producer enqueue "at most once per key", lease_token identifies the
-- consumer currently holding a claimed message, ordering_key hands out messages that share it
-- one at a time in enqueue order, waiting_for says why a due message is not claimable.
CREATE TABLE outbox (
    id           bigserial    PRIMARY KEY,
    -- The idempotency key every consumer and receiver sees. Time-ordered (UUIDv7), so its
    -- unique index grows at the right edge instead of splitting pages at random.
    public_id    uuid         NOT NULL DEFAULT outbox_uuid_v7(),
    -- An event name, past tense: 'booking.created'.
    topic        varchar(64)  NOT NULL,
    -- A snapshot of what the handler needs, not just a foreign key.
    payload      jsonb        NOT NULL,
    status       outbox_status NOT NULL DEFAULT 'PENDING',
    -- Deliveries so far: incremented by every claim, so a message that keeps crashing its
    -- consumer still runs out of attempts.
    attempts     integer      NOT NULL DEFAULT 0,
    -- Creation time, then the backoff deadline after a failure, or the lease expiry while a
    -- consumer holds the message. Readiness is always "available_at <= clock".
    available_at timestamptz  NOT NULL DEFAULT clock_timestamp(),
    processed_at timestamptz,
    -- Why the last attempt failed, so a DEAD row is diagnosable after the logs have rotated.
    last_error   text,
    created_at   timestamptz  NOT NULL DEFAULT now(),
    dedupe_key   text,
    lease_token  uuid,
    ordering_key text,
    waiting_for  outbox_wait,
    -- String-valued headers the producer gave the message: consumers see them, the delivery
    -- worker sends them with every attempt (W3C traceparent, a tenant id, ...).
    headers      jsonb,
    CONSTRAINT outbox_public_id_key UNIQUE (public_id)
);

-- No CHECK constraints, on purpose. PostgreSQL 15 rebuilds every CHECK of a table from its
-- stored text for each INSERT or UPDATE statement: one CHECK cost 18% of the insert rate, and
-- the four this table had about a fifth (bench/README.md). Every write goes through the
-- extension's functions (no role may write to the table), and they keep the invariants the
-- constraints stated: a valid topic, attempts >= 0, and processed_at set exactly when the
-- status is not PENDING. tests/reliability/hostile.py checks them after its random calls.

COMMENT ON TABLE outbox IS 'Work owed by committed transactions: PENDING until a consumer completes it (DONE) or it runs out of attempts (DEAD).';

-- The claim query seeks here: only claimable pending rows are indexed, in the order they become
-- ready, so neither a sort, nor the (eventually huge) DONE history, nor the messages waiting
-- behind their ordering key or for their deliveries is ever visited.
CREATE INDEX outbox_ready_idx ON outbox (available_at, id)
    WHERE status OPERATOR(pg_catalog.=) 'PENDING'::outbox_status AND waiting_for IS NULL;

-- "Enqueue once per key and topic": the arbiter of INSERT ... ON CONFLICT in outbox_enqueue.
CREATE UNIQUE INDEX outbox_dedupe_key_idx ON outbox (topic, dedupe_key) WHERE dedupe_key IS NOT NULL;

-- Finished rows by status and time: dead letters, the last minute's completions and the purge
-- of old DONE rows all seek here instead of walking the DONE history.
CREATE INDEX outbox_processed_idx ON outbox (status, processed_at) WHERE status OPERATOR(pg_catalog.<>) 'PENDING'::outbox_status;

-- A queue's table churns: every message is inserted, updated two or three times and deleted.
-- Vacuum it early and often (dead index entries slow the claim down). The fillfactor stays
-- 100: every update of a message changes an indexed column (status or available_at), so none
-- can be HOT, and free space kept on each page for one would only go unused.
ALTER TABLE outbox SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.05,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_delay = 1
);

-- pg_dump keeps the messages (an extension's tables are otherwise dumped empty).
SELECT pg_catalog.pg_extension_config_dump('outbox', '');
SELECT pg_catalog.pg_extension_config_dump('outbox_id_seq', '');

-- Dead letters with what is needed to diagnose them.
CREATE VIEW outbox_dead_letters AS
SELECT id, public_id, topic, attempts, last_error, created_at, processed_at AS died_at, payload
  FROM outbox
 WHERE status OPERATOR(pg_catalog.=) 'DEAD'::outbox_status;

-- Subscriptions: which endpoints the delivery worker sends each topic's messages to.
--
-- An endpoint is a place the server will send data to, and a secret signs what it sends, so
-- only administrators may manage them (sql/privileges.sql). The view outbox_subscriptions
-- shows no secrets and only the names of extra headers (they may carry credentials).
CREATE TABLE outbox_subscription (
    id         bigserial   PRIMARY KEY,
    topic      varchar(64) NOT NULL CHECK (outbox_topic_is_valid(topic::text)),
    url        text        NOT NULL,
    secret     text,
    headers    jsonb       NOT NULL DEFAULT '{}',
    -- NULL: outbox.http_timeout.
    timeout    interval    CHECK (timeout OPERATOR(pg_catalog.>=) interval '100 milliseconds' AND timeout OPERATOR(pg_catalog.<=) interval '10 minutes'),
    enabled    boolean     NOT NULL DEFAULT true,
    created_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT outbox_subscription_topic_url_key UNIQUE (topic, url)
);
SELECT pg_catalog.pg_extension_config_dump('outbox_subscription', '');
SELECT pg_catalog.pg_extension_config_dump('outbox_subscription_id_seq', '');

CREATE VIEW outbox_subscriptions AS
SELECT id, topic, url, secret IS NOT NULL AS signed,
       ARRAY(SELECT jsonb_object_keys(headers) ORDER BY 1) AS header_names,
       timeout, enabled, created_at
  FROM outbox_subscription;

-- ======== new in 0.4.0 ========

-- Per ordering key, at most one message is claimable (the head: the oldest PENDING one); the
-- others wait behind it, in enqueue order, until it ends (DONE or DEAD) or is handed to the
-- delivery worker (src/ordering). The database enforces the one head.
CREATE UNIQUE INDEX outbox_key_head_idx ON outbox (ordering_key)
    WHERE status OPERATOR(pg_catalog.=) 'PENDING'::outbox_status AND waiting_for IS NULL AND ordering_key IS NOT NULL;
CREATE INDEX outbox_key_queue_idx ON outbox (ordering_key, id)
    WHERE status OPERATOR(pg_catalog.=) 'PENDING'::outbox_status AND waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::outbox_wait;

-- Endpoints that protect themselves and their receivers (docs/worker.md):
--   enabled false: the endpoint is disabled, by hand (outbox_disable_subscription) or by the
--       worker after outbox.endpoint_disable_after of failures; its deliveries are parked (kept,
--       not attempted) until outbox_enable_subscription. disabled_reason says why.
--   failing_since: when the endpoint's current run of failed attempts began (NULL: its latest
--       attempt succeeded). While it fails, the worker sends it one request at a time.
--   rate_limit, max_in_flight: at most so many requests per second, and at once (NULL: none).
--   previous_secret: the secret before outbox_rotate_secret; requests carry its signature too
--       until previous_secret_until.
ALTER TABLE outbox_subscription
    ADD COLUMN disabled_reason       text,
    ADD COLUMN failing_since         timestamptz,
    ADD COLUMN rate_limit            double precision CHECK (rate_limit OPERATOR(pg_catalog.>) 0),
    ADD COLUMN max_in_flight         integer CHECK (max_in_flight OPERATOR(pg_catalog.>) 0),
    ADD COLUMN previous_secret       text,
    ADD COLUMN previous_secret_until timestamptz;

CREATE OR REPLACE VIEW outbox_subscriptions AS
SELECT id, topic, url, secret IS NOT NULL AS signed,
       ARRAY(SELECT jsonb_object_keys(headers) ORDER BY 1) AS header_names,
       timeout, enabled, created_at,
       disabled_reason, failing_since, rate_limit, max_in_flight,
       CASE WHEN previous_secret_until > now() THEN previous_secret_until END AS previous_secret_until
  FROM outbox_subscription;

-- Messages handed to the delivery worker wait for their deliveries; the numbers count them here.
CREATE INDEX outbox_handed_over_idx ON outbox (id)
    WHERE status OPERATOR(pg_catalog.=) 'PENDING'::outbox_status AND waiting_for OPERATOR(pg_catalog.=) 'deliveries'::outbox_wait;

-- Deliveries: one message to one endpoint (subscription). The delivery worker makes them when
-- it first picks a message up, one for each enabled subscription of its topic, and each then
-- lives the message's life on its own: attempts, backoff, a lease while a request is in flight,
-- DONE or DEAD. An endpoint that took a message never gets it again because another failed.
-- The message stays PENDING until all its deliveries have ended (waiting_for 'deliveries', so
-- that no claim takes it); then it is DONE, or DEAD if any of them is.
CREATE TABLE outbox_delivery (
    message_id      bigint        NOT NULL REFERENCES outbox (id) ON DELETE CASCADE,
    subscription_id bigint        NOT NULL REFERENCES outbox_subscription (id) ON DELETE CASCADE,
    status          outbox_status NOT NULL DEFAULT 'PENDING',
    -- Requests made so far: each claim by the worker is one (a crash mid-request counts).
    attempts        integer       NOT NULL DEFAULT 0,
    -- When it is due: now, the backoff deadline after a failure, or the lease's end while a
    -- request is in flight.
    available_at    timestamptz   NOT NULL DEFAULT clock_timestamp(),
    -- A request is in flight (or was, when the worker stopped: a new worker releases it).
    leased          boolean       NOT NULL DEFAULT false,
    last_error      text,
    created_at      timestamptz   NOT NULL DEFAULT now(),
    -- When it became DONE or DEAD.
    processed_at    timestamptz,
    -- The message's ordering_key: an endpoint gets a key's messages one at a time, in order.
    ordering_key    text,
    waiting_for     outbox_wait,
    PRIMARY KEY (message_id, subscription_id)
);
COMMENT ON TABLE outbox_delivery IS 'One message to one endpoint: its own attempts, backoff, lease and outcome.';

-- The worker claims each endpoint's due deliveries here, oldest first.
CREATE INDEX outbox_delivery_ready_idx ON outbox_delivery (subscription_id, available_at, message_id)
    WHERE status OPERATOR(pg_catalog.=) 'PENDING'::outbox_status AND waiting_for IS NULL;
-- Per endpoint and ordering key, at most one delivery is claimable (the head); the others wait
-- in message order.
CREATE UNIQUE INDEX outbox_delivery_key_head_idx ON outbox_delivery (subscription_id, ordering_key)
    WHERE status OPERATOR(pg_catalog.=) 'PENDING'::outbox_status AND waiting_for IS NULL AND ordering_key IS NOT NULL;
CREATE INDEX outbox_delivery_key_queue_idx ON outbox_delivery (subscription_id, ordering_key, message_id)
    WHERE status OPERATOR(pg_catalog.=) 'PENDING'::outbox_status AND waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::outbox_wait;
-- Dead deliveries, for the numbers (only those: a DONE delivery is history, and each index
-- costs every delivery a write).
CREATE INDEX outbox_delivery_dead_idx ON outbox_delivery (subscription_id)
    WHERE status OPERATOR(pg_catalog.=) 'DEAD'::outbox_status;
-- Unsubscribing (ON DELETE CASCADE) finds an endpoint's deliveries here.
CREATE INDEX outbox_delivery_subscription_idx ON outbox_delivery (subscription_id);
SELECT pg_catalog.pg_extension_config_dump('outbox_delivery', '');

-- The attempt log: one row per HTTP request the worker made, with what came back. Kept for
-- outbox.retention, purged with the DONE messages. (0.5.2 partitions it by day: below.)
CREATE TABLE outbox_delivery_attempt (
    message_id      bigint      NOT NULL,
    subscription_id bigint      NOT NULL,
    attempt         integer     NOT NULL,
    started_at      timestamptz NOT NULL,
    duration        interval    NOT NULL,
    -- NULL when no answer came (refused, timed out, cut off).
    http_status     integer,
    error           text
);
COMMENT ON TABLE outbox_delivery_attempt IS 'Every HTTP request of the delivery worker: when, how long, what came back.';
CREATE INDEX outbox_delivery_attempt_delivery_idx ON outbox_delivery_attempt (message_id, subscription_id);
-- Appended in time order: a BRIN index finds the old part for the purge at almost no cost.
CREATE INDEX outbox_delivery_attempt_started_idx ON outbox_delivery_attempt USING brin (started_at);
SELECT pg_catalog.pg_extension_config_dump('outbox_delivery_attempt', '');

CREATE VIEW outbox_deliveries AS
SELECT d.message_id, d.subscription_id, m.public_id, m.topic, s.url, d.status, d.attempts,
       d.available_at, d.leased AS in_flight, d.last_error,
       CASE WHEN d.status OPERATOR(pg_catalog.=) 'DONE'::outbox_status THEN d.processed_at END AS delivered_at,
       d.processed_at, d.created_at
  FROM outbox_delivery d
  JOIN outbox m ON m.id OPERATOR(pg_catalog.=) d.message_id
  JOIN outbox_subscription s ON s.id OPERATOR(pg_catalog.=) d.subscription_id;

CREATE VIEW outbox_delivery_attempts AS
SELECT a.message_id, a.subscription_id, s.url, a.attempt, a.started_at, a.duration, a.http_status, a.error
  FROM outbox_delivery_attempt a
  LEFT JOIN outbox_subscription s ON s.id OPERATOR(pg_catalog.=) a.subscription_id;

-- ======== new in 0.5.0 ========

-- The dead letters by topic, for outbox_stats(): counted from this index alone, whatever the
-- history around them (outbox_processed_idx leads with the status, and its rows' topics are in
-- the table). Maintained only when a message becomes DEAD.
CREATE INDEX outbox_dead_idx ON outbox (topic) WHERE status OPERATOR(pg_catalog.=) 'DEAD'::outbox_status;

-- ======== new in 0.5.1 ========
-- No new objects: 0.5.1 changes function bodies (sql/upgrades/0.5.0--0.5.1.sql).

-- ======== new in 0.5.2 ========

-- The attempt log in 32 partitions, one per UTC day in turn, so that retention empties a whole
-- day with TRUNCATE (outbox_purge) instead of deleting its rows one by one: no dead tuples, no
-- vacuum, a time that does not grow with the rows. A fixed set of partitions, created here,
-- rather than one per date created as time goes by: they are the extension's own objects, so
-- pg_dump and pg_upgrade carry them like the rest, and no DDL runs while the worker delivers.
-- A day's rows share their partition with no other day's as long as the retention is under 32
-- days (docs/storage.md says what happens beyond).
--
-- The partition of a request: its UTC day since 1970, modulo 32. The one place of that rule.
-- Written with immutable operators only, so the planner inlines it into the partition key and
-- routing a row costs no function call.
CREATE FUNCTION outbox_attempt_log_slot(started_at timestamptz) RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
RETURN (pg_catalog.floor(EXTRACT(epoch FROM started_at OPERATOR(pg_catalog.-) timestamptz '1970-01-01 00:00:00+00')
            OPERATOR(pg_catalog./) 86400)::bigint OPERATOR(pg_catalog.%) 32 OPERATOR(pg_catalog.+) 32)::integer
       OPERATOR(pg_catalog.%) 32;

-- The view reads the table by its identity: it goes while the table is replaced.
DROP VIEW outbox_delivery_attempts;
ALTER TABLE outbox_delivery_attempt RENAME TO outbox_delivery_attempt_unpartitioned;
ALTER INDEX outbox_delivery_attempt_delivery_idx RENAME TO outbox_delivery_attempt_unpartitioned_delivery_idx;
ALTER INDEX outbox_delivery_attempt_started_idx RENAME TO outbox_delivery_attempt_unpartitioned_started_idx;

CREATE TABLE outbox_delivery_attempt (
    message_id      bigint      NOT NULL,
    subscription_id bigint      NOT NULL,
    attempt         integer     NOT NULL,
    started_at      timestamptz NOT NULL,
    duration        interval    NOT NULL,
    -- NULL when no answer came (refused, timed out, cut off).
    http_status     integer,
    error           text
) PARTITION BY LIST (outbox_attempt_log_slot(started_at));
COMMENT ON TABLE outbox_delivery_attempt IS 'Every HTTP request of the delivery worker: when, how long, what came back.';
CREATE INDEX outbox_delivery_attempt_delivery_idx ON outbox_delivery_attempt (message_id, subscription_id);
-- Appended in time order: a BRIN index tells at almost no cost whether a partition holds rows
-- newer than a purge's cutoff (then it is not emptied) or older than its day (then they are
-- deleted, see outbox_purge).
CREATE INDEX outbox_delivery_attempt_started_idx ON outbox_delivery_attempt USING brin (started_at);
-- One partition per value of outbox_attempt_log_slot (outbox_purge counts them here).
DO $$
BEGIN
    FOR slot IN 0..31 LOOP
        EXECUTE pg_catalog.format('CREATE TABLE @extschema@.%I PARTITION OF @extschema@.outbox_delivery_attempt FOR VALUES IN (%s)',
                                  pg_catalog.format('outbox_delivery_attempt_%s', slot), slot);
        -- pg_dump keeps their rows (an extension's tables are otherwise dumped empty).
        PERFORM pg_catalog.pg_extension_config_dump(
            pg_catalog.format('@extschema@.%I', pg_catalog.format('outbox_delivery_attempt_%s', slot))::pg_catalog.regclass, '');
    END LOOP;
END
$$;

INSERT INTO outbox_delivery_attempt SELECT * FROM outbox_delivery_attempt_unpartitioned;
-- Out of the extension first: that also takes it off the tables pg_dump keeps the rows of.
ALTER EXTENSION outbox_ext DROP TABLE outbox_delivery_attempt_unpartitioned;
DROP TABLE outbox_delivery_attempt_unpartitioned;

CREATE VIEW outbox_delivery_attempts AS
SELECT a.message_id, a.subscription_id, s.url, a.attempt, a.started_at, a.duration, a.http_status, a.error
  FROM outbox_delivery_attempt a
  LEFT JOIN outbox_subscription s ON s.id OPERATOR(pg_catalog.=) a.subscription_id;

-- ======== new in 0.5.3 ========

-- The history of DONE messages leaves the table the claims and the worker read (docs/storage.md).
-- outbox_archive (the delivery worker calls it every second) moves each DONE message, with its
-- deliveries, out of outbox into outbox_history_N, N the day it was processed
-- (outbox_attempt_log_slot: the attempt log's rule, one place for both); outbox_purge empties a
-- whole day with TRUNCATE. The history tables INHERIT outbox (and outbox_delivery), so that
-- outbox stays the essay's one table for its readers: SELECT ... FROM outbox sees every message
-- in every state (FOR UPDATE works on it, as on any table); SELECT ... FROM ONLY outbox, what the
-- extension's own statements read, sees the hot part: pending work, dead letters (kept until an
-- operator acts on them), DONE messages not yet moved, and those with a dedupe_key (which stay
-- until purged: the key's unique index is outbox's own).
--
-- Deliveries move with their message, so their foreign key to outbox (which would delete them)
-- goes; the extension's functions delete a message's deliveries with it (outbox_purge,
-- outbox_discard).
ALTER TABLE outbox_delivery DROP CONSTRAINT outbox_delivery_message_id_fkey;

-- Finished rows by status and time, in two indexes: those without a dedupe_key, which the
-- archive seeks (the others stay, and it would otherwise walk past every one of them each
-- time), and those with one. Each finished row is in exactly one: no write more per message.
DROP INDEX outbox_processed_idx;
CREATE INDEX outbox_processed_idx ON outbox (status, processed_at)
    WHERE status OPERATOR(pg_catalog.<>) 'PENDING'::outbox_status AND dedupe_key IS NULL;
CREATE INDEX outbox_processed_keyed_idx ON outbox (status, processed_at)
    WHERE status OPERATOR(pg_catalog.<>) 'PENDING'::outbox_status AND dedupe_key IS NOT NULL;
DO $$
BEGIN
    FOR slot IN 0..31 LOOP
        -- The CHECK lets the planner leave the history out of a reader's query for pending
        -- messages (constraint_exclusion); it costs the archive one check per statement.
        EXECUTE pg_catalog.format(
            'CREATE TABLE @extschema@.%1$I (CONSTRAINT %2$I CHECK (status OPERATOR(pg_catalog.=) ''DONE''::@extschema@.outbox_status))
                 INHERITS (@extschema@.outbox)', pg_catalog.format('outbox_history_%s', slot), pg_catalog.format('outbox_history_%s_done', slot));
        EXECUTE pg_catalog.format('CREATE INDEX ON @extschema@.%I (id)', pg_catalog.format('outbox_history_%s', slot));
        EXECUTE pg_catalog.format('CREATE INDEX ON @extschema@.%I (public_id)', pg_catalog.format('outbox_history_%s', slot));
        -- Moved in processed_at order: whether a day holds rows newer than a purge's cutoff.
        EXECUTE pg_catalog.format('CREATE INDEX ON @extschema@.%I USING brin (processed_at)', pg_catalog.format('outbox_history_%s', slot));
        EXECUTE pg_catalog.format(
            'CREATE TABLE @extschema@.%1$I (CONSTRAINT %2$I CHECK (status OPERATOR(pg_catalog.=) ''DONE''::@extschema@.outbox_status))
                 INHERITS (@extschema@.outbox_delivery)', pg_catalog.format('outbox_delivery_history_%s', slot), pg_catalog.format('outbox_delivery_history_%s_done', slot));
        EXECUTE pg_catalog.format('CREATE INDEX ON @extschema@.%I (message_id, subscription_id)', pg_catalog.format('outbox_delivery_history_%s', slot));
        -- pg_dump keeps their rows (an extension's tables are otherwise dumped empty).
        PERFORM pg_catalog.pg_extension_config_dump(pg_catalog.format('@extschema@.%I', pg_catalog.format('outbox_history_%s', slot))::pg_catalog.regclass, '');
        PERFORM pg_catalog.pg_extension_config_dump(pg_catalog.format('@extschema@.%I', pg_catalog.format('outbox_delivery_history_%s', slot))::pg_catalog.regclass, '');
    END LOOP;
END
$$;

-- ======== new in 0.5.4 ========

-- outbox_complete writes most DONE messages into the history of their day at once
-- (src/complete), so outbox_stats() finds the last minute's completions there: by a B-tree on
-- processed_at (a BRIN index leaves the ranges being filled unsummarized, and reads them whole).
-- It also finds, for outbox_purge, whether a day holds rows newer than its cutoff.
DO $$
BEGIN
    FOR slot IN 0..31 LOOP
        EXECUTE pg_catalog.format('DROP INDEX @extschema@.%I', pg_catalog.format('outbox_history_%s_processed_at_idx', slot));
        EXECUTE pg_catalog.format('CREATE INDEX %I ON @extschema@.%I (processed_at)',
                                  pg_catalog.format('outbox_history_%s_processed_at_idx', slot), pg_catalog.format('outbox_history_%s', slot));
    END LOOP;
END
$$;

-- ======== new in 0.5.5 ========

-- ======== new in 0.5.6 ========

-- ======== new in 0.5.7 ========

-- ======== new in 0.5.8 ========

-- ======== new in 0.5.9 ========

-- ======== new in 0.5.10 ========

-- ======== new in 0.5.11 ========

-- ======== new in 0.5.12 ========

-- ======== new in 0.5.13 ========

-- ======== new in 0.5.14 ========

-- ======== new in 0.5.15 ========

-- ======== new in 0.5.16 ========

-- ======== new in 0.5.17 ========

-- The PL/pgSQL and SQL functions name the extension's schema as it was called when they were
-- created. Renamed, that name could be given to a new schema of its owner's (for public, the
-- database owner), whose objects the functions would then use with the extension owner's
-- rights. Refuse the rename, whoever asks: the functions would no longer find their objects.
CREATE FUNCTION outbox_keep_schema_name() RETURNS event_trigger
    LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    renamed_to name;
BEGIN
    SELECT n.nspname INTO renamed_to
      FROM pg_catalog.pg_event_trigger_ddl_commands() c
      JOIN pg_catalog.pg_extension e ON e.extnamespace OPERATOR(pg_catalog.=) c.objid
      JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
     WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext'
       AND c.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_namespace'::pg_catalog.regclass
       AND pg_catalog.quote_ident(n.nspname) OPERATOR(pg_catalog.<>) '@extschema@';
    IF FOUND THEN
        RAISE EXCEPTION 'outbox_ext: schema % holds the extension and cannot be renamed (to %)',
                        '@extschema@', pg_catalog.quote_ident(renamed_to)
            USING ERRCODE = 'feature_not_supported',
                  DETAIL = 'The extension''s functions name the schema as it was called when they were created; under another name, a new schema given the old one would be used in its place.',
                  HINT = 'To move the extension, dump its data, DROP EXTENSION outbox_ext, and CREATE EXTENSION outbox_ext SCHEMA the_new_one.';
    END IF;
END
$$;

CREATE EVENT TRIGGER outbox_keep_schema_name ON ddl_command_end
    WHEN TAG IN ('ALTER SCHEMA')
    EXECUTE FUNCTION outbox_keep_schema_name();

-- ======== new in 0.5.18 ========

-- An endpoint's timeout is sent as seconds (EXTRACT(epoch ...): a year as 365.25 days) but was
-- checked as an interval (a year as 360 days): '-1 year 360 days 5 seconds' passed as 5 seconds
-- and the worker waited no time at all. Both readings must be within bounds; a timeout stored
-- before that is brought within them, as the worker bounded it.
UPDATE outbox_subscription
   SET timeout = pg_catalog.make_interval(secs => LEAST(GREATEST(EXTRACT(epoch FROM timeout), 0.1), 600.0)::pg_catalog.float8)
 WHERE EXTRACT(epoch FROM timeout) OPERATOR(pg_catalog.<) 0.1 OR EXTRACT(epoch FROM timeout) OPERATOR(pg_catalog.>) 600.0;
ALTER TABLE outbox_subscription DROP CONSTRAINT outbox_subscription_timeout_check;
ALTER TABLE outbox_subscription ADD CONSTRAINT outbox_subscription_timeout_check CHECK (
    timeout OPERATOR(pg_catalog.>=) interval '100 milliseconds' AND timeout OPERATOR(pg_catalog.<=) interval '10 minutes'
    AND EXTRACT(epoch FROM timeout) OPERATOR(pg_catalog.>=) 0.1 AND EXTRACT(epoch FROM timeout) OPERATOR(pg_catalog.<=) 600.0);

-- The other CHECKs made before 0.5.18 resolved `rate_limit > 0` and outbox_topic_is_valid(varchar)
-- on the install's search_path, where a look-alike the schema's owner planted first would win and
-- be kept: made again, naming pg_catalog's operator and the extension's function exactly.
ALTER TABLE outbox_subscription DROP CONSTRAINT outbox_subscription_topic_check;
ALTER TABLE outbox_subscription ADD CONSTRAINT outbox_subscription_topic_check CHECK (outbox_topic_is_valid(topic::text));
ALTER TABLE outbox_subscription DROP CONSTRAINT outbox_subscription_rate_limit_check;
ALTER TABLE outbox_subscription ADD CONSTRAINT outbox_subscription_rate_limit_check CHECK (rate_limit OPERATOR(pg_catalog.>) 0);

-- ======== new in 0.5.19 ========

-- ======== new in 0.5.20 ========

-- ======== new in 0.5.21 ========

-- ======== new in 0.5.22 ========

-- ======== new in 0.5.23 ========

-- ======== new in 0.5.24 ========

-- ======== new in 0.5.25 ========

-- ======== new in 0.5.26 ========

-- ======== new in 0.5.27 ========

-- ======== new in 0.5.28 ========

-- ======== new in 0.5.29 ========

-- ======== new in 0.5.30 ========

-- ======== new in 0.5.31 ========

-- ======== new in 0.5.32 ========

-- ======== new in 0.5.33 ========

-- ======== new in 0.5.34 ========

-- ======== new in 0.5.35 ========

-- A lease that ran out is not in flight (its delivery is due again): one whose worker stopped,
-- or handed it back too late, showed in flight for good.
CREATE OR REPLACE VIEW outbox_deliveries AS
SELECT d.message_id, d.subscription_id, m.public_id, m.topic, s.url, d.status, d.attempts,
       d.available_at, (d.leased AND d.available_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()) AS in_flight,
       d.last_error,
       CASE WHEN d.status OPERATOR(pg_catalog.=) 'DONE'::outbox_status THEN d.processed_at END AS delivered_at,
       d.processed_at, d.created_at
  FROM outbox_delivery d
  JOIN outbox m ON m.id OPERATOR(pg_catalog.=) d.message_id
  JOIN outbox_subscription s ON s.id OPERATOR(pg_catalog.=) d.subscription_id;

-- ======== new in 0.5.36 ========

-- ======== new in 0.5.37 ========

-- ======== new in 0.5.38 (scripts/make-upgrade-script.sh copies from here to the end) ========
