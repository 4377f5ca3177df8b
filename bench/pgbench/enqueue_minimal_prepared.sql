-- enqueue_minimal.sql with the payload a bound parameter, for pgbench -M prepared.
INSERT INTO minimal_outbox (topic, payload) VALUES ('booking.created', :payload::jsonb);
