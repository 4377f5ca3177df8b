-- outbox_enqueue with an ordering_key ($6), first try: the message becomes its key's head
-- (claimable). Nothing is inserted when the key already has a head (outbox_key_head_idx) or, with
-- a dedupe_key ($5), when the topic already has a message with that key.
INSERT INTO @extschema@.outbox AS o (topic, payload, available_at, headers, dedupe_key, ordering_key)
VALUES ($1, $2, pg_catalog.clock_timestamp() OPERATOR(pg_catalog.+) $3, $4, $5, $6)
ON CONFLICT DO NOTHING
RETURNING o
