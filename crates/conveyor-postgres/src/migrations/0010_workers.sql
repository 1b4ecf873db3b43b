-- Conveyor PostgreSQL store, migration 10: the worker registry (see `conveyor_core::workers`).
-- One row per worker id, upserted by its heartbeats. Small (one row per worker process), so it
-- has no index besides its key. A dead worker's jobs are found by `jobs.lease_worker` through
-- `jobs_lease` (running jobs only).
CREATE TABLE @schema@.workers (
    id           text PRIMARY KEY,
    host         text NOT NULL,
    pid          bigint,
    queues       text[] NOT NULL,
    concurrency  integer NOT NULL CHECK (concurrency >= 0),
    busy         integer NOT NULL CHECK (busy >= 0),
    version      text NOT NULL,
    started_at   timestamptz NOT NULL,
    last_seen_at timestamptz NOT NULL,
    state        text NOT NULL CHECK (state IN ('alive', 'stopped', 'dead')),
    ended_at     timestamptz
);
