-- The users' grants saved at the start of this script, granted again where they are gone: on
-- objects dropped and created anew (objects that no longer exist are skipped). A grant still
-- there is left as it is, with its grantor: granted again by whoever runs the update, it would
-- outlive a REVOKE ... CASCADE from the role that granted it.
DO $keep_grants$
DECLARE
    saved pg_catalog.jsonb;
    still_there boolean;
    successor text;
    acl pg_catalog.aclitem[];
BEGIN
    FOR saved IN SELECT * FROM pg_catalog.jsonb_array_elements(pg_catalog.current_setting('outbox_ext_upgrade.grants')::pg_catalog.jsonb) LOOP
        IF saved OPERATOR(pg_catalog.->>) 0 OPERATOR(pg_catalog.=) 'FUNCTION' THEN
            still_there := pg_catalog.to_regprocedure(saved OPERATOR(pg_catalog.->>) 1) IS NOT NULL;
            IF NOT still_there THEN
                -- A function whose arguments changed: the grant goes to its one successor of the
                -- same name, if it has exactly one.
                SELECT pg_catalog.min(p.oid::pg_catalog.regprocedure::pg_catalog.text), pg_catalog.count(*) OPERATOR(pg_catalog.=) 1
                  INTO successor, still_there
                  FROM pg_catalog.pg_proc p
                  JOIN pg_catalog.pg_depend d ON d.objid OPERATOR(pg_catalog.=) p.oid
                   AND d.classid OPERATOR(pg_catalog.=) 'pg_catalog.pg_proc'::pg_catalog.regclass
                   AND d.deptype OPERATOR(pg_catalog.=) 'e'
                  JOIN pg_catalog.pg_extension e ON e.oid OPERATOR(pg_catalog.=) d.refobjid
                   AND e.extname OPERATOR(pg_catalog.=) 'outbox_ext'
                 WHERE p.proname OPERATOR(pg_catalog.=) pg_catalog.split_part(saved OPERATOR(pg_catalog.->>) 1, '(', 1);
                saved := pg_catalog.jsonb_set(saved, '{1}', pg_catalog.to_jsonb(successor));
            END IF;
            acl := (SELECT p.proacl FROM pg_catalog.pg_proc p
                     WHERE p.oid OPERATOR(pg_catalog.=) pg_catalog.to_regprocedure(saved OPERATOR(pg_catalog.->>) 1));
        ELSIF saved OPERATOR(pg_catalog.->>) 0 OPERATOR(pg_catalog.=) 'COLUMN' THEN
            SELECT a.attacl INTO acl FROM pg_catalog.pg_attribute a
             WHERE a.attrelid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(saved OPERATOR(pg_catalog.->>) 1)
               AND a.attname OPERATOR(pg_catalog.=) (saved OPERATOR(pg_catalog.->>) 5)
               AND NOT a.attisdropped;
            still_there := FOUND;
        ELSE
            SELECT c.relacl INTO acl FROM pg_catalog.pg_class c
             WHERE c.oid OPERATOR(pg_catalog.=) pg_catalog.to_regclass(saved OPERATOR(pg_catalog.->>) 1);
            still_there := FOUND;
        END IF;
        IF still_there AND NOT EXISTS (
               SELECT FROM pg_catalog.aclexplode(acl) a
                WHERE a.grantee OPERATOR(pg_catalog.=) pg_catalog.to_regrole(pg_catalog.quote_ident(saved OPERATOR(pg_catalog.->>) 2))
                  AND a.privilege_type OPERATOR(pg_catalog.=) (saved OPERATOR(pg_catalog.->>) 3)
                  AND (a.is_grantable OR NOT (saved OPERATOR(pg_catalog.->>) 4)::pg_catalog.bool)) THEN
            EXECUTE pg_catalog.format('GRANT %s%s ON %s %s TO %I%s',
                saved OPERATOR(pg_catalog.->>) 3,
                CASE WHEN saved OPERATOR(pg_catalog.->>) 0 OPERATOR(pg_catalog.=) 'COLUMN'
                     THEN pg_catalog.format(' (%I)', saved OPERATOR(pg_catalog.->>) 5) ELSE '' END,
                CASE WHEN saved OPERATOR(pg_catalog.->>) 0 OPERATOR(pg_catalog.=) 'COLUMN' THEN 'TABLE'
                     ELSE saved OPERATOR(pg_catalog.->>) 0 END,
                saved OPERATOR(pg_catalog.->>) 1,
                saved OPERATOR(pg_catalog.->>) 2,
                CASE WHEN (saved OPERATOR(pg_catalog.->>) 4)::pg_catalog.bool THEN ' WITH GRANT OPTION' ELSE '' END);
        END IF;
    END LOOP;
