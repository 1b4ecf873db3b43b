//! The `conveyor_core` store traits on [`PgStore`]: each method checks nothing (the traits'
//! provided methods validated already) and hands over to the module of its noun.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use conveyor_core::workflow::{CreatedFlow, FlowListParams, FlowView, SignalOutcome, ValidFlow};
use conveyor_core::FlowStore;
use conveyor_core::{
    AccessStore, Clock, CompleteParams, FailParams, FetchParams, HeartbeatParams, Inserted, Job,
    JobListParams, JobStore, LeadershipStore, LeaseOutcome, LeaseRef, LeaseStore,
    NamedQueueSettings, NewJob, QueueSettings, QueueStats, QueueStore, ReplaySelector,
    RescueParams, RescueReport, ScheduleStore, SnoozeParams, StoreError, StoreResult, Valid,
    ValidJob, WorkerStore,
};
use conveyor_core::{
    ApiToken, AuditEntry, AuditListParams, NewAuditEntry, NewSession, NewToken, StoredSession,
    StoredToken, TokenSelector,
};
use conveyor_core::{FireOutcome, FireRequest, Schedule, ScheduleRun, ScheduleView};
use conveyor_core::{
    StaleReport, StaleWorkerParams, StuckJob, StuckParams, WorkerHeartbeat, WorkerInfo,
};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use uuid::Uuid;

use crate::errors::db;
use crate::*;

#[async_trait]
impl JobStore for PgStore {
    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    /// Ready when a pooled connection answers within a few seconds and reaches a primary
    /// (a hot standby refuses writes). Never "not live": a lost database is not fixed by
    /// restarting this process, and the pool reconnects by itself.
    async fn health(&self) -> conveyor_core::StoreHealth {
        use conveyor_core::StoreHealth;
        let probe =
            sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()").fetch_one(&self.inner.pool);
        match tokio::time::timeout(std::time::Duration::from_secs(5), probe).await {
            Ok(Ok(false)) => StoreHealth::ok(),
            Ok(Ok(true)) => StoreHealth::not_ready(
                "connected to a PostgreSQL standby (read-only): writes would fail",
            ),
            Ok(Err(error)) => StoreHealth::not_ready(format!("cannot reach PostgreSQL: {error}")),
            Err(_) => StoreHealth::not_ready("PostgreSQL did not answer within 5 s"),
        }
    }

    async fn jobs_insert_valid(&self, jobs: Vec<ValidJob>) -> StoreResult<Vec<Inserted>> {
        let jobs: Vec<NewJob> = jobs.into_iter().map(ValidJob::into_job).collect();
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let ctx = self.ctx();
        let mut reserved = self.reserve_turns(&ctx, &jobs).await?;
        let mut tx = self.begin().await?;
        let insertion = ops::insert_many(&mut tx, &ctx, jobs, &mut reserved).await?;
        conveyor_core::faults::inject("insert")?;
        commit(tx).await?;
        self.wake_local(insertion.made_available);
        Ok(insertion.inserted)
    }

    async fn job_get(&self, id: Uuid) -> StoreResult<Option<Job>> {
        ops::get(&mut *self.conn().await?, &self.inner.sql, id).await
    }

    async fn jobs_list(&self, params: JobListParams) -> StoreResult<Vec<Job>> {
        ops::list(&mut *self.conn().await?, &self.inner.sql, &params).await
    }

