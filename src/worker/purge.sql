-- The worker's share of housekeeping: outbox_purge, the same function operators call.
SELECT @extschema@.outbox_purge($1, false, $2)
