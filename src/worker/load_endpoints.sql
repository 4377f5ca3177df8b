-- The enabled subscriptions, with extra headers flattened to [name, value, name, value, …]
-- and the timeout in milliseconds (NULL: outbox.http_timeout).
SELECT s.id, s.topic::pg_catalog.text, s.url, s.secret,
       ARRAY(SELECT pg_catalog.unnest(ARRAY[h.key, h.value]) FROM pg_catalog.jsonb_each_text(s.headers) h),
       (pg_catalog.date_part('epoch', s.timeout) OPERATOR(pg_catalog.*) 1000)::pg_catalog.int8
  FROM @extschema@.outbox_subscription s
 WHERE s.enabled
 ORDER BY s.id