    async fn job_cancel(&self, id: Uuid) -> StoreResult<Job> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let flow_id = match ops::cancel(&mut tx, &ctx, id, None).await? {
            ops::CancelOutcome::Cancelled(job) => {
                commit(tx).await?;
                ctx.flows_committed();
                return Ok(*job);
            }
            ops::CancelOutcome::FlowBusy(flow_id) => flow_id,
        };
        // The job's flow is held by another transaction, which may be waiting for the job's
        // row that this one holds: let go of it and start over, taking the flow first.
        tx.rollback().await.map_err(db("roll back cancel"))?;
        ctx.flows_rolled_back();
        let mut tx = self.begin().await?;
        match ops::cancel(&mut tx, &ctx, id, Some(flow_id)).await? {
            ops::CancelOutcome::Cancelled(job) => {
                commit(tx).await?;
                ctx.flows_committed();
                Ok(*job)
            }
            ops::CancelOutcome::FlowBusy(_) => Err(StoreError::backend(format!(
                "postgres: cancel of job {id}: its flow {flow_id} was locked and then not found \
                 locked by this transaction"
            ))),
        }
    }

    async fn dead_replay(&self, selector: ReplaySelector) -> StoreResult<u64> {
        let replayed =
            ops::dead_replay(&mut *self.conn().await?, &self.flow_ctx(), &selector).await?;
        self.wake_local(replayed > 0);
        Ok(replayed)
    }

    async fn dead_discard(&self, id: Uuid) -> StoreResult<bool> {
        ops::dead_discard(&mut *self.conn().await?, &self.inner.sql, id).await
    }

    async fn jobs_import(&self, jobs: Vec<Job>) -> StoreResult<u64> {
        let mut tx = self.begin().await?;
        let (imported, woke) = ops::import(&mut tx, &self.inner.sql, &jobs).await?;
        commit(tx).await?;
        self.wake_local(woke);
        Ok(imported)
    }
}

#[async_trait]
impl LeaseStore for PgStore {
    async fn jobs_fetch_valid(&self, params: Valid<FetchParams>) -> StoreResult<Vec<Job>> {
        conveyor_core::faults::inject("fetch")?;
        let fetched = ops::fetch(&mut *self.conn().await?, &self.ctx(), &params).await?;
        // Promoted jobs may be in queues other fetchers of this process wait on.
        self.wake_local(fetched.promoted > 0);
        self.inner.flow_jobs.remember(&fetched.jobs);
        Ok(fetched.jobs)
    }

    async fn jobs_heartbeat_many(
        &self,
        params: Vec<HeartbeatParams>,
    ) -> StoreResult<Vec<Option<DateTime<Utc>>>> {
        if params.is_empty() {
            return Ok(Vec::new());
        }
        ops::heartbeat_many(&mut *self.conn().await?, &self.ctx(), &params).await
    }

    async fn jobs_complete_valid(
        &self,
        params: Valid<Vec<CompleteParams>>,
    ) -> StoreResult<Vec<LeaseOutcome>> {
        let params = params.into_inner();
        conveyor_core::faults::inject("complete")?;
        ops::complete_many(
            &mut *self.conn().await?,
            &self.flow_ctx(),
            params,
            &self.inner.flow_jobs,
        )
        .await
    }

    async fn job_fail_valid(&self, params: Valid<FailParams>) -> StoreResult<Job> {
        conveyor_core::faults::inject("fail")?;
        let params = params.into_inner();
        ops::fail(&mut *self.conn().await?, &self.flow_ctx(), params).await
    }

    async fn job_snooze(&self, params: SnoozeParams) -> StoreResult<Job> {
        let mut tx = self.begin().await?;
        let (job, woke) = ops::snooze(&mut tx, &self.ctx(), params).await?;
        commit(tx).await?;
        self.wake_local(woke);
        Ok(job)
    }

    async fn jobs_release_many(&self, leases: Vec<LeaseRef>) -> StoreResult<u64> {
        let released = ops::release_many(&mut *self.conn().await?, &self.ctx(), &leases).await?;
        self.wake_local(released > 0);
        Ok(released)
    }

    async fn job_progress(
        &self,
        lease: LeaseRef,
        percent: u8,
        message: Option<String>,
    ) -> StoreResult<()> {
        let ctx = self.ctx();
        let progress = conveyor_core::Progress::new(percent, message, ctx.now)?;
        ops::progress(&mut *self.conn().await?, &ctx, lease, &progress).await
    }

    fn wakeup(&self) -> Arc<Notify> {
        self.inner.wakeup.clone()
    }

    async fn jobs_next_due(&self, queues: &[String]) -> StoreResult<Option<DateTime<Utc>>> {
        ops::next_due(&mut *self.conn().await?, &self.inner.sql, queues).await
    }

