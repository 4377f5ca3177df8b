-- Who may do what. PUBLIC gets nothing but the few helpers docs/security.md names as open to
-- every role; every other function, table, view and sequence of the extension is for the
-- extension's roles:
--
--   outbox_producer  may enqueue (and nothing else: it cannot read other messages)
--   outbox_consumer  may claim, complete and fail
--   outbox_admin     both, plus dead letters, purge, subscriptions, the worker's status
--   pg_monitor       the statistics (outbox_stats(), the view outbox_monitoring)
--   outbox_worker    the delivery worker's own role: what it needs, nothing more
--
-- The roles are created if missing (NOLOGIN; grant them to your application's roles). The API
-- runs with the extension owner's rights, so the roles need no rights on the table itself.
-- Like every statement run with the owner's rights, these name what they use in full.
--
-- A role that exists already was made by an earlier install, or by someone else: a role with
-- CREATEROLE, not a superuser, may have made it first, with a password it knows or with itself
-- as the role's admin (PostgreSQL 16 and later make a role's creator so), to be given the
-- extension's rights (the subscriptions' secrets) once a superuser creates the extension.
-- Refuse what the extension never makes: a password, a login (but the worker's: see below),
-- objects it owns (a SECURITY DEFINER function of its runs with its rights), an admin who is
-- not a superuser, a member of the worker's role.
DO $$
DECLARE
    existing record;
    holder name;
    -- A login or objects are refused only at a first install (no message ever enqueued): in an
    -- installation in use they may be an administrator's choice, which an update must not break.
    first_install boolean := NOT (SELECT q.is_called FROM @extschema@.outbox_id_seq q);
BEGIN
    FOR existing IN
        SELECT a.oid, a.rolname, a.rolpassword IS NOT NULL AS has_password, a.rolcanlogin
          FROM pg_catalog.pg_authid a
         WHERE a.rolname OPERATOR(pg_catalog.=) ANY (ARRAY['outbox_producer', 'outbox_consumer', 'outbox_admin', 'outbox_worker']::name[])
         ORDER BY a.rolname
    LOOP
        IF existing.has_password THEN
            RAISE EXCEPTION 'outbox_ext: role % already exists, with a password', existing.rolname
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'outbox_ext makes its roles without one. A role with CREATEROLE may have made it first, to be given the extension''s rights.',
                      HINT = pg_catalog.format('If you gave it the password, ALTER ROLE %I PASSWORD NULL; if not, DROP ROLE %I. Then try again.', existing.rolname, existing.rolname);
        END IF;
        -- (The worker's role logs in before 17, where a background worker needs LOGIN, and
        -- keeps it through pg_upgrade.)
        IF first_install AND existing.rolcanlogin AND existing.rolname OPERATOR(pg_catalog.<>) 'outbox_worker' THEN
            RAISE EXCEPTION 'outbox_ext: role % already exists, and may log in', existing.rolname
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'outbox_ext makes its roles NOLOGIN: grant them to your roles. Without a password a role may still log in where pg_hba.conf does not ask for one.',
                      HINT = pg_catalog.format('ALTER ROLE %I NOLOGIN, or DROP ROLE %I. Then try again.', existing.rolname, existing.rolname);
        END IF;
        -- In any database (pg_shdepend is the cluster's): the extension's roles own nothing.
        SELECT COALESCE(b.datname, 'none: an object of the whole cluster') INTO holder
          FROM pg_catalog.pg_shdepend d
          LEFT JOIN pg_catalog.pg_database b ON b.oid OPERATOR(pg_catalog.=) d.dbid
         WHERE d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_authid'::pg_catalog.regclass
           AND d.refobjid OPERATOR(pg_catalog.=) existing.oid
           AND d.deptype OPERATOR(pg_catalog.=) 'o'
         ORDER BY 1
         LIMIT 1;
        IF FOUND AND first_install THEN
            RAISE EXCEPTION 'outbox_ext: role % already exists, and owns objects (database %)', existing.rolname, holder
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'outbox_ext''s roles own nothing. A role with CREATEROLE may have made it first and given it a function, which would run with the extension''s rights.',
                      HINT = pg_catalog.format('In that database, REASSIGN OWNED BY %I TO a role of yours (or DROP OWNED BY %I), or DROP ROLE %I. Then try again.', existing.rolname, existing.rolname, existing.rolname);
        END IF;
        SELECT m.rolname INTO holder
          FROM pg_catalog.pg_auth_members g
          JOIN pg_catalog.pg_authid m ON m.oid OPERATOR(pg_catalog.=) g.member
         WHERE g.roleid OPERATOR(pg_catalog.=) existing.oid AND g.admin_option AND NOT m.rolsuper
         ORDER BY m.rolname
         LIMIT 1;
        IF FOUND THEN
            RAISE EXCEPTION 'outbox_ext: role % already exists, and role % (not a superuser) may grant it', existing.rolname, holder
                USING ERRCODE = 'object_not_in_prerequisite_state',
                      DETAIL = 'Whoever may grant one of the extension''s roles may take its rights. PostgreSQL 16 and later make a role''s creator its admin: a role with CREATEROLE may have made it first.',
                      HINT = pg_catalog.format('If you made %I its admin, REVOKE ADMIN OPTION FOR %I FROM %I; if not, DROP ROLE %I. Then try again.', holder, existing.rolname, holder, existing.rolname);
        END IF;
        IF existing.rolname OPERATOR(pg_catalog.=) 'outbox_worker' THEN
            SELECT m.rolname INTO holder
              FROM pg_catalog.pg_auth_members g
              JOIN pg_catalog.pg_authid m ON m.oid OPERATOR(pg_catalog.=) g.member
             WHERE g.roleid OPERATOR(pg_catalog.=) existing.oid
             ORDER BY m.rolname
             LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'outbox_ext: role outbox_worker already exists, with a member (%)', holder
                    USING ERRCODE = 'object_not_in_prerequisite_state',
                          DETAIL = 'Only the delivery worker acts as outbox_worker: it reads every subscription''s secret.',
                          HINT = pg_catalog.format('REVOKE outbox_worker FROM %I, or DROP ROLE outbox_worker. Then try again.', holder);
            END IF;
        END IF;
    END LOOP;
END
$$;
DO $$
DECLARE
    role_name text;
BEGIN
    FOREACH role_name IN ARRAY ARRAY['outbox_producer', 'outbox_consumer', 'outbox_admin']::text[] LOOP
        IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) role_name) THEN
            EXECUTE pg_catalog.format('CREATE ROLE %I NOLOGIN', role_name);
        END IF;
    END LOOP;
    -- The delivery worker connects as outbox_worker, never as a superuser. Before PostgreSQL 17
    -- a background worker cannot connect as a role without LOGIN; it gets no password, so
    -- password authentication refuses it (docs/security.md).
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) 'outbox_worker') THEN
        IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog.>=) 170000 THEN
            CREATE ROLE outbox_worker NOLOGIN;
        ELSE
            CREATE ROLE outbox_worker LOGIN;
        END IF;
    END IF;
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
REVOKE ALL ON TABLE outbox, outbox_subscription, outbox_delivery, outbox_delivery_attempt FROM PUBLIC;
REVOKE ALL ON SEQUENCE outbox_id_seq, outbox_subscription_id_seq FROM PUBLIC;
REVOKE ALL ON outbox_monitoring, outbox_dead_letters, outbox_subscriptions, outbox_deliveries, outbox_delivery_attempts FROM PUBLIC;

