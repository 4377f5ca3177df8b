-- Checks written in Rust (src/topic.rs, src/subscriptions.rs) that the schema and the SQL
-- functions use. C functions, so that they read text in any database encoding. Not for
-- PUBLIC, but outbox_topic_is_valid (sql/privileges.sql). Their symbols keep the names they
-- had when pgrx generated them (until 0.3.0), which databases not yet updated still call.

CREATE OR REPLACE FUNCTION outbox_topic_is_valid(topic text) RETURNS boolean
LANGUAGE c IMMUTABLE STRICT PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_topic_is_valid_wrapper';

COMMENT ON FUNCTION outbox_topic_is_valid(text) IS
'Whether topic is a well-formed event name: an ASCII letter or digit, then letters, digits, _ . : or -; at most 64 characters.';

-- Raises the error a SQL-language function owes its caller for a bad topic argument.
CREATE OR REPLACE FUNCTION outbox_check_topic("function" text, argument text, topic text) RETURNS void
LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_check_topic_wrapper';

-- Raises the error outbox_subscribe owes its caller for a bad url, secret or headers.
CREATE OR REPLACE FUNCTION outbox_check_subscription(url text, secret text, headers jsonb) RETURNS void
LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_check_subscription_wrapper';
