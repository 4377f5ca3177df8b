-- Who may do what. Nothing is granted to PUBLIC: not the table, not the API.
--
--   outbox_producer  may enqueue (and nothing else: it cannot read other messages)
--   outbox_consumer  may claim, complete and fail
--   outbox_admin     both, plus dead letters, purge, subscriptions, the worker's status
--   pg_monitor       the statistics (outbox_stats(), the view outbox_monitoring)
--
-- The roles are created if missing (NOLOGIN; grant them to your application's roles). The API
-- runs with the extension owner's rights and a pinned search_path, so the roles need no rights
-- on the table itself.
DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['outbox_producer', 'outbox_consumer', 'outbox_admin'] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = role_name) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', role_name);
        END IF;
    END LOOP;
END
$$;
GRANT outbox_producer, outbox_consumer TO outbox_admin;

REVOKE ALL ON TABLE outbox, outbox_subscription FROM PUBLIC;
REVOKE ALL ON SEQUENCE outbox_id_seq, outbox_subscription_id_seq FROM PUBLIC;
REVOKE ALL ON outbox_monitoring, outbox_dead_letters, outbox_subscriptions FROM PUBLIC;
REVOKE ALL ON FUNCTION
    outbox_enqueue(text, jsonb, interval, text),
    outbox_enqueue_batch(text, jsonb[], interval),
    outbox_exhausted_error(integer, integer, uuid, text),
    outbox_claim(integer, text[], interval),
    outbox_complete(bigint, uuid),
    outbox_complete(bigint[], uuid[]),
    outbox_fail(bigint, text, uuid, interval),
    outbox_stats(),
    outbox_requeue_dead(bigint[], text),
    outbox_requeue(bigint),
    outbox_requeue(text),
    outbox_requeue_all(),
    outbox_discard_dead(bigint[], text),
    outbox_discard(bigint),
    outbox_discard(text),
    outbox_discard_all(),
    outbox_purge(interval, boolean, integer),
    outbox_subscribe(text, text, text, jsonb, interval, boolean),
    outbox_unsubscribe(text, text),
    outbox_worker_status()
FROM PUBLIC;

GRANT EXECUTE ON FUNCTION
    outbox_enqueue(text, jsonb, interval, text),
    outbox_enqueue_batch(text, jsonb[], interval)
TO outbox_producer;

GRANT EXECUTE ON FUNCTION
    outbox_claim(integer, text[], interval),
    outbox_complete(bigint, uuid),
    outbox_complete(bigint[], uuid[]),
    outbox_fail(bigint, text, uuid, interval)
TO outbox_consumer;

GRANT EXECUTE ON FUNCTION
    outbox_stats(),
    outbox_requeue(bigint),
    outbox_requeue(text),
    outbox_requeue_all(),
    outbox_discard(bigint),
    outbox_discard(text),
    outbox_discard_all(),
    outbox_purge(interval, boolean, integer),
    outbox_subscribe(text, text, text, jsonb, interval, boolean),
    outbox_unsubscribe(text, text),
    outbox_worker_status()
TO outbox_admin;
GRANT SELECT ON outbox, outbox_monitoring, outbox_dead_letters, outbox_subscription, outbox_subscriptions TO outbox_admin;

GRANT EXECUTE ON FUNCTION outbox_stats(), outbox_worker_status() TO pg_monitor;
GRANT SELECT ON outbox_monitoring TO pg_monitor;