    async fn jobs_available_of_kind(
        &self,
        queue: &str,
        kind: &str,
        limit: usize,
    ) -> StoreResult<Vec<Job>> {
        let mut conn = self.conn().await?;
        ops::available_of_kind(&mut conn, &self.inner.sql, queue, kind, limit).await
    }
}

/// Every flow event runs in one transaction that locks the flow first (see `workflow`).
#[async_trait]
impl FlowStore for PgStore {
    async fn flow_create(&self, flow: ValidFlow) -> StoreResult<CreatedFlow> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let created = workflow::create(&mut tx, &ctx, flow).await?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(created)
    }

    async fn events_accept(
        &self,
        jobs: Vec<ValidJob>,
        flows: Vec<ValidFlow>,
    ) -> StoreResult<conveyor_core::Accepted> {
        let jobs: Vec<NewJob> = jobs.into_iter().map(ValidJob::into_job).collect();
        let ctx = self.flow_ctx();
        let mut reserved = self.reserve_turns(&ctx, &jobs).await?;
        let mut tx = self.begin().await?;
        // Flows first, then jobs: each flow's key and each job's key belong to one event and
        // subscription, so two of these transactions contend only for the same event's, in
        // the same order.
        let mut created = Vec::with_capacity(flows.len());
        for flow in flows {
            created.push(workflow::create(&mut tx, &ctx, flow).await?);
        }
        let (inserted, made_available) = if jobs.is_empty() {
            (Vec::new(), false)
        } else {
            let insertion = ops::insert_many(&mut tx, &ctx, jobs, &mut reserved).await?;
            conveyor_core::faults::inject("insert")?;
            (insertion.inserted, insertion.made_available)
        };
        commit(tx).await?;
        ctx.flows_committed();
        self.wake_local(made_available);
        Ok(conveyor_core::Accepted {
            jobs: inserted,
            flows: created,
        })
    }

    async fn flow_get(&self, id: Uuid) -> StoreResult<Option<FlowView>> {
        workflow::view(&mut *self.conn().await?, &self.ctx(), id).await
    }

    async fn flows_list(&self, params: FlowListParams) -> StoreResult<Vec<FlowView>> {
        workflow::list(&mut *self.conn().await?, &self.ctx(), &params).await
    }

    async fn flow_cancel(&self, id: Uuid) -> StoreResult<FlowView> {
        let mut tx = self.begin().await?;
        let flow = workflow::cancel(&mut tx, &self.ctx(), id).await?;
        commit(tx).await?;
        Ok(flow)
    }

    async fn flow_signal_valid(
        &self,
        id: Uuid,
        signal: &str,
        payload: Valid<Value>,
    ) -> StoreResult<SignalOutcome> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let outcome = workflow::signal(&mut tx, &ctx, id, signal, &payload).await?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(outcome)
    }

    async fn flows_expire_waits(&self, limit: usize) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let expired = workflow::expire_waits(&mut tx, &ctx, limit).await?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(expired)
    }

    fn flow_starts(&self) -> Arc<conveyor_core::FlowStarts> {
        self.inner.flow_starts.clone()
    }

    async fn flows_prune(&self, params: conveyor_core::PruneParams) -> StoreResult<u64> {
        workflow::prune(&mut *self.conn().await?, &self.ctx(), &params).await
    }
}

#[async_trait]
impl QueueStore for PgStore {
    async fn queues_stats(&self) -> StoreResult<Vec<QueueStats>> {
        ops::queues_stats(&mut *self.conn().await?, &self.ctx()).await
    }

    async fn queue_settings_get(&self, queue: &str) -> StoreResult<QueueSettings> {
        ops::queue_settings_get(&mut *self.conn().await?, &self.inner.sql, queue).await
    }

    async fn queue_settings_put_valid(
        &self,
        settings: Valid<NamedQueueSettings>,
    ) -> StoreResult<QueueSettings> {
        let mut tx = self.begin().await?;
        let (stored, resumed) =
            ops::queue_settings_put(&mut tx, &self.ctx(), &settings.name, &settings.settings)
                .await?;
        commit(tx).await?;
        self.wake_local(resumed);
        Ok(stored)
    }

