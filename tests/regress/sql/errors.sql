-- Bad input: each refused with its SQLSTATE and a message naming the function and the argument,
-- before anything is written.
CREATE EXTENSION outbox_ext;
CREATE FUNCTION pg_temp.try(statement text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE statement;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ' ' || SQLERRM;
END
$$;
SELECT pg_temp.try(call) FROM (VALUES
    ($$SELECT outbox_enqueue(NULL, '{}')$$),
    ($$SELECT outbox_enqueue('', '{}')$$),
    ($$SELECT outbox_enqueue(repeat('a', 65), '{}')$$),
    ($$SELECT outbox_enqueue('booking created', '{}')$$),
    ($$SELECT outbox_enqueue('booking.created', NULL)$$),
    ($$SELECT outbox_enqueue('booking.created', '{}', NULL)$$),
    ($$SELECT outbox_enqueue('booking.created', '{}', interval '-1 second')$$),
    ($$SELECT outbox_enqueue('booking.created', '{}', dedupe_key => '')$$),
    ($$SELECT outbox_enqueue('booking.created', '{}', dedupe_key => repeat('k', 256))$$),
    ($$SELECT outbox_enqueue_batch('booking.created', NULL)$$),
    ($$SELECT outbox_enqueue_batch('booking.created', ARRAY['{}'::jsonb, NULL])$$),
    ($$SELECT outbox_enqueue_batch('booking.created', ARRAY[['{}','{}'],['{}','{}']]::jsonb[])$$),
    ($$SELECT outbox_claim(NULL)$$),
    ($$SELECT outbox_claim(0)$$),
    ($$SELECT outbox_claim(10, ARRAY[NULL]::text[])$$),
    ($$SELECT outbox_claim(10, ARRAY['not a topic'])$$),
    ($$SELECT outbox_claim(10, NULL, interval '0')$$),
    ($$SELECT outbox_complete(NULL::bigint)$$),
    ($$SELECT outbox_complete_batch(ARRAY[1, NULL]::bigint[])$$),
    ($$SELECT outbox_complete_batch(ARRAY[1, 2]::bigint[], ARRAY[gen_random_uuid()])$$),
    ($$SELECT outbox_fail(NULL, 'boom')$$),
    ($$SELECT outbox_fail(1, NULL)$$),
    ($$SELECT outbox_fail(1, 'boom', NULL, interval '-1 second')$$),
    ($$SELECT outbox_backoff(-1)$$),
    ($$SELECT outbox_purge(NULL)$$),
    ($$SELECT outbox_purge('-1 day')$$),
    ($$SELECT outbox_subscribe('t.x', 'ftp://example.com/')$$),
    ($$SELECT outbox_subscribe('t.x', 'http://127.0.0.1:99999/')$$),
    ($$SELECT outbox_subscribe('t.x', 'https://example.com/', 'not-a-secret')$$),
    ($$SELECT outbox_subscribe('t.x', 'https://example.com/', headers => '{"outbox-attempt": "9"}')$$),
    ($$SELECT outbox_redeliver(NULL)$$),
    ($$SELECT outbox_redeliver(4242)$$)
) AS calls(call);
SELECT count(*) AS nothing_written FROM outbox;
DROP EXTENSION outbox_ext;
