-- Conveyor PostgreSQL store, migration 5: cron schedules and their runs.
-- `definition` is the schedule's spec (cron, timezone, job template, policies) as the core
-- serializes it. Every tick up to `due_after` has been handled; `revision` changes with every
-- update and firing, and a firing applies only at the revision it was planned from (checked
-- under the row's lock), so a tick is recorded once however many servers try. `last_job_id` is
-- the job of the latest enqueued run, which `overlap: skip` checks.
CREATE TABLE @schema@.schedules (
    name        text PRIMARY KEY,
    definition  jsonb NOT NULL,
    revision    bigint NOT NULL CHECK (revision > 0),
    due_after   timestamptz NOT NULL,
    last_tick   timestamptz,
    last_job_id uuid,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);

-- One row per fired tick: the key makes a second firing of a tick impossible. Runs go with
-- their schedule; their jobs stay. Only the newest runs of a schedule are kept.
CREATE TABLE @schema@.schedule_runs (
    schedule text NOT NULL REFERENCES @schema@.schedules (name) ON DELETE CASCADE,
    tick     timestamptz NOT NULL,
    fired_at timestamptz NOT NULL,
    status   text NOT NULL CHECK (status IN ('enqueued', 'skipped_overlap', 'refused')),
    catch_up boolean NOT NULL,
    job_id   uuid,
    detail   text,
    PRIMARY KEY (schedule, tick)
);
