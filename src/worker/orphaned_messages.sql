-- Messages handed to the worker of which no delivery is pending any more although they still
-- wait for their deliveries: their endpoints were unsubscribed (deleting the deliveries with
-- them). Found through outbox_handed_over_idx, and each message's deliveries by
-- outbox_delivery's key (run with sequential scans off: src/spi.rs, execute_by_index). Returns
-- each, and whether deliveries (ended ones) remain.
SELECT o.id,
       EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery d WHERE d.message_id OPERATOR(pg_catalog.=) o.id)
  FROM ONLY @extschema@.outbox o
 WHERE o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND o.waiting_for OPERATOR(pg_catalog.=) 'deliveries'::@extschema@.outbox_wait
   AND NOT EXISTS (SELECT FROM ONLY @extschema@.outbox_delivery d
                    WHERE d.message_id OPERATOR(pg_catalog.=) o.id
                      AND d.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status)
