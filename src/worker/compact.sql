SELECT @extschema@.outbox_compact()
