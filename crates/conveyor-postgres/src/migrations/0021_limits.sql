-- Conveyor PostgreSQL store, migration 21: named limits (`conveyor_core::limits::named`).
-- Jobs are stamped at enqueue with the limit keys they hold (a JSON array of `limit:value`;
-- NULL when none); queues and kinds name the limits their jobs are subject to.
ALTER TABLE @schema@.jobs ADD COLUMN limit_keys jsonb;
ALTER TABLE @schema@.queue_settings ADD COLUMN limits text[] NOT NULL DEFAULT '{}';
ALTER TABLE @schema@.kinds ADD COLUMN limits text[] NOT NULL DEFAULT '{}';
-- The claim's gate asks whether a queue has available jobs with keys (one probe), and the
-- limited claim counts running jobs per key. Jobs without keys are in neither index, so the
-- common path pays nothing for them.
CREATE INDEX jobs_limited ON @schema@.jobs (queue)
    WHERE state = 'available' AND limit_keys IS NOT NULL;
CREATE INDEX jobs_running_limited ON @schema@.jobs (queue)
    WHERE state = 'running' AND limit_keys IS NOT NULL;
