-- Conveyor PostgreSQL store, migration 15: let a flow step's state changes be HOT updates.
-- A step row is written when its flow is created and changed as it finishes (and as a wait
-- begins). Its deadline index read `state` in its predicate, which made every state change a
-- change of an indexed column: a new index entry in both indexes and a new row version in
-- another page. The deadline index now covers the rows that have a deadline, and a step's
-- deadline is cleared when it stops waiting (`set_steps`), so a job step's changes touch no
-- indexed column; the free space left in each page (fillfactor) keeps the new version beside
-- the old one.
DROP INDEX IF EXISTS @schema@.flow_steps_deadline;
UPDATE @schema@.flow_steps SET wait_deadline = NULL
    WHERE wait_deadline IS NOT NULL AND state <> 'waiting';
CREATE INDEX flow_steps_wait_deadline ON @schema@.flow_steps (wait_deadline)
    WHERE wait_deadline IS NOT NULL;
ALTER TABLE @schema@.flow_steps SET (fillfactor = 50);
