-- The message already enqueued with dedupe_key $1.
SELECT o FROM @extschema@.outbox o WHERE o.dedupe_key OPERATOR(pg_catalog.=) $1
