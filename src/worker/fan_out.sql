-- The worker's pick-up, second statement: it makes the deliveries of the messages $2 that
-- pick_up.sql locked (their ordering keys locked too), at the clock $1, in a snapshot taken
-- after those locks. Each gets one delivery per subscription of its topic (parked while that
-- one is disabled), which starts where the message stood (its attempts and last error: a
-- message that was backing off keeps its schedule) and, with an ordering key, waits behind
-- the endpoint's pending deliveries of that key, if any (they have a head, the oldest, but
-- while an operator's transaction holds the next one: src/ordering). The message then waits
-- for its deliveries (no claim takes it) and releases its key: from here the order holds per
-- endpoint.
--
-- A topic whose subscriptions an operator is changing (unsubscribing one, not yet committed,
-- or removed since this statement's snapshot) is left alone, its messages untouched: the
-- foreign key of a delivery to the removed subscription would wait for the operator's commit
-- (holding back every topic) and then fail the statement, and one subscribed again in the same
-- transaction is not in the snapshot yet. The worker tries such topics again shortly.
--
-- Returns the endpoints that got new deliveries, the ordering keys released (for
-- src/ordering) and the topics left alone.
WITH picked AS MATERIALIZED (
    SELECT o.id, o.topic, o.attempts, o.last_error, o.ordering_key
      FROM ONLY @extschema@.outbox o
     WHERE o.id OPERATOR(pg_catalog.=) ANY ($2)
), ready_topics AS MATERIALIZED (
    SELECT ARRAY(SELECT DISTINCT r.topic::pg_catalog.text FROM picked r) AS topics
), held AS MATERIALIZED (
    -- The subscriptions of those messages' topics, locked as each new delivery's foreign key
    -- locks them, skipping any that an operator is removing.
    SELECT s.id, s.topic
      FROM @extschema@.outbox_subscription s
     WHERE s.topic::pg_catalog.text OPERATOR(pg_catalog.=) ANY ((SELECT t.topics FROM ready_topics t)::pg_catalog.text[])
       FOR KEY SHARE SKIP LOCKED
), unsettled AS MATERIALIZED (
    -- Topics with a subscription in the snapshot that could not be locked.
    SELECT ARRAY(SELECT DISTINCT s.topic::pg_catalog.text
                   FROM @extschema@.outbox_subscription s
                  WHERE s.topic::pg_catalog.text OPERATOR(pg_catalog.=) ANY ((SELECT t.topics FROM ready_topics t)::pg_catalog.text[])
                    AND s.id OPERATOR(pg_catalog.<>) ALL (ARRAY(SELECT h.id FROM held h))) AS topics
), made AS (
    INSERT INTO @extschema@.outbox_delivery AS d
           (message_id, subscription_id, attempts, last_error, available_at, ordering_key, waiting_for)
    SELECT r.id, s.id, r.attempts, r.last_error, $1, r.ordering_key,
           -- Behind the key's head at the endpoint, or behind its deliveries queued without one
           -- (their next one held by an operator's transaction: src/ordering hands it on later).
           -- (Looked up in outbox_delivery_key_head_idx and _queue_idx; as an EXISTS, the plan
           -- could read every PENDING delivery instead, at every pick-up.)
           CASE WHEN r.ordering_key IS NOT NULL
                 AND ((SELECT true
                         FROM ONLY @extschema@.outbox_delivery p
                        WHERE p.subscription_id OPERATOR(pg_catalog.=) s.id
                          AND p.ordering_key OPERATOR(pg_catalog.=) r.ordering_key
                          AND p.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                          AND p.waiting_for IS NULL
                        LIMIT 1)
                      OR (SELECT true
                            FROM ONLY @extschema@.outbox_delivery q
                           WHERE q.subscription_id OPERATOR(pg_catalog.=) s.id
                             AND q.ordering_key OPERATOR(pg_catalog.=) r.ordering_key
                             AND q.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
                             AND q.waiting_for OPERATOR(pg_catalog.=) 'ordering_key'::@extschema@.outbox_wait
                           LIMIT 1))
                THEN 'ordering_key'::@extschema@.outbox_wait END
      FROM picked r
      JOIN held s
        ON s.topic OPERATOR(pg_catalog.=) r.topic
     WHERE r.topic::pg_catalog.text OPERATOR(pg_catalog.<>) ALL ((SELECT u.topics FROM unsettled u)::pg_catalog.text[])
    ON CONFLICT (message_id, subscription_id) DO NOTHING
    RETURNING d.message_id, d.subscription_id
), waiting AS (
    -- (The ids as an array: joined to the CTE, the plan kept for the session, which cannot know
    -- how many ids $2 holds, hashed the whole table.)
    UPDATE ONLY @extschema@.outbox o
       SET waiting_for = 'deliveries'::@extschema@.outbox_wait, lease_token = NULL
     WHERE o.id OPERATOR(pg_catalog.=) ANY (ARRAY(
               SELECT r.id
                 FROM picked r
                WHERE r.topic::pg_catalog.text OPERATOR(pg_catalog.<>) ALL ((SELECT u.topics FROM unsettled u)::pg_catalog.text[])
                  AND (EXISTS (SELECT FROM made m WHERE m.message_id OPERATOR(pg_catalog.=) r.id)
                       -- (A requeued message's deliveries, by outbox_delivery's key: as an EXISTS,
                       -- the plan could read the whole table.)
                       OR (SELECT true FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id OPERATOR(pg_catalog.=) r.id LIMIT 1))))
    RETURNING o.ordering_key
)
SELECT ARRAY(SELECT DISTINCT m.subscription_id FROM made m),
       (SELECT pg_catalog.array_agg(DISTINCT w.ordering_key) FILTER (WHERE w.ordering_key IS NOT NULL) FROM waiting w),
       (SELECT u.topics FROM unsettled u)
