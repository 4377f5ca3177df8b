-- outbox_ext's consumer with a lease, as it runs against a real handler: the claim commits,
-- then the completion commits (two transactions; the lease covers the work in between).
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS tokens FROM outbox_claim(:batch) \gset
SELECT outbox_complete_batch(':ids'::bigint[], ':tokens'::uuid[]);
