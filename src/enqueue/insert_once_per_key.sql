-- outbox_enqueue with a dedupe_key ($5) and no ordering_key: nothing when the topic ($1)
-- already has a message with that key. A concurrent producer with the same key and topic makes
-- this wait for its transaction: if it commits, nothing is inserted; if it rolls back, this row is.
INSERT INTO @extschema@.outbox AS o (topic, payload, available_at, headers, dedupe_key)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (topic, dedupe_key) WHERE dedupe_key IS NOT NULL DO NOTHING
RETURNING o
