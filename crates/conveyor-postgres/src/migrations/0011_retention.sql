-- Conveyor PostgreSQL store, migration 11: retention of finished jobs per queue (seconds; NULL
-- means the server's default: 24 h for completed and cancelled jobs, 14 days for dead ones).
ALTER TABLE @schema@.queue_settings
    ADD COLUMN completed_retention_secs bigint CHECK (completed_retention_secs >= 1),
    ADD COLUMN dead_retention_secs      bigint CHECK (dead_retention_secs >= 1);
