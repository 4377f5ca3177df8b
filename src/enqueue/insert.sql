-- outbox_enqueue without a dedupe_key: $1 topic, $2 payload, $3 delay. Returns the whole row.
INSERT INTO @extschema@.outbox AS o (topic, payload, available_at)
VALUES ($1, $2, pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $3)
RETURNING o
