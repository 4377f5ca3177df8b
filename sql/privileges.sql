-- Who may do what. PUBLIC gets nothing but the few helpers docs/security.md names as open to
-- every role; every other function, table, view and sequence of the extension is for the
-- extension's roles:
--
--   outbox_producer  may enqueue (and nothing else: it cannot read other messages)
--   outbox_consumer  may claim, complete and fail
--   outbox_admin     both, plus dead letters, purge, subscriptions, the worker's status
--   pg_monitor       the statistics (outbox_stats(), the view outbox_monitoring)
--
-- The roles are created if missing (NOLOGIN; grant them to your application's roles). The API
-- runs with the extension owner's rights, so the roles need no rights on the table itself.
-- Like every statement run with the owner's rights, these name what they use in full.
DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['outbox_producer', 'outbox_consumer', 'outbox_admin']::text[] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) role_name) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', role_name);
        END IF;
    END LOOP;
END
$$;
GRANT outbox_producer, outbox_consumer TO outbox_admin;

-- Nothing of the extension for PUBLIC (functions are executable by PUBLIC when created, so
-- each is revoked by name: every function the extension owns, whatever module declared it).
DO $$
DECLARE
    member regprocedure;
BEGIN
    FOR member IN
        SELECT d.objid::pg_catalog.regprocedure
          FROM pg_catalog.pg_depend d
          JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
         WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext'
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
    LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', member);
    END LOOP;
END
$$;
REVOKE ALL ON TABLE outbox, outbox_subscription FROM PUBLIC;
REVOKE ALL ON SEQUENCE outbox_id_seq, outbox_subscription_id_seq FROM PUBLIC;
REVOKE ALL ON outbox_monitoring, outbox_dead_letters, outbox_subscriptions FROM PUBLIC;

-- Open to every role (docs/security.md): which topics the worker delivers, and pure helpers.
GRANT EXECUTE ON FUNCTION
    outbox_topics(),
    outbox_topic_is_valid(text),
    outbox_backoff(integer),
    outbox_max_attempts(),
    outbox_uuid_v7()
TO PUBLIC;

GRANT EXECUTE ON FUNCTION
    outbox_enqueue(text, jsonb, interval, text),
    outbox_enqueue_batch(text, jsonb[], interval)
TO outbox_producer;

GRANT EXECUTE ON FUNCTION
    outbox_claim(integer, text[], interval),
    outbox_complete(bigint, uuid),
    outbox_complete_batch(bigint[], uuid[]),
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
    outbox_generate_secret(),
    outbox_worker_status()
TO outbox_admin;
GRANT SELECT ON outbox, outbox_monitoring, outbox_dead_letters, outbox_subscription, outbox_subscriptions TO outbox_admin;

GRANT EXECUTE ON FUNCTION outbox_stats(), outbox_worker_status() TO pg_monitor;
GRANT SELECT ON outbox_monitoring TO pg_monitor;