    async fn queue_settings_list(&self) -> StoreResult<Vec<NamedQueueSettings>> {
        ops::queue_settings_list(&mut *self.conn().await?, &self.inner.sql).await
    }

    async fn limit_usage(
        &self,
        limit: &str,
        rate_period_ms: Option<u64>,
    ) -> StoreResult<Vec<conveyor_core::limits::named::KeyUsage>> {
        crate::limits::key_usage(&mut *self.conn().await?, &self.ctx(), limit, rate_period_ms).await
    }
}

#[async_trait]
impl conveyor_core::KindStore for PgStore {
    async fn kind_put(
        &self,
        settings: conveyor_core::kinds::KindSettings,
    ) -> StoreResult<conveyor_core::kinds::KindSettings> {
        conveyor_core::kinds::validate_settings(&settings)?;
        kinds::put(
            &mut *self.conn().await?,
            &self.ctx(),
            &self.inner.kind_sql,
            settings,
        )
        .await
    }

    async fn kind_get(
        &self,
        kind: &str,
    ) -> StoreResult<Option<conveyor_core::kinds::KindSettings>> {
        Ok(self
            .kinds_list()
            .await?
            .into_iter()
            .find(|k| k.kind == kind))
    }

    async fn kinds_list(&self) -> StoreResult<Vec<conveyor_core::kinds::KindSettings>> {
        kinds::list(&mut *self.conn().await?, &self.inner.kind_sql).await
    }

    async fn kind_delete(&self, kind: &str) -> StoreResult<bool> {
        kinds::delete(&mut *self.conn().await?, &self.inner.kind_sql, kind).await
    }
}

#[async_trait]
impl conveyor_core::BreakerStore for PgStore {
    async fn breakers_list(&self) -> StoreResult<Vec<conveyor_core::StoredBreaker>> {
        kinds::breakers_list(&mut *self.conn().await?, &self.inner.breaker_sql).await
    }

    async fn breaker_get(
        &self,
        scope: conveyor_core::BreakerScope,
        name: &str,
    ) -> StoreResult<Option<conveyor_core::StoredBreaker>> {
        kinds::breaker_get(
            &mut *self.conn().await?,
            &self.inner.breaker_sql,
            scope,
            name,
        )
        .await
    }

    async fn breaker_write_valid(
        &self,
        breaker: Valid<conveyor_core::StoredBreaker>,
    ) -> StoreResult<bool> {
        kinds::breaker_write(&mut *self.conn().await?, &self.inner.breaker_sql, &breaker).await
    }
}

#[async_trait]
impl conveyor_core::StatsStore for PgStore {
    async fn stats_merge(&self, rollups: Vec<conveyor_core::stats::Rollup>) -> StoreResult<()> {
        conveyor_core::stats::validate_rollups(&rollups)?;
        if rollups.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        stats::merge(&mut tx, &self.inner.stats_sql, rollups).await?;
        commit(tx).await
    }

    async fn stats_read(
        &self,
        query: conveyor_core::stats::StatsQuery,
    ) -> StoreResult<Vec<conveyor_core::stats::Rollup>> {
        stats::read(&mut *self.conn().await?, &self.inner.stats_sql, &query).await
    }

    async fn stats_prune(&self, older_than: std::time::Duration) -> StoreResult<u64> {
        let before = conveyor_core::clock::before(self.ctx().now, older_than);
        let before = before - chrono::Duration::minutes(1);
        stats::prune(&mut *self.conn().await?, &self.inner.stats_sql, before).await
    }
}

#[async_trait]
impl ScheduleStore for PgStore {
    async fn schedule_put(&self, schedule: Schedule) -> StoreResult<ScheduleView> {
        let mut tx = self.begin().await?;
        schedules::put(&mut tx, &self.ctx(), &self.inner.schedule_sql, &schedule).await?;
        commit(tx).await?;
        self.schedule_get(schedule.name()).await?.ok_or_else(|| {
            StoreError::backend(format!(
                "postgres: schedule {:?} was deleted right after being stored",
                schedule.name()
            ))
        })
    }

