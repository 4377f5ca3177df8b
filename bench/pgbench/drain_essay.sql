-- Reference: the essay's consumer. Claim a batch with FOR UPDATE SKIP LOCKED, then mark it DONE.
BEGIN;
SELECT coalesce(array_agg(id), '{}') AS ids FROM (
    SELECT id FROM essay_outbox
     WHERE status = 'PENDING' AND available_at <= now()
     ORDER BY available_at
     LIMIT :batch
       FOR UPDATE SKIP LOCKED) claimed \gset
UPDATE essay_outbox SET status = 'DONE', processed_at = now() WHERE id = ANY (':ids'::bigint[]);
COMMIT;
