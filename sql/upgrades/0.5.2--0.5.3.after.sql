-- The DONE messages of 0.5.2 (with their deliveries) move to the history of their day, in the
-- update's transaction (docs/upgrades.md gives the time it takes). What a concurrent session
-- holds locked stays in outbox, and the delivery worker (or outbox_purge) moves it later.
DO $$
BEGIN
    LOOP
        EXIT WHEN @extschema@.outbox_archive(1000000) < 1000000;
    END LOOP;
END
$$;
