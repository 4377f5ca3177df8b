-- The message of topic $1 that holds dedupe_key $2, as the producer that hit the key may see
-- it: its id, public_id, topic and key, nothing else (not another producer's payload or state).
SELECT pg_catalog.jsonb_populate_record(
           NULL::@extschema@.outbox,
           pg_catalog.jsonb_build_object('id', o.id, 'public_id', o.public_id, 'topic', o.topic, 'dedupe_key', o.dedupe_key))
  FROM ONLY @extschema@.outbox o
 WHERE o.topic OPERATOR(pg_catalog.=) $1
   AND o.dedupe_key OPERATOR(pg_catalog.=) $2
