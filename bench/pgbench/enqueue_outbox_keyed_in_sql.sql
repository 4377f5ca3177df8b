-- The same with the key built in the statement ('booking:' || n), as part 8 measured until 0.5.9:
-- the server also parses and plans the concatenation, which enqueue_outbox.sql does not have.
\set booking random(1, 1000)
SELECT id FROM outbox_enqueue('booking.created', ':payload'::jsonb, ordering_key => 'booking:' || :booking);
