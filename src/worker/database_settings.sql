-- The outbox.* settings that ALTER DATABASE ... SET and ALTER ROLE ... SET give the worker's session,
-- applied again for the session (set_config), from the least specific to the most: for every
-- database and role, for its database, for its role, for its role in its database, so that the
-- most specific wins, as when a session starts (PostgreSQL's postinit.c, process_settings).
-- Returns how many.
SELECT pg_catalog.count(pg_catalog.set_config(pg_catalog.split_part(c.setting, '=', 1),
                                              pg_catalog.substr(c.setting, pg_catalog.strpos(c.setting, '=') OPERATOR(pg_catalog.+) 1),
                                              false))
  FROM (SELECT c.setting
          FROM pg_catalog.pg_db_role_setting s,
               pg_catalog.unnest(s.setconfig) WITH ORDINALITY AS c(setting, n)
         WHERE s.setdatabase OPERATOR(pg_catalog.=) ANY (ARRAY[0, (SELECT d.oid FROM pg_catalog.pg_database d
                                                                  WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())]::pg_catalog.oid[])
           AND s.setrole OPERATOR(pg_catalog.=) ANY (ARRAY[0, (SELECT r.oid FROM pg_catalog.pg_roles r
                                                              WHERE r.rolname OPERATOR(pg_catalog.=) pg_catalog."session_user"())]::pg_catalog.oid[])
           AND c.setting OPERATOR(pg_catalog.~~) 'outbox.%'
         ORDER BY (s.setrole OPERATOR(pg_catalog.<>) 0), (s.setdatabase OPERATOR(pg_catalog.<>) 0), c.n) c
