-- Conveyor PostgreSQL store, migration 13: workflows (see `conveyor_core::workflow`) and job
-- progress.
--
-- A job of a flow (a step's job, or a compensation) carries its flow, its step and its
-- parents' results; plain jobs leave the three NULL. `progress` is the handler's latest report.
-- Nullable, without defaults or checks, so adding them only changes the catalog: the table is
-- neither rewritten nor scanned (a CHECK would scan every row under the ALTER's exclusive
-- lock), and jobs are blocked only for the moment of the ALTER. No index on `flow_id`:
-- flows reach their jobs through `flow_steps.job_id` and the primary key, so plain jobs pay
-- nothing for it on insert.
ALTER TABLE @schema@.jobs
    ADD COLUMN flow_id   uuid,
    ADD COLUMN flow_step text,
    ADD COLUMN parents   jsonb,
    ADD COLUMN progress  jsonb;

-- One row per flow. Every event of a flow (a step's job finished, a signal, a timeout, a
-- cancel, a replay) locks its row first (`SELECT ... FOR UPDATE`) in the event's transaction,
-- so events of one flow are applied one after the other even from different servers.
CREATE TABLE @schema@.flows (
    id              uuid PRIMARY KEY,          -- UUIDv7: lists page by id, newest first
    name            text,
    state           text NOT NULL CHECK (state IN (
                        'running', 'completed', 'failed', 'compensating', 'compensated',
                        'cancelled')),
    on_failure      text NOT NULL CHECK (on_failure IN ('stop', 'compensate')),
    failed_step     text,
    idempotency_key text,
    tags            text[] NOT NULL,           -- labels (the creating token's owner tag)
    created_at      timestamptz NOT NULL,
    finished_at     timestamptz
);
-- Lists filtered by state or name, newest first.
CREATE INDEX flows_state ON @schema@.flows (state, id);
CREATE INDEX flows_name ON @schema@.flows (name, id) WHERE name IS NOT NULL;
-- One flow per key: a concurrent create with the same key waits for the first and returns it.
CREATE UNIQUE INDEX flows_idempotency ON @schema@.flows (idempotency_key)
    WHERE idempotency_key IS NOT NULL;

-- A flow's steps. A job step's job is inserted, under the id reserved here, when the step
-- starts; `job` and `compensate` are the `NewJob` specs. `result` is the step's result (copied
-- from its job when it completes, or a wait's signal payload), `error` why it failed.
CREATE TABLE @schema@.flow_steps (
    flow_id             uuid NOT NULL REFERENCES @schema@.flows (id) ON DELETE CASCADE,
    name                text NOT NULL,
    position            integer NOT NULL,      -- order given at creation
    state               text NOT NULL CHECK (state IN (
                            'pending', 'active', 'waiting', 'completed', 'failed', 'skipped',
                            'cancelled')),
    after               text[] NOT NULL,       -- the parents' names
    on_parent_failure   text NOT NULL CHECK (on_parent_failure IN ('fail', 'skip', 'continue')),
    job_id              uuid,
    job                 jsonb,
    compensate          jsonb,
    wait_signal         text,
    wait_timeout_ms     bigint CHECK (wait_timeout_ms > 0),
    wait_deadline       timestamptz,
    signalled           boolean NOT NULL DEFAULT false,
    result              jsonb,
    error               jsonb,
    completed_seq       bigint,                -- completion order (compensation runs latest first)
    compensation        text CHECK (compensation IN ('running', 'completed', 'failed')),
    compensation_job_id uuid,
    finished_at         timestamptz,
    PRIMARY KEY (flow_id, name),
    -- A step runs a job or waits for a signal, never both.
    CONSTRAINT flow_steps_job_or_wait CHECK (
        (job IS NULL) = (job_id IS NULL) AND (job IS NULL) <> (wait_signal IS NULL))
);
-- The maintenance pass's look for waits past their deadline.
CREATE INDEX flow_steps_deadline ON @schema@.flow_steps (wait_deadline)
    WHERE state = 'waiting' AND wait_deadline IS NOT NULL;
