-- Conveyor embedded store, schema version 1.
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
-- Listing and counting by queue and state.
CREATE INDEX IF NOT EXISTS jobs_queue_state ON jobs (queue, state);
