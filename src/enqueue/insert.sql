-- outbox_enqueue without a dedupe_key or an ordering_key: $1 topic, $2 payload, $3 delay,
-- $4 headers. Returns the whole row.
INSERT INTO @extschema@.outbox AS o (topic, payload, available_at, headers)
VALUES ($1, $2, pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $3, $4)
RETURNING o
