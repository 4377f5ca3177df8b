SELECT id FROM outbox_enqueue('booking.created', ':payload'::jsonb);
