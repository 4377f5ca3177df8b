-- The SQL API. Every function runs inside the caller's transaction and never commits: the
-- caller's COMMIT is what makes the business change and the work it owes durable together.
--
-- The functions run with the extension owner's rights (SECURITY DEFINER), so a role granted
-- outbox_producer or outbox_consumer needs no rights on the table (sql/privileges.sql).
-- Nothing a caller puts on its search_path can stand in for an operator or a function they
-- use: the PL/pgSQL and SQL ones pin search_path to pg_catalog and reference the extension's
-- objects as @extschema@.name, the C ones (below) qualify every name in their statements.
-- Arguments are checked before anything is written:
-- NULL where a value is required is SQLSTATE 22004, a value out of range or ill-formed is 22023,
-- a string too long for its column is 22001. Messages name the function and the argument.

-- enqueue: record a message in the caller's transaction. outbox_enqueue, outbox_claim and
-- outbox_complete are written in Rust (src/hot_path/): they run in every producer's and
-- consumer's transaction, and C functions with plans kept per session cost less than the
-- PL/pgSQL ones they replaced (bench/README.md). They have no SET search_path: their statements (sql/hot_path/) name every
-- schema, function and operator in full instead, so a caller's search_path cannot change what
-- they run. A concurrent producer with the same dedupe_key waits for the first one's
-- transaction, then gets its message.
CREATE OR REPLACE FUNCTION outbox_enqueue(
    topic      text,
    payload    jsonb,
    delay      interval DEFAULT '0',
    dedupe_key text     DEFAULT NULL
) RETURNS outbox
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_enqueue_c';

COMMENT ON FUNCTION outbox_enqueue(text, jsonb, interval, text) IS
'Records a message in the caller''s transaction (never commits). delay schedules it for later; a dedupe_key already present returns the existing message instead of a second one.';

-- enqueue, batch form: many messages of one topic in one statement.
CREATE OR REPLACE FUNCTION outbox_enqueue_batch(
    topic    text,
    payloads jsonb[],
    delay    interval DEFAULT '0'
) RETURNS SETOF outbox
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    PERFORM @extschema@.outbox_check_topic('outbox_enqueue_batch', 'topic', outbox_enqueue_batch.topic);
    IF outbox_enqueue_batch.payloads IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue_batch: payloads must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF array_position(outbox_enqueue_batch.payloads, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'outbox_enqueue_batch: payloads must not contain NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF outbox_enqueue_batch.delay IS NULL OR outbox_enqueue_batch.delay < interval '0' THEN
        RAISE EXCEPTION 'outbox_enqueue_batch: delay must be zero or positive, got %', coalesce(outbox_enqueue_batch.delay::text, 'NULL')
            USING ERRCODE = CASE WHEN outbox_enqueue_batch.delay IS NULL THEN 'null_value_not_allowed' ELSE 'invalid_parameter_value' END;
    END IF;
    PERFORM @extschema@.outbox_wake_worker_at_commit();

    RETURN QUERY
    INSERT INTO @extschema@.outbox (topic, payload, available_at)
    SELECT outbox_enqueue_batch.topic, p.payload, clock_timestamp() + outbox_enqueue_batch.delay
      FROM unnest(outbox_enqueue_batch.payloads) WITH ORDINALITY AS p(payload, n)
     ORDER BY p.n
    RETURNING *;
END
$$;

COMMENT ON FUNCTION outbox_enqueue_batch(text, jsonb[], interval) IS
'Records one message per payload, in order, in the caller''s transaction (never commits); returns the new rows.';

-- Why claim dead-letters a message instead of delivering it: out of attempts without an
-- outcome, because the last consumer's lease ran out (it crashed or hung), or because
-- outbox.max_attempts was lowered.
CREATE OR REPLACE FUNCTION outbox_exhausted_error(attempts integer, max_attempts integer, lease_token uuid, last_error text)
RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN CASE
           WHEN lease_token IS NOT NULL THEN
               format('lease expired without an outcome after %s deliveries (did the consumer crash?)', attempts)
           ELSE
               format('attempts (%s) reached outbox.max_attempts (%s)', attempts, max_attempts)
       END || coalesce('; last error: ' || last_error, '');

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
CREATE OR REPLACE FUNCTION outbox_complete(ids bigint[], lease_tokens uuid[] DEFAULT NULL) RETURNS integer
LANGUAGE c VOLATILE SECURITY DEFINER
AS 'MODULE_PATHNAME', 'outbox_complete_batch_c';

COMMENT ON FUNCTION outbox_complete(bigint[], uuid[]) IS
'Batch form of outbox_complete: returns how many of the messages this call completed.';

-- fail: the attempt failed; retry later or, out of attempts, dead-letter.
CREATE OR REPLACE FUNCTION outbox_fail(
    id          bigint,
    error       text,
    lease_token uuid     DEFAULT NULL,
    retry_in    interval DEFAULT NULL
) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    max_attempts integer;
    new_status   text;
BEGIN
    IF outbox_fail.id IS NULL THEN
        RAISE EXCEPTION 'outbox_fail: id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF outbox_fail.error IS NULL THEN
        RAISE EXCEPTION 'outbox_fail: error must not be NULL (say what went wrong)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF outbox_fail.retry_in < interval '0' THEN
        RAISE EXCEPTION 'outbox_fail: retry_in must not be negative, got %', outbox_fail.retry_in
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    max_attempts := @extschema@.outbox_max_attempts();

    -- A claim with a lease counted this attempt already (and left its token on the row); one
    -- without (lease NULL), or a failure recorded without any claim, is counted here: that is
    -- the (lease_token IS NULL)::integer.
    UPDATE @extschema@.outbox o
       SET attempts = o.attempts + (o.lease_token IS NULL)::integer,
           status = CASE WHEN o.attempts + (o.lease_token IS NULL)::integer >= max_attempts
                         THEN 'DEAD'::@extschema@.outbox_status ELSE 'PENDING' END,
           processed_at = CASE WHEN o.attempts + (o.lease_token IS NULL)::integer >= max_attempts THEN clock_timestamp() END,
           available_at = CASE
               WHEN o.attempts + (o.lease_token IS NULL)::integer >= max_attempts THEN o.available_at
               ELSE clock_timestamp() + coalesce(outbox_fail.retry_in, @extschema@.outbox_backoff(o.attempts + (o.lease_token IS NULL)::integer))
           END,
           -- Errors are kept whole up to 4 kB: enough to diagnose, bounded so that a
           -- consumer failing with a huge message cannot bloat the table.
           last_error = left(outbox_fail.error, 4096),
           -- The holder's token dies with the attempt: a late complete() cannot undo this.
           lease_token = NULL
     WHERE o.id = outbox_fail.id
       AND o.status = 'PENDING'
       AND (outbox_fail.lease_token IS NULL OR o.lease_token = outbox_fail.lease_token)
    RETURNING o.status INTO new_status;
    RETURN new_status;
END
$$;

COMMENT ON FUNCTION outbox_fail(bigint, text, uuid, interval) IS
'Records a failed attempt with its error. Returns PENDING (retried after the backoff, or after retry_in), DEAD (attempts reached outbox.max_attempts), or NULL when the caller no longer holds the message.';
