SELECT @extschema@.outbox_archive($1)
