SELECT @extschema@.outbox_purge($1, false, $2)