-- Open to every role (docs/security.md): which topics the worker delivers, and pure helpers.
GRANT EXECUTE ON FUNCTION
    outbox_topics(),
    outbox_topic_is_valid(text),
    outbox_backoff(integer),
    outbox_max_attempts(),
    outbox_uuid_v7()
TO PUBLIC;

GRANT EXECUTE ON FUNCTION
    outbox_enqueue(text, jsonb, interval, text, text, jsonb),
    outbox_enqueue_batch(text, jsonb[], interval, text)
TO outbox_producer;

GRANT EXECUTE ON FUNCTION
    outbox_depth(text[]),
    outbox_claim(integer, text[], interval),
    outbox_complete(bigint, uuid),
    outbox_complete_batch(bigint[], uuid[]),
    outbox_complete(bigint[], uuid[]),
    outbox_fail(bigint, text, uuid, interval)
TO outbox_consumer;

GRANT EXECUTE ON FUNCTION
    outbox_stats(),
    outbox_endpoint_stats(),
    outbox_redeliver(bigint, timestamptz, bigint[]),
    outbox_requeue(bigint),
    outbox_requeue(text),
    outbox_requeue_all(),
    outbox_discard(bigint),
    outbox_discard(text),
    outbox_discard_all(),
    outbox_purge(interval, boolean, integer),
    outbox_archive(integer),
    outbox_compact(boolean, integer),
    outbox_subscribe(text, text, text, jsonb, interval, boolean, double precision, integer),
    outbox_unsubscribe(text, text),
    outbox_enable_subscription(bigint),
    outbox_disable_subscription(bigint, text),
    outbox_rotate_secret(bigint, text, interval),
    outbox_generate_secret(),
    outbox_worker_status()
