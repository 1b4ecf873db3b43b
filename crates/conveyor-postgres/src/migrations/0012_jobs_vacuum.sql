-- Conveyor PostgreSQL store, migration 12: vacuum the jobs table as often as a queue needs.
-- Every claim and every completion leaves a dead row version and dead index entries, and the
-- ones in `jobs_fetch` sit exactly where the next claim starts its ordered scan: until VACUUM
-- removes them each claim steps over all of them (12,600 index pages per claim after 570,000
-- jobs of a 1,000,000 backlog were claimed, against 160 at the start). PostgreSQL's defaults
-- vacuum a table once a fifth of it is dead, which for a queue is far too late, so the jobs
-- table is vacuumed after 1% (and at least 1,000 rows) changed, without cost-based sleeping,
-- and analyzed after 2% so the planner's statistics follow a backlog that grows from nothing.
-- Only storage parameters change (a SHARE UPDATE EXCLUSIVE lock, no rewrite: jobs are not
-- blocked). No fillfactor: a claim changes `state`, which every partial index's predicate
-- reads, so claims and completions can never be HOT updates and free space in a page would
-- only make the table larger. These take effect only where autovacuum is on (see
-- docs/architecture.md, "PostgreSQL at depth").
ALTER TABLE @schema@.jobs SET (
    autovacuum_vacuum_scale_factor = 0.01,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.01,
    autovacuum_vacuum_insert_threshold = 1000,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_analyze_threshold = 1000,
    autovacuum_vacuum_cost_delay = 0
);
-- Statistics now, for a database upgraded with a backlog (a sample of the table; a SHARE UPDATE
-- EXCLUSIVE lock, like the change above).
ANALYZE @schema@.jobs;
