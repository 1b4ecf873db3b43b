-- Conveyor PostgreSQL store, migration 1: the jobs table and its partial indexes.
-- `@schema@` is replaced by the configured (validated, quoted) schema name.
-- Times are timestamptz written at millisecond precision (the store truncates before writing),
-- so values read back equal the `Clock` values the store was given.
CREATE TABLE @schema@.jobs (
    id               uuid PRIMARY KEY,            -- UUIDv7: time-ordered, so inserts append
    kind             text NOT NULL,
    queue            text NOT NULL,
    payload          jsonb NOT NULL,
    priority         integer NOT NULL,
    run_at           timestamptz NOT NULL,
    attempt          integer NOT NULL CHECK (attempt >= 0),
    max_attempts     integer NOT NULL CHECK (max_attempts > 0),
    timeout_ms       bigint CHECK (timeout_ms > 0),
    idempotency_key  text,
    tags             text[] NOT NULL,
    tenant           text,
    state            text NOT NULL CHECK (state IN (
                         'scheduled', 'available', 'running', 'retryable',
                         'completed', 'dead', 'cancelled')),
    errors           jsonb NOT NULL CHECK (jsonb_typeof(errors) = 'array'),
    lease_worker     text,
    lease_token      uuid,
    lease_expires_at timestamptz,
    result           jsonb,
    created_at       timestamptz NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz,
    -- Every lease-conditional change matches on the token, so a running job must have one.
    CONSTRAINT jobs_running_has_lease CHECK (
        state <> 'running' OR (lease_token IS NOT NULL AND lease_expires_at IS NOT NULL))
);

-- The fetch path: only available jobs, in claim order.
CREATE INDEX jobs_fetch ON @schema@.jobs (queue, priority DESC, run_at, id)
    WHERE state = 'available';
-- Promotion of due jobs and the next-due lookup.
CREATE INDEX jobs_due ON @schema@.jobs (run_at)
    WHERE state IN ('scheduled', 'retryable');
-- The rescuer: running jobs by lease expiry.
CREATE INDEX jobs_lease ON @schema@.jobs (lease_expires_at)
    WHERE state = 'running';
-- Idempotency lookups: the latest job holding a key.
CREATE INDEX jobs_idempotency ON @schema@.jobs (idempotency_key, created_at)
    WHERE idempotency_key IS NOT NULL;
-- Dead jobs by queue and kind: the dead-letter views and replay filters.
CREATE INDEX jobs_dead ON @schema@.jobs (queue, kind)
    WHERE state = 'dead';