TO outbox_admin;
GRANT SELECT ON outbox, outbox_monitoring, outbox_dead_letters, outbox_subscription, outbox_subscriptions,
                outbox_delivery, outbox_delivery_attempt, outbox_deliveries, outbox_delivery_attempts
   TO outbox_admin;

GRANT EXECUTE ON FUNCTION outbox_stats(), outbox_endpoint_stats(), outbox_worker_status(), outbox_depth(text[]) TO pg_monitor;
GRANT SELECT ON outbox_monitoring TO pg_monitor;

-- The delivery worker (src/worker): it picks messages up and makes their deliveries, leases
-- and records them (with the attempt log), reads the subscriptions with their secrets, and
-- purges old history through outbox_purge; it releases ordering keys through the functions
-- that hold that rule. Nothing else: no API function, no sequence.
GRANT USAGE ON SCHEMA @extschema@ TO outbox_worker;
-- ... and connects: a database hardened with REVOKE CONNECT ... FROM PUBLIC, before or after the
-- install, would lock it out (FATAL at every try).
DO $$
BEGIN
    EXECUTE pg_catalog.format('GRANT CONNECT ON DATABASE %I TO outbox_worker', pg_catalog.current_database());
END
$$;
-- It updates a message's progress, never what its producer wrote: the columns it sets, not the
-- table (a grant on outbox reaches the archived messages in outbox_history_N too, whose
-- privileges PostgreSQL checks on outbox; an update before 0.5.30 granted the whole table).
REVOKE UPDATE ON outbox FROM outbox_worker;
GRANT SELECT, UPDATE (status, waiting_for, lease_token, available_at, processed_at, last_error) ON outbox TO outbox_worker;
GRANT SELECT ON outbox_subscription TO outbox_worker;
-- ... and marks an endpoint failing, recovered, or disabled after failing too long.
GRANT UPDATE (failing_since, enabled, disabled_reason) ON outbox_subscription TO outbox_worker;
GRANT SELECT, INSERT, UPDATE ON outbox_delivery TO outbox_worker;
GRANT INSERT ON outbox_delivery_attempt TO outbox_worker;
-- ... and reads which attempt it logged last, not what came back: a delivery out of attempts
-- with its last one answered saw the limit lowered, not a crash (0.5.33).
GRANT SELECT (message_id, subscription_id, attempt, started_at) ON outbox_delivery_attempt TO outbox_worker;
-- (The attempt log's partition key: routing a row runs it with the inserter's rights.)
GRANT EXECUTE ON FUNCTION outbox_attempt_log_slot(timestamptz) TO outbox_worker;
GRANT EXECUTE ON FUNCTION outbox_purge(interval, boolean, integer), outbox_archive(integer), outbox_compact(boolean, integer)
    TO outbox_worker;
GRANT EXECUTE ON FUNCTION outbox_release_keys(text[]), outbox_release_delivery_keys(bigint[], text[]) TO outbox_worker;

-- A role that may create objects in the extension's schema can plant there an overload that a
-- call with untyped literals resolves to, run with its caller's rights: an administrator's
-- outbox_subscribe would hand it the secret (stop 58's probe of privileges). PostgreSQL 15
-- grants no one CREATE on public; say so when someone has it (docs/security.md).
DO $$
DECLARE
    creators text;
BEGIN
    SELECT pg_catalog.string_agg(CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0::pg_catalog.oid THEN 'PUBLIC'
                                      ELSE pg_catalog.quote_ident(r.rolname) END, ', ' ORDER BY r.rolname)
      INTO creators
      FROM pg_catalog.pg_namespace n
     CROSS JOIN LATERAL pg_catalog.aclexplode(n.nspacl) a
      LEFT JOIN pg_catalog.pg_roles r ON r.oid OPERATOR(pg_catalog.=) a.grantee
     WHERE n.oid OPERATOR(pg_catalog.=) '@extschema@'::pg_catalog.regnamespace::pg_catalog.oid
       AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
       AND a.grantee OPERATOR(pg_catalog.<>) n.nspowner
       AND NOT COALESCE(r.rolsuper, false);
    IF creators IS NOT NULL THEN
        RAISE WARNING 'outbox_ext: % may create objects in the schema of outbox_ext', creators
            USING DETAIL = 'A function created there with the name of one of the extension''s runs with the rights of whoever calls it by that name, an administrator included.',
                  HINT = 'REVOKE CREATE on that schema, or put the extension in a schema of its own (docs/security.md).';
    END IF;
END
$$;

-- This database's delivery worker starts when CREATE EXTENSION (or ALTER EXTENSION UPDATE)
-- commits.
SELECT @extschema@.outbox_wake_worker_at_commit();
