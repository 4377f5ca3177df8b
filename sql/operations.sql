-- Operating the outbox: the numbers to watch, dead-letter repair, housekeeping.
-- These functions run with the extension owner's rights (SECURITY DEFINER) and are granted to
-- outbox_admin (and the statistics to pg_monitor), not to PUBLIC. Each pins
-- search_path = pg_catalog, pg_temp, names the extension's objects as @extschema@.name and
-- passes every argument with its type, so that no look-alike (an operator, or an overload of
-- one of these functions in the extension's schema) is ever chosen over what is meant.

-- The four numbers (and a few more), per topic and in total (the row whose topic is NULL).
-- Reads pending rows through outbox_ready_idx and finished ones through outbox_processed_idx,
-- so it stays cheap with millions of DONE rows.
CREATE OR REPLACE FUNCTION outbox_stats() RETURNS TABLE (
    topic                 text,
    pending               bigint,    -- PENDING messages: the depth
    ready                 bigint,    -- ... of which claimable now
    in_flight             bigint,    -- ... of which held by a consumer under a live lease
    retrying              bigint,    -- ... of which failed before and wait for a retry
    dead                  bigint,    -- DEAD messages: somebody should look
    oldest_ready_age      interval,  -- how long the oldest ready message has been waiting
    oldest_pending_age    interval,  -- age of the oldest PENDING message
    completed_last_minute bigint     -- DONE in the last minute: the drain rate
)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock_now timestamptz := clock_timestamp();
BEGIN
    RETURN QUERY
    WITH live AS (
        SELECT o.topic, o.status, o.attempts, o.available_at, o.created_at, o.lease_token, o.processed_at
          FROM @extschema@.outbox o
         WHERE o.status = 'PENDING'
        UNION ALL
        SELECT o.topic, o.status, o.attempts, o.available_at, o.created_at, o.lease_token, o.processed_at
          FROM @extschema@.outbox o
         WHERE o.status = 'DEAD'
        UNION ALL
        SELECT o.topic, o.status, o.attempts, o.available_at, o.created_at, o.lease_token, o.processed_at
          FROM @extschema@.outbox o
         WHERE o.status = 'DONE' AND o.processed_at > clock_now - interval '1 minute'
    )
    SELECT l.topic::text,
           count(*) FILTER (WHERE l.status = 'PENDING'),
           count(*) FILTER (WHERE l.status = 'PENDING' AND l.available_at <= clock_now),
           count(*) FILTER (WHERE l.status = 'PENDING' AND l.available_at > clock_now AND l.lease_token IS NOT NULL),
           count(*) FILTER (WHERE l.status = 'PENDING' AND l.attempts > 0 AND l.lease_token IS NULL),
           count(*) FILTER (WHERE l.status = 'DEAD'),
           clock_now - min(l.available_at) FILTER (WHERE l.status = 'PENDING' AND l.available_at <= clock_now),
           clock_now - min(l.created_at) FILTER (WHERE l.status = 'PENDING'),
           count(*) FILTER (WHERE l.status = 'DONE')
      FROM live l
     GROUP BY GROUPING SETS ((l.topic), ())
     ORDER BY l.topic NULLS FIRST;
END
$$;

COMMENT ON FUNCTION outbox_stats() IS
'Queue depth, ready, in flight, retrying and dead counts, the age of the oldest ready and pending messages, and the last minute''s completions, per topic and in total (topic NULL).';

-- For monitoring roles and exporters: SELECT * FROM outbox_monitoring.
CREATE OR REPLACE VIEW outbox_monitoring AS SELECT * FROM outbox_stats();

-- requeue: give dead messages a new life (attempts from 0, ready now). last_error is kept
-- until the next failure, as a record of why it died.
CREATE OR REPLACE FUNCTION outbox_requeue_dead(ids bigint[], topic text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    requeued integer;
BEGIN
    UPDATE @extschema@.outbox o
       SET status = 'PENDING', attempts = 0, available_at = clock_timestamp(),
           processed_at = NULL, lease_token = NULL
     WHERE o.status = 'DEAD'
       AND (outbox_requeue_dead.ids IS NULL OR o.id = ANY (outbox_requeue_dead.ids))
       AND (outbox_requeue_dead.topic IS NULL OR o.topic = outbox_requeue_dead.topic);
    GET DIAGNOSTICS requeued = ROW_COUNT;
    IF requeued > 0 THEN
        PERFORM @extschema@.outbox_wake_worker_at_commit();
    END IF;
    RETURN requeued;
END
$$;

CREATE OR REPLACE FUNCTION outbox_requeue(id bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'outbox_requeue: id must not be NULL (outbox_requeue_all() requeues every dead letter)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN @extschema@.outbox_requeue_dead(ARRAY[id]::bigint[], NULL::text);
END
$$;

CREATE OR REPLACE FUNCTION outbox_requeue(topic text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.outbox_check_topic('outbox_requeue'::text, 'topic'::text, topic::text);
    RETURN @extschema@.outbox_requeue_dead(NULL::bigint[], topic::text);
END
$$;

CREATE OR REPLACE FUNCTION outbox_requeue_all() RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN @extschema@.outbox_requeue_dead(NULL::bigint[], NULL::text);

COMMENT ON FUNCTION outbox_requeue(bigint) IS 'Puts the DEAD message back to PENDING with attempts reset; returns 1, or 0 when it is not dead.';
COMMENT ON FUNCTION outbox_requeue(text) IS 'Puts every DEAD message of the topic back to PENDING with attempts reset; returns how many.';
COMMENT ON FUNCTION outbox_requeue_all() IS 'Puts every DEAD message back to PENDING with attempts reset; returns how many.';

-- discard: delete dead letters that are not worth retrying.
CREATE OR REPLACE FUNCTION outbox_discard_dead(ids bigint[], topic text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    discarded integer;
BEGIN
    DELETE FROM @extschema@.outbox o
     WHERE o.status = 'DEAD'
       AND (outbox_discard_dead.ids IS NULL OR o.id = ANY (outbox_discard_dead.ids))
       AND (outbox_discard_dead.topic IS NULL OR o.topic = outbox_discard_dead.topic);
    GET DIAGNOSTICS discarded = ROW_COUNT;
    RETURN discarded;
END
$$;

CREATE OR REPLACE FUNCTION outbox_discard(id bigint) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF id IS NULL THEN
        RAISE EXCEPTION 'outbox_discard: id must not be NULL (outbox_discard_all() discards every dead letter)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    RETURN @extschema@.outbox_discard_dead(ARRAY[id]::bigint[], NULL::text);
END
$$;

CREATE OR REPLACE FUNCTION outbox_discard(topic text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM @extschema@.outbox_check_topic('outbox_discard'::text, 'topic'::text, topic::text);
    RETURN @extschema@.outbox_discard_dead(NULL::bigint[], topic::text);
END
$$;

CREATE OR REPLACE FUNCTION outbox_discard_all() RETURNS integer
LANGUAGE sql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
RETURN @extschema@.outbox_discard_dead(NULL::bigint[], NULL::text);

COMMENT ON FUNCTION outbox_discard(bigint) IS 'Deletes the DEAD message; returns 1, or 0 when it is not dead.';
COMMENT ON FUNCTION outbox_discard(text) IS 'Deletes every DEAD message of the topic; returns how many.';
COMMENT ON FUNCTION outbox_discard_all() IS 'Deletes every DEAD message; returns how many.';

-- purge: delete DONE rows (and DEAD ones, when asked) finished longer than older_than ago,
-- at most max_rows of them, oldest first. Bounded so no call holds its row locks or its
-- transaction for long: call it again until it returns less than max_rows (the delivery
-- worker does, every minute, with outbox.retention).
CREATE OR REPLACE FUNCTION outbox_purge(older_than interval, include_dead boolean DEFAULT false, max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    cutoff   timestamptz;
    purged   bigint := 0;
    deleted  bigint;
    finished @extschema@.outbox_status;
BEGIN
    IF older_than IS NULL THEN
        RAISE EXCEPTION 'outbox_purge: older_than must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF older_than < interval '0' THEN
        RAISE EXCEPTION 'outbox_purge: older_than must not be negative, got %', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF include_dead IS NULL THEN
        RAISE EXCEPTION 'outbox_purge: include_dead must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_rows IS NULL OR max_rows < 1 OR max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox_purge: max_rows must be between 1 and 1000000, got %', max_rows
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    cutoff := clock_timestamp() - older_than;
    FOREACH finished IN ARRAY CASE WHEN include_dead THEN '{DONE,DEAD}'::@extschema@.outbox_status[] ELSE '{DONE}' END LOOP
        EXIT WHEN purged >= max_rows;
        DELETE FROM @extschema@.outbox o
         WHERE o.ctid = ANY (ARRAY(
                   SELECT d.ctid FROM @extschema@.outbox d
                    WHERE d.status = finished AND d.processed_at < cutoff
                    ORDER BY d.processed_at
                    LIMIT max_rows - purged))
           -- Re-checked on the row actually deleted (a dead letter requeued meanwhile stays).
           AND o.status = finished AND o.processed_at < cutoff;
        GET DIAGNOSTICS deleted = ROW_COUNT;
        purged := purged + deleted;
    END LOOP;
    RETURN purged;
END
$$;

COMMENT ON FUNCTION outbox_purge(interval, boolean, integer) IS
'Deletes up to max_rows DONE messages (and DEAD ones with include_dead) processed longer than older_than ago, oldest first; returns how many. Call again until it returns less than max_rows.';
