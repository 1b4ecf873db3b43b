-- Conveyor PostgreSQL store, migration 7: flow control. Per-key concurrency limits, rate
-- limits (per queue and per key; a limit is its two columns), queue weights, and the indexes
-- and table the flow-controlled claim reads (see `flow.rs`).
ALTER TABLE @schema@.queue_settings
    ADD COLUMN per_key_concurrency_limit bigint CHECK (per_key_concurrency_limit >= 1),
    ADD COLUMN rate_count                bigint CHECK (rate_count >= 1),
    ADD COLUMN rate_period_ms            bigint CHECK (rate_period_ms >= 1),
    ADD COLUMN per_key_rate_count        bigint CHECK (per_key_rate_count >= 1),
    ADD COLUMN per_key_rate_period_ms    bigint CHECK (per_key_rate_period_ms >= 1),
    ADD COLUMN weight                    integer CHECK (weight >= 1);

-- Tenant fairness: each tenant's available jobs in claim order, and the distinct tenants of a
-- queue (read by skipping through this index). Jobs without a tenant have no entry, so the
-- common path pays nothing for it.
CREATE INDEX jobs_fair ON @schema@.jobs (queue, tenant, priority DESC, run_at, id)
    WHERE state = 'available' AND tenant IS NOT NULL;
-- Per-key concurrency limits: running jobs per tenant.
CREATE INDEX jobs_running_tenant ON @schema@.jobs (queue, tenant)
    WHERE state = 'running' AND tenant IS NOT NULL;
-- A tenant's depth is now the sum over three partial indexes of one state each (`jobs_fair`,
-- `jobs_running_tenant` and this one), like a queue's. The single index over all unfinished
-- states that migration 3 made is dropped: it also matched the fairness reads of available
-- jobs, and PostgreSQL, estimating from stale statistics, preferred it to `jobs_fair` and then
-- visited every running and waiting entry on the way.
CREATE INDEX jobs_waiting_tenant ON @schema@.jobs (queue, tenant)
    WHERE state IN ('scheduled', 'retryable') AND tenant IS NOT NULL;
DROP INDEX @schema@.jobs_tenant_unfinished;

-- Rate limits: the start times that still count, per queue (`scope` '') and per tenant
-- (`scope` the tenant). Only queues with a rate limit write here; rows older than the queue's
-- longest rate period are pruned by the next claim from the queue.
CREATE TABLE @schema@.rate_starts (
    queue      text NOT NULL,
    scope      text NOT NULL,
    started_at timestamptz NOT NULL
);
CREATE INDEX rate_starts_window ON @schema@.rate_starts (queue, scope, started_at);
