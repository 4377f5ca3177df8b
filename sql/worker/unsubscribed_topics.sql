-- Topics with pending messages but no subscription ($1: the subscribed topics). Bounded: it
-- looks at no more than 10,000 pending rows.
SELECT p.topic::text, count(*)
  FROM (SELECT o.topic
          FROM outbox o
         WHERE o.status = 'PENDING'
           AND NOT (o.topic = ANY ($1))
         LIMIT 10000) p
 GROUP BY p.topic
 ORDER BY count(*) DESC, p.topic
 LIMIT 10
