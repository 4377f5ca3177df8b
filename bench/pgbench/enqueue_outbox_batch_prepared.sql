-- enqueue_outbox_batch.sql with the payload a bound parameter, for pgbench -M prepared.
SELECT count(*) FROM outbox_enqueue_batch('booking.created', array_fill(:payload::jsonb, ARRAY[10]));
