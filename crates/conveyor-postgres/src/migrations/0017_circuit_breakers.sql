-- Conveyor PostgreSQL store, migration 17: circuit breakers per queue and per kind (issue 14).
-- Settings live with the queue's and the kind's other settings (JSON, `BreakerSettings`);
-- each breaker's state is one document (`BreakerRecord`) changed only by a conditional write
-- on `version`, so a transition made by one node is the one every node sees. The rules are
-- in `conveyor_core::breaker`; the store never looks inside.
ALTER TABLE @schema@.queue_settings ADD COLUMN circuit_breaker jsonb;
ALTER TABLE @schema@.kinds ADD COLUMN circuit_breaker jsonb;
CREATE TABLE @schema@.circuit_breakers (
    scope    text   NOT NULL CHECK (scope IN ('queue', 'kind')),
    name     text   NOT NULL,
    version  bigint NOT NULL CHECK (version >= 1),
    record   jsonb  NOT NULL,
    PRIMARY KEY (scope, name)
);
