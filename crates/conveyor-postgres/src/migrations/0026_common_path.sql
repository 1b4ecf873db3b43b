-- Conveyor PostgreSQL store, migration 26: what plain jobs pay for the features of issue 31.
--
-- The sequence release triggers of migration 22 exist only once a job of a sequence does. A table
-- with an AFTER UPDATE row trigger makes every updated row, of a sequence or not, read its old
-- version again for the trigger, before the trigger's WHEN is looked at; each claim and completion
-- paid that (docs/benchmarks.md, "The common path on PostgreSQL"). So they are dropped here unless
-- a job of a sequence is stored, and `sequence_release_arm` puts them back.
--
-- Every row of a sequence arms them before it is stored, however it is inserted (this server's
-- enqueue or copy, or a server older than this migration still running beside it): a BEFORE
-- INSERT trigger whose WHEN plain rows fail on a NULL test (100,000-row inserts did not show its
-- cost). So whenever a job of a sequence exists, so do the triggers, and no job can be blocked
-- behind one that finishes unseen. Arming takes SHARE ROW EXCLUSIVE on `jobs`, waiting for the
-- transactions writing jobs to end; once armed, the check is one catalog lookup and no lock.
-- This server also arms before its transaction writes any job (the insert's sequence lock keys,
-- a copy's import): inside an INSERT the lock is an upgrade from ROW EXCLUSIVE, and two
-- transactions upgrading at once would deadlock.
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
    IF NOT EXISTS (SELECT 1 FROM @schema@.jobs WHERE sequence_key IS NOT NULL) THEN
        DROP TRIGGER jobs_sequence_release_on_update ON @schema@.jobs;
        DROP TRIGGER jobs_sequence_release_on_delete ON @schema@.jobs;
    END IF;
END
$disarm$;
CREATE FUNCTION @schema@.sequence_release_arm_on_insert() RETURNS trigger
LANGUAGE plpgsql AS $arm_on_insert$
BEGIN
    PERFORM @schema@.sequence_release_arm();
    RETURN NEW;
END
$arm_on_insert$;
CREATE TRIGGER jobs_sequence_arm_on_insert
    BEFORE INSERT ON @schema@.jobs
    FOR EACH ROW
    WHEN (NEW.sequence_key IS NOT NULL)
    EXECUTE FUNCTION @schema@.sequence_release_arm_on_insert();
-- The running jobs with a tenant and those with limit keys in one index instead of two
-- (`jobs_running_tenant`, migration 7, and `jobs_running_limited`, migration 21): each index
-- is one more predicate for every row a claim or completion writes, and one more relation
-- each statement opens and locks. The tenant counts ask `tenant IS NOT NULL` and read it; the
-- counts per limit key ask `limit_keys IS NOT NULL`, which implies its predicate too, and read
-- it or `jobs_lease` (every running job), whichever the planner finds smaller.
--
-- Every partial index whose predicate pairs a state with a column that plain jobs leave NULL
-- tests the NULL first. PostgreSQL evaluates each index's predicate for every row an insert or
-- a non-HOT update writes (a claim and a completion change `state`, so neither is HOT), in the
-- order written, and stops at the first false term: a NULL test reads a flag, a state test
-- compares text. Plain jobs fail the NULL test of each of these, so each costs them one flag
-- (docs/benchmarks.md, "The common path on PostgreSQL", for the figures). The planner proves a
-- partial index usable whatever the order of its terms, so no query changes.
CREATE INDEX jobs_running_keyed ON @schema@.jobs (queue, tenant)
    WHERE (tenant IS NOT NULL OR limit_keys IS NOT NULL) AND state = 'running';
DROP INDEX @schema@.jobs_running_tenant;
DROP INDEX @schema@.jobs_running_limited;

DROP INDEX @schema@.jobs_fair;
CREATE INDEX jobs_fair ON @schema@.jobs (queue, tenant, priority DESC, run_at, id)
    WHERE tenant IS NOT NULL AND state = 'available';
DROP INDEX @schema@.jobs_fair_turn;
CREATE INDEX jobs_fair_turn ON @schema@.jobs (queue, priority DESC, fair_turn, fair_key, id)
    WHERE fair_key IS NOT NULL AND state = 'available';
DROP INDEX @schema@.jobs_unturned;
CREATE INDEX jobs_unturned ON @schema@.jobs (queue, run_at, id)
    WHERE fair_key IS NOT NULL AND fair_turn IS NULL AND state = 'available';
DROP INDEX @schema@.jobs_limited;
CREATE INDEX jobs_limited ON @schema@.jobs (queue)
    WHERE limit_keys IS NOT NULL AND state = 'available';
DROP INDEX @schema@.jobs_waiting_tenant;
CREATE INDEX jobs_waiting_tenant ON @schema@.jobs (queue, tenant)
    WHERE tenant IS NOT NULL AND state IN ('scheduled', 'retryable');
