-- outbox_enqueue with an ordering key, one of 1,000 (a booking's events, say), given as a literal
-- (as a client's bound parameter would be): the statement differs from enqueue_outbox.sql only
-- by the key.
\set booking random(1, 1000)
SELECT id FROM outbox_enqueue('booking.created', ':payload'::jsonb, ordering_key => 'booking-:booking');
