-- The SQL API. Every function runs inside the caller's transaction and never commits: the
-- caller's COMMIT is what makes the business change and the work it owes durable together.
--
-- The functions run with the extension owner's rights (SECURITY DEFINER), so a role granted
-- outbox_producer or outbox_consumer needs no rights on the table (sql/privileges.sql). Their
-- search_path is pinned to pg_catalog and they reference the extension's objects as
-- @extschema@.name: nothing a caller puts on its search_path can stand in for an operator or
-- a function they use. Arguments are checked before anything is written:
-- NULL where a value is required is SQLSTATE 22004, a value out of range or ill-formed is 22023,
-- a string too long for its column is 22001. Messages name the function and the argument.

-- enqueue: record a message in the caller's transaction.
CREATE OR REPLACE FUNCTION outbox_enqueue(
    topic      text,
    payload    jsonb,
    delay      interval DEFAULT '0',
    dedupe_key text     DEFAULT NULL
) RETURNS outbox
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    message @extschema@.outbox;
BEGIN
    -- The check is a cheap expression; the function that explains what is wrong runs only
    -- when something is.
    IF outbox_enqueue.topic IS NULL OR NOT @extschema@.outbox_topic_is_valid(outbox_enqueue.topic) THEN
        PERFORM @extschema@.outbox_check_topic('outbox_enqueue', 'topic', outbox_enqueue.topic);
    END IF;
    IF outbox_enqueue.payload IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: payload must not be NULL'
            USING ERRCODE = 'null_value_not_allowed', HINT = 'Use ''{}''::jsonb for an empty payload.';
    END IF;
    IF outbox_enqueue.delay IS NULL THEN
        RAISE EXCEPTION 'outbox_enqueue: delay must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF outbox_enqueue.delay < interval '0' THEN
        RAISE EXCEPTION 'outbox_enqueue: delay must not be negative, got %', outbox_enqueue.delay
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- When this transaction commits, an idle delivery worker starts at once.
    PERFORM @extschema@.outbox_wake_worker_at_commit();

    IF outbox_enqueue.dedupe_key IS NULL THEN
        INSERT INTO @extschema@.outbox (topic, payload, available_at)
        VALUES (outbox_enqueue.topic, outbox_enqueue.payload, clock_timestamp() + outbox_enqueue.delay)
        RETURNING * INTO message;
        RETURN message;
    END IF;

    IF outbox_enqueue.dedupe_key = '' THEN
        RAISE EXCEPTION 'outbox_enqueue: dedupe_key must not be empty (pass NULL for no key)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(outbox_enqueue.dedupe_key) > 255 THEN
        RAISE EXCEPTION 'outbox_enqueue: dedupe_key is longer than 255 characters'
            USING ERRCODE = 'string_data_right_truncation';
    END IF;

    -- A concurrent producer with the same key makes the INSERT wait for its transaction:
    -- if it commits, ours does nothing and the SELECT (a new snapshot) sees its row; if it
    -- rolls back, ours inserts. The loop covers a row deleted between the two statements.
    LOOP
        INSERT INTO @extschema@.outbox (topic, payload, available_at, dedupe_key)
        VALUES (outbox_enqueue.topic, outbox_enqueue.payload,
                clock_timestamp() + outbox_enqueue.delay, outbox_enqueue.dedupe_key)
        ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
        RETURNING * INTO message;
        IF FOUND THEN
            RETURN message;
        END IF;

        SELECT * INTO message FROM @extschema@.outbox o WHERE o.dedupe_key = outbox_enqueue.dedupe_key;
        IF FOUND THEN
            RETURN message;
        END IF;
    END LOOP;
