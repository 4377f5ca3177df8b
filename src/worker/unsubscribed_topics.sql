-- Topics with ready messages but no subscription, in a database that has subscriptions (one
-- without any is used by SQL consumers alone: nothing to warn about). Judged against
-- outbox_subscription in this statement's snapshot, not against the subscriptions the worker
-- read a moment before: one committed in between, with messages of its topic, is not reported.
-- Bounded: it looks at no more than 10,000 pending rows; the third column says how many it
-- looked at (housekeeping.rs, UNSUBSCRIBED_SAMPLE_ROWS: with all of them, counts are "at least").
SELECT p.topic::pg_catalog.text, pg_catalog.count(*), pg_catalog.sum(pg_catalog.count(*)) OVER ()::pg_catalog.int8
  FROM (SELECT o.topic
          FROM ONLY @extschema@.outbox o
         WHERE o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
           AND o.waiting_for IS NULL
           AND NOT EXISTS (SELECT FROM @extschema@.outbox_subscription s
                            WHERE s.topic OPERATOR(pg_catalog.=) o.topic)
         LIMIT 10000) p
 WHERE EXISTS (SELECT FROM @extschema@.outbox_subscription)
 GROUP BY p.topic
 ORDER BY pg_catalog.count(*) DESC, p.topic
 LIMIT 10
