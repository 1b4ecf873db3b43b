-- Conveyor PostgreSQL store, migration 2: maintenance leadership. One row per role; its holder
-- keeps it by renewing before `expires_at` (a time from the store's clock, like every job time).
CREATE TABLE @schema@.leadership (
    name       text PRIMARY KEY,
    holder     text NOT NULL,
    expires_at timestamptz NOT NULL
);
