-- Conveyor PostgreSQL store, migration 3: per-queue settings (pause, maximum depths), and the
-- indexes the depth limits count with.
-- A queue without a row has the defaults: not paused, no limits. Limits count unfinished jobs
-- (scheduled, available, running, retryable); NULL means no limit.
CREATE TABLE @schema@.queue_settings (
    queue                text PRIMARY KEY,
    paused               boolean NOT NULL DEFAULT false,
    max_depth            bigint CHECK (max_depth >= 0),
    max_depth_per_tenant bigint CHECK (max_depth_per_tenant >= 0),
    updated_at           timestamptz
);

-- A queue's depth is counted from three partial indexes: available jobs from `jobs_fetch`,
-- running ones from `jobs_lease`, and waiting (scheduled, retryable) ones from this one, so jobs
-- that are available when enqueued (the common case) pay for no extra index entry.
CREATE INDEX jobs_waiting ON @schema@.jobs (queue)
    WHERE state IN ('scheduled', 'retryable');
-- A tenant's depth in a queue. Only jobs with a tenant pay for its entries.
CREATE INDEX jobs_tenant_unfinished ON @schema@.jobs (queue, tenant)
    WHERE tenant IS NOT NULL AND state IN ('scheduled', 'available', 'running', 'retryable');
