-- outbox_enqueue_batch: one message of topic $1 per element of the payloads $2, in their
-- order, due at $3. Returns the whole rows.
INSERT INTO @extschema@.outbox AS o (topic, payload, available_at)
SELECT $1, p.payload, $3
  FROM pg_catalog.unnest($2) WITH ORDINALITY AS p(payload, n)
 ORDER BY p.n
RETURNING o
