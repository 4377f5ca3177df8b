-- Messages $1 still PENDING, locked (in id order) before their deliveries' answers are
-- recorded, or before they are settled: an operator's redelivery of one of them either
-- committed before (and is counted) or is not yet committed. (outbox_redeliver locks messages,
-- then deliveries: the worker does too.) One that another transaction holds is skipped rather
-- than waited for, which would hold back the whole step, every endpoint's: held_messages.sql
-- finds those among the others. Returns those it locked.
SELECT o.id
  FROM ONLY @extschema@.outbox o
 WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
   -- (As text: matched against the partial index of ready rows, the plan kept for the session
   -- could walk that whole index instead of looking the rows up by id.)
   AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
 ORDER BY o.id
   FOR UPDATE SKIP LOCKED
