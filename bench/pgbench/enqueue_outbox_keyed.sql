-- outbox_enqueue with an ordering key, one of 1,000 (a booking's events, say).
\set booking random(1, 1000)
SELECT id FROM outbox_enqueue('booking.created', ':payload'::jsonb, ordering_key => 'booking:' || :booking);
