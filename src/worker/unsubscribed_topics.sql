-- Topics with ready messages but no subscription ($1: the subscribed topics). Bounded: it looks
-- at no more than 10,000 pending rows.
SELECT p.topic::pg_catalog.text, pg_catalog.count(*)
  FROM (SELECT o.topic
          FROM ONLY @extschema@.outbox o
         WHERE o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
           AND o.waiting_for IS NULL
           AND NOT (o.topic::pg_catalog.text OPERATOR(pg_catalog.=) ANY ($1))
         LIMIT 10000) p
 GROUP BY p.topic
 ORDER BY pg_catalog.count(*) DESC, p.topic
 LIMIT 10
