-- The keys $1 of messages that just ended or went to the delivery worker: the next message of
-- each becomes claimable (sql/api.sql, outbox_release_keys: the one definition of the rule).
SELECT @extschema@.outbox_release_keys($1)
