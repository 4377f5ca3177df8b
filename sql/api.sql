-- The SQL API of a message's life: enqueue, claim, complete, fail. Every function runs inside
-- the caller's transaction and never commits: the caller's COMMIT is what makes the business
-- change and the work it owes durable together.
--
-- They are C functions (src/enqueue, src/claim, src/complete, src/fail) with statements planned
-- once per session; outbox_enqueue without keys writes its row with no statement at all, as
-- logical replication does (src/enqueue/direct_insert.rs). They run with the extension owner's
-- rights (SECURITY DEFINER), so a role granted outbox_producer or outbox_consumer needs no
-- rights on the table (sql/privileges.sql).
-- They have no SET search_path (that clause alone costs a save and restore per call): their
-- statements name every schema, function and operator in full instead, so nothing a caller
-- puts on its search_path can stand in for them. Arguments are checked before anything is
-- written: NULL where a value is required is SQLSTATE 22004, a value out of range or
-- ill-formed 22023, a string too long for its column 22001 (docs/api.md).

-- enqueue: record a message in the caller's transaction.
CREATE OR REPLACE FUNCTION outbox_enqueue(
    topic        text,
    payload      jsonb,
    delay        interval DEFAULT '0',
    dedupe_key   text     DEFAULT NULL,
    ordering_key text     DEFAULT NULL,
    headers      jsonb    DEFAULT NULL
) RETURNS outbox
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_enqueue_c';

COMMENT ON FUNCTION outbox_enqueue(text, jsonb, interval, text, text, jsonb) IS
'Records a message in the caller''s transaction (never commits) and returns it. delay schedules it for later. With a dedupe_key already held by a message of the same topic, nothing is recorded and only that message''s id, public_id, topic and dedupe_key are returned (payload NULL). Messages that share an ordering_key are handed out one at a time, in enqueue order. headers (string values) travel with the message to consumers and endpoints.';

-- enqueue, batch form: many messages of one topic in one statement.
CREATE OR REPLACE FUNCTION outbox_enqueue_batch(
    topic        text,
    payloads     jsonb[],
    delay        interval DEFAULT '0',
    ordering_key text     DEFAULT NULL
) RETURNS SETOF outbox
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_enqueue_batch_c';

COMMENT ON FUNCTION outbox_enqueue_batch(text, jsonb[], interval, text) IS
'Records one message per payload, in order, in the caller''s transaction (never commits); returns the new rows. With an ordering_key, all of them share it, in the payloads'' order.';

-- claim: take up to batch_size ready messages, skipping rows other consumers hold.
CREATE OR REPLACE FUNCTION outbox_claim(
    batch_size integer  DEFAULT 10,
    topics     text[]   DEFAULT NULL,
    lease      interval DEFAULT '30 seconds'
) RETURNS SETOF outbox
LANGUAGE c VOLATILE ROWS 10 SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_claim_c';

COMMENT ON FUNCTION outbox_claim(integer, text[], interval) IS
'Claims up to batch_size ready PENDING messages (of the given topics, or all), oldest-ready first, with FOR UPDATE SKIP LOCKED. With a lease, each claim is a delivery: attempts += 1, a new lease_token, and available_at = clock + lease. With lease NULL the rows are only locked until the caller''s transaction ends.';

-- complete: the message was handled.
CREATE OR REPLACE FUNCTION outbox_complete(id bigint, lease_token uuid DEFAULT NULL) RETURNS boolean
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_complete_c';

COMMENT ON FUNCTION outbox_complete(bigint, uuid) IS
'Marks a PENDING message DONE. True when this call completed it; false when the caller no longer holds it (already done or dead, or re-claimed by another consumer so lease_token is stale). Without a lease_token any PENDING message is completed.';

-- complete, batch form: ids[i] is completed when lease_tokens[i] still holds it.
CREATE OR REPLACE FUNCTION outbox_complete_batch(ids bigint[], lease_tokens uuid[] DEFAULT NULL) RETURNS integer
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_complete_batch_c';

COMMENT ON FUNCTION outbox_complete_batch(bigint[], uuid[]) IS
'Batch form of outbox_complete: returns how many of the messages this call completed.';

-- The batch form's name until 0.3.0, kept for one release. Deprecated: beside
-- outbox_complete(bigint, uuid) it makes outbox_complete($1) ambiguous for drivers that send
-- untyped parameters. Use outbox_complete_batch.
CREATE OR REPLACE FUNCTION outbox_complete(ids bigint[], lease_tokens uuid[] DEFAULT NULL) RETURNS integer
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_complete_batch_c';

COMMENT ON FUNCTION outbox_complete(bigint[], uuid[]) IS
'Deprecated name of outbox_complete_batch (removed in the next release).';

-- fail: the attempt failed; retry later or, out of attempts, dead-letter (src/policy.rs).
CREATE OR REPLACE FUNCTION outbox_fail(
    id          bigint,
    error       text,
    lease_token uuid     DEFAULT NULL,
    retry_in    interval DEFAULT NULL
) RETURNS text
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_fail_c';

COMMENT ON FUNCTION outbox_fail(bigint, text, uuid, interval) IS
'Records a failed attempt with its error. Returns PENDING (retried after the backoff, or after retry_in), DEAD (attempts reached outbox.max_attempts), or NULL when the caller no longer holds the message.';

-- Ordering keys (src/ordering): once the claimable message of a key has ended (DONE or DEAD)
-- or gone to the delivery worker, the oldest message waiting behind it becomes claimable.
-- Called by the functions that end messages, in the same transaction. Not for any role. The
-- rule and its locks are in src/ordering (key_locks.rs, release_messages.sql).
CREATE OR REPLACE FUNCTION outbox_release_keys(keys text[]) RETURNS integer
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_release_keys_c';

-- The same per endpoint: once the claimable delivery of a key at an endpoint has ended, the
-- oldest delivery waiting behind it becomes claimable (subscriptions and keys pairwise). The
-- rule is in src/ordering (release_deliveries.sql).
CREATE OR REPLACE FUNCTION outbox_release_delivery_keys(subscriptions bigint[], keys text[]) RETURNS integer
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_release_delivery_keys_c';
