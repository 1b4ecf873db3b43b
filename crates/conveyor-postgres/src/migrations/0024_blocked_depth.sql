-- Conveyor PostgreSQL store, migration 24: jobs blocked behind their sequence count towards
-- their queue's depth and their tenant's (`JobState::UNFINISHED`), so a sequence cannot take a
-- queue past `max_depth`. Counted from this index, as the other states are from theirs
-- (migrations 3 and 7); only jobs of a sequence are ever blocked, so other jobs pay nothing.
CREATE INDEX jobs_blocked ON @schema@.jobs (queue, tenant)
    WHERE state = 'blocked';
