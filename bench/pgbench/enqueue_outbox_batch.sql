-- The batch path: 10 messages per statement (pgbench counts statements; the driver multiplies).
SELECT count(*) FROM outbox_enqueue_batch('booking.created', array_fill(':payload'::jsonb, ARRAY[10]));
