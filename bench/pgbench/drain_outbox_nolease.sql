-- outbox_ext's consumer without a lease: the claim only locks, the complete is the one write.
BEGIN;
SELECT coalesce(array_agg(id), '{}') AS ids FROM outbox_claim(:batch, lease => NULL) \gset
SELECT outbox_complete_batch(':ids'::bigint[]);
COMMIT;
