-- Conveyor PostgreSQL store, migration 21: named limits (`conveyor_core::limits::named`).
-- Jobs are stamped at enqueue with the limit keys they hold (a JSON array of `limit:value`;
-- NULL when none); queues and kinds name the limits their jobs are subject to.
ALTER TABLE @schema@.jobs ADD COLUMN limit_keys jsonb;
-- The key it takes turns by: the first of its keys of a limit with a key.
ALTER TABLE @schema@.jobs ADD COLUMN fair_key text;
ALTER TABLE @schema@.queue_settings ADD COLUMN limits text[] NOT NULL DEFAULT '{}';
ALTER TABLE @schema@.kinds ADD COLUMN limits text[] NOT NULL DEFAULT '{}';
-- The claim's gate asks whether a queue has available jobs with keys (one probe), and the
-- limited claim counts running jobs per key. Jobs without keys are in neither index, so the
-- common path pays nothing for them.
CREATE INDEX jobs_limited ON @schema@.jobs (queue)
    WHERE state = 'available' AND limit_keys IS NOT NULL;
CREATE INDEX jobs_running_limited ON @schema@.jobs (queue)
    WHERE state = 'running' AND limit_keys IS NOT NULL;
-- Fairness among a keyed limit's keys: each key's available jobs in claim order, and the
-- distinct keys of a queue (read by skipping through it), as `jobs_fair` does for tenants.
CREATE INDEX jobs_fair_key ON @schema@.jobs (queue, fair_key, priority DESC, run_at, id)
    WHERE state = 'available' AND fair_key IS NOT NULL;