END
$keep_grants$;

-- Every GRANT in an extension's script is recorded as one of the extension's initial privileges
-- (pg_init_privs), the users' grants given again above included, and so is the whole ACL of
-- any object this script granted on. pg_dump leaves initial privileges out (a dump and restore
-- would lose the users' grants) and, from PostgreSQL 17, DROP ROLE refuses a role that holds
-- one. So the initial privileges keep only what a fresh install grants: to the owner and to
-- the extension's own roles.
DO $initial_privileges$
DECLARE
    own_roles pg_catalog.name[] := ARRAY['outbox_producer', 'outbox_consumer', 'outbox_admin', 'outbox_worker', 'pg_monitor'];
    extension_oid pg_catalog.oid := (SELECT e.oid FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext');
    owner_oid pg_catalog.oid := (SELECT e.extowner FROM pg_catalog.pg_extension e WHERE e.extname OPERATOR(pg_catalog.=) 'outbox_ext');
BEGIN
    UPDATE pg_catalog.pg_init_privs i
       SET initprivs = COALESCE((
               SELECT pg_catalog.array_agg(item ORDER BY n)
                 FROM pg_catalog.unnest(i.initprivs) WITH ORDINALITY AS u(item, n)
                WHERE (SELECT a.grantee FROM pg_catalog.aclexplode(ARRAY[u.item]) a LIMIT 1) OPERATOR(pg_catalog.=) ANY (
                          ARRAY[0::pg_catalog.oid, owner_oid]
                          OPERATOR(pg_catalog.||) ARRAY(SELECT r.oid FROM pg_catalog.pg_roles r
                                                         WHERE r.rolname OPERATOR(pg_catalog.=) ANY (own_roles)))),
               '{}')
      FROM pg_catalog.pg_depend d
     WHERE d.refobjid OPERATOR(pg_catalog.=) extension_oid
       AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
       AND d.deptype OPERATOR(pg_catalog.=) 'e'
       AND i.classoid OPERATOR(pg_catalog.=) d.classid
       AND i.objoid OPERATOR(pg_catalog.=) d.objid;
    -- A column only users were granted has no initial privilege in a fresh install; left empty,
    -- the row would make the next update's GRANT fail (PostgreSQL 16 and later).
    DELETE FROM pg_catalog.pg_init_privs i
     USING pg_catalog.pg_depend d
     WHERE d.refobjid OPERATOR(pg_catalog.=) extension_oid
       AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
       AND d.deptype OPERATOR(pg_catalog.=) 'e'
       AND i.classoid OPERATOR(pg_catalog.=) d.classid
       AND i.objoid OPERATOR(pg_catalog.=) d.objid
       AND pg_catalog.array_ndims(i.initprivs) IS NULL;
    -- PostgreSQL 17 and later also record each role named in an initial privilege as a
    -- dependency of the object ('i' in pg_shdepend).
    IF pg_catalog.current_setting('server_version_num')::pg_catalog.int4 OPERATOR(pg_catalog.>=) 170000 THEN
        DELETE FROM pg_catalog.pg_shdepend s
         USING pg_catalog.pg_depend d
         WHERE s.deptype OPERATOR(pg_catalog.=) 'i'
           AND s.dbid OPERATOR(pg_catalog.=) (SELECT b.oid FROM pg_catalog.pg_database b
                                               WHERE b.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
           AND s.classid OPERATOR(pg_catalog.=) d.classid
           AND s.objid OPERATOR(pg_catalog.=) d.objid
           AND d.refobjid OPERATOR(pg_catalog.=) extension_oid
           AND d.refclassid OPERATOR(pg_catalog.=) 'pg_catalog.pg_extension'::pg_catalog.regclass
           AND d.deptype OPERATOR(pg_catalog.=) 'e'
           AND s.refobjid OPERATOR(pg_catalog.<>) owner_oid
           AND pg_catalog.pg_get_userbyid(s.refobjid) OPERATOR(pg_catalog.<>) ALL (own_roles);
    END IF;
END
$initial_privileges$;