    async fn schedule_get(&self, name: &str) -> StoreResult<Option<ScheduleView>> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        schedules::get(&mut conn, &self.inner.schedule_sql, name, now).await
    }

    async fn schedules_list(&self) -> StoreResult<Vec<ScheduleView>> {
        let now = self.ctx().now;
        schedules::list(&mut *self.conn().await?, &self.inner.schedule_sql, now).await
    }

    async fn schedule_delete(&self, name: &str) -> StoreResult<bool> {
        schedules::delete(&mut *self.conn().await?, &self.inner.schedule_sql, name).await
    }

    async fn schedule_fire(&self, request: FireRequest) -> StoreResult<FireOutcome> {
        let mut tx = self.begin().await?;
        let fired =
            schedules::fire(&mut tx, &self.ctx(), &self.inner.schedule_sql, &request).await?;
        conveyor_core::faults::inject("schedule_fire")?;
        commit(tx).await?;
        self.wake_local(fired.made_available);
        Ok(fired.outcome)
    }

    async fn schedule_runs(&self, name: &str, limit: usize) -> StoreResult<Vec<ScheduleRun>> {
        let mut conn = self.conn().await?;
        schedules::runs(&mut conn, &self.inner.schedule_sql, name, limit).await
    }
}

#[async_trait]
impl AccessStore for PgStore {
    async fn tokens_insert_valid(&self, token: Valid<NewToken>) -> StoreResult<ApiToken> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        access::tokens_insert(&mut conn, &self.inner.access_sql, now, token.into_inner()).await
    }

    async fn tokens_list(&self) -> StoreResult<Vec<ApiToken>> {
        access::tokens_list(&mut *self.conn().await?, &self.inner.access_sql).await
    }

    async fn token_revoke(&self, selector: TokenSelector) -> StoreResult<Option<ApiToken>> {
        let now = self.ctx().now;
        let mut tx = self.begin().await?;
        let revoked = access::token_revoke(&mut tx, &self.inner.access_sql, now, &selector).await?;
        commit(tx).await?;
        Ok(revoked)
    }

    async fn token_get(&self, id: Uuid) -> StoreResult<Option<StoredToken>> {
        access::token_get(&mut *self.conn().await?, &self.inner.access_sql, id).await
    }

    async fn session_insert(&self, session: NewSession) -> StoreResult<()> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        access::session_insert(&mut conn, &self.inner.access_sql, now, session).await
    }

    async fn session_get(&self, id: Uuid) -> StoreResult<Option<StoredSession>> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        access::session_get(&mut conn, &self.inner.access_sql, now, id).await
    }

    async fn session_delete(&self, id: Uuid) -> StoreResult<bool> {
        access::session_delete(&mut *self.conn().await?, &self.inner.access_sql, id).await
    }

    async fn audit_append(&self, entry: NewAuditEntry) -> StoreResult<AuditEntry> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        access::audit_append(&mut conn, &self.inner.access_sql, now, entry).await
    }

    async fn audit_list(&self, params: AuditListParams) -> StoreResult<Vec<AuditEntry>> {
        access::audit_list(&mut *self.conn().await?, &self.inner.access_sql, &params).await
    }

    async fn audit_prune(
        &self,
        cutoff: conveyor_core::AuditCutoff,
        limit: usize,
    ) -> StoreResult<u64> {
        let before = cutoff.before(self.ctx().now);
        access::audit_prune(
            &mut *self.conn().await?,
            &self.inner.access_sql,
            before,
            limit,
        )
        .await
    }
}

#[async_trait]
impl WorkerStore for PgStore {
    async fn workers_heartbeat(&self, beat: WorkerHeartbeat) -> StoreResult<WorkerInfo> {
        conveyor_core::workers::heartbeat(&beat)?;
        let (ctx, mut conn) = (self.ctx(), self.conn().await?);
        workers::heartbeat(&mut conn, &ctx, &self.inner.worker_sql, &beat).await
    }

    async fn workers_list(&self) -> StoreResult<Vec<WorkerInfo>> {
        workers::list(&mut *self.conn().await?, &self.inner.worker_sql).await
    }

