-- The schema outbox_ext is installed in (no row: not installed).
SELECT e.extnamespace FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext'
