-- The deliveries whose answers came back ($1 message, $2 endpoint), locked before their
-- answers are recorded. One that an operator's open transaction holds (an unsubscribe deleting
-- it, a redelivery) is skipped rather than waited for, which would hold back the whole step,
-- every endpoint's: its answer waits for a later step (held_answered.sql). Returns those it
-- locked.
SELECT d.message_id, d.subscription_id
  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2)) AS a(message_id, subscription_id)
  JOIN ONLY @extschema@.outbox_delivery d
    ON d.message_id OPERATOR(pg_catalog.=) a.message_id
   AND d.subscription_id OPERATOR(pg_catalog.=) a.subscription_id
   FOR NO KEY UPDATE OF d SKIP LOCKED
