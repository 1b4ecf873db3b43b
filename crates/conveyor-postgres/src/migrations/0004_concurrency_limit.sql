-- Conveyor PostgreSQL store, migration 4: per-queue concurrency limits, and the index their
-- running-job counts read.
-- At most `concurrency_limit` of the queue's jobs are running at once; NULL means no limit.
ALTER TABLE @schema@.queue_settings ADD COLUMN concurrency_limit bigint
    CHECK (concurrency_limit >= 0);

-- A queue's running jobs, counted under the queue's claim lock (and by the depth limits),
-- without scanning every running job of the schema as `jobs_lease` would.
CREATE INDEX jobs_running ON @schema@.jobs (queue)
    WHERE state = 'running';
