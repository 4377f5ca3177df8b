-- The users' grants saved at the start of this script, granted again (objects that no longer
-- exist are skipped).
DO $keep_grants$
DECLARE
    saved pg_catalog.jsonb;
    still_there boolean;
BEGIN
    FOR saved IN SELECT * FROM pg_catalog.jsonb_array_elements(pg_catalog.current_setting('outbox_ext_upgrade.grants')::pg_catalog.jsonb) LOOP
        IF saved OPERATOR(pg_catalog.->>) 0 OPERATOR(pg_catalog.=) 'FUNCTION' THEN
            still_there := pg_catalog.to_regprocedure(saved OPERATOR(pg_catalog.->>) 1) IS NOT NULL;
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
