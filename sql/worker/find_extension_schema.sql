-- The schema outbox_ext is installed in, or NULL when it is not installed in this database.
SELECT (SELECT n.nspname::text
          FROM pg_catalog.pg_extension e
          JOIN pg_catalog.pg_namespace n ON n.oid = e.extnamespace
         WHERE e.extname = 'outbox_ext')
