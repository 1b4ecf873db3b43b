-- Conveyor PostgreSQL store, migration 8: drop `jobs_running` (migration 4).
-- Every claim moves a job to `running`, and a moved row gets an entry in each index whose
-- predicate it now matches: this index cost every claim one more index insertion (about 15% of
-- drain throughput) to speed up only the running-job counts of queues with limits. Those
-- counts now read `jobs_lease` (every running job, bounded by the workers' total slots), which
-- the claim maintains anyway.
DROP INDEX IF EXISTS @schema@.jobs_running;
