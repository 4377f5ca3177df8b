-- Reference: the essay's hand-written outbox insert (random UUID, its two indexes).
INSERT INTO essay_outbox (public_id, topic, payload, status) VALUES (gen_random_uuid(), 'booking.created', ':payload'::jsonb, 'PENDING');
