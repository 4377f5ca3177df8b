-- outbox_fail, first step: lock message $1 while the caller still holds it (PENDING, and, with
-- a lease token $2, only while that token holds it). Returns its attempts and whether a lease
-- names a holder (a claim with a lease counted this attempt already).
SELECT o.attempts, o.lease_token IS NOT NULL
  FROM ONLY @extschema@.outbox o
 WHERE o.id OPERATOR(pg_catalog.=) $1
   -- (As text: matched against the partial index of ready rows, the plan kept for the session
   -- could walk that whole index instead of looking the rows up by id.)
   AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
   AND ($2::pg_catalog.uuid IS NULL OR o.lease_token OPERATOR(pg_catalog.=) $2)
   FOR UPDATE
