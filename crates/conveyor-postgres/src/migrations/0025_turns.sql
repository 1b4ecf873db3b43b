-- Conveyor PostgreSQL store, migration 25: keyed jobs take turns by numbers given as they
-- become available (reserved just before an enqueue's transaction, or by the next keyed claim) (`conveyor_core::limits::turns`; docs/plans/flow-control-by-key.md, "Turns
-- instead of a rotation"), so a claim over many keys reads one range of `jobs_fair_turn` instead
-- of seeking once per key in `jobs_fair_key`. A job holds a turn only while available: the
-- claim clears it, and a job made available other than by insert (due, retried, replayed,
-- released) is given one by the next keyed claim of its queue, found by `jobs_unturned`.
ALTER TABLE @schema@.jobs ADD COLUMN fair_turn int8;
DROP INDEX @schema@.jobs_fair_key;
CREATE INDEX jobs_fair_turn ON @schema@.jobs (queue, priority DESC, fair_turn, fair_key, id)
    WHERE state = 'available' AND fair_key IS NOT NULL;
CREATE INDEX jobs_unturned ON @schema@.jobs (queue, run_at, id)
    WHERE state = 'available' AND fair_key IS NOT NULL AND fair_turn IS NULL;
-- Per queue, priority and key: the turn its next job gets and how many jobs have it already
-- (`KeyTurns`), and the weight and number of jobs of the last batch given turns (from which
-- that batch's first place is read back: `limits::Turns::giving`). Rows whose next turn has
-- been served say nothing and are deleted by claims.
CREATE TABLE @schema@.fair_turns (
    queue      text NOT NULL,
    priority   int4 NOT NULL,
    key        text NOT NULL,
    next_turn  int8 NOT NULL,
    given      int4 NOT NULL,
    weight     int4 NOT NULL,
    added      int4 NOT NULL,
    PRIMARY KEY (queue, priority, key)
) WITH (fillfactor = 50);  -- room on each page for an updated row beside the old (HOT updates)
-- Per queue and priority: the highest turn claimed (`turns::served`); a key arriving joins the
-- turn after it.
CREATE TABLE @schema@.fair_served (
    queue     text NOT NULL,
    priority  int4 NOT NULL,
    turn      int8 NOT NULL,
    PRIMARY KEY (queue, priority)
);
