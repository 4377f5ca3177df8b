-- The distinct hashes of the ordering keys $1, which name their advisory locks with outbox's oid
-- (src/ordering/key_locks.rs); another key with the same hash only waits a little longer.
SELECT pg_catalog.array_agg(DISTINCT pg_catalog.hashtext(k.key))
  FROM pg_catalog.unnest($1) AS k(key)
