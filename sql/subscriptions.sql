-- Managing subscriptions: which endpoints the delivery worker sends each topic's messages to
-- (the table outbox_subscription and the view outbox_subscriptions are in sql/schema.sql). For
-- administrators only (sql/privileges.sql): an endpoint is a place the server sends data to.
-- Like sql/operations.sql: SECURITY DEFINER, search_path pinned, every argument typed.

-- subscribe: add an endpoint for a topic, or change the one with the same (topic, url).
CREATE OR REPLACE FUNCTION outbox_subscribe(
    topic         text,
    url           text,
    secret        text             DEFAULT NULL,
    headers       jsonb            DEFAULT '{}',
    timeout       interval         DEFAULT NULL,
    enabled       boolean          DEFAULT true,
    rate_limit    double precision DEFAULT NULL,
    max_in_flight integer          DEFAULT NULL
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    subscription_id bigint;
    parked_id       bigint;
BEGIN
    PERFORM @extschema@.outbox_check_topic('outbox_subscribe'::text, 'topic'::text, outbox_subscribe.topic::text);
    PERFORM @extschema@.outbox_check_subscription(outbox_subscribe.url::text, outbox_subscribe.secret::text, outbox_subscribe.headers::jsonb);
    PERFORM @extschema@.outbox_check_destination(outbox_subscribe.url::text);
    -- The worker waits EXTRACT(epoch ...) seconds (a year as 365.25 days); intervals compare with
    -- a year as 360 days: '1 year -360 days 5 seconds' must pass both ways (it is 5 days).
    IF outbox_subscribe.timeout IS NOT NULL
       AND (outbox_subscribe.timeout NOT BETWEEN interval '100 milliseconds' AND interval '10 minutes'
            OR EXTRACT(epoch FROM outbox_subscribe.timeout) NOT BETWEEN 0.1 AND 600) THEN
        RAISE EXCEPTION 'outbox_subscribe: timeout must be between 100 milliseconds and 10 minutes, got %', outbox_subscribe.timeout
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_subscribe.enabled IS NULL THEN
        RAISE EXCEPTION 'outbox_subscribe: enabled must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF NOT outbox_subscribe.rate_limit > 0 OR outbox_subscribe.rate_limit IN ('Infinity', 'NaN') THEN
        RAISE EXCEPTION 'outbox_subscribe: rate_limit must be a positive number of messages per second (NULL: no limit), got %', outbox_subscribe.rate_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_subscribe.max_in_flight < 1 THEN
        RAISE EXCEPTION 'outbox_subscribe: max_in_flight must be at least 1 (NULL: the worker''s share), got %', outbox_subscribe.max_in_flight
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- Enabling a disabled subscription: as outbox_enable_subscription does (its parked
    -- deliveries due at once; 0.5.32 and earlier left them on their backoff), then the rest.
    SELECT s.id INTO parked_id
      FROM @extschema@.outbox_subscription s
     WHERE s.topic = outbox_subscribe.topic AND s.url = outbox_subscribe.url AND NOT s.enabled;
    IF parked_id IS NOT NULL AND outbox_subscribe.enabled THEN
        PERFORM @extschema@.outbox_enable_subscription(parked_id);
    END IF;
    INSERT INTO @extschema@.outbox_subscription AS s (topic, url, secret, headers, timeout, enabled, rate_limit, max_in_flight,
                                                      disabled_reason)
    VALUES (outbox_subscribe.topic, outbox_subscribe.url, outbox_subscribe.secret,
            coalesce(outbox_subscribe.headers, '{}'), outbox_subscribe.timeout, outbox_subscribe.enabled,
            outbox_subscribe.rate_limit, outbox_subscribe.max_in_flight,
            CASE WHEN NOT outbox_subscribe.enabled THEN 'subscribed disabled' END)
    ON CONFLICT (topic, url) DO UPDATE
       SET secret = EXCLUDED.secret, headers = EXCLUDED.headers, timeout = EXCLUDED.timeout,
           enabled = EXCLUDED.enabled, rate_limit = EXCLUDED.rate_limit, max_in_flight = EXCLUDED.max_in_flight,
           disabled_reason = CASE WHEN EXCLUDED.enabled THEN NULL ELSE coalesce(s.disabled_reason, EXCLUDED.disabled_reason) END,
           failing_since = CASE WHEN EXCLUDED.enabled AND NOT s.enabled THEN NULL ELSE s.failing_since END,
           previous_secret = NULL, previous_secret_until = NULL
    RETURNING s.id INTO subscription_id;
    PERFORM @extschema@.outbox_wake_worker_at_commit();
    RETURN subscription_id;
END
$$;

COMMENT ON FUNCTION outbox_subscribe(text, text, text, jsonb, interval, boolean, double precision, integer) IS
'Sends the topic''s messages to url (http or https), signed with secret (whsec_... form; see outbox_generate_secret()) when given, with extra headers, a per-endpoint timeout, and at most rate_limit requests per second and max_in_flight at once (NULL: no limit). enabled false parks its deliveries until outbox_enable_subscription. Re-subscribing the same (topic, url) updates it. Returns the subscription id.';

-- The subscription with this id, locked, or an error naming the function (22004, 22023). Locked
-- FOR NO KEY UPDATE, as the updates that follow lock it: the worker's new deliveries of it (their
-- foreign key's FOR KEY SHARE) go on meanwhile. FOR UPDATE held them back until the caller's
-- transaction ended, and an operator's transaction that went on to wait for the worker then
-- deadlocked with it (stop 43's probe).
CREATE OR REPLACE FUNCTION outbox_subscription_for_update(function_name text, argument_name text, subscription_id bigint)
RETURNS @extschema@.outbox_subscription
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    found_subscription @extschema@.outbox_subscription;
BEGIN
    IF subscription_id IS NULL THEN
        RAISE EXCEPTION '%: % must not be NULL', function_name, argument_name
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT * INTO found_subscription
      FROM @extschema@.outbox_subscription s
     WHERE s.id = subscription_id
       FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION '%: % % is not a subscription', function_name, argument_name, subscription_id
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'SELECT id, topic, url FROM outbox_subscriptions lists them.';
    END IF;
    RETURN found_subscription;
END
$$;

-- disable: park an endpoint by hand. Its deliveries are kept, not attempted and not
-- dead-lettered; new messages of its topic still get one for it.
CREATE OR REPLACE FUNCTION outbox_disable_subscription(id bigint, reason text DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    subscription @extschema@.outbox_subscription;
BEGIN
    -- (As bounded as the errors the worker records: the reason is shown wherever the endpoint is.)
    IF pg_catalog.length(outbox_disable_subscription.reason) > 4096 THEN
        RAISE EXCEPTION 'outbox_disable_subscription: reason must be at most 4096 characters, got %',
                pg_catalog.length(outbox_disable_subscription.reason)
            USING ERRCODE = 'string_data_right_truncation';
    END IF;
    -- (Shown as why the endpoint is disabled, in psql as anywhere: one line, saying something.)
    IF pg_catalog.btrim(outbox_disable_subscription.reason) = '' THEN
        RAISE EXCEPTION 'outbox_disable_subscription: reason must not be empty (NULL says who disabled it)'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_disable_subscription.reason OPERATOR(pg_catalog.~) '[[:cntrl:]]' THEN
        RAISE EXCEPTION 'outbox_disable_subscription: reason must be one line without control characters, got one at position %',
                pg_catalog.regexp_instr(outbox_disable_subscription.reason, '[[:cntrl:]]')
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    subscription := @extschema@.outbox_subscription_for_update('outbox_disable_subscription'::text, 'id'::text, outbox_disable_subscription.id);
    IF NOT subscription.enabled THEN
        RETURN false;
    END IF;
    UPDATE @extschema@.outbox_subscription s
       SET enabled = false,
           disabled_reason = coalesce(outbox_disable_subscription.reason, 'disabled by ' || session_user)
     WHERE s.id = subscription.id;
    PERFORM @extschema@.outbox_wake_worker_at_commit();
    RETURN true;
END
$$;

COMMENT ON FUNCTION outbox_disable_subscription(bigint, text) IS
'Disables the endpoint: its deliveries are parked (kept, not attempted, no attempt used) until outbox_enable_subscription. Returns false when it was already disabled.';

-- enable: resume an endpoint and its parked deliveries (due now, their attempts kept).
CREATE OR REPLACE FUNCTION outbox_enable_subscription(id bigint) RETURNS boolean
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    subscription @extschema@.outbox_subscription;
BEGIN
    subscription := @extschema@.outbox_subscription_for_update('outbox_enable_subscription'::text, 'id'::text, outbox_enable_subscription.id);
    IF subscription.enabled THEN
        RETURN false;
    END IF;
    UPDATE @extschema@.outbox_subscription s
       SET enabled = true, disabled_reason = NULL, failing_since = NULL
     WHERE s.id = subscription.id;
    UPDATE ONLY @extschema@.outbox_delivery d
       SET available_at = clock_timestamp()
     WHERE d.subscription_id = subscription.id
       AND d.status = 'PENDING'::@extschema@.outbox_status
       AND d.waiting_for IS NULL
       AND NOT d.leased
       AND d.available_at > clock_timestamp();
    PERFORM @extschema@.outbox_wake_worker_at_commit();
    RETURN true;
END
$$;

COMMENT ON FUNCTION outbox_enable_subscription(bigint) IS
'Enables the endpoint again: its parked deliveries are due at once (with the attempts they had). Returns false when it was already enabled.';

-- rotate: a new secret for an endpoint, with a time when requests carry both signatures.
CREATE OR REPLACE FUNCTION outbox_rotate_secret(
    subscription_id bigint,
    new_secret      text     DEFAULT NULL,
    overlap         interval DEFAULT '24 hours'
) RETURNS text
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    subscription  @extschema@.outbox_subscription;
    chosen_secret text := coalesce(outbox_rotate_secret.new_secret, @extschema@.outbox_generate_secret());
    called_at        timestamptz;
    old_secret_until timestamptz;
BEGIN
    subscription := @extschema@.outbox_subscription_for_update('outbox_rotate_secret'::text, 'subscription_id'::text, outbox_rotate_secret.subscription_id);
    IF outbox_rotate_secret.overlap IS NULL THEN
        RAISE EXCEPTION 'outbox_rotate_secret: overlap must not be NULL (''0'' ends the old secret at once)'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM @extschema@.outbox_check_interval('outbox_rotate_secret'::text, 'overlap'::text, outbox_rotate_secret.overlap::interval);
    -- Judged by where it takes the clock (as every interval argument): compared as an interval,
    -- '-12 months 361 days' is a day, but it ends the old secret days ago.
    called_at := clock_timestamp();
    BEGIN
        old_secret_until := called_at + outbox_rotate_secret.overlap;
    EXCEPTION WHEN datetime_field_overflow THEN
        old_secret_until := '-infinity';  -- before 4713 BC: negative
    END;
    IF old_secret_until < called_at THEN
        RAISE EXCEPTION 'outbox_rotate_secret: overlap must not be negative, got %', outbox_rotate_secret.overlap
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM @extschema@.outbox_check_new_secret(chosen_secret);
    UPDATE @extschema@.outbox_subscription s
       SET secret = chosen_secret,
           previous_secret = CASE WHEN old_secret_until > called_at THEN subscription.secret END,
           previous_secret_until = CASE WHEN old_secret_until > called_at AND subscription.secret IS NOT NULL
                                        THEN old_secret_until END
     WHERE s.id = subscription.id;
    PERFORM @extschema@.outbox_wake_worker_at_commit();
    RETURN chosen_secret;
END
$$;

COMMENT ON FUNCTION outbox_rotate_secret(bigint, text, interval) IS
'Gives the endpoint a new secret (new_secret, or a generated one) and returns it. For overlap, every request carries signatures by both the old and the new secret (webhook-signature holds both, space-separated), so the receiver can switch at any time in between; after it, only the new one.';

-- unsubscribe: stop sending a topic to one endpoint (or, without url, to all).
--
-- Removing a subscription removes its deliveries (their foreign key cascades): the subscription
-- first, then the deliveries. A step of the delivery worker takes them the other way round: it
-- records answers (locking their deliveries), then makes deliveries of newer messages (whose
-- foreign key waits for the subscription). The two could wait for each other until PostgreSQL
-- failed one of them (40P01). So each try here waits only briefly for a lock (100 ms, or half of
-- deadlock_timeout if that is less: PostgreSQL looks for a deadlock after deadlock_timeout, and
-- this must step back first); past that, it steps back (to its savepoint, letting go of
-- everything) and tries again once the worker's step has ended. The caller's lock_timeout, if
-- set, bounds the whole: its last try waits for what is left of it. Without one, the 50th try
-- waits as long as it takes.
CREATE OR REPLACE FUNCTION outbox_unsubscribe(topic text, url text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
-- The deliveries go with the subscription by their foreign key's cascade, which a session in
-- session_replication_role = replica (a superuser's) skips: they stayed, orphaned, their
-- messages waiting for them for good (stop 56's probe).
SET session_replication_role = origin
AS $$
#variable_conflict use_column
DECLARE
    removed integer;
    callers_lock_timeout text := pg_catalog.current_setting('lock_timeout');
    callers_lock_timeout_ms bigint := (SELECT p.setting::bigint FROM pg_catalog.pg_settings p WHERE p.name = 'lock_timeout');
    deadlock_timeout_ms bigint := (SELECT p.setting::bigint FROM pg_catalog.pg_settings p WHERE p.name = 'deadlock_timeout');
    brief_ms bigint;
    left_ms bigint;
    started timestamptz := pg_catalog.clock_timestamp();
    tries integer := 0;
    last_try boolean := false;
BEGIN
    PERFORM @extschema@.outbox_check_topic('outbox_unsubscribe'::text, 'topic'::text, outbox_unsubscribe.topic::text);
    brief_ms := GREATEST(LEAST(100, deadlock_timeout_ms / 2), 1);
    LOOP
        tries := tries + 1;
        IF callers_lock_timeout_ms > 0 THEN
            left_ms := callers_lock_timeout_ms
                       - (EXTRACT(epoch FROM pg_catalog.clock_timestamp() - started) * 1000)::bigint;
            last_try := left_ms <= brief_ms;
        ELSE
            last_try := tries >= 50;
        END IF;
        BEGIN
            IF last_try AND callers_lock_timeout_ms > 0 THEN
                PERFORM pg_catalog.set_config('lock_timeout', GREATEST(left_ms, 1)::text || 'ms', true);
            ELSIF NOT last_try THEN
                PERFORM pg_catalog.set_config('lock_timeout', brief_ms::text || 'ms', true);
            END IF;
            DELETE FROM @extschema@.outbox_subscription s
             WHERE s.topic = outbox_unsubscribe.topic
               AND (outbox_unsubscribe.url IS NULL OR s.url = outbox_unsubscribe.url);
            GET DIAGNOSTICS removed = ROW_COUNT;
            PERFORM pg_catalog.set_config('lock_timeout', callers_lock_timeout, true);
            RETURN removed;
        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
            IF last_try THEN
                RAISE;
            END IF;
        END;
        PERFORM pg_catalog.pg_sleep(0.01 * LEAST(tries, 20));
    END LOOP;
END
$$;

COMMENT ON FUNCTION outbox_unsubscribe(text, text) IS
'Removes the subscription of topic to url, or all of the topic''s subscriptions when url is NULL. Returns how many were removed.';

-- The topics the worker delivers (the SQL twin of a worker's --list-topics): messages of any
-- other topic stay PENDING, untouched. Readable without rights on the subscriptions.
CREATE OR REPLACE FUNCTION outbox_topics() RETURNS TABLE (topic text, endpoints integer)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.topic::text, count(*)::integer
      FROM @extschema@.outbox_subscription s
     GROUP BY s.topic
     ORDER BY s.topic
$$;
