-- The worker's share of moving DONE messages to their history: outbox_archive, the same
-- function operators call.
SELECT @extschema@.outbox_archive($1)