    async fn worker_command(
        &self,
        id: &str,
        command: Option<conveyor_core::WorkerCommand>,
    ) -> StoreResult<Option<WorkerInfo>> {
        workers::command(
            &mut *self.conn().await?,
            &self.inner.worker_sql,
            id,
            command,
        )
        .await
    }

    async fn workers_mark_stale(&self, params: StaleWorkerParams) -> StoreResult<StaleReport> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let sql = &self.inner.worker_sql;
        let report = workers::mark_stale(&mut tx, &ctx, sql, &params).await?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(report)
    }

    async fn jobs_stuck(&self, params: StuckParams) -> StoreResult<Vec<StuckJob>> {
        let (ctx, mut conn) = (self.ctx(), self.conn().await?);
        workers::stuck(&mut conn, &ctx, &self.inner.worker_sql, &params).await
    }
}

#[async_trait]
impl LeadershipStore for PgStore {
    async fn storage_maintenance(&self) -> StoreResult<()> {
        self.inner.upkeep.run_if_due(&self.inner.pool).await
    }

    async fn jobs_rescue_expired(&self, params: RescueParams) -> StoreResult<RescueReport> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let report = ops::rescue_expired(&mut tx, &ctx, &params).await?;
        conveyor_core::faults::inject("rescue")?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(report)
    }

    async fn jobs_promote_due(&self) -> StoreResult<u64> {
        let mut conn = self.conn().await?;
        let ctx = self.flow_ctx();
        // Expiry first: a job expiring now is not made available. Batches keep each statement
        // short; a short batch means nothing expiring is left.
        while ops::expire_due(&mut conn, &ctx).await? >= ops::EXPIRE_BATCH as u64 {}
        // Batches keep each statement short; a short batch means nothing due is left.
        let mut promoted = 0;
        loop {
            let batch = ops::promote_due(&mut conn, &ctx, ops::PROMOTE_BATCH).await?;
            promoted += batch;
            if batch < ops::PROMOTE_BATCH as u64 {
                break;
            }
        }
        self.wake_local(promoted > 0);
        Ok(promoted)
    }

    async fn jobs_prune(
        &self,
        params: conveyor_core::PruneParams,
    ) -> StoreResult<conveyor_core::PruneReport> {
        retention::prune(
            &mut *self.conn().await?,
            &self.ctx(),
            &self.inner.retention_sql,
            &params,
        )
        .await
    }

    async fn leader_try_acquire(&self, holder: &str, ttl: Duration) -> StoreResult<bool> {
        ops::leader_try_acquire(&mut *self.conn().await?, &self.ctx(), holder, ttl).await
    }

    async fn leader_release(&self, holder: &str) -> StoreResult<()> {
        ops::leader_release(&mut *self.conn().await?, &self.inner.sql, holder).await
    }
}

#[async_trait]
impl conveyor_core::ConfigStore for PgStore {
    async fn config_put(
        &self,
        collection: &str,
        name: &str,
        document: serde_json::Value,
    ) -> StoreResult<conveyor_core::ConfigEntry> {
        conveyor_core::config::validate_key(collection, name)?;
        conveyor_core::fields::json_without_nul("document", &document)?;
        let now = self.ctx().now;
        crate::config::put(
            &mut *self.conn().await?,
            &self.inner.config_sql,
            now,
            collection,
            name,
            document,
        )
        .await
    }

    async fn config_get(
        &self,
        collection: &str,
        name: &str,
    ) -> StoreResult<Option<conveyor_core::ConfigEntry>> {
        crate::config::get(
            &mut *self.conn().await?,
            &self.inner.config_sql,
            collection,
            name,
        )
        .await
    }

    async fn config_list(&self, collection: &str) -> StoreResult<Vec<conveyor_core::ConfigEntry>> {
        crate::config::list(
            &mut *self.conn().await?,
            &self.inner.config_sql,
            Some(collection),
        )
        .await
    }

    async fn config_delete(&self, collection: &str, name: &str) -> StoreResult<bool> {
        crate::config::delete(
            &mut *self.conn().await?,
            &self.inner.config_sql,
            collection,
            name,
        )
        .await
    }
}
