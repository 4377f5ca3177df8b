-- Of the deliveries lock_answered.sql could not lock ($1 message, $2 endpoint), those that are
-- still there: another transaction holds them, and their answers wait for a later step. (The
-- others are gone: their answers are let go when they are recorded.)
SELECT d.message_id, d.subscription_id
  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS a(message_id, subscription_id)
  JOIN ONLY @extschema@.outbox_delivery d
    ON d.message_id OPERATOR(pg_catalog.=) a.message_id
   AND d.subscription_id OPERATOR(pg_catalog.=) a.subscription_id
