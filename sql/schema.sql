-- A message's life: PENDING until a consumer completes it (DONE) or it runs out of attempts
-- (DEAD). An enum rather than the essay's varchar + CHECK: it admits nothing else, at no cost
-- per row written (see the note on constraints below).
CREATE TYPE outbox_status AS ENUM ('PENDING', 'DONE', 'DEAD');

-- The outbox table: one row per piece of work the application owes.
--
-- Column order follows the essay; the columns after created_at are what the design adds:
-- dedupe_key lets a producer enqueue "at most once per key", lease_token identifies the
-- consumer currently holding a claimed message.
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
    CONSTRAINT outbox_public_id_key UNIQUE (public_id)
);

-- No CHECK constraints, on purpose. PostgreSQL 15 rebuilds every CHECK of a table from its
-- stored text for each INSERT or UPDATE statement: one CHECK cost 18% of the insert rate, and
-- the four this table had about a fifth (bench/README.md). Every write goes through the
-- functions in sql/api.sql and sql/operations.sql (no role may write to the table), and they
-- keep the invariants the constraints stated: a valid topic, attempts >= 0, and processed_at
-- set exactly when the status is not PENDING. tests/reliability/hostile.py checks them after
-- its random calls.

COMMENT ON TABLE outbox IS 'Work owed by committed transactions: PENDING until a consumer completes it (DONE) or it runs out of attempts (DEAD).';

-- The claim query seeks here: only pending rows are indexed, in the order they become ready,
-- so neither a sort nor the (eventually huge) DONE history is ever visited.
CREATE INDEX outbox_ready_idx ON outbox (available_at, id) WHERE status = 'PENDING';

-- "Enqueue once per key": the arbiter of INSERT … ON CONFLICT in outbox_enqueue.
CREATE UNIQUE INDEX outbox_dedupe_key_idx ON outbox (dedupe_key) WHERE dedupe_key IS NOT NULL;

-- pg_dump keeps the messages (an extension's tables are otherwise dumped empty).
SELECT pg_catalog.pg_extension_config_dump('outbox', '');
SELECT pg_catalog.pg_extension_config_dump('outbox_id_seq', '');
