SELECT outbox_enqueue('booking.created', ':payload'::jsonb);
