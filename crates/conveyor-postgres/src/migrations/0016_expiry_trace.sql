-- Conveyor PostgreSQL store, migration 16: job expiry and trace context (issue 14).
-- `expires_at`: a job not started by then moves to the terminal state `expired`. `trace`: the
-- producer's W3C trace context (traceparent, tracestate) as JSON. A queue's `default_ttl_ms`
-- gives jobs enqueued without an expiry one. Adding nullable columns rewrites nothing.
ALTER TABLE @schema@.jobs
    ADD COLUMN expires_at timestamptz,
    ADD COLUMN trace      jsonb;
ALTER TABLE @schema@.jobs DROP CONSTRAINT IF EXISTS jobs_state_check;
ALTER TABLE @schema@.jobs ADD CONSTRAINT jobs_state_check CHECK (state IN (
    'scheduled', 'available', 'running', 'retryable', 'completed', 'dead', 'cancelled',
    'expired')) NOT VALID;
ALTER TABLE @schema@.jobs VALIDATE CONSTRAINT jobs_state_check;
-- The sweep that expires waiting jobs, soonest first.
CREATE INDEX jobs_expiry ON @schema@.jobs (expires_at)
    WHERE expires_at IS NOT NULL AND state IN ('scheduled', 'available', 'retryable');
ALTER TABLE @schema@.queue_settings
    ADD COLUMN default_ttl_ms bigint CHECK (default_ttl_ms >= 1);
