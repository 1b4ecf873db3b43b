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
    finished_at      INTEGER,
    unique_key       TEXT,                  -- version 6: set for jobs enqueued with a UniqueSpec
    flow_id          TEXT,                  -- version 11: a workflow's step or compensation
    flow_step        TEXT,
    parents          TEXT,                  -- JSON object: the step's parents' results
    progress         TEXT,                  -- JSON: the handler's latest progress report
    expires_at       INTEGER,               -- version 13: not started by then, it expires
    trace            TEXT,                  -- version 13: JSON W3C trace context
    limit_keys       TEXT,                  -- version 18: JSON array of `limit:value` keys
    fair_key         TEXT,                  -- version 18: the one of them it takes turns by
    sequence_key     TEXT,                  -- version 19: the sequence it runs in (`expr=value`)
    sequence_no      INTEGER,               -- its place there
    sequence_skip_dead INTEGER NOT NULL DEFAULT 0, -- 1: dead, it lets the next one run
    fold_key         TEXT,                  -- version 19: its debounce or throttle key
    fold_until       INTEGER,               -- enqueues of the key are dropped until then
    fair_turn        INTEGER                -- version 22: its turn by fair_key while available
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
    concurrency_limit    INTEGER,
    -- Version 7: flow control (see `QueueSettings`). A rate limit is its two columns.
    per_key_concurrency_limit INTEGER,
    rate_count                INTEGER,
    rate_period_ms            INTEGER,
    per_key_rate_count        INTEGER,
    per_key_rate_period_ms    INTEGER,
    weight                    INTEGER,
    -- Version 10: retention per queue (seconds; NULL: the server's default).
    completed_retention_secs  INTEGER,
    dead_retention_secs       INTEGER,
    -- Version 13: jobs enqueued without an expiry expire this long after they could start.
    default_ttl_ms            INTEGER,
    -- Version 14: the queue's circuit breaker settings (JSON, `BreakerSettings`).
    circuit_breaker           TEXT,
    -- Version 18: the named limits its jobs are subject to (JSON array of names).
    limits                    TEXT,
    -- Version 19: the sequence its jobs run in (JSON, `SequenceSpec`).
    sequence                  TEXT
) WITHOUT ROWID;
-- Version 13: waiting jobs by expiry, for the sweep that expires them.
CREATE INDEX IF NOT EXISTS jobs_expiry ON jobs (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('scheduled', 'available', 'retryable');
-- Unfinished jobs per tenant, for the per-tenant depth limit (jobs without a tenant cost
-- nothing). Version 21: blocked jobs count too (`jobs_tenant_unfinished` before).
DROP INDEX IF EXISTS jobs_tenant_unfinished;
CREATE INDEX IF NOT EXISTS jobs_tenant_queued ON jobs (queue, tenant)
    WHERE tenant IS NOT NULL
      AND state IN ('scheduled', 'available', 'running', 'retryable', 'blocked');

-- Version 4: concurrency_limit (added above for new databases; this upgrades version 3 ones).

-- Version 5: cron schedules. `definition` is the schedule's spec as JSON (cron, timezone, job
-- template, policies). Every tick up to `due_after` has been handled; `revision` changes with
-- every update and firing, and a firing applies only at the revision it was planned from, so
-- a tick is recorded once however many nodes try. `last_job_id` is the job of the latest
-- enqueued run, which `overlap: skip` checks.
CREATE TABLE IF NOT EXISTS schedules (
    name        TEXT PRIMARY KEY,
    definition  TEXT NOT NULL,
    revision    INTEGER NOT NULL,
    due_after   INTEGER NOT NULL,
    last_tick   INTEGER,
    last_job_id TEXT,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
) WITHOUT ROWID;
-- One row per fired tick (the key makes a second firing of a tick impossible), newest kept.
CREATE TABLE IF NOT EXISTS schedule_runs (
    schedule TEXT NOT NULL,
    tick     INTEGER NOT NULL,
    fired_at INTEGER NOT NULL,
    status   TEXT NOT NULL,
    catch_up INTEGER NOT NULL,
    job_id   TEXT,
    detail   TEXT,
    PRIMARY KEY (schedule, tick)
) WITHOUT ROWID;

