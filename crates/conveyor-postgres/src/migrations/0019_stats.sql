-- Conveyor PostgreSQL store, migration 19: history, one row per minute, queue and kind
-- (issue 15, `conveyor_core::stats`). Each server adds the counts it recorded since its last
-- flush; durations are histograms (`Histogram`, JSON) so that they add too. The rule for adding
-- is in Rust, shared with SQLite; rows are locked in key order while they are changed.
CREATE TABLE @schema@.stats_minutes (
    minute      timestamptz NOT NULL,
    queue       text        NOT NULL,
    kind        text        NOT NULL,
    enqueued    bigint      NOT NULL DEFAULT 0,
    started     bigint      NOT NULL DEFAULT 0,
    completed   bigint      NOT NULL DEFAULT 0,
    failed      bigint      NOT NULL DEFAULT 0,
    retried     bigint      NOT NULL DEFAULT 0,
    dead        bigint      NOT NULL DEFAULT 0,
    run_time    jsonb       NOT NULL DEFAULT '{}',
    queue_wait  jsonb       NOT NULL DEFAULT '{}',
    PRIMARY KEY (minute, queue, kind)
);
-- And operators' commands to workers (`conveyor_core::workers::WorkerCommand`): 'quiet' or
-- 'stop', kept across heartbeats.
ALTER TABLE @schema@.workers ADD COLUMN command text;
