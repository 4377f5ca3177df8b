-- A consumer with a lease as it runs in production: the claim commits, then the completion
-- commits (each statement its own transaction). Each cycle first enqueues the batch it will
-- take, so the backlog stays level for the whole run.
SELECT count(*) FROM outbox_enqueue_batch('booking.created', array_fill(':payload'::jsonb, ARRAY[:batch]));
SELECT coalesce(array_agg(id), '{}') AS ids, coalesce(array_agg(lease_token), '{}') AS tokens FROM outbox_claim(:batch) \gset
SELECT outbox_complete_batch(':ids'::bigint[], ':tokens'::uuid[]);
