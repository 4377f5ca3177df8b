-- Deliveries the worker leased but did not send (endpoints $1 and messages $2, pairwise): its
-- endpoint was disabled or went away, the worker is stopping, or the lease would have run out
-- before the request ended. Due again now, and the attempt they were leased for is not counted.
-- Only while still leased: a lease that ran out may have been taken again.
UPDATE ONLY @extschema@.outbox_delivery d
   SET leased = false,
       available_at = pg_catalog.clock_timestamp(),
       attempts = d.attempts OPERATOR(pg_catalog.-) 1
  FROM ROWS FROM (pg_catalog.unnest($1::pg_catalog.int8[]), pg_catalog.unnest($2::pg_catalog.int8[])) AS back(subscription_id, message_id)
 WHERE d.subscription_id OPERATOR(pg_catalog.=) back.subscription_id
   AND d.message_id OPERATOR(pg_catalog.=) back.message_id
   AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND d.leased
   AND d.available_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp()
