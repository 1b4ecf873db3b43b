-- Conveyor PostgreSQL store, migration 26: what plain jobs pay for the features of issue 31.
--
-- The sequence release triggers of migration 22 exist only once a job of a sequence does. A table
-- with an AFTER UPDATE row trigger makes every updated row, of a sequence or not, read its old
-- version again for the trigger, before the trigger's WHEN is looked at; each claim and completion
-- paid that (docs/benchmarks.md, "The common path on PostgreSQL"). So they are dropped here unless
-- a job of a sequence is stored, and `sequence_release_arm` puts them back: every statement that
-- stores jobs of a sequence calls it first (the insert's sequence lock keys, a copy's import).
--
-- Arming takes SHARE ROW EXCLUSIVE on `jobs`: it waits for the transactions writing jobs to end,
-- and the ones after it see the triggers. The insert that armed reads its sequences' tails after
-- that, so a holder that finished without the trigger is seen finished and no job is left blocked
-- behind it. Once armed, the check is one catalog lookup and no lock.
CREATE FUNCTION @schema@.sequence_release_arm() RETURNS void LANGUAGE plpgsql AS $arm$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger
               WHERE tgrelid = '@schema@.jobs'::regclass
                 AND tgname = 'jobs_sequence_release_on_update') THEN
        RETURN;
    END IF;
    LOCK TABLE @schema@.jobs IN SHARE ROW EXCLUSIVE MODE;
    IF EXISTS (SELECT 1 FROM pg_trigger
               WHERE tgrelid = '@schema@.jobs'::regclass
                 AND tgname = 'jobs_sequence_release_on_update') THEN
        RETURN;
    END IF;
    CREATE TRIGGER jobs_sequence_release_on_update
        AFTER UPDATE OF state ON @schema@.jobs
        FOR EACH ROW
        WHEN (OLD.sequence_key IS NOT NULL
              AND (((OLD.state IN ('scheduled', 'available', 'running', 'retryable') OR (OLD.state = 'dead' AND NOT OLD.sequence_skip_dead))
                    AND NOT (NEW.state IN ('scheduled', 'available', 'running', 'retryable') OR (NEW.state = 'dead' AND NOT NEW.sequence_skip_dead)))
                   OR (NEW.state = 'blocked' AND OLD.state <> 'blocked')))
        EXECUTE FUNCTION @schema@.sequence_release('@channel@');
    CREATE TRIGGER jobs_sequence_release_on_delete
        AFTER DELETE ON @schema@.jobs
        FOR EACH ROW
        WHEN (OLD.sequence_key IS NOT NULL
              AND (OLD.state IN ('scheduled', 'available', 'running', 'retryable') OR (OLD.state = 'dead' AND NOT OLD.sequence_skip_dead)))
        EXECUTE FUNCTION @schema@.sequence_release('@channel@');
END
$arm$;
LOCK TABLE @schema@.jobs IN SHARE ROW EXCLUSIVE MODE;
DO $disarm$
BEGIN
    -- Kept where sequences are in use or configured: a server of an older version still
    -- running beside this migration would store jobs of a configured sequence without
    -- arming the triggers.
    IF NOT EXISTS (SELECT 1 FROM @schema@.jobs WHERE sequence_key IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM @schema@.queue_settings WHERE sequence IS NOT NULL)
       AND NOT EXISTS (SELECT 1 FROM @schema@.kinds WHERE sequence IS NOT NULL) THEN
        DROP TRIGGER jobs_sequence_release_on_update ON @schema@.jobs;
        DROP TRIGGER jobs_sequence_release_on_delete ON @schema@.jobs;
    END IF;
END
$disarm$;
-- The running jobs with a tenant and those with limit keys in one index instead of two
-- (`jobs_running_tenant`, migration 7, and `jobs_running_limited`, migration 21): each index
-- is one more predicate for every row a claim or completion writes, and one more relation
-- each statement opens and locks. The tenant counts ask `tenant IS NOT NULL` and read it; the
-- counts per limit key ask `limit_keys IS NOT NULL`, which implies its predicate too, and read
-- it or `jobs_lease` (every running job), whichever the planner finds smaller.
CREATE INDEX jobs_running_keyed ON @schema@.jobs (queue, tenant)
    WHERE state = 'running' AND (tenant IS NOT NULL OR limit_keys IS NOT NULL);
DROP INDEX @schema@.jobs_running_tenant;
DROP INDEX @schema@.jobs_running_limited;
