-- Keep the users' grants: what roles other than the extension's own were granted on the
-- extension's tables, views, sequences, their columns and functions, saved for the end of this
-- script, where it is granted again on whatever was dropped and created anew in between.
DO $keep_grants$
BEGIN
    -- Updates before 0.5.18 left an empty initial privilege for a column a user was granted
    -- (keep_grants_after.sql); from PostgreSQL 16 the first GRANT or REVOKE on its table below
    -- fails on it ("ACL arrays must be one-dimensional"). A fresh install has none.
    DELETE FROM pg_catalog.pg_init_privs i
     USING pg_catalog.pg_depend d
     WHERE d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e
                                               WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext')
       AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
       AND d.deptype OPERATOR(pg_catalog.=) 'e'
       AND i.classoid OPERATOR(pg_catalog.=) d.classid
       AND i.objoid OPERATOR(pg_catalog.=) d.objid
       AND pg_catalog.array_ndims(i.initprivs) IS NULL;
    PERFORM pg_catalog.set_config('outbox_ext_upgrade.grants', COALESCE((
        SELECT pg_catalog.jsonb_agg(pg_catalog.jsonb_build_array(
                   g.kind, g.object, pg_catalog.pg_get_userbyid(g.grantee), g.privilege, g.grantable, g.column_name))
          FROM (SELECT CASE c.relkind WHEN 'S' THEN 'SEQUENCE' ELSE 'TABLE' END AS kind,
                       c.oid::pg_catalog.regclass::pg_catalog.text AS object, c.relowner AS owner,
                       a.grantee, a.privilege_type AS privilege, a.is_grantable AS grantable,
                       NULL::pg_catalog.name AS column_name
                  FROM pg_catalog.pg_depend d
                  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid
                 CROSS JOIN LATERAL pg_catalog.aclexplode(c.relacl) a
                 WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                   AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e
                                                            WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext')
                   AND d.deptype OPERATOR(pg_catalog.=) 'e'
                UNION ALL
                SELECT 'COLUMN', c.oid::pg_catalog.regclass::pg_catalog.text, c.relowner,
                       a.grantee, a.privilege_type, a.is_grantable, att.attname
                  FROM pg_catalog.pg_depend d
                  JOIN pg_catalog.pg_class c ON c.oid OPERATOR(pg_catalog.=) d.objid
                  JOIN pg_catalog.pg_attribute att ON att.attrelid OPERATOR(pg_catalog.=) c.oid
                   AND att.attnum OPERATOR(pg_catalog.>) 0 AND NOT att.attisdropped
                 CROSS JOIN LATERAL pg_catalog.aclexplode(att.attacl) a
                 WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_class'::pg_catalog.regclass
                   AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e
                                                            WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext')
                   AND d.deptype OPERATOR(pg_catalog.=) 'e'
                UNION ALL
                SELECT 'FUNCTION', p.oid::pg_catalog.regprocedure::pg_catalog.text, p.proowner,
                       a.grantee, a.privilege_type, a.is_grantable, NULL
                  FROM pg_catalog.pg_depend d
                  JOIN pg_catalog.pg_proc p ON p.oid OPERATOR(pg_catalog.=) d.objid
                 CROSS JOIN LATERAL pg_catalog.aclexplode(p.proacl) a
                 WHERE d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                   AND d.refobjid OPERATOR(pg_catalog.=) (SELECT e.oid FROM pg_catalog.pg_extension e
                                                            WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext')
                   AND d.deptype OPERATOR(pg_catalog.=) 'e') g
         WHERE g.grantee OPERATOR(pg_catalog.<>) 0
           AND g.grantee OPERATOR(pg_catalog.<>) g.owner
           AND pg_catalog.pg_get_userbyid(g.grantee) OPERATOR(pg_catalog.<>) ALL (
                   ARRAY['outbox_producer', 'outbox_consumer', 'outbox_admin', 'outbox_worker', 'pg_monitor']::pg_catalog.name[])
    ), '[]')::pg_catalog.text, true);
END
$keep_grants$;
