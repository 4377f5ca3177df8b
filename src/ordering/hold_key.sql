-- A producer about to add a message to ordering key $1, in READ COMMITTED: hold the key's
-- advisory lock shared until the transaction ends. Whoever releases the key takes it
-- exclusively first (lock_keys.sql), so it waits for this transaction and then sees its
-- message; a consumer that holds the key's head (a claim without a lease) does not hold this
-- producer up. Returns false, without the lock, under REPEATABLE READ or SERIALIZABLE: there
-- the producer's one snapshot could predate a release it waited for, so it locks the head row
-- instead (lock_head.sql).
SELECT CASE WHEN pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.=) 'read committed'
            THEN (SELECT true
                    FROM pg_catalog.pg_advisory_xact_lock_shared(
                             '@extschema@.outbox'::pg_catalog.regclass::pg_catalog.oid::pg_catalog.int4,
                             pg_catalog.hashtext($1)))
            ELSE false
       END
