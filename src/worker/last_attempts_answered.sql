-- Of endpoint $1's deliveries to messages $2, found out of attempts ($3: the attempts of each),
-- those whose last attempt has its outcome in the attempt log (written with the outcome): the
-- limit was lowered below their attempts since. The others' last request got no outcome (the
-- worker stopped during it, or that day of the log is purged). The newest entry counts: a
-- redelivery starts the attempts again from 1.
SELECT d.message_id
  FROM ROWS FROM (pg_catalog.unnest($2), pg_catalog.unnest($3)) AS d(message_id, attempts)
 WHERE (SELECT a.attempt
          FROM @extschema@.outbox_delivery_attempt a
         WHERE a.message_id OPERATOR(pg_catalog.=) d.message_id
           AND a.subscription_id OPERATOR(pg_catalog.=) $1
         ORDER BY a.started_at DESC, a.attempt DESC
         LIMIT 1) OPERATOR(pg_catalog.=) d.attempts
