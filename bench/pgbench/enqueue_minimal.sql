-- Reference: the least an outbox table can be (bench.py's minimal_outbox), by a direct INSERT.
INSERT INTO minimal_outbox (topic, payload) VALUES ('booking.created', ':payload'::jsonb);
