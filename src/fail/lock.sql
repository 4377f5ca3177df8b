-- outbox_fail, first step: lock message $1 while the caller still holds it (PENDING, and, with
-- a lease token $2, only while that token holds it). Returns its attempts and whether a lease
-- names a holder (a claim with a lease counted this attempt already).
SELECT o.attempts, o.lease_token IS NOT NULL
  FROM @extschema@.outbox o
 WHERE o.id OPERATOR(pg_catalog.=) $1
   AND o.status OPERATOR(pg_catalog.=) 'PENDING'::@extschema@.outbox_status
   AND ($2::pg_catalog.uuid IS NULL OR o.lease_token OPERATOR(pg_catalog.=) $2)
   FOR UPDATE
