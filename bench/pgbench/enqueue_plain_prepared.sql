-- enqueue_plain.sql with the payload a bound parameter, for pgbench -M prepared (as most
-- drivers send a statement they run often: parsed and planned once per connection).
INSERT INTO plain_queue (payload) VALUES (:payload::jsonb);
