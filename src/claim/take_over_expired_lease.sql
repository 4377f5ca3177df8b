-- outbox_claim without a lease, of messages $1 whose last holder's lease ran out: the stale
-- lease_token goes. The claim counted that holder's attempt; this one's is counted when the
-- caller fails it (outbox_fail counts an attempt for a message held without a token), and the
-- old holder's token no longer completes or fails it.
UPDATE ONLY @extschema@.outbox o
   SET lease_token = NULL
 WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
RETURNING o, o.id
