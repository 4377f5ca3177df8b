-- outbox_enqueue with a dedupe_key ($4): nothing when the key is already there.
INSERT INTO @extschema@.outbox AS o (topic, payload, available_at, dedupe_key)
VALUES ($1, $2, pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $3, $4)
ON CONFLICT (dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
RETURNING o
