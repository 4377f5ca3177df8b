-- outbox_claim with a lease: each locked message $1 is a delivery. One more attempt, a new
-- lease_token (gen_random_uuid: cryptographically random), and ready again only when the lease
-- $3 runs out (from the claim's clock $2).
UPDATE ONLY @extschema@.outbox o
   SET attempts = o.attempts OPERATOR(pg_catalog.+) 1,
       available_at = $2 OPERATOR(pg_catalog.+) $3,
       lease_token = pg_catalog.gen_random_uuid()
 WHERE o.id OPERATOR(pg_catalog.=) ANY ($1)
RETURNING o, o.id
