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

-- Raises the error a SQL-language function owes its caller for an interval argument beyond what
-- the clock may be moved by (src/interval.rs: finite, at most 10,000 years).
CREATE OR REPLACE FUNCTION outbox_check_interval("function" text, argument text, value interval) RETURNS void
LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_check_interval_wrapper';

-- Raises the error outbox_subscribe owes its caller for a bad url, secret or headers.
CREATE OR REPLACE FUNCTION outbox_check_subscription(url text, secret text, headers jsonb) RETURNS void
LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_check_subscription_wrapper';

-- The error outbox_rotate_secret raises for a new_secret not in the whsec_ form.
CREATE OR REPLACE FUNCTION outbox_check_new_secret(secret text) RETURNS void
LANGUAGE c IMMUTABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_check_new_secret_c';

-- A NOTICE when the URL's host is a literal address the delivery worker refuses
-- (outbox.allowed_networks).
CREATE OR REPLACE FUNCTION outbox_check_destination(url text) RETURNS void
LANGUAGE c STABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_check_destination_c';

-- The default of outbox.public_id: a time-ordered UUID (version 7).
CREATE OR REPLACE FUNCTION outbox_uuid_v7() RETURNS uuid
LANGUAGE c VOLATILE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_uuid_v7_wrapper';

-- The retry policy (src/policy.rs), as the current settings define it.
CREATE OR REPLACE FUNCTION outbox_backoff(attempts integer) RETURNS interval
LANGUAGE c VOLATILE STRICT PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_backoff_wrapper';

COMMENT ON FUNCTION outbox_backoff(integer) IS
'The delay before the next attempt after attempts failures, under the current settings (outbox.backoff_base, outbox.backoff_max, outbox.backoff_jitter).';

CREATE OR REPLACE FUNCTION outbox_max_attempts() RETURNS integer
LANGUAGE c STABLE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_max_attempts_wrapper';

-- A new Standard Webhooks signing secret (whsec_...), from the operating system's cryptographic
-- random source.
CREATE OR REPLACE FUNCTION outbox_generate_secret() RETURNS text
LANGUAGE c VOLATILE PARALLEL SAFE
AS 'MODULE_PATHNAME', 'outbox_generate_secret_wrapper';

-- When the calling transaction commits, wake this database's delivery worker, or have the
-- launcher start one (the end of CREATE EXTENSION, a redelivery).
CREATE OR REPLACE FUNCTION outbox_wake_worker_at_commit() RETURNS void
LANGUAGE c VOLATILE PARALLEL UNSAFE
AS 'MODULE_PATHNAME', 'outbox_wake_worker_at_commit_wrapper';
