-- The version of outbox_ext installed in this database (NULL: not installed).
SELECT e.extversion FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext'
