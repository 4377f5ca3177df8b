-- Operating the outbox: the numbers to watch, dead-letter repair, housekeeping.
-- These functions run with the extension owner's rights (SECURITY DEFINER) and are granted to
-- outbox_admin (and the statistics to pg_monitor), not to PUBLIC. Each pins
-- search_path = pg_catalog, pg_temp, names the extension's objects with their schema and
-- passes every argument with its type, so that no look-alike (an operator, or an overload of
-- one of these functions in the extension's schema) is ever chosen over what is meant.

-- The four numbers (and a few more), per topic and in total (the row whose topic is NULL).
-- Reads pending rows through outbox_ready_idx and the last minute's completions through
-- outbox_processed_idx, outbox_processed_keyed_idx and the processed_at index of the day's
-- history table, never the rest of the DONE history (docs/storage.md), so it stays cheap. For topics the delivery
-- worker delivers, the deliveries say more: how many are dead (an endpoint gave up on) and the
-- age of the oldest message not yet delivered everywhere (outbox_endpoint_stats() has them per
-- endpoint).
CREATE OR REPLACE FUNCTION outbox_stats() RETURNS TABLE (
    topic                       text,
    pending                     bigint,    -- PENDING messages: the depth
    ready                       bigint,    -- ... of which claimable now
    in_flight                   bigint,    -- ... of which held by a consumer under a live lease
    retrying                    bigint,    -- ... of which failed before and wait for their retry to fall due
    dead                        bigint,    -- DEAD messages: somebody should look
    oldest_ready_age            interval,  -- how long the oldest ready message has been waiting
    oldest_pending_age          interval,  -- age of the oldest PENDING message
    completed_last_minute       bigint,    -- DONE in the last minute: the drain rate
    dead_deliveries             bigint,    -- deliveries an endpoint gave up on
    oldest_pending_delivery_age interval,  -- age of the oldest message an endpoint has yet to take
    blocked_keys                bigint,    -- ordering keys whose next message waits behind an earlier one
    oldest_blocked_age          interval,  -- age of the oldest message waiting behind its key
    disabled_endpoints          bigint,    -- subscriptions disabled (by hand or after failing too long)
    parked_deliveries           bigint     -- deliveries kept for disabled endpoints
)
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    clock_now         timestamptz := clock_timestamp();
    day_slot          integer;
    history_topics    text[] := '{}';
    history_completed bigint[] := '{}';
    seqscan_setting   text;
BEGIN
    -- The last minute's completions that went to the history (most: outbox_complete moves them
    -- at once), from the table of today (and of yesterday, in a day's first minute) by its
    -- processed_at index. Only those tables: planning a query over all 32 would cost more than
    -- the rest of the statistics.
    -- (Through that index even before autovacuum has analyzed a day's table, which fills up
    -- within its day: estimated without statistics, a sequential scan of it looks cheaper.)
    seqscan_setting := current_setting('enable_seqscan');
    PERFORM set_config('enable_seqscan', 'off', true);
    FOR day_slot IN SELECT DISTINCT @extschema@.outbox_attempt_log_slot(t)
                      FROM unnest(ARRAY[clock_now, clock_now - interval '1 minute']) t LOOP
        EXECUTE format('SELECT $2 || array_agg(c.topic::text), $3 || array_agg(c.completed)
                          FROM (SELECT h.topic, count(*) AS completed FROM @extschema@.%I h
                                 WHERE h.processed_at > $1 GROUP BY h.topic) c', 'outbox_history_' || day_slot)
           INTO history_topics, history_completed
          USING clock_now - interval '1 minute', history_topics, history_completed;
    END LOOP;
    PERFORM set_config('enable_seqscan', seqscan_setting, true);

    RETURN QUERY
    WITH live AS (
        -- One row per PENDING message, and one per topic counting its dead letters (from
        -- outbox_dead_idx alone: what they are, not the history around them) and one counting
        -- its completions in the last minute. The counts are aggregated per topic only; the
        -- total (topic NULL) is summed from those few rows: two grouping sets would aggregate
        -- every pending row twice.
        SELECT o.topic, o.attempts, o.available_at, o.created_at, o.lease_token, o.waiting_for,
               0::bigint AS dead, 0::bigint AS completed
          FROM ONLY @extschema@.outbox o
         WHERE o.status = 'PENDING'::@extschema@.outbox_status AND o.waiting_for IS NULL
        UNION ALL
        SELECT o.topic, o.attempts, o.available_at, o.created_at, o.lease_token, o.waiting_for, 0, 0
          FROM ONLY @extschema@.outbox o
         WHERE o.status = 'PENDING'::@extschema@.outbox_status AND o.waiting_for = 'ordering_key'::@extschema@.outbox_wait
        UNION ALL
        SELECT o.topic, o.attempts, o.available_at, o.created_at, o.lease_token, o.waiting_for, 0, 0
          FROM ONLY @extschema@.outbox o
         WHERE o.status = 'PENDING'::@extschema@.outbox_status AND o.waiting_for = 'deliveries'::@extschema@.outbox_wait
        UNION ALL
        SELECT o.topic, NULL, NULL, NULL, NULL, NULL, count(*), 0
          FROM ONLY @extschema@.outbox o
         WHERE o.status = 'DEAD'::@extschema@.outbox_status
         GROUP BY o.topic
        UNION ALL
        -- (The last minute's completions: those in the history, counted above, and those still
        -- in outbox, one query for each of outbox_processed_idx and outbox_processed_keyed_idx.)
        SELECT h.topic, NULL, NULL, NULL, NULL, NULL, 0, h.completed
          FROM unnest(history_topics, history_completed) h(topic, completed)
        UNION ALL
        SELECT o.topic, NULL, NULL, NULL, NULL, NULL, 0, count(*)
          FROM ONLY @extschema@.outbox o
         WHERE o.status = 'DONE'::@extschema@.outbox_status AND o.processed_at > clock_now - interval '1 minute'
           AND o.dedupe_key IS NULL
         GROUP BY o.topic
        UNION ALL
        SELECT o.topic, NULL, NULL, NULL, NULL, NULL, 0, count(*)
          FROM ONLY @extschema@.outbox o
         WHERE o.status = 'DONE'::@extschema@.outbox_status AND o.processed_at > clock_now - interval '1 minute'
           AND o.dedupe_key IS NOT NULL
         GROUP BY o.topic
        UNION ALL
        -- (The topic of a disabled endpoint has its row, message or none: the alert on
        -- disabled endpoints reads the topic's row.)
        SELECT s.topic, NULL, NULL, NULL, NULL, NULL, 0, 0
          FROM @extschema@.outbox_subscription s
         WHERE NOT s.enabled
    ), per_topic AS (
        -- (Only a PENDING message's row has a created_at.)
        SELECT l.topic::text AS topic,
               count(l.created_at) AS pending,
               count(*) FILTER (WHERE l.waiting_for IS NULL AND l.available_at <= clock_now) AS ready,
               count(*) FILTER (WHERE l.available_at > clock_now AND l.lease_token IS NOT NULL) AS in_flight,
               count(*) FILTER (WHERE l.attempts > 0 AND l.lease_token IS NULL AND l.waiting_for IS NULL
                                        AND l.available_at > clock_now) AS retrying,
               sum(l.dead)::bigint AS dead,
               min(l.available_at) FILTER (WHERE l.waiting_for IS NULL AND l.available_at <= clock_now) AS oldest_ready_at,
               min(l.created_at) AS oldest_created_at,
               sum(l.completed)::bigint AS completed_last_minute
          FROM live l
         GROUP BY l.topic
    ), messages AS (
        SELECT t.topic, 0 AS total, t.pending, t.ready, t.in_flight, t.retrying, t.dead,
               clock_now - t.oldest_ready_at AS oldest_ready_age, clock_now - t.oldest_created_at AS oldest_pending_age,
               t.completed_last_minute
          FROM per_topic t
        UNION ALL
        SELECT NULL, 1, COALESCE(sum(t.pending), 0)::bigint, COALESCE(sum(t.ready), 0)::bigint,
               COALESCE(sum(t.in_flight), 0)::bigint, COALESCE(sum(t.retrying), 0)::bigint, COALESCE(sum(t.dead), 0)::bigint,
               clock_now - min(t.oldest_ready_at), clock_now - min(t.oldest_created_at),
               COALESCE(sum(t.completed_last_minute), 0)::bigint
          FROM per_topic t
    ), blocked AS (
        -- (Apart from messages, over the waiting messages only: a DISTINCT aggregate there
        -- would make the plan sort every pending row instead of hashing them.) A key is held
        -- back on the messages (SQL consumers) or, for the topics the worker delivers, at an
        -- endpoint, on the deliveries; the age is that of the message waiting.
        SELECT w.topic, GROUPING(w.topic) AS total,
               count(DISTINCT w.ordering_key) AS keys,
               clock_now - min(w.created_at) AS oldest_age
          FROM (SELECT m.topic::text AS topic, m.ordering_key, m.created_at
                  FROM ONLY @extschema@.outbox m
                 WHERE m.status = 'PENDING'::@extschema@.outbox_status AND m.waiting_for = 'ordering_key'::@extschema@.outbox_wait
                UNION ALL
                SELECT m.topic::text, q.ordering_key, m.created_at
                  FROM ONLY @extschema@.outbox_delivery q
                  JOIN ONLY @extschema@.outbox m ON m.id = q.message_id
                 WHERE q.status = 'PENDING'::@extschema@.outbox_status AND q.waiting_for = 'ordering_key'::@extschema@.outbox_wait) w
         GROUP BY GROUPING SETS ((w.topic), ())
    ), parked AS (
        SELECT s.topic::text AS topic, GROUPING(s.topic) AS total,
               count(DISTINCT s.id) AS endpoints,
               count(d.message_id) AS deliveries
          FROM @extschema@.outbox_subscription s
          LEFT JOIN (SELECT r.subscription_id, r.message_id FROM ONLY @extschema@.outbox_delivery r
                      WHERE r.status = 'PENDING'::@extschema@.outbox_status AND r.waiting_for IS NULL
                     UNION ALL
                     SELECT w.subscription_id, w.message_id FROM ONLY @extschema@.outbox_delivery w
                      WHERE w.status = 'PENDING'::@extschema@.outbox_status
                        AND w.waiting_for = 'ordering_key'::@extschema@.outbox_wait) d
            ON d.subscription_id = s.id
         WHERE NOT s.enabled
         GROUP BY GROUPING SETS ((s.topic), ())
    ), deliveries AS (
        SELECT d.topic, GROUPING(d.topic) AS total,
               COALESCE(sum(d.n) FILTER (WHERE d.dead), 0)::bigint AS dead,
               clock_now - min(d.created_at) FILTER (WHERE NOT d.dead) AS oldest_pending_age
          FROM (SELECT m.topic::text AS topic, false AS dead, m.created_at, 1::bigint AS n
                  FROM (SELECT p.message_id FROM ONLY @extschema@.outbox_delivery p
                         WHERE p.status = 'PENDING'::@extschema@.outbox_status AND p.waiting_for IS NULL
                        UNION ALL
                        SELECT w.message_id FROM ONLY @extschema@.outbox_delivery w
                         WHERE w.status = 'PENDING'::@extschema@.outbox_status
                           AND w.waiting_for = 'ordering_key'::@extschema@.outbox_wait) pending
                  JOIN ONLY @extschema@.outbox m ON m.id = pending.message_id
                UNION ALL
                -- (Dead deliveries counted per endpoint, then by the endpoint's topic, which is
                -- their message's: an index-only scan of outbox_delivery_dead_idx, no visit to
                -- the messages, and a join of one row per endpoint.)
                SELECT s.topic::text, true, NULL::timestamptz, e.n
                  FROM (SELECT e.subscription_id, count(*) AS n
                          FROM ONLY @extschema@.outbox_delivery e
                         WHERE e.status = 'DEAD'::@extschema@.outbox_status
                         GROUP BY e.subscription_id) e
                  JOIN @extschema@.outbox_subscription s ON s.id = e.subscription_id) d
         GROUP BY GROUPING SETS ((d.topic), ())
    )
    SELECT ms.topic, ms.pending, ms.ready, ms.in_flight, ms.retrying, ms.dead, ms.oldest_ready_age,
           ms.oldest_pending_age, ms.completed_last_minute, COALESCE(ds.dead, 0), ds.oldest_pending_age,
           COALESCE(bk.keys, 0), bk.oldest_age, COALESCE(ps.endpoints, 0), COALESCE(ps.deliveries, 0)
      FROM messages ms
      LEFT JOIN deliveries ds ON ds.total = ms.total AND ds.topic IS NOT DISTINCT FROM ms.topic
      LEFT JOIN blocked bk ON bk.total = ms.total AND bk.topic IS NOT DISTINCT FROM ms.topic
      LEFT JOIN parked ps ON ps.total = ms.total AND ps.topic IS NOT DISTINCT FROM ms.topic
     ORDER BY ms.topic NULLS FIRST;
END
$$;

COMMENT ON FUNCTION outbox_stats() IS
'Queue depth, ready, in flight, retrying and dead counts, the age of the oldest ready and pending messages, the last minute''s completions, dead deliveries and the age of the oldest message not yet delivered to every endpoint, the ordering keys held back and the age of the oldest message waiting behind its key, the disabled endpoints and their parked deliveries, per topic and in total (topic NULL).';

-- The depth a consumer needs to scale itself: ready messages of its topics (or of all), counted
-- through outbox_ready_idx (the cost of the ready work, not of the history). For consumers and
-- monitoring roles, who may not read the table.
CREATE OR REPLACE FUNCTION outbox_depth(topics text[] DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    IF array_ndims(outbox_depth.topics) > 1 THEN
        RAISE EXCEPTION 'outbox_depth: topics must be a one-dimensional array, got % dimensions',
                        array_ndims(outbox_depth.topics)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(outbox_depth.topics, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'outbox_depth: topics must not contain NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- A topic that cannot exist is a mistake to report, not a depth of 0.
    PERFORM @extschema@.outbox_check_topic('outbox_depth'::text, 'topics'::text, wanted)
       FROM unnest(outbox_depth.topics) wanted;
    RETURN (SELECT count(*)
              FROM ONLY @extschema@.outbox o
             WHERE o.status = 'PENDING'::@extschema@.outbox_status
               AND o.waiting_for IS NULL
               AND o.available_at <= clock_timestamp()
               AND (outbox_depth.topics IS NULL OR o.topic::text = ANY (outbox_depth.topics)));
END
$$;

COMMENT ON FUNCTION outbox_depth(text[]) IS
'Ready messages (PENDING, due, not waiting behind an ordering key or for deliveries) of the given topics, or of all: what a consumer has to do now.';

-- For monitoring roles and exporters: SELECT * FROM outbox_monitoring.
CREATE OR REPLACE VIEW outbox_monitoring AS SELECT * FROM outbox_stats();

-- The same numbers per endpoint, for the topics the delivery worker delivers: pending
-- deliveries through outbox_delivery_ready_idx, dead ones through outbox_delivery_dead_idx,
-- the last minute's deliveries from the attempt log (whose BRIN index finds the last minute).
CREATE OR REPLACE FUNCTION outbox_endpoint_stats() RETURNS TABLE (
    subscription_id       bigint,
    topic                 text,
    url                   text,
    enabled               boolean,
    pending               bigint,    -- deliveries not yet ended
    ready                 bigint,    -- ... of which due now
    in_flight             bigint,    -- ... of which a request is in flight
    retrying              bigint,    -- ... of which failed before and wait for their retry to fall due
    dead                  bigint,    -- deliveries this endpoint gave up on
    oldest_pending_age    interval,  -- age of the oldest message this endpoint has yet to take
    delivered_last_minute bigint,    -- requests it answered with 2xx in the last minute
    failing_since         timestamptz,  -- its current run of failed attempts began then (NULL: not failing)
    disabled_reason       text          -- why it is disabled (its pending deliveries are parked)
)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $$
    SELECT s.id, s.topic::text,
           -- Many URLs carry a credential in their path or query: only the roles that may read
           -- the subscriptions see them whole; monitoring sees where the endpoint is. (The cut
           -- shows U+2026 in a UTF-8 database, written as its bytes: PostgreSQL reads this
           -- script in the database's encoding, so it stays ASCII. E'' strings: the body is read
           -- in the caller's settings, and standard_conforming_strings off made '\xe2...' escapes.)
           CASE WHEN pg_catalog.pg_has_role(session_user, 'outbox_admin', 'USAGE') THEN s.url
                ELSE pg_catalog.regexp_replace(s.url, '^([A-Za-z][A-Za-z0-9+.-]*://[^/?#]*)[/?#].+$', E'\\1/' || (CASE WHEN pg_catalog.getdatabaseencoding() = 'UTF8' THEN pg_catalog.convert_from(E'\\xe280a6'::bytea, 'UTF8') ELSE '...' END))
           END,
           s.enabled,
           COALESCE(p.pending, 0), COALESCE(p.ready, 0), COALESCE(p.in_flight, 0), COALESCE(p.retrying, 0),
           (SELECT count(*) FROM ONLY @extschema@.outbox_delivery d
             WHERE d.subscription_id = s.id AND d.status = 'DEAD'::@extschema@.outbox_status),
           p.oldest_pending_age,
           COALESCE(delivered.n, 0),
           s.failing_since,
           -- The worker's reason quotes the start of the endpoint's answer, which often repeats
           -- the request (its URL, its headers): for monitoring, the status alone.
           CASE WHEN pg_catalog.pg_has_role(session_user, 'outbox_admin', 'USAGE') THEN s.disabled_reason
                ELSE pg_catalog.regexp_replace(s.disabled_reason, '(; last error: HTTP [0-9]+): .*$', E'\\1: ' || (CASE WHEN pg_catalog.getdatabaseencoding() = 'UTF8' THEN pg_catalog.convert_from(E'\\xe280a6'::bytea, 'UTF8') ELSE '...' END))
           END
      FROM @extschema@.outbox_subscription s
      LEFT JOIN LATERAL (
            SELECT count(*) AS pending,
                   -- A lease that ran out (its worker stopped, or handed it back too late) is
                   -- due again, not in flight: it showed in flight for good (stop 59's probe).
                   count(*) FILTER (WHERE d.available_at <= clock_timestamp() AND d.waiting_for IS NULL) AS ready,
                   count(*) FILTER (WHERE d.leased AND d.available_at > clock_timestamp()) AS in_flight,
                   count(*) FILTER (WHERE NOT d.leased AND d.attempts > 0 AND d.waiting_for IS NULL
                                        AND d.available_at > clock_timestamp()) AS retrying,
                   clock_timestamp() - min(m.created_at) AS oldest_pending_age
              FROM (SELECT r.message_id, r.available_at, r.leased, r.attempts, r.waiting_for FROM ONLY @extschema@.outbox_delivery r
                     WHERE r.subscription_id = s.id AND r.status = 'PENDING'::@extschema@.outbox_status AND r.waiting_for IS NULL
                    UNION ALL
                    SELECT w.message_id, w.available_at, w.leased, w.attempts, w.waiting_for FROM ONLY @extschema@.outbox_delivery w
                     WHERE w.subscription_id = s.id AND w.status = 'PENDING'::@extschema@.outbox_status
                       AND w.waiting_for = 'ordering_key'::@extschema@.outbox_wait) d
              JOIN ONLY @extschema@.outbox m ON m.id = d.message_id) p ON true
      -- The last minute's requests answered with 2xx, counted once for every endpoint: the
      -- BRIN index on started_at cannot pass over the pages autovacuum has not summarized yet
      -- (up to a fifth of the day's table), which a count per endpoint read again for each.
      -- Only the tables of this minute's and a minute ago's days (the partition key's
      -- expression, with now() stable: pruned when the statement starts); now() also gives the
      -- planner the bound that seeks the index (with the clock alone it read the whole table).
      LEFT JOIN (SELECT a.subscription_id, count(*) AS n
                   FROM @extschema@.outbox_delivery_attempt a
                  WHERE a.http_status BETWEEN 200 AND 299
                    AND @extschema@.outbox_attempt_log_slot(a.started_at) = ANY (ARRAY[
                            @extschema@.outbox_attempt_log_slot(now()),
                            @extschema@.outbox_attempt_log_slot(now() - interval '1 minute')])
                    AND a.started_at > now() - interval '1 minute'
                    AND a.started_at > clock_timestamp() - interval '1 minute'
                  GROUP BY a.subscription_id) delivered ON delivered.subscription_id = s.id
     ORDER BY s.id
$$;

COMMENT ON FUNCTION outbox_endpoint_stats() IS
'Per endpoint (subscription): deliveries pending, ready, in flight, retrying and dead, the age of the oldest message it has yet to take, and the last minute''s deliveries.';

-- requeue: give dead messages a new life (attempts from 0, ready now). last_error is kept
-- until the next failure, as a record of why it died. A message the delivery worker sent to
-- several endpoints gets only its dead deliveries back: endpoints that took it do not get it
-- again.
--
-- A session that called this (or outbox_discard_dead, outbox_redeliver) a few times while
-- there was nothing to do kept generic plans made on empty tables (the planner gives tables
-- with children no minimum size): each row joined its deliveries and its message by reading
-- the whole set, and an outage's 30,000 dead letters took over a minute instead of half a
-- second (test_operations.py). These run seldom, so each call plans for the tables as they
-- are (force_custom_plan: a millisecond), and they find the rows of a set they just chose by
-- key (= ANY (ARRAY(...))), never by a join an estimate could turn into a loop over the set.
CREATE OR REPLACE FUNCTION outbox_requeue_dead(ids bigint[], topic text) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan
AS $$
#variable_conflict use_column
DECLARE
    requeued      integer;
    keys          text[];
    endpoints     bigint[];
    endpoint_keys text[];
BEGIN
    WITH dead AS (
        -- (Dead letters are never moved to the history: outbox itself holds them all.)
        SELECT o.id
          FROM ONLY @extschema@.outbox o
         WHERE o.status = 'DEAD'::@extschema@.outbox_status
           AND (outbox_requeue_dead.ids IS NULL OR o.id = ANY (outbox_requeue_dead.ids))
           AND (outbox_requeue_dead.topic IS NULL OR o.topic = outbox_requeue_dead.topic)
           FOR UPDATE
    ), deliveries AS (
        -- With an ordering key, a requeued delivery queues behind its key's at that endpoint.
        UPDATE ONLY @extschema@.outbox_delivery d
           SET status = 'PENDING', attempts = 0, available_at = clock_timestamp(), processed_at = NULL, leased = false,
               waiting_for = CASE WHEN d.ordering_key IS NOT NULL THEN 'ordering_key'::@extschema@.outbox_wait END
         WHERE d.message_id = ANY (ARRAY(SELECT dead.id FROM dead))
           AND d.status = 'DEAD'::@extschema@.outbox_status
        RETURNING d.subscription_id, d.ordering_key
    ), keyed_deliveries AS (
        SELECT array_agg(k.subscription_id) AS endpoints, array_agg(k.ordering_key) AS endpoint_keys
          FROM (SELECT DISTINCT e.subscription_id, e.ordering_key FROM deliveries e WHERE e.ordering_key IS NOT NULL) k
    ), settled AS (
        -- Messages the worker handed to endpoints, none of them dead any more (their dead
        -- deliveries went with an unsubscribed endpoint): every endpoint left took them. Nothing
        -- is sent again: DONE, as the worker settles such a message (0.5.32 left it PENDING,
        -- waiting for deliveries that never came).
        -- (Their deliveries found by message id alone, in the primary key, in one scan: a
        -- probe of the dead deliveries per message, planned for the few rows the statistics of
        -- a table loaded since promised, read the whole dead index for each, 30,000 times.)
        SELECT d.message_id AS id
          FROM ONLY @extschema@.outbox_delivery d
         WHERE d.message_id = ANY (ARRAY(SELECT dead.id FROM dead))
         GROUP BY d.message_id
        HAVING NOT pg_catalog.bool_or(d.status = 'DEAD'::@extschema@.outbox_status)
    ), done AS (
        UPDATE ONLY @extschema@.outbox o
           SET status = 'DONE', processed_at = clock_timestamp(), waiting_for = NULL, lease_token = NULL
         WHERE o.id = ANY (ARRAY(SELECT settled.id FROM settled))
    ), messages AS (
        UPDATE ONLY @extschema@.outbox o
           SET status = 'PENDING', attempts = 0, processed_at = NULL, lease_token = NULL,
               available_at = clock_timestamp(),
               -- With deliveries, the message waits for them again; with an ordering key, it
               -- queues behind the key's messages (released below when the key has none).
               waiting_for = CASE WHEN EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id = o.id)
                                  THEN 'deliveries'::@extschema@.outbox_wait
                                  WHEN o.ordering_key IS NOT NULL THEN 'ordering_key'::@extschema@.outbox_wait
                             END
         WHERE o.id = ANY (ARRAY(SELECT dead.id FROM dead))
           AND o.id <> ALL (ARRAY(SELECT settled.id FROM settled))
        RETURNING o.id, o.ordering_key, o.waiting_for
    )
    SELECT (SELECT count(*) FROM messages),
           (SELECT array_agg(DISTINCT m.ordering_key) FILTER (WHERE m.waiting_for = 'ordering_key') FROM messages m),
           kd.endpoints, kd.endpoint_keys
      INTO requeued, keys, endpoints, endpoint_keys
      FROM keyed_deliveries kd;
    -- The locks of the endpoints where it hands keys on (src/ordering/lock_endpoints_keys.sql
    -- takes them again below, already held), before any key's: the worker holds an endpoint's
    -- lock from its hand-ons and may then wait for a key, so a requeue holding the key while it
    -- waited for the endpoint waited in a circle with it (40P01 after deadlock_timeout).
    PERFORM pg_advisory_xact_lock('@extschema@.outbox_delivery'::regclass::oid::int4, e.hash)
       FROM (SELECT DISTINCT hashint8(e.subscription_id) AS hash FROM unnest(endpoints) AS e(subscription_id) ORDER BY 1) e;
    -- The keys of the requeued deliveries, held as a producer holds a key it queues behind
    -- (shared) until this transaction ends, as outbox_redeliver does: meanwhile the worker
    -- leaves the keys' newer messages alone, rather than make one the key's head at an endpoint
    -- beside a requeued delivery (it waited for this commit, every endpoint with it, and then
    -- failed on outbox_delivery_key_head_idx). Those of the requeued messages outbox_release_keys
    -- takes below, exclusively, never holding one while it waits for another
    -- (src/ordering/key_locks.rs); held shared here first, two requeues of one key would each
    -- wait for the other's share.
    PERFORM pg_advisory_xact_lock_shared('@extschema@.outbox'::regclass::oid::int4, d.hash)
       FROM (SELECT DISTINCT hashtext(d.key) AS hash
               FROM unnest(endpoint_keys) AS d(key)
              WHERE d.key <> ALL (coalesce(keys, '{}'))
              ORDER BY 1) d;
    IF keys IS NOT NULL THEN
        PERFORM @extschema@.outbox_release_keys(keys);
    END IF;
    IF endpoints IS NOT NULL THEN
        PERFORM @extschema@.outbox_release_delivery_keys(endpoints, endpoint_keys);
    END IF;
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
SET plan_cache_mode = force_custom_plan  -- (see outbox_requeue_dead)
AS $$
#variable_conflict use_column
DECLARE
    discarded integer;
BEGIN
    -- (Dead letters are never moved to the history: outbox itself holds them all.)
    WITH gone AS (
        DELETE FROM ONLY @extschema@.outbox o
         WHERE o.status = 'DEAD'
           AND (outbox_discard_dead.ids IS NULL OR o.id = ANY (outbox_discard_dead.ids))
           AND (outbox_discard_dead.topic IS NULL OR o.topic = outbox_discard_dead.topic)
        RETURNING o.id
    ), gone_deliveries AS (
        DELETE FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id = ANY (ARRAY(SELECT g.id FROM gone g))
    )
    SELECT count(*) INTO discarded FROM gone;
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

-- archive: move DONE messages, with their deliveries, out of the table the claims and the
-- worker read, a minute after they ended, into the history table of the day they were
-- processed (sql/schema.sql, docs/storage.md), at most max_rows of them, oldest first;
-- returns how many. The delivery worker calls it every second; outbox_purge calls it too, for
-- databases without a worker. Messages with a dedupe_key stay (their key is unique in outbox
-- only) until purged.
--
-- The worker's session plans its statements once, often while outbox and outbox_delivery are
-- still empty (the planner gives tables with children no minimum size), and keeps the plans:
-- made then, this one read the whole delivery table for each message, minutes for a bulk of
-- 30,000 (test_history.py). So its scans are by index whatever the estimates: enable_seqscan
-- off, and the deliveries looked up per message (below).
CREATE OR REPLACE FUNCTION outbox_archive(max_rows integer DEFAULT 10000) RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    archived bigint := 0;
    moved    bigint;
    day_slot integer;
    ids      bigint[];
BEGIN
    IF max_rows IS NULL THEN
        RAISE EXCEPTION 'outbox_archive: max_rows must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_rows < 1 OR max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox_archive: max_rows must be between 1 and 1000000, got %', max_rows
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- outbox_redeliver holds this lock while it reads messages of any age: rather than move a
    -- message from under it, wait for the next call. (Shared: archives run side by side,
    -- each skipping the rows another has locked.)
    IF NOT pg_try_advisory_xact_lock_shared('@extschema@.outbox_history_0'::regclass::oid::int4, 0) THEN
        RETURN 0;
    END IF;
    FOR day_slot, ids IN
        SELECT @extschema@.outbox_attempt_log_slot(e.processed_at), array_agg(e.id)
          FROM (SELECT o.id, o.processed_at
                  FROM ONLY @extschema@.outbox o
                 WHERE o.status = 'DONE'::@extschema@.outbox_status
                   AND o.status <> 'PENDING'::@extschema@.outbox_status  -- (outbox_processed_idx)
                   -- A minute after, as before 0.5.4 (when outbox_stats() counted the last
                   -- minute's completions in outbox only); outbox_complete moves most at once.
                   AND o.processed_at < clock_timestamp() - interval '1 minute'
                   AND o.dedupe_key IS NULL
                   -- (A message completed by hand while the worker delivered it stays. OFFSET 0
                   -- keeps this a lookup per message, by outbox_delivery's key: as a join, a
                   -- plan made on empty tables scanned the whole table for each message.)
                   AND NOT EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery d
                                    WHERE d.message_id = o.id AND d.status <> 'DONE'::@extschema@.outbox_status
                                   OFFSET 0)
                 ORDER BY o.status, o.processed_at
                 LIMIT max_rows
                   FOR UPDATE SKIP LOCKED) e
         GROUP BY 1
    LOOP
        -- A message whose deliveries another transaction holds (an unsubscribe deleting them)
        -- stays for a later call, rather than waited for: the worker calls this in its loop.
        ids := ARRAY(
            SELECT m.id
              FROM unnest(ids) AS m(id)
             WHERE (SELECT count(*) FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id = m.id)
                 = (SELECT count(*) FROM (SELECT FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id = m.id
                                             FOR UPDATE SKIP LOCKED) locked));
        EXECUTE format(
            'WITH messages AS (DELETE FROM ONLY @extschema@.outbox o WHERE o.id = ANY ($1) RETURNING o.*),
                  deliveries AS (DELETE FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id = ANY ($1) RETURNING d.*),
                  archived_deliveries AS (INSERT INTO @extschema@.%I SELECT * FROM deliveries)
             INSERT INTO @extschema@.%I SELECT * FROM messages',
            'outbox_delivery_history_' || day_slot, 'outbox_history_' || day_slot) USING ids;
        GET DIAGNOSTICS moved = ROW_COUNT;
        archived := archived + moved;
    END LOOP;
    RETURN archived;
END
$$;

COMMENT ON FUNCTION outbox_archive(integer) IS
'Moves up to max_rows DONE messages (without a dedupe_key) that ended over a minute ago, with their deliveries, into the history table of the day they were processed, oldest first; returns how many. The delivery worker calls it every second.';

-- compact: give the hot tables (outbox and outbox_delivery without their histories) back the
-- space that row versions vacuum may not remove yet have taken. While a session holds back the
-- xmin horizon (idle in transaction, a long query), every claim, completion and move to the
-- history leaves a version that no vacuum can remove, so what the claims read grows with the
-- traffic, and stays grown afterwards. The live rows are few: under an exclusive lock this
-- copies them, empties the table with TRUNCATE (which frees its files whatever the horizon)
-- and writes them back, unchanged, in one transaction: a crash leaves the tables as they were.
-- Only a table over 2 MB is compacted (both when forced), and only it is locked: TRUNCATE
-- builds each of a table's indexes again (before PostgreSQL 17 each build waits for its own
-- fsync), and every statement on a locked table waits meanwhile. Each TRUNCATE names ONLY its
-- table: the history tables inherit from these two, and a TRUNCATE without ONLY would empty
-- them too (0.5.7 to 0.5.12 emptied outbox_delivery's so; docs/upgrades.md).
-- Returns how many rows it kept, or NULL when it did nothing (docs/storage.md):
--   - unless forced, when the tables are small (under 2 MB each), or under 8 MB while no
--     transaction of this database (nor a prepared one) has held the horizon back for 10
--     seconds and no replication slot that nobody uses holds it (autovacuum
--     keeps up then; over 8 MB, a horizon held back earlier left them so, perhaps by a
--     session whose lock kept the compaction out), or more live rows than max_live_rows are
--     counted in the statistics;
--   - when either table is published for logical replication (a subscriber would see the rows
--     emptied and inserted again);
--   - when the lock is not granted within 20 ms (a session is using the tables: a consumer in
--     its transaction, a dump), or more than max_live_rows rows are live.
-- TRUNCATE is not MVCC-safe: a REPEATABLE READ transaction whose snapshot is older than the
-- compaction and that has not yet read the tables sees them without the rows written back (it
-- claims nothing; a message it completes under a lease is handed out again after the lease).
-- The write-back fires no trigger (session_replication_role): the rows are the same.
CREATE OR REPLACE FUNCTION outbox_compact(force boolean DEFAULT false, max_live_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET lock_timeout = '20ms'
SET session_replication_role = replica
AS $$
DECLARE
    small_table CONSTANT bigint := 2 * 1024 * 1024;
    large_table CONSTANT bigint := 8 * 1024 * 1024;
    largest     bigint;
    held_back   CONSTANT interval := interval '10 seconds';
    -- A standby's xmin stands still between two of its feedbacks (wal_receiver_status_interval,
    -- 10 s by default) even when healthy: three of them.
    standby_held_back CONSTANT interval := interval '30 seconds';
    standby_xmins jsonb;
    seen_xmins  jsonb;
    horizon     xid;
    -- Which tables this call compacts: over small_table, or both when forced.
    compact_messages   boolean;
    compact_deliveries boolean;
    compacted   text;
    messages    @extschema@.outbox[];
    deliveries  @extschema@.outbox_delivery[];
    kept        bigint;
    size_before bigint;
BEGIN
    IF force IS NULL THEN
        RAISE EXCEPTION 'outbox_compact: force must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_live_rows IS NULL THEN
        RAISE EXCEPTION 'outbox_compact: max_live_rows must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_live_rows < 0 OR max_live_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox_compact: max_live_rows must be between 0 and 1000000, got %', max_live_rows
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    compact_messages := force OR pg_relation_size('@extschema@.outbox'::regclass) >= small_table;
    compact_deliveries := force OR pg_relation_size('@extschema@.outbox_delivery'::regclass) >= small_table;
    largest := greatest(pg_relation_size('@extschema@.outbox'::regclass),
                        pg_relation_size('@extschema@.outbox_delivery'::regclass));
    IF NOT force AND (
           largest < small_table
           -- (Counted before the lock: a large backlog is never locked up only to be counted.)
        OR CASE WHEN compact_messages THEN pg_stat_get_live_tuples('@extschema@.outbox'::regclass) ELSE 0 END
           + CASE WHEN compact_deliveries THEN pg_stat_get_live_tuples('@extschema@.outbox_delivery'::regclass) ELSE 0 END
           > max_live_rows)
    THEN
        RETURN NULL;
    END IF;
    IF NOT force AND largest < large_table
        -- (The horizon of a database's tables: its own sessions'. A vacuum elsewhere holds
        -- back no other vacuum.)
        AND NOT EXISTS (SELECT FROM pg_stat_activity a
                         WHERE (a.backend_xmin IS NOT NULL OR a.backend_xid IS NOT NULL)
                           AND a.xact_start < clock_timestamp() - held_back
                           AND a.datname = current_database()
                           AND a.backend_type <> 'autovacuum worker'
                           AND a.pid <> pg_backend_pid())
        AND NOT EXISTS (SELECT FROM pg_prepared_xacts p WHERE p.prepared < clock_timestamp() - held_back)
        -- (A slot no one uses that holds the horizon: a standby gone with hot_standby_feedback
        -- on. It holds it for every database, and for as long as it stays.)
        AND NOT EXISTS (SELECT FROM pg_replication_slots s WHERE NOT s.active AND s.xmin IS NOT NULL)
    THEN
        -- A connected standby with hot_standby_feedback = on holds the horizon at its oldest
        -- query's snapshot, and the primary cannot see since when. So this session remembers
        -- each standby whose xmin is behind the primary's own horizon: that xmin, and since when
        -- it has been seen behind (in a setting of the session: the worker calls this every
        -- second from one session). An xmin only moves forward, so one behind for 30 s has held
        -- vacuum back all that time, whatever happened between two calls; one the primary has
        -- not passed (nothing happened since) holds nothing back, and is forgotten.
        -- (The primary's oldest running transaction, as a 32-bit xid like the standbys'.)
        horizon := (pg_snapshot_xmin(pg_current_snapshot())::text::numeric % 4294967296)::text::xid;
        -- (Anyone who may run this can set the setting in their session, and a database owner
        -- for every session: what does not read as JSON starts the state again, and an entry
        -- whose time is not a number starts its standby's clock again.)
        BEGIN
            seen_xmins := coalesce(nullif(current_setting('outbox_ext_compact.standby_xmins', true), ''), '{}')::jsonb;
        EXCEPTION WHEN invalid_text_representation THEN
            seen_xmins := '{}';
        END;
        SELECT coalesce(jsonb_object_agg(f.standby, jsonb_build_array(f.xmin::text,
                            CASE WHEN seen_xmins -> f.standby ->> 0 = f.xmin::text
                                  AND jsonb_typeof(seen_xmins -> f.standby -> 1) = 'number'
                                 THEN seen_xmins -> f.standby -> 1
                                 ELSE to_jsonb(extract(epoch FROM clock_timestamp())) END))
                            FILTER (WHERE age(f.xmin) > age(horizon)), '{}')
          INTO standby_xmins
          FROM (SELECT 'slot ' || s.slot_name AS standby, s.xmin
                  FROM pg_replication_slots s WHERE s.active AND s.xmin IS NOT NULL
                UNION ALL
                SELECT 'walsender ' || r.pid, r.backend_xmin
                  FROM pg_stat_replication r WHERE r.backend_xmin IS NOT NULL) f;
        PERFORM set_config('outbox_ext_compact.standby_xmins', standby_xmins::text, false);
        IF NOT EXISTS (SELECT FROM jsonb_each(standby_xmins) e
                        WHERE (e.value -> 1)::numeric < extract(epoch FROM clock_timestamp() - standby_held_back)) THEN
            RETURN NULL;
        END IF;
    END IF;
    IF EXISTS (SELECT FROM pg_publication p
                WHERE p.puballtables
                   OR EXISTS (SELECT FROM pg_publication_rel r
                               WHERE r.prpubid = p.oid
                                 AND r.prrelid IN ('@extschema@.outbox'::regclass, '@extschema@.outbox_delivery'::regclass))
                   OR EXISTS (SELECT FROM pg_publication_namespace n
                               WHERE n.pnpubid = p.oid AND n.pnnspid = '@extschema@'::regnamespace)) THEN
        RETURN NULL;
    END IF;
    -- (A table left alone is not locked either: the worker's deliveries go on meanwhile.)
    BEGIN
        IF compact_messages AND compact_deliveries THEN
            LOCK TABLE ONLY @extschema@.outbox, ONLY @extschema@.outbox_delivery IN ACCESS EXCLUSIVE MODE;
            compacted := 'outbox and outbox_delivery';
        ELSIF compact_messages THEN
            LOCK TABLE ONLY @extschema@.outbox IN ACCESS EXCLUSIVE MODE;
            compacted := 'outbox';
        ELSE
            LOCK TABLE ONLY @extschema@.outbox_delivery IN ACCESS EXCLUSIVE MODE;
            compacted := 'outbox_delivery';
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RETURN NULL;
    END;
    IF compact_messages THEN
        SELECT array_agg(o) INTO messages
          FROM (SELECT o FROM ONLY @extschema@.outbox o LIMIT max_live_rows + 1) o;
    END IF;
    IF compact_deliveries THEN
        SELECT array_agg(d) INTO deliveries
          FROM (SELECT d FROM ONLY @extschema@.outbox_delivery d LIMIT max_live_rows + 1) d;
    END IF;
    kept := coalesce(cardinality(messages), 0) + coalesce(cardinality(deliveries), 0);
    IF kept > max_live_rows THEN
        RETURN NULL;
    END IF;
    size_before := CASE WHEN compact_messages THEN pg_total_relation_size('@extschema@.outbox'::regclass) ELSE 0 END
                 + CASE WHEN compact_deliveries THEN pg_total_relation_size('@extschema@.outbox_delivery'::regclass) ELSE 0 END;
    IF compact_messages THEN
        TRUNCATE ONLY @extschema@.outbox;
        INSERT INTO @extschema@.outbox SELECT * FROM unnest(messages);
    END IF;
    IF compact_deliveries THEN
        TRUNCATE ONLY @extschema@.outbox_delivery;
        INSERT INTO @extschema@.outbox_delivery SELECT * FROM unnest(deliveries);
    END IF;
    -- (An event worth the server log, as autovacuum's are: an exclusive lock and a new file.)
    RAISE LOG 'outbox_compact: compacted % from % to % (% live rows kept)',
        compacted,
        pg_size_pretty(size_before),
        pg_size_pretty(CASE WHEN compact_messages THEN pg_total_relation_size('@extschema@.outbox'::regclass) ELSE 0 END
                       + CASE WHEN compact_deliveries THEN pg_total_relation_size('@extschema@.outbox_delivery'::regclass) ELSE 0 END),
        kept;
    RETURN kept;
END
$$;

COMMENT ON FUNCTION outbox_compact(boolean, integer) IS
'Gives outbox and outbox_delivery (not their histories) back the space of row versions vacuum may not remove yet: under an exclusive lock, copies the live rows, empties the table with TRUNCATE and writes the rows back; only a table over 2 MB (both when forced). Unless forced, only when a table is over 8 MB, or over 2 MB while a transaction has held the xmin horizon back for 10 s, an inactive replication slot holds it, or a connected standby''s xmin has been behind the primary''s own for 30 s (seen by calls from the same session: the worker''s). Returns the rows kept, or NULL when it did nothing (small tables, a publication, the lock not granted within 20 ms, more than max_live_rows live rows). The delivery worker calls it every second.';

-- purge: delete DONE rows (and DEAD ones, when asked) finished longer than older_than ago,
-- at most max_rows of them, oldest first, with their deliveries. Bounded so no call holds its
-- row locks or its transaction for long: call it again until it returns less than max_rows
-- (the delivery worker does, every minute, with outbox.retention). The history of DONE messages
-- and the attempt log go a whole day at a time (below), not counted. Its plans, like
-- outbox_archive's, are kept by a worker session that may have begun on empty tables: by index
-- whatever the estimates (enable_seqscan off).
CREATE OR REPLACE FUNCTION outbox_purge(older_than interval, include_dead boolean DEFAULT false, max_rows integer DEFAULT 10000)
RETURNS bigint
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET enable_seqscan = off
AS $$
DECLARE
    called_at   timestamptz;
    cutoff      timestamptz;
    purged      bigint := 0;
    deleted     bigint;
    finished    @extschema@.outbox_status;
    today       timestamptz;
    days        integer;  -- partitions of the attempt log: the days it cycles through
    day_start   timestamptz;
    day_kind    text;
    day_table   regclass;
    companion   regclass;     -- the deliveries' history of the same day, for outbox_history_N
    time_column text;
    holds       boolean;
    waited      text;
BEGIN
    IF older_than IS NULL THEN
        RAISE EXCEPTION 'outbox_purge: older_than must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    PERFORM @extschema@.outbox_check_interval('outbox_purge'::text, 'older_than'::text, older_than::interval);
    -- Judged by where it takes the clock, not by comparing intervals (which count a month as 30
    -- days: '-1 year +361 days' compares as positive but moves the cut-off days ahead).
    called_at := clock_timestamp();
    BEGIN
        cutoff := called_at - older_than;
    EXCEPTION WHEN datetime_field_overflow THEN
        cutoff := '-infinity';  -- before 4713 BC, where timestamps begin: nothing is that old
    END;
    IF cutoff > called_at THEN
        RAISE EXCEPTION 'outbox_purge: older_than must not be negative, got %', older_than
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF include_dead IS NULL THEN
        RAISE EXCEPTION 'outbox_purge: include_dead must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_rows IS NULL THEN
        RAISE EXCEPTION 'outbox_purge: max_rows must not be NULL' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF max_rows < 1 OR max_rows > 1000000 THEN
        RAISE EXCEPTION 'outbox_purge: max_rows must be between 1 and 1000000, got %', max_rows
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF cutoff = '-infinity' THEN
        RETURN 0;
    END IF;

    -- What is still in outbox itself (dead letters, DONE messages not moved to the history yet,
    -- those with a dedupe_key): row by row, with their deliveries.
    FOREACH finished IN ARRAY CASE WHEN include_dead THEN '{DONE,DEAD}'::@extschema@.outbox_status[] ELSE '{DONE}' END LOOP
        EXIT WHEN purged >= max_rows;
        -- What another transaction holds (a redelivery its messages, an unsubscribe their
        -- deliveries) is left to a later purge rather than waited for (since 0.5.25: the
        -- worker's purge waited, and its whole loop with it).
        WITH oldest AS (
            -- The oldest of those without and with a dedupe_key (an index each).
            SELECT e.ctid
              FROM ((SELECT d.ctid, d.processed_at FROM ONLY @extschema@.outbox d
                      WHERE d.status = finished AND d.status <> 'PENDING'::@extschema@.outbox_status
                        AND d.dedupe_key IS NULL AND d.processed_at < cutoff
                      ORDER BY d.status, d.processed_at
                      LIMIT max_rows - purged)
                    UNION ALL
                    (SELECT d.ctid, d.processed_at FROM ONLY @extschema@.outbox d
                      WHERE d.status = finished AND d.status <> 'PENDING'::@extschema@.outbox_status
                        AND d.dedupe_key IS NOT NULL AND d.processed_at < cutoff
                      ORDER BY d.status, d.processed_at
                      LIMIT max_rows - purged)) e
             ORDER BY e.processed_at
             LIMIT max_rows - purged
        ), chosen AS (
            -- (Re-checked on the row locked: a dead letter requeued meanwhile stays.)
            SELECT o.ctid, o.id
              FROM ONLY @extschema@.outbox o
             WHERE o.ctid = ANY (ARRAY(SELECT e.ctid FROM oldest e))
               AND o.status = finished AND o.processed_at < cutoff
               FOR UPDATE SKIP LOCKED
        ), locked_deliveries AS (
            SELECT l.message_id, l.subscription_id
              FROM ONLY @extschema@.outbox_delivery l
             WHERE l.message_id = ANY (ARRAY(SELECT c.id FROM chosen c))
               FOR UPDATE SKIP LOCKED
        ), held AS (
            -- (NOT IN a subquery: hashed, whatever the plan cached on empty tables expects.)
            SELECT d.message_id
              FROM ONLY @extschema@.outbox_delivery d
             WHERE d.message_id = ANY (ARRAY(SELECT c.id FROM chosen c))
               AND (d.message_id, d.subscription_id) NOT IN (SELECT l.message_id, l.subscription_id FROM locked_deliveries l)
        ), gone AS (
            DELETE FROM ONLY @extschema@.outbox o
             WHERE o.ctid = ANY (ARRAY(SELECT c.ctid FROM chosen c WHERE c.id NOT IN (SELECT h.message_id FROM held h)))
            RETURNING o.id
        ), gone_deliveries AS (
            -- (By the key of outbox_delivery, each message's: see enable_seqscan above.)
            DELETE FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id = ANY (ARRAY(SELECT g.id FROM gone g))
        )
        SELECT count(*) INTO deleted FROM gone;
        purged := purged + deleted;
    END LOOP;
    -- Without a delivery worker, nothing else moves DONE messages to the history.
    PERFORM @extschema@.outbox_archive(max_rows);

    -- The history of DONE messages (with their deliveries) and the attempt log, a day at a time:
    -- the table of a day that ended before the cutoff is emptied whole (TRUNCATE: no dead tuples,
    -- a time that does not grow with its rows; not counted in the result). The rows of a day
    -- that has not ended yet wait for it. Rows older than the day their table holds now (a
    -- retention over 31 days, a time set by hand) are deleted one by one.
    today := date_trunc('day', clock_timestamp() AT TIME ZONE 'UTC') AT TIME ZONE 'UTC';
    days := (SELECT count(*) FROM pg_inherits i WHERE i.inhparent = '@extschema@.outbox_delivery_attempt'::regclass);
    FOR slot IN 0 .. days - 1 LOOP
        -- The latest day, up to today, whose rows this slot holds.
        day_start := today - ((@extschema@.outbox_attempt_log_slot(today) - slot + days) % days) * interval '1 day';
        FOREACH day_kind IN ARRAY '{outbox_delivery_attempt_,outbox_history_}'::text[] LOOP
            day_table := format('@extschema@.%I', day_kind || slot)::regclass;
            IF day_kind = 'outbox_history_' THEN
                time_column := 'processed_at';
                companion := format('@extschema@.%I', 'outbox_delivery_history_' || slot)::regclass;
            ELSE
                time_column := 'started_at';
                companion := NULL;
            END IF;
            IF day_start + interval '1 day' <= cutoff THEN
                EXECUTE format('SELECT EXISTS (SELECT FROM %s)', day_table) INTO holds;
                IF holds THEN
                    waited := current_setting('lock_timeout');
                    BEGIN
                        -- Whoever reads these rows meanwhile makes this wait, and everyone
                        -- after it: give up soon, the next purge tries again.
                        PERFORM set_config('lock_timeout', '1s', true);
                        EXECUTE format('LOCK TABLE %s IN ACCESS EXCLUSIVE MODE', concat_ws(', ', day_table, companion));
                        PERFORM set_config('lock_timeout', waited, true);
                        -- Under the lock: nothing of the cutoff or later (a clock set back) is lost.
                        EXECUTE format('SELECT EXISTS (SELECT FROM %s WHERE %I >= $1)', day_table, time_column) USING cutoff INTO holds;
                        IF NOT holds THEN
                            EXECUTE format('TRUNCATE %s', concat_ws(', ', day_table, companion));
                        END IF;
                    EXCEPTION WHEN lock_not_available THEN
                        NULL;  -- (the block's subtransaction also restores lock_timeout)
                    END;
                END IF;
            END IF;
            IF purged < max_rows THEN
                IF companion IS NULL THEN
                    EXECUTE format('DELETE FROM %1$s a WHERE a.ctid = ANY (ARRAY(SELECT l.ctid FROM %1$s l WHERE l.%2$I < $1 LIMIT $2 FOR UPDATE SKIP LOCKED))',
                                   day_table, time_column)
                      USING least(cutoff, day_start), max_rows - purged;
                    GET DIAGNOSTICS deleted = ROW_COUNT;
                ELSE
                    EXECUTE format('WITH gone AS (DELETE FROM %1$s a WHERE a.ctid = ANY (ARRAY(SELECT l.ctid FROM %1$s l WHERE l.%2$I < $1 LIMIT $2 FOR UPDATE SKIP LOCKED)) RETURNING a.id),
                                         gone_deliveries AS (DELETE FROM %3$s d USING gone WHERE d.message_id = gone.id)
                                    SELECT count(*) FROM gone', day_table, time_column, companion)
                      USING least(cutoff, day_start), max_rows - purged INTO deleted;
                END IF;
                purged := purged + deleted;
            END IF;
        END LOOP;
    END LOOP;
    RETURN purged;
END
$$;

COMMENT ON FUNCTION outbox_purge(interval, boolean, integer) IS
'Deletes up to max_rows DONE messages (and DEAD ones with include_dead) processed longer than older_than ago, oldest first, with their deliveries, and empties the history of DONE messages and the attempt log of the days that ended before then; returns how many rows it deleted one by one. Call again until it returns less than max_rows.';

-- redeliver: send messages of an endpoint's topic to that endpoint again, whatever their
-- delivery's state: DONE (replay to a receiver that lost data), DEAD (retry after a fix) or
-- none (catch a new endpoint up). Those in message_ids, else those created at or after since,
-- else every one still in the table; messages not yet picked up by the worker are left alone
-- (they get this endpoint's delivery when they are). Fresh attempts, the same webhook-id.
CREATE OR REPLACE FUNCTION outbox_redeliver(
    subscription_id bigint,
    since           timestamptz DEFAULT NULL,
    message_ids     bigint[]    DEFAULT NULL
) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
SET plan_cache_mode = force_custom_plan  -- (see outbox_requeue_dead)
AS $$
#variable_conflict use_column
DECLARE
    endpoint_topic text;
    scheduled      integer;
    keys           text[];
    chosen_ids     bigint[];
    key_hashes     integer[];
BEGIN
    IF outbox_redeliver.subscription_id IS NULL THEN
        RAISE EXCEPTION 'outbox_redeliver: subscription_id must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    IF array_ndims(outbox_redeliver.message_ids) > 1 THEN
        RAISE EXCEPTION 'outbox_redeliver: message_ids must be a one-dimensional array, got % dimensions',
                        array_ndims(outbox_redeliver.message_ids)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(outbox_redeliver.message_ids, NULL) IS NOT NULL THEN
        RAISE EXCEPTION 'outbox_redeliver: message_ids must not contain NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT s.topic INTO endpoint_topic
      FROM @extschema@.outbox_subscription s
     WHERE s.id = outbox_redeliver.subscription_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'outbox_redeliver: subscription_id % is not a subscription', outbox_redeliver.subscription_id
            USING ERRCODE = 'invalid_parameter_value',
                  HINT = 'SELECT id, topic, url FROM outbox_subscriptions lists them.';
    END IF;

    -- The messages, wherever they are (outbox and its history, below), locked. While this
    -- transaction lasts, outbox_archive moves nothing (it would move them from under it).
    PERFORM pg_advisory_xact_lock('@extschema@.outbox_history_0'::regclass::oid::int4, 0);
    chosen_ids := ARRAY(
        SELECT o.id
          FROM @extschema@.outbox o
         WHERE o.topic = endpoint_topic
           AND (outbox_redeliver.message_ids IS NULL OR o.id = ANY (outbox_redeliver.message_ids))
           AND (outbox_redeliver.message_ids IS NOT NULL OR outbox_redeliver.since IS NULL
                OR o.created_at >= outbox_redeliver.since)
           AND NOT (o.status = 'PENDING'::@extschema@.outbox_status
                    AND o.waiting_for IS DISTINCT FROM 'deliveries'::@extschema@.outbox_wait)
         ORDER BY o.id
           FOR UPDATE);
    -- Their ordering keys (read once: outbox and each of its history tables are looked in).
    key_hashes := ARRAY(SELECT DISTINCT hashtext(o.ordering_key)
                          FROM @extschema@.outbox o
                         WHERE o.id = ANY (chosen_ids) AND o.ordering_key IS NOT NULL
                         ORDER BY 1);
    -- The endpoint's lock, before the keys' (as outbox_requeue_dead: the worker holds it from
    -- its hand-ons and may then wait for a key); src/ordering takes it again below.
    IF cardinality(key_hashes) > 0 THEN
        PERFORM pg_advisory_xact_lock('@extschema@.outbox_delivery'::regclass::oid::int4,
                                      hashint8(outbox_redeliver.subscription_id));
    END IF;
    -- The keys, held as a producer holds a key it queues behind (src/ordering) until this
    -- transaction ends, in the hashes' order: meanwhile the worker leaves the keys' newer
    -- messages alone, rather than make one the key's head at this endpoint beside the replay (it
    -- waited for this commit, every endpoint with it, and then failed on
    -- outbox_delivery_key_head_idx).
    PERFORM pg_advisory_xact_lock_shared('@extschema@.outbox'::regclass::oid::int4, k.hash)
       FROM unnest(key_hashes) WITH ORDINALITY AS k(hash, position)
      ORDER BY k.position;
    -- Those in the history come back to outbox, with their deliveries, to be sent again.
    WITH archived AS (
        DELETE FROM @extschema@.outbox o
         WHERE o.id = ANY (chosen_ids) AND o.tableoid <> '@extschema@.outbox'::regclass
        RETURNING o.*
    ), archived_deliveries AS (
        DELETE FROM @extschema@.outbox_delivery d
         WHERE d.message_id = ANY (ARRAY(SELECT a.id FROM archived a)) AND d.tableoid <> '@extschema@.outbox_delivery'::regclass
        RETURNING d.*
    ), restored_deliveries AS (
        INSERT INTO @extschema@.outbox_delivery SELECT * FROM archived_deliveries
    )
    INSERT INTO @extschema@.outbox SELECT * FROM archived;

    WITH chosen AS (
        -- (Locked above, or inserted just now by this transaction.)
        SELECT o.id, o.ordering_key
          FROM ONLY @extschema@.outbox o
         WHERE o.id = ANY (chosen_ids)
         ORDER BY o.id
    ), deliveries AS (
        -- With an ordering key, a replayed delivery queues behind the key's (released below).
        INSERT INTO @extschema@.outbox_delivery AS d (message_id, subscription_id, ordering_key, waiting_for)
        SELECT c.id, outbox_redeliver.subscription_id, c.ordering_key,
               CASE WHEN c.ordering_key IS NOT NULL THEN 'ordering_key'::@extschema@.outbox_wait END
          FROM chosen c
        ON CONFLICT (message_id, subscription_id) DO UPDATE
           SET status = 'PENDING', attempts = 0, available_at = clock_timestamp(), processed_at = NULL, leased = false,
               waiting_for = EXCLUDED.waiting_for
        RETURNING d.message_id, d.ordering_key
    ), reopened AS (
        UPDATE ONLY @extschema@.outbox o
           SET status = 'PENDING', processed_at = NULL, lease_token = NULL,
               waiting_for = 'deliveries'::@extschema@.outbox_wait
         WHERE o.id = ANY (ARRAY(SELECT d.message_id FROM deliveries d))
    )
    SELECT count(*), array_agg(DISTINCT d.ordering_key) FILTER (WHERE d.ordering_key IS NOT NULL)
      INTO scheduled, keys
      FROM deliveries d;
    IF keys IS NOT NULL THEN
        PERFORM @extschema@.outbox_release_delivery_keys(
            array_fill(outbox_redeliver.subscription_id, ARRAY[cardinality(keys)]), keys);
    END IF;
    IF scheduled > 0 THEN
        PERFORM @extschema@.outbox_wake_worker_at_commit();
    END IF;
    RETURN scheduled;
END
$$;

COMMENT ON FUNCTION outbox_redeliver(bigint, timestamptz, bigint[]) IS
'Schedules messages of the subscription''s topic for that endpoint again, whatever their delivery''s state: those in message_ids, else those created at or after since, else all still in the table (messages not yet picked up by the worker are left alone). Fresh attempts, the same webhook-id. Returns how many it scheduled.';

-- The delivery workers, and the databases waiting for one (written in Rust: src/worker).
CREATE OR REPLACE FUNCTION outbox_worker_status() RETURNS TABLE (
    database     text,
    pid          integer,       -- NULL: the database waits for a worker (state says why)
    state        text,
    started_at   timestamptz,
    last_poll_at timestamptz,
    in_flight    integer,       -- HTTP requests in flight now
    delivered    bigint,        -- since the worker started
    failed       bigint,
    compactions  bigint,        -- of the hot tables (outbox_compact), since the worker started
    last_compaction_at timestamptz
)
LANGUAGE c VOLATILE
AS 'MODULE_PATHNAME', 'outbox_worker_status_wrapper';
