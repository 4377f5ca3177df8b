-- The subscriptions (disabled ones too: their topics' messages still get parked deliveries),
-- with extra headers flattened to [name, value, name, value, ...], the timeout in milliseconds
-- (NULL: outbox.http_timeout), the protections, and the previous secret while it still signs.
SELECT s.id, s.topic::pg_catalog.text, s.url, s.secret,
       ARRAY(SELECT pg_catalog.unnest(ARRAY[h.key, h.value]) FROM pg_catalog.jsonb_each_text(s.headers) h),
       (pg_catalog.date_part('epoch', s.timeout) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8,
       s.enabled, s.failing_since, s.rate_limit, s.max_in_flight,
       CASE WHEN s.previous_secret_until OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp() THEN s.previous_secret END,
       s.previous_secret_until
  FROM @extschema@.outbox_subscription s
 ORDER BY s.id
