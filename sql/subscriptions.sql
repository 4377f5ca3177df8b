-- Subscriptions: which endpoints the delivery worker sends each topic's messages to.
--
-- An endpoint is a place the server will send data to, and a secret signs what it sends, so
-- only administrators may manage them (sql/privileges.sql). The view outbox_subscriptions
-- shows no secrets and only the names of extra headers (they may carry credentials).
CREATE TABLE outbox_subscription (
    id         bigserial   PRIMARY KEY,
    topic      varchar(64) NOT NULL CHECK (outbox_topic_is_valid(topic)),
    url        text        NOT NULL,
    secret     text,
    headers    jsonb       NOT NULL DEFAULT '{}',
    -- NULL: outbox.http_timeout.
    timeout    interval    CHECK (timeout BETWEEN interval '100 milliseconds' AND interval '10 minutes'),
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

-- subscribe: add an endpoint for a topic, or change the one with the same (topic, url).
CREATE FUNCTION outbox_subscribe(
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
    PERFORM @extschema@.outbox_check_topic('outbox_subscribe', 'topic', outbox_subscribe.topic);
    PERFORM @extschema@.outbox_check_subscription(outbox_subscribe.url, outbox_subscribe.secret, outbox_subscribe.headers);
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
CREATE FUNCTION outbox_unsubscribe(topic text, url text DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    removed integer;
BEGIN
    PERFORM @extschema@.outbox_check_topic('outbox_unsubscribe', 'topic', outbox_unsubscribe.topic);
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
CREATE FUNCTION outbox_topics() RETURNS TABLE (topic text, endpoints integer)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.topic::text, count(*)::integer
      FROM @extschema@.outbox_subscription s
     WHERE s.enabled
     GROUP BY s.topic
     ORDER BY s.topic
$$;
