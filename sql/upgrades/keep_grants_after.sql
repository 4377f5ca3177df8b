-- The users' grants saved at the start of this script, granted again (objects that no longer
-- exist are skipped).
DO $keep_grants$
DECLARE
    saved pg_catalog.jsonb;
    still_there boolean;
    successor text;
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
        ELSE
            still_there := pg_catalog.to_regclass(saved OPERATOR(pg_catalog.->>) 1) IS NOT NULL;
        END IF;
        IF still_there THEN
            EXECUTE pg_catalog.format('GRANT %s ON %s %s TO %I%s',
                saved OPERATOR(pg_catalog.->>) 3, saved OPERATOR(pg_catalog.->>) 0, saved OPERATOR(pg_catalog.->>) 1,
                saved OPERATOR(pg_catalog.->>) 2,
                CASE WHEN (saved OPERATOR(pg_catalog.->>) 4)::pg_catalog.bool THEN ' WITH GRANT OPTION' ELSE '' END);
        END IF;
    END LOOP;
END
$keep_grants$;
