-- Conveyor PostgreSQL store, migration 6: unique jobs.
-- `unique_key` is set for jobs enqueued with a unique spec (see `conveyor_core::unique`): the
-- SHA-256 of the job's kind, queue and selected payload. Nullable without a default, so adding
-- it rewrites nothing.
ALTER TABLE @schema@.jobs ADD COLUMN unique_key text;

-- The insert path looks up the latest job with a key in the spec's states (and window). The
-- state is in the index so that a key's long history of finished jobs is not scanned when only
-- unfinished ones count; only unique jobs have entries, so other jobs never touch it.
CREATE INDEX jobs_unique ON @schema@.jobs (unique_key, state, created_at)
    WHERE unique_key IS NOT NULL;
