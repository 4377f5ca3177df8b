-- Reference: a plain INSERT of the same snapshot into a bare table (bigserial + jsonb).
INSERT INTO plain_queue (payload) VALUES (':payload'::jsonb);
