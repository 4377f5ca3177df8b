-- enqueue_essay.sql with the payload a bound parameter, for pgbench -M prepared.
INSERT INTO essay_outbox (public_id, topic, payload, status) VALUES (gen_random_uuid(), 'booking.created', :payload::jsonb, 'PENDING');
