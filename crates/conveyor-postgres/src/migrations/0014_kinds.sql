-- Conveyor PostgreSQL store, migration 14: settings per job kind (see `conveyor_core::kinds`),
-- for now a payload schema that every enqueue of the kind is checked against (by the
-- enqueuing process, which re-reads this table at most a second after a change).
CREATE TABLE @schema@.kinds (
    kind        text PRIMARY KEY,
    schema      jsonb,
    version     integer,
    updated_at  timestamptz NOT NULL
);
