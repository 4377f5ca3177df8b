-- enqueue_outbox.sql with the payload a bound parameter, for pgbench -M prepared.
SELECT id FROM outbox_enqueue('booking.created', :payload::jsonb);
