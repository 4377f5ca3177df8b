-- Before releasing the ordering keys $1: take their advisory locks exclusively, until the
-- transaction ends. Producers queuing a message behind a key hold its lock shared until they
-- commit (src/ordering, hold_key_in_read_committed): this waits for them, and a producer that
-- comes later waits for this transaction and then sees its outcome. The lock is (outbox's oid
-- as an int4, $2; hashtext(key)): another key with the same hash only waits a little longer.
-- Taken in the hashes' order, so that two releases never wait for each other in a circle.
SELECT pg_catalog.pg_advisory_xact_lock($2, h.hash)
  FROM (SELECT DISTINCT pg_catalog.hashtext(k.key) AS hash
          FROM pg_catalog.unnest($1) AS k(key)
         ORDER BY 1) h
