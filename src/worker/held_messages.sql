-- Of the messages lock_messages.sql did not lock ($1), those still PENDING: another
-- transaction holds them (an operator's redelivery not yet committed), and their answers, or
-- their settling, wait for a later step. (The others have ended, or are gone.)
SELECT o.id
  FROM ONLY @extschema@.outbox o
 WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
   AND o.status::pg_catalog.text OPERATOR(pg_catalog.=) 'PENDING'
