-- The attempt log: one row per request ($1 message, $2 endpoint, $3 attempt, $4 start, $5 its
-- duration in microseconds, $6 the HTTP status or NULL, $7 the error or NULL).
INSERT INTO @extschema@.outbox_delivery_attempt (message_id, subscription_id, attempt, started_at, duration, http_status, error)
SELECT a.message_id, a.subscription_id, a.attempt, a.started_at,
       pg_catalog.make_interval(secs => a.micros OPERATOR(pg_catalog./) 1000000.0), a.http_status, a.error
  FROM ROWS FROM (pg_catalog.unnest($1), pg_catalog.unnest($2), pg_catalog.unnest($3), pg_catalog.unnest($4),
                  pg_catalog.unnest($5), pg_catalog.unnest($6), pg_catalog.unnest($7))
       AS a(message_id, subscription_id, attempt, started_at, micros, http_status, error)
