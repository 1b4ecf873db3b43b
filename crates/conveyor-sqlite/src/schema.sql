-- Conveyor embedded store. Every statement is idempotent (IF NOT EXISTS), so upgrading from an
-- older version re-runs this file; the version is kept in PRAGMA user_version.
-- Timestamps are milliseconds since the Unix epoch; JSON columns hold text.
CREATE TABLE IF NOT EXISTS jobs (
    id               TEXT PRIMARY KEY,      -- UUIDv7: time-ordered, so inserts append
    kind             TEXT NOT NULL,
    queue            TEXT NOT NULL,
    payload          TEXT NOT NULL,
    priority         INTEGER NOT NULL,
    run_at           INTEGER NOT NULL,
    attempt          INTEGER NOT NULL,
    max_attempts     INTEGER NOT NULL,
    timeout_ms       INTEGER,
    idempotency_key  TEXT,
    tags             TEXT NOT NULL,
    tenant           TEXT,
    state            TEXT NOT NULL,
    errors           TEXT NOT NULL,
    lease_worker     TEXT,
    lease_token      TEXT,
    lease_expires_at INTEGER,
    result           TEXT,
    created_at       INTEGER NOT NULL,
    started_at       INTEGER,
    finished_at      INTEGER
) WITHOUT ROWID;

-- The fetch path: only available jobs, in claim order.
CREATE INDEX IF NOT EXISTS jobs_fetch ON jobs (queue, priority DESC, run_at, id)
    WHERE state = 'available';
-- Promotion of due jobs and the next-due lookup.
CREATE INDEX IF NOT EXISTS jobs_due ON jobs (run_at)
    WHERE state IN ('scheduled', 'retryable');
-- The rescuer: running jobs by lease expiry.
CREATE INDEX IF NOT EXISTS jobs_lease ON jobs (lease_expires_at)
    WHERE state = 'running';
CREATE INDEX IF NOT EXISTS jobs_idempotency ON jobs (idempotency_key, created_at)
    WHERE idempotency_key IS NOT NULL;
-- Dead jobs by queue and kind: the dead-letter views and replay filters.
CREATE INDEX IF NOT EXISTS jobs_dead ON jobs (queue, kind) WHERE state = 'dead';

-- Per-queue counts by state, maintained by the writer in the same transaction as every change
-- (see `WriteCtx::count_move`). Cheaper than an index on (queue, state) over the whole table,
-- where each state change would move an entry in a large index, and cheaper than triggers;
-- it makes `queues_stats` constant-time.
CREATE TABLE IF NOT EXISTS queue_state_counts (
    queue TEXT NOT NULL,
    state TEXT NOT NULL,
    n     INTEGER NOT NULL,
    PRIMARY KEY (queue, state)
) WITHOUT ROWID;

-- Version 2: maintenance leadership. One row per role; a holder keeps it by renewing before
-- `expires_at`.
CREATE TABLE IF NOT EXISTS leadership (
    name       TEXT PRIMARY KEY,
    holder     TEXT NOT NULL,
    expires_at INTEGER NOT NULL
) WITHOUT ROWID;

-- Version 3: per-queue settings (pause, back-pressure). The writer keeps a copy in memory.
CREATE TABLE IF NOT EXISTS queue_settings (
    queue                TEXT PRIMARY KEY,
    paused               INTEGER NOT NULL DEFAULT 0,
    max_depth            INTEGER,
    max_depth_per_tenant INTEGER,
    concurrency_limit    INTEGER
) WITHOUT ROWID;
-- Unfinished jobs per tenant, for the per-tenant depth limit (jobs without a tenant cost nothing).
CREATE INDEX IF NOT EXISTS jobs_tenant_unfinished ON jobs (queue, tenant)
    WHERE tenant IS NOT NULL AND state IN ('scheduled', 'available', 'running', 'retryable');

-- Version 4: concurrency_limit (added above for new databases; this upgrades version 3 ones).
