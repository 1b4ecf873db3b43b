-- Conveyor PostgreSQL store, migration 22: sequences (`conveyor_core::sequence`), debounce and
-- throttle (`conveyor_core::debounce`). A job of a
-- sequence carries its key (`expr=value`), its number within the key and what a dead job does
-- to the jobs behind it; a job enqueued behind unfinished ones waits in the new state
-- `blocked`, never fetched, until the one before it finishes. Queues and kinds may name a
-- sequence (JSON, `SequenceSpec`). Adding nullable columns rewrites nothing.
ALTER TABLE @schema@.jobs
    ADD COLUMN sequence_key       text,
    ADD COLUMN sequence_no        bigint,
    ADD COLUMN sequence_skip_dead boolean NOT NULL DEFAULT false,
    -- Debounce and throttle (`conveyor_core::debounce`): the key enqueues fold by, and until
    -- when later enqueues of the key are dropped.
    ADD COLUMN fold_key           text,
    ADD COLUMN fold_until         timestamptz;
-- A key's latest job, which a new enqueue of the key folds into.
CREATE INDEX jobs_fold ON @schema@.jobs (fold_key, created_at)
    WHERE fold_key IS NOT NULL;
ALTER TABLE @schema@.jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
ALTER TABLE @schema@.jobs ADD CONSTRAINT jobs_state_check CHECK (state IN (
    'scheduled', 'available', 'running', 'retryable', 'completed', 'dead', 'cancelled',
    'expired', 'blocked')) NOT VALID;
ALTER TABLE @schema@.jobs VALIDATE CONSTRAINT jobs_state_check;
ALTER TABLE @schema@.queue_settings ADD COLUMN sequence jsonb;
ALTER TABLE @schema@.kinds ADD COLUMN sequence jsonb;
-- A key's jobs by number: the last number for the next enqueue; the unfinished ones (and dead
-- ones, which may hold the sequence) for whether a new job must wait and which blocked job is
-- released next. Jobs without a sequence are in neither index.
CREATE INDEX jobs_sequence ON @schema@.jobs (sequence_key, sequence_no)
    WHERE sequence_key IS NOT NULL;
CREATE INDEX jobs_sequence_open ON @schema@.jobs (sequence_key, sequence_no)
    WHERE sequence_key IS NOT NULL
      AND state IN ('blocked', 'scheduled', 'available', 'running', 'retryable', 'dead');
-- The release (`conveyor_core::sequence`): when a job that held its sequence stops holding it
-- (completed, cancelled, expired, dead with on_dead skip, or a dead job deleted), or a replayed
-- job is put back behind it, and no job of the key holds it any more, the lowest-numbered
-- blocked job becomes available (scheduled while its run_at is ahead of the database's clock;
-- a fetch promotes it by the store's clock) and its queue is notified. A trigger, so every change of
-- state in any statement or transaction (the application's own, through complete_tx) releases
-- in the same transaction, and a crash between the change and the release cannot happen.
-- Inserts take the same lock per key (ops::insert), so a job enqueued while the last holder
-- finishes is either seen by the release or sees the finish.
CREATE FUNCTION @schema@.sequence_release() RETURNS trigger LANGUAGE plpgsql AS $release$
DECLARE
    released_queue text;
BEGIN
    PERFORM pg_advisory_xact_lock(hashtextextended(
        'conveyor:sequence:' || TG_TABLE_SCHEMA || ':' || OLD.sequence_key, 0));
    LOOP
        IF EXISTS (SELECT 1 FROM @schema@.jobs
                   WHERE sequence_key = OLD.sequence_key
                     AND state IN ('blocked', 'scheduled', 'available', 'running',
                                   'retryable', 'dead')
                     AND (state IN ('scheduled', 'available', 'running', 'retryable') OR (state = 'dead' AND NOT sequence_skip_dead))) THEN
            RETURN NULL;
        END IF;
        UPDATE @schema@.jobs
        SET state = CASE WHEN run_at > now() THEN 'scheduled' ELSE 'available' END
        WHERE id = (SELECT id FROM @schema@.jobs
                    WHERE sequence_key = OLD.sequence_key
                      AND state IN ('blocked', 'scheduled', 'available', 'running',
                                    'retryable', 'dead')
                      AND state = 'blocked'
                    ORDER BY sequence_no LIMIT 1)
          AND state = 'blocked'
        RETURNING queue INTO released_queue;
        IF FOUND THEN
            PERFORM pg_notify(TG_ARGV[0], released_queue);
            RETURN NULL;
        END IF;
        -- The next one left `blocked` meanwhile (cancelled by a transaction this one waited
        -- for): look again, unless none is left.
        IF NOT EXISTS (SELECT 1 FROM @schema@.jobs
                       WHERE sequence_key = OLD.sequence_key
                         AND state IN ('blocked', 'scheduled', 'available', 'running',
                                       'retryable', 'dead')
                         AND state = 'blocked') THEN
            RETURN NULL;
        END IF;
    END LOOP;
END
$release$;
CREATE TRIGGER jobs_sequence_release_on_update
    AFTER UPDATE OF state ON @schema@.jobs
    FOR EACH ROW
    WHEN (OLD.sequence_key IS NOT NULL
          AND (((OLD.state IN ('scheduled', 'available', 'running', 'retryable') OR (OLD.state = 'dead' AND NOT OLD.sequence_skip_dead))
                AND NOT (NEW.state IN ('scheduled', 'available', 'running', 'retryable') OR (NEW.state = 'dead' AND NOT NEW.sequence_skip_dead)))
               -- A replayed job put back behind its sequence: it runs at once if nothing holds it.
               OR (NEW.state = 'blocked' AND OLD.state <> 'blocked')))
    EXECUTE FUNCTION @schema@.sequence_release('@channel@');
CREATE TRIGGER jobs_sequence_release_on_delete
    AFTER DELETE ON @schema@.jobs
    FOR EACH ROW
    WHEN (OLD.sequence_key IS NOT NULL
          AND (OLD.state IN ('scheduled', 'available', 'running', 'retryable') OR (OLD.state = 'dead' AND NOT OLD.sequence_skip_dead)))
    EXECUTE FUNCTION @schema@.sequence_release('@channel@');
