-- Managing subscriptions: which endpoints the delivery worker sends each topic's messages to
-- (the table outbox_subscription and the view outbox_subscriptions are in sql/schema.sql). For
-- administrators only (sql/privileges.sql): an endpoint is a place the server sends data to.
-- Like sql/operations.sql: SECURITY DEFINER, search_path pinned, every argument typed.

-- subscribe: add an endpoint for a topic, or change the one with the same (topic, url).
CREATE OR REPLACE FUNCTION outbox_subscribe(
    topic   text,
    url     text,
    secret  text     DEFAULT NULL,
    headers jsonb    DEFAULT '{}',
    timeout interval DEFAULT NULL,
    enabled boolean  DEFAULT true
) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    subscription_id bigint;
BEGIN
    PERFORM @extschema@.outbox_check_topic('outbox_subscribe'::text, 'topic'::text, outbox_subscribe.topic::text);
    PERFORM @extschema@.outbox_check_subscription(outbox_subscribe.url::text, outbox_subscribe.secret::text, outbox_subscribe.headers::jsonb);
    IF outbox_subscribe.timeout IS NOT NULL
       AND outbox_subscribe.timeout NOT BETWEEN interval '100 milliseconds' AND interval '10 minutes' THEN
        RAISE EXCEPTION 'outbox_subscribe: timeout must be between 100 milliseconds and 10 minutes, got %', outbox_subscribe.timeout
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF outbox_subscribe.enabled IS NULL THEN
        RAISE EXCEPTION 'outbox_subscribe: enabled must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;

    INSERT INTO @extschema@.outbox_subscription AS s (topic, url, secret, headers, timeout, enabled)
    VALUES (outbox_subscribe.topic, outbox_subscribe.url, outbox_subscribe.secret,
            coalesce(outbox_subscribe.headers, '{}'), outbox_subscribe.timeout, outbox_subscribe.enabled)
    ON CONFLICT (topic, url) DO UPDATE
       SET secret = EXCLUDED.secret, headers = EXCLUDED.headers,
           timeout = EXCLUDED.timeout, enabled = EXCLUDED.enabled
    RETURNING s.id INTO subscription_id;
    RETURN subscription_id;
END
$$;

COMMENT ON FUNCTION outbox_subscribe(text, text, text, jsonb, interval, boolean) IS
'Sends the topic''s messages to url (http or https), signed with secret (whsec_… form; see outbox_generate_secret()) when given, with extra headers and a per-endpoint timeout. Re-subscribing the same (topic, url) updates it. Returns the subscription id.';

-- unsubscribe: stop sending a topic to one endpoint (or, without url, to all).
CREATE OR REPLACE FUNCTION outbox_unsubscribe(topic text, url text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    removed integer;
BEGIN
    PERFORM @extschema@.outbox_check_topic('outbox_unsubscribe'::text, 'topic'::text, outbox_unsubscribe.topic::text);
    DELETE FROM @extschema@.outbox_subscription s
     WHERE s.topic = outbox_unsubscribe.topic
       AND (outbox_unsubscribe.url IS NULL OR s.url = outbox_unsubscribe.url);
    GET DIAGNOSTICS removed = ROW_COUNT;
    RETURN removed;
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
     WHERE s.enabled
     GROUP BY s.topic
     ORDER BY s.topic
$$;
