-- Messages $1 still PENDING, locked (in id order) before their deliveries are counted: an
-- operator's redelivery of one of them either committed before (and is counted) or waits.
SELECT o.id
  FROM @extschema@.outbox o
 WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
   AND o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
 ORDER BY o.id
   FOR UPDATE
