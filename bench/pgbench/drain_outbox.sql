-- outbox_ext's consumer with leases (the default): claim a batch, then complete it, in one transaction.
BEGIN;
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS tokens FROM outbox_claim(:batch) \gset
SELECT outbox_complete_batch(':ids'::bigint[], ':tokens'::uuid[]);
COMMIT;
