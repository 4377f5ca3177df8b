-- Deliveries ($1 endpoint, $2 ordering key, pairwise) that just ended: the next delivery of each
-- key at each endpoint becomes claimable (sql/api.sql, outbox_release_delivery_keys: the one
-- definition of the rule).
SELECT @extschema@.outbox_release_delivery_keys($1, $2)
