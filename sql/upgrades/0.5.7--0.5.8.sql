-- What changes 0.5.7's objects on the way to 0.5.8 (the rest of the update script comes from
-- the sources, run again: see scripts/make-upgrade-script.sh).

-- outbox_worker_status() gains the worker's compactions (compactions, last_compaction_at): a new
-- result type, so it is made again (sql/operations.sql); the users' grants on it are kept.
DROP FUNCTION outbox_worker_status();
