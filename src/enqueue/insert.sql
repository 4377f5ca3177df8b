-- outbox_enqueue without a dedupe_key or an ordering_key: $1 topic, $2 payload, $3 available_at,
-- $4 headers. Returns the whole row.
INSERT INTO @extschema@.outbox AS o (topic, payload, available_at, headers)
VALUES ($1, $2, $3, $4)
RETURNING o
