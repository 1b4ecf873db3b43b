-- Conveyor PostgreSQL store, migration 20: configuration the cluster shares
-- (`conveyor_core::config`): named JSON documents by collection, such as event sources. Every
-- server reads them about once a second, so a change through any server reaches all.
CREATE TABLE @schema@.config (
    collection  text NOT NULL,
    name        text NOT NULL,
    document    jsonb NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (collection, name)
);