-- Version 6: unique jobs. The insert path looks up the latest job with a key in the spec's
-- states (and window). The state is in the index so that a key's long history of finished jobs
-- is not scanned when only unfinished ones count; only unique jobs have entries, so the state
-- changes of other jobs never touch it. (`unique_key` is added above, or by `migrate`.)
CREATE INDEX IF NOT EXISTS jobs_unique ON jobs (unique_key, state, created_at)
    WHERE unique_key IS NOT NULL;

-- Version 7: flow control.
-- Tenant fairness: each tenant's available jobs in claim order, and the distinct tenants of a
-- queue (read by skipping through this index). Jobs without a tenant are not in it, so the
-- common path pays nothing for it.
CREATE INDEX IF NOT EXISTS jobs_fair ON jobs (queue, tenant, priority DESC, run_at, id)
    WHERE state = 'available' AND tenant IS NOT NULL;
-- Per-key concurrency limits: running jobs per tenant.
CREATE INDEX IF NOT EXISTS jobs_running_tenant ON jobs (queue, tenant)
    WHERE state = 'running' AND tenant IS NOT NULL;
-- Rate limits: the start times that still count, per queue (`scope` '') and per tenant
-- (`scope` the tenant). Only queues with a rate limit write here; rows older than the
-- queue's longest rate period are pruned by the next fetch from the queue.
CREATE TABLE IF NOT EXISTS rate_starts (
    queue      TEXT NOT NULL,
    scope      TEXT NOT NULL,
    started_at INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS rate_starts_window ON rate_starts (queue, scope, started_at);
CREATE INDEX IF NOT EXISTS rate_starts_age ON rate_starts (queue, started_at);

-- Version 8: access control and audit (see `conveyor_core::access`). Only the SHA-256 of each
-- secret is kept; a credential is looked up by its id, then its secret's hash compared.
-- A name belongs to one active token at a time; a revoked token keeps its name.
CREATE TABLE IF NOT EXISTS api_tokens (
    id          TEXT PRIMARY KEY,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS api_tokens_active_name ON api_tokens (name)
    WHERE revoked_at IS NULL;
-- Browser sessions made by logging in with a token; revoking the token deletes them.
CREATE TABLE IF NOT EXISTS sessions (
    id          TEXT PRIMARY KEY,
    secret_hash TEXT NOT NULL,
    token_id    TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    expires_at  INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sessions_token ON sessions (token_id);
CREATE INDEX IF NOT EXISTS sessions_expiry ON sessions (expires_at);
-- Who did what. `id` grows with every append (AUTOINCREMENT: never reused, so a page cursor
-- stays valid); `job_ids` is a JSON array of at most 100 ids, `job_count` the full number.
CREATE TABLE IF NOT EXISTS audit_log (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    at             INTEGER NOT NULL,
    actor          TEXT NOT NULL,
    actor_token_id TEXT,
    action         TEXT NOT NULL,
    target         TEXT,
    job_ids        TEXT NOT NULL,
    job_count      INTEGER NOT NULL,
    detail         TEXT
);
CREATE INDEX IF NOT EXISTS audit_log_action ON audit_log (action, id);

-- Version 9: the worker registry (see `conveyor_core::workers`). One row per worker id;
-- `queues` is a JSON array, `state` alive | stopped | dead. Small (one row per worker process),
-- so it has no index of its own.
CREATE TABLE IF NOT EXISTS workers (
    id           TEXT PRIMARY KEY,
    host         TEXT NOT NULL,
    pid          INTEGER,
    queues       TEXT NOT NULL,
    concurrency  INTEGER NOT NULL,
    busy         INTEGER NOT NULL,
    version      TEXT NOT NULL,
    started_at   INTEGER NOT NULL,
    last_seen_at INTEGER NOT NULL,
    state        TEXT NOT NULL,
    ended_at     INTEGER,
    command      TEXT               -- version 15: 'quiet' or 'stop', set by an operator
) WITHOUT ROWID;

-- Version 11: workflows (see `conveyor_core::workflow`). A flow's steps; a step's job is
-- inserted, with the id reserved here, when the step starts. `job` and `compensate` are the
-- NewJob specs as JSON; `after` a JSON array of step names. Jobs of a flow carry `flow_id`,
-- `flow_step` and `parents` (added to `jobs` by `migrate`); plain jobs leave them NULL.
CREATE TABLE IF NOT EXISTS flows (
    id              TEXT PRIMARY KEY,
    name            TEXT,
    state           TEXT NOT NULL,
    on_failure      TEXT NOT NULL,
    failed_step     TEXT,
    idempotency_key TEXT,
    tags            TEXT NOT NULL,          -- JSON array
    created_at      INTEGER NOT NULL,
    finished_at     INTEGER
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS flows_state ON flows (state, id);
CREATE INDEX IF NOT EXISTS flows_name ON flows (name, id) WHERE name IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS flows_idempotency ON flows (idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE TABLE IF NOT EXISTS flow_steps (
    flow_id             TEXT NOT NULL,
    name                TEXT NOT NULL,
    position            INTEGER NOT NULL,
    state               TEXT NOT NULL,
    after               TEXT NOT NULL,
    on_parent_failure   TEXT NOT NULL,
    job_id              TEXT,
    job                 TEXT,
    compensate          TEXT,
    wait_signal         TEXT,
    wait_timeout_ms     INTEGER,
    wait_deadline       INTEGER,
    signalled           INTEGER NOT NULL DEFAULT 0,
    result              TEXT,
    error               TEXT,
    completed_seq       INTEGER,
    compensation        TEXT,
    compensation_job_id TEXT,
    finished_at         INTEGER,
    PRIMARY KEY (flow_id, name)
) WITHOUT ROWID;
-- The maintenance pass's look for waits past their deadline.
CREATE INDEX IF NOT EXISTS flow_steps_deadline ON flow_steps (wait_deadline)
    WHERE state = 'waiting' AND wait_deadline IS NOT NULL;

-- Version 12: settings per job kind (see `conveyor_core::kinds`): a payload schema.
CREATE TABLE IF NOT EXISTS kinds (
    kind        TEXT PRIMARY KEY,
    schema      TEXT,                  -- JSON Schema 2020-12, checked at every enqueue
    version     INTEGER,
    updated_at  INTEGER NOT NULL,
    -- Version 14: the kind's circuit breaker settings (JSON, `BreakerSettings`).
    circuit_breaker TEXT,
    -- Version 18: the named limits its jobs are subject to (JSON array of names).
    limits TEXT,
    -- Version 19: the sequence its jobs run in (JSON, `SequenceSpec`).
    sequence TEXT,
    -- Version 20: how its jobs go out in batches (JSON, `BatchSpec`).
    batch TEXT
) WITHOUT ROWID;

-- Version 14: circuit breakers' states (`conveyor_core::breaker`), one document each, changed
-- only by a conditional write on `version`.
CREATE TABLE IF NOT EXISTS circuit_breakers (
    scope    TEXT NOT NULL,             -- 'queue' or 'kind'
    name     TEXT NOT NULL,
    version  INTEGER NOT NULL,
    record   TEXT NOT NULL,             -- JSON, `BreakerRecord`
    PRIMARY KEY (scope, name)
) WITHOUT ROWID;

-- Version 15: history, one row per minute, queue and kind (`conveyor_core::stats`). Counts are
-- added to by each flush of a server's recorder; durations are histograms (JSON) so they add too.
CREATE TABLE IF NOT EXISTS stats_minutes (
    minute      INTEGER NOT NULL,   -- ms since the epoch, a whole minute
    queue       TEXT NOT NULL,
    kind        TEXT NOT NULL,
    enqueued    INTEGER NOT NULL,
    started     INTEGER NOT NULL,
    completed   INTEGER NOT NULL,
    failed      INTEGER NOT NULL,
    retried     INTEGER NOT NULL,
    dead        INTEGER NOT NULL,
    run_time    TEXT NOT NULL,      -- JSON, `Histogram`
    queue_wait  TEXT NOT NULL,      -- JSON, `Histogram`
    PRIMARY KEY (minute, queue, kind)
) WITHOUT ROWID;

-- Version 16: no new table or column. A job step completed by its own job may stay `pending`
-- (or `active`) in `flow_steps`, its completed job saying it is completed (see `workflow.rs`,
-- STEP_COMPLETED_BY_JOB). A Conveyor of version 15 would read such a step as still running,
-- and its retention would lose the step's result: the version makes it refuse this file.

-- Version 17: configuration the cluster shares (`conveyor_core::config`): named JSON documents
-- by collection, such as event sources.
CREATE TABLE IF NOT EXISTS config (
    collection  TEXT NOT NULL,
    name        TEXT NOT NULL,
    document    TEXT NOT NULL,     -- JSON
    updated_at  INTEGER NOT NULL,  -- ms since the epoch
    PRIMARY KEY (collection, name)
) WITHOUT ROWID;

-- Version 18: named limits (`conveyor_core::limits::named`). Jobs stamped with limit keys at
-- enqueue; the claim looks for available ones per queue (one probe) and counts running ones
-- per key. Jobs without keys are in neither index, so the common path pays nothing.
CREATE INDEX IF NOT EXISTS jobs_limited ON jobs (queue)
    WHERE state = 'available' AND limit_keys IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_running_limited ON jobs (queue)
    WHERE state = 'running' AND limit_keys IS NOT NULL;
-- Fairness among a keyed limit's keys. Version 22: by turns (`turns.rs`) instead of a
-- rotation over `jobs_fair_key` (ordered by key, which made a claim or an enqueue over many
-- keys write a page per key). Jobs waiting for their turn (it is given at the next keyed claim)
-- sort first and are found by `jobs_unturned`.
DROP INDEX IF EXISTS jobs_fair_key;
CREATE INDEX IF NOT EXISTS jobs_fair_turn ON jobs (queue, priority DESC, fair_turn, fair_key, id)
    WHERE state = 'available' AND fair_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_unturned ON jobs (queue, run_at, id)
    WHERE state = 'available' AND fair_key IS NOT NULL AND fair_turn IS NULL;
-- Per queue, priority and key: the turn the key's next job gets and how many jobs already have
-- it (`conveyor_core::limits::turns::KeyTurns`). Rows behind the turn served are deleted.
CREATE TABLE IF NOT EXISTS fair_turns (
    queue      TEXT NOT NULL,
    priority   INTEGER NOT NULL,
    key        TEXT NOT NULL,
    next_turn  INTEGER NOT NULL,
    given      INTEGER NOT NULL,
    PRIMARY KEY (queue, priority, key)
) WITHOUT ROWID;
-- Per queue and priority: the highest turn claimed (`turns::served`); a key arriving joins it.
CREATE TABLE IF NOT EXISTS fair_served (
    queue     TEXT NOT NULL,
    priority  INTEGER NOT NULL,
    turn      INTEGER NOT NULL,
    PRIMARY KEY (queue, priority)
) WITHOUT ROWID;

-- Version 19: sequences (`conveyor_core::sequence`). A key's jobs by number: the last number
-- for the next enqueue, and the unfinished ones (and dead ones, which may hold the sequence)
-- for whether it must wait and which blocked job is released next. Jobs without a sequence are
-- in neither index.
CREATE INDEX IF NOT EXISTS jobs_sequence ON jobs (sequence_key, sequence_no)
    WHERE sequence_key IS NOT NULL;
CREATE INDEX IF NOT EXISTS jobs_sequence_open ON jobs (sequence_key, sequence_no)
    WHERE sequence_key IS NOT NULL
      AND state IN ('blocked', 'scheduled', 'available', 'running', 'retryable', 'dead');
-- Debounce and throttle (`conveyor_core::debounce`): a key's latest job, which a new enqueue
-- of the key folds into.
CREATE INDEX IF NOT EXISTS jobs_fold ON jobs (fold_key, created_at)
    WHERE fold_key IS NOT NULL;
