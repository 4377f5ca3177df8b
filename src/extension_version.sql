-- The version of outbox_ext installed in this database (no row: not installed), and its schema.
SELECT e.extversion, e.extnamespace FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext'
