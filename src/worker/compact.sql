-- The worker's share of keeping the hot tables small while vacuum is held back: outbox_compact,
-- the same function operators call, which decides whether it is worth it.
SELECT @extschema@.outbox_compact()