END
$$;

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
LANGUAGE plpgsql VOLATILE ROWS 10 SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    -- One reading of the clock for the whole claim: readiness is judged by it (not by the
    -- start of the caller's transaction) and, as a parameter, it lets the index seek.
    claimed_at   timestamptz := clock_timestamp();
    max_attempts integer;
    wanted_topic text;
BEGIN
    IF outbox_claim.batch_size IS NULL THEN
        RAISE EXCEPTION 'outbox_claim: batch_size must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF outbox_claim.batch_size < 1 OR outbox_claim.batch_size > 10000 THEN
        RAISE EXCEPTION 'outbox_claim: batch_size must be between 1 and 10000, got %', outbox_claim.batch_size
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_claim.topics IS NOT NULL THEN
        FOREACH wanted_topic IN ARRAY outbox_claim.topics LOOP
            PERFORM @extschema@.outbox_check_topic('outbox_claim', 'topics', wanted_topic);
        END LOOP;
    END IF;
    IF outbox_claim.lease <= interval '0' THEN
        RAISE EXCEPTION 'outbox_claim: lease must be positive, got %', outbox_claim.lease
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    max_attempts := @extschema@.outbox_max_attempts();

    IF outbox_claim.lease IS NULL THEN
        -- No lease: the rows stay locked until the caller's transaction ends, and nothing is
        -- written. The caller completes or fails them in that transaction (outbox_fail counts
        -- the attempt); if it rolls back or dies, they are as if never claimed.
        RETURN QUERY
        WITH ready AS (
            SELECT o AS message
              FROM @extschema@.outbox o
             WHERE o.status = 'PENDING'
               AND o.available_at <= claimed_at
               AND (outbox_claim.topics IS NULL OR o.topic = ANY (outbox_claim.topics))
             ORDER BY o.available_at, o.id
             LIMIT outbox_claim.batch_size
               FOR UPDATE SKIP LOCKED
        ),
        exhausted AS (
            UPDATE @extschema@.outbox o
               SET status = 'DEAD',
                   processed_at = claimed_at,
                   lease_token = NULL,
                   last_error = @extschema@.outbox_exhausted_error(o.attempts, max_attempts, o.lease_token, o.last_error)
              FROM ready
             WHERE o.id = (ready.message).id AND (ready.message).attempts >= max_attempts
        )
        SELECT (ready.message).* FROM ready
         WHERE (ready.message).attempts < max_attempts
         ORDER BY (ready.message).available_at, (ready.message).id;
        RETURN;
    END IF;

    RETURN QUERY
    WITH ready AS (
        SELECT o.id, o.available_at, o.attempts
          FROM @extschema@.outbox o
         WHERE o.status = 'PENDING'
           AND o.available_at <= claimed_at
           AND (outbox_claim.topics IS NULL OR o.topic = ANY (outbox_claim.topics))
         ORDER BY o.available_at, o.id
         LIMIT outbox_claim.batch_size
           FOR UPDATE SKIP LOCKED
    ),
    -- Out of attempts without an outcome: dead-letter instead of delivering again.
    exhausted AS (
        UPDATE @extschema@.outbox o
           SET status = 'DEAD',
               processed_at = claimed_at,
               lease_token = NULL,
               last_error = @extschema@.outbox_exhausted_error(o.attempts, max_attempts, o.lease_token, o.last_error)
          FROM ready
         WHERE o.id = ready.id AND ready.attempts >= max_attempts
    ),
    claimed AS (
        UPDATE @extschema@.outbox o
           SET attempts = o.attempts + 1,
               available_at = claimed_at + outbox_claim.lease,
               lease_token = gen_random_uuid()
          FROM ready
         WHERE o.id = ready.id AND ready.attempts < max_attempts
        RETURNING o AS message, ready.available_at AS ready_at
    )
    SELECT (claimed.message).* FROM claimed ORDER BY claimed.ready_at, (claimed.message).id;
END
$$;

COMMENT ON FUNCTION outbox_claim(integer, text[], interval) IS
'Claims up to batch_size ready PENDING messages (of the given topics, or all), oldest-ready first, with FOR UPDATE SKIP LOCKED. With a lease, each claim is a delivery: attempts += 1, a new lease_token, and available_at = clock + lease. With lease NULL the rows are only locked until the caller''s transaction ends.';

-- complete: the message was handled.
CREATE OR REPLACE FUNCTION outbox_complete(id bigint, lease_token uuid DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    IF outbox_complete.id IS NULL THEN
        RAISE EXCEPTION 'outbox_complete: id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;

    UPDATE @extschema@.outbox o
       SET status = 'DONE', processed_at = clock_timestamp()
     WHERE o.id = outbox_complete.id
       AND o.status = 'PENDING'
       AND (outbox_complete.lease_token IS NULL OR o.lease_token = outbox_complete.lease_token);
    RETURN FOUND;
END
$$;

COMMENT ON FUNCTION outbox_complete(bigint, uuid) IS
'Marks a PENDING message DONE. True when this call completed it; false when the caller no longer holds it (already done or dead, or re-claimed by another consumer so lease_token is stale). Without a lease_token any PENDING message is completed.';

-- complete, batch form: ids[i] is completed when lease_tokens[i] still holds it.
CREATE OR REPLACE FUNCTION outbox_complete(ids bigint[], lease_tokens uuid[] DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    completed integer;
BEGIN
    IF ids IS NULL THEN
        RAISE EXCEPTION 'outbox_complete: ids must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF array_position(ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'outbox_complete: ids must not contain NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF lease_tokens IS NOT NULL AND cardinality(lease_tokens) <> cardinality(ids) THEN
        RAISE EXCEPTION 'outbox_complete: lease_tokens has % elements but ids has %',
                cardinality(lease_tokens), cardinality(ids)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    WITH done AS (
        UPDATE @extschema@.outbox o
           SET status = 'DONE', processed_at = clock_timestamp()
          FROM unnest(ids, lease_tokens) AS wanted(id, lease_token)
         WHERE o.id = wanted.id
           AND o.status = 'PENDING'
           AND (wanted.lease_token IS NULL OR o.lease_token = wanted.lease_token)
        RETURNING 1
    )
    SELECT count(*) INTO completed FROM done;
    RETURN completed;
END
$$;

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
