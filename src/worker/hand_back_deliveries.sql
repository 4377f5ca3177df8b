-- Deliveries the worker leased but did not send (endpoints $1, messages $2 and the ends of
-- their leases $3, pairwise): its endpoint was disabled or went away, the worker is stopping, or
-- the lease would have run out before the request ended. Due again now, and the attempt they
-- were leased for is not counted. Only while that lease holds them: one that ran out may have
-- been taken again, and a later lease of the delivery (after a redelivery, say) ends later.
--
-- One that an operator's open transaction holds (an unsubscribe deleting it, a redelivery) is
-- skipped rather than waited for, which would hold back the whole step, every endpoint's. Those
-- still leased are returned (endpoint, message): the worker tries them again after a moment,
-- until they are gone or their lease runs out.
WITH back AS MATERIALIZED (
    SELECT *
      FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), pg_catalog.unnest($2::pg_catalog.int8[]),
                     pg_catalog.unnest($3::pg_catalog.timestamptz[])) AS back(subscription_id, message_id, lease_until)
), free AS MATERIALIZED (
    SELECT d.message_id, d.subscription_id, back.lease_until
      FROM back
      JOIN ONLY @extschema@.outbox_delivery d
        ON d.subscription_id OPERATOR(pg_catalog.=) back.subscription_id
       AND d.message_id OPERATOR(pg_catalog.=) back.message_id
       FOR NO KEY UPDATE OF d SKIP LOCKED
), handed_back AS (
    UPDATE ONLY @extschema@.outbox_delivery d
       SET leased = false,
           available_at = pg_catalog.clock_timestamp(),
           attempts = d.attempts OPERATOR(pg_catalog.-) 1
      FROM free
     WHERE d.subscription_id OPERATOR(pg_catalog.=) free.subscription_id
       AND d.message_id OPERATOR(pg_catalog.=) free.message_id
       AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
       AND d.leased
       AND d.available_at OPERATOR(pg_catalog.=) free.lease_until
       AND d.available_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
)
SELECT back.subscription_id, back.message_id
  FROM back
  JOIN ONLY @extschema@.outbox_delivery d
    ON d.subscription_id OPERATOR(pg_catalog.=) back.subscription_id
   AND d.message_id OPERATOR(pg_catalog.=) back.message_id
 WHERE NOT EXISTS (SELECT FROM free
                    WHERE free.subscription_id OPERATOR(pg_catalog.=) back.subscription_id
                      AND free.message_id OPERATOR(pg_catalog.=) back.message_id)
   AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND d.leased
   AND d.available_at OPERATOR(pg_catalog.=) back.lease_until
   AND d.available_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
