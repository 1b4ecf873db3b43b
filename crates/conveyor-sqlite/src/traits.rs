//! The `conveyor_core` store traits on [`SqliteStore`]: each method checks nothing (the traits'
//! provided methods validated already) and hands over to the module of its noun.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use conveyor_core::kinds::KindSettings;
use conveyor_core::workflow::{CreatedFlow, FlowListParams, FlowView, SignalOutcome, ValidFlow};
use conveyor_core::{
    AccessStore, Clock, CompleteParams, FailParams, FetchParams, HeartbeatParams, Inserted, Job,
    JobListParams, JobStore, LeadershipStore, LeaseOutcome, LeaseRef, LeaseStore,
    NamedQueueSettings, NewJob, QueueSettings, QueueStats, QueueStore, ReplaySelector,
    RescueParams, RescueReport, ScheduleStore, SnoozeParams, StoreError, StoreHealth, StoreResult,
    Valid, ValidJob, WorkerStore,
};
use conveyor_core::{
    ApiToken, AuditEntry, AuditListParams, NewAuditEntry, NewSession, NewToken, StoredSession,
    StoredToken, TokenSelector,
};
use conveyor_core::{FireOutcome, FireRequest, Schedule, ScheduleRun, ScheduleView};
use conveyor_core::{FlowStore, KindStore};
use conveyor_core::{
    StaleReport, StaleWorkerParams, StuckJob, StuckParams, WorkerHeartbeat, WorkerInfo,
};
use std::sync::Arc;
use tokio::sync::Notify;
use uuid::Uuid;

/// How long a health probe waits for the writer before calling it not ready.
use crate::*;

#[async_trait]
impl JobStore for SqliteStore {
    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    async fn health(&self) -> StoreHealth {
        if let Some(problem) = self.inner.status.problem() {
            return StoreHealth::broken(problem);
        }
        // A round trip through the writer: answered only by a live writer that can begin and
        // commit a transaction.
        let probe = self.claim(|_| Ok(()));
        match tokio::time::timeout(HEALTH_PROBE_TIMEOUT, probe).await {
            Ok(Ok(())) => StoreHealth::ok(),
            Ok(Err(StoreError::Closed)) => {
                // The writer is gone or going: wait for it to finish so its reason is known.
                let writer = self.inner.writer.lock().ok().and_then(|mut w| w.take());
                if let Some(writer) = writer {
                    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
                }
                StoreHealth::broken(self.inner.status.problem().unwrap_or_else(|| {
                    "the SQLite writer thread has stopped: restart the process".to_string()
                }))
            }
            Ok(Err(error)) => match self.inner.status.problem() {
                Some(problem) => StoreHealth::broken(problem),
                None => StoreHealth::not_ready(format!("the store refused a write: {error}")),
            },
            Err(_) => StoreHealth::not_ready(format!(
                "the SQLite writer did not answer within {} s",
                HEALTH_PROBE_TIMEOUT.as_secs()
            )),
        }
    }

    async fn jobs_insert_valid(&self, jobs: Vec<ValidJob>) -> StoreResult<Vec<Inserted>> {
        let jobs: Vec<NewJob> = jobs.into_iter().map(ValidJob::into_job).collect();
        self.write(move |ctx| injected("insert", ops::insert_many(ctx, jobs)))
            .await
    }

    async fn job_get(&self, id: Uuid) -> StoreResult<Option<Job>> {
        self.read(move |conn, _| reads::job_get(conn, id)).await
    }

    async fn jobs_list(&self, params: JobListParams) -> StoreResult<Vec<Job>> {
        self.read(move |conn, _| reads::jobs_list(conn, &params))
            .await
    }

    async fn job_cancel(&self, id: Uuid) -> StoreResult<Job> {
        self.write(move |ctx| ops::cancel(ctx, id)).await
    }

    async fn dead_replay(&self, selector: ReplaySelector) -> StoreResult<u64> {
        self.write(move |ctx| ops::dead_replay(ctx, &selector))
            .await
    }

    async fn jobs_import(&self, jobs: Vec<Job>) -> StoreResult<u64> {
        self.write(move |ctx| ops::import(ctx, jobs)).await
    }

    async fn dead_discard(&self, id: Uuid) -> StoreResult<bool> {
        self.write(move |ctx| ops::dead_discard(ctx, id)).await
    }
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn jobs_fetch_valid(&self, params: Valid<FetchParams>) -> StoreResult<Vec<Job>> {
        self.claim(move |ctx| injected("fetch", ops::fetch(ctx, &params)))
            .await
    }

    async fn jobs_heartbeat_many(
        &self,
        params: Vec<HeartbeatParams>,
    ) -> StoreResult<Vec<Option<DateTime<Utc>>>> {
        self.claim(move |ctx| ops::heartbeat_many(ctx, &params))
            .await
    }

    async fn jobs_complete_valid(
        &self,
        params: Valid<Vec<CompleteParams>>,
    ) -> StoreResult<Vec<LeaseOutcome>> {
        let params = params.into_inner();
        self.write(move |ctx| injected("complete", ops::complete_many(ctx, params)))
            .await
    }

    async fn job_fail_valid(&self, params: Valid<FailParams>) -> StoreResult<Job> {
        let params = params.into_inner();
        self.write(move |ctx| injected("fail", ops::fail(ctx, params)))
            .await
    }

    async fn job_snooze(&self, params: SnoozeParams) -> StoreResult<Job> {
        self.write(move |ctx| ops::snooze(ctx, params)).await
    }

    async fn jobs_release_many(&self, leases: Vec<LeaseRef>) -> StoreResult<u64> {
        self.write(move |ctx| ops::release_many(ctx, &leases)).await
    }

    async fn job_progress(
        &self,
        lease: LeaseRef,
        percent: u8,
        message: Option<String>,
    ) -> StoreResult<()> {
        conveyor_core::Progress::new(percent, message.clone(), Utc::now())?;
        self.write(move |ctx| {
            let progress = conveyor_core::Progress::new(percent, message, ctx.now)?;
            ops::progress(ctx, lease, &progress)
        })
        .await
    }

    fn wakeup(&self) -> Arc<Notify> {
        self.inner.wakeup.clone()
    }

    async fn jobs_next_due(&self, queues: &[String]) -> StoreResult<Option<DateTime<Utc>>> {
        let queues = queues.to_vec();
        self.read(move |conn, _| reads::next_due(conn, &queues))
            .await
    }

    async fn jobs_available_of_kind(
        &self,
        queue: &str,
        kind: &str,
        limit: usize,
    ) -> StoreResult<Vec<Job>> {
        let (queue, kind) = (queue.to_string(), kind.to_string());
        self.read(move |conn, _| reads::available_of_kind(conn, &queue, &kind, limit))
            .await
    }
}

#[async_trait]
impl FlowStore for SqliteStore {
    async fn flow_create(&self, flow: ValidFlow) -> StoreResult<CreatedFlow> {
        self.write(move |ctx| workflow::create(ctx, flow)).await
    }

    async fn events_accept(
        &self,
        jobs: Vec<ValidJob>,
        flows: Vec<ValidFlow>,
    ) -> StoreResult<conveyor_core::Accepted> {
        let jobs: Vec<NewJob> = jobs.into_iter().map(ValidJob::into_job).collect();
        // One operation, so one savepoint: a part that fails undoes the others.
        self.write(move |ctx| {
            let flows = flows
                .into_iter()
                .map(|flow| workflow::create(ctx, flow))
                .collect::<StoreResult<Vec<_>>>()?;
            let jobs = if jobs.is_empty() {
                Vec::new()
            } else {
                injected("insert", ops::insert_many(ctx, jobs))?
            };
            Ok(conveyor_core::Accepted { jobs, flows })
        })
        .await
    }

    async fn flow_get(&self, id: Uuid) -> StoreResult<Option<FlowView>> {
        self.read(move |conn, _| workflow::view(conn, id)).await
    }

    async fn flows_list(&self, params: FlowListParams) -> StoreResult<Vec<FlowView>> {
        self.read(move |conn, _| workflow::list(conn, &params))
            .await
    }

    async fn flow_cancel(&self, id: Uuid) -> StoreResult<FlowView> {
        self.write(move |ctx| workflow::cancel(ctx, id)).await
    }

    async fn flow_signal_valid(
        &self,
        id: Uuid,
        signal: &str,
        payload: Valid<serde_json::Value>,
    ) -> StoreResult<SignalOutcome> {
        let payload = payload.into_inner();
        let signal = signal.to_string();
        self.write(move |ctx| workflow::signal(ctx, id, &signal, &payload))
            .await
    }

    async fn flows_expire_waits(&self, limit: usize) -> StoreResult<u64> {
        self.write(move |ctx| workflow::expire_waits(ctx, limit))
            .await
    }

    fn flow_starts(&self) -> Arc<conveyor_core::FlowStarts> {
        self.inner.flow_starts.clone()
    }

    async fn flows_prune(&self, params: conveyor_core::PruneParams) -> StoreResult<u64> {
        self.write(move |ctx| workflow::prune(ctx, &params)).await
    }
}

#[async_trait]
impl QueueStore for SqliteStore {
    async fn queue_settings_get(&self, queue: &str) -> StoreResult<QueueSettings> {
        let queue = queue.to_string();
        self.read(move |conn, _| {
            Ok(rows::queue_settings(conn)?
                .into_iter()
                .find(|named| named.name == queue)
                .map(|named| named.settings)
                .unwrap_or_default())
        })
        .await
    }

    async fn queue_settings_put_valid(
        &self,
        settings: Valid<NamedQueueSettings>,
    ) -> StoreResult<QueueSettings> {
        let NamedQueueSettings { name, settings } = settings.into_inner();
        self.write(move |ctx| ops::queue_settings_put(ctx, &name, settings))
            .await
    }

    async fn queue_settings_list(&self) -> StoreResult<Vec<NamedQueueSettings>> {
        self.read(|conn, _| rows::queue_settings(conn)).await
    }

    async fn limit_usage(
        &self,
        limit: &str,
        rate_period_ms: Option<u64>,
    ) -> StoreResult<Vec<conveyor_core::limits::named::KeyUsage>> {
        let limit = limit.to_string();
        self.read(move |conn, now| crate::limits::key_usage(conn, &limit, rate_period_ms, now))
            .await
    }

    async fn queues_stats(&self) -> StoreResult<Vec<QueueStats>> {
        self.read(reads::queues_stats).await
    }
}

#[async_trait]
impl conveyor_core::BreakerStore for SqliteStore {
    async fn breakers_list(&self) -> StoreResult<Vec<conveyor_core::StoredBreaker>> {
        self.read(|conn, _| kinds::breakers_list(conn, None)).await
    }

    async fn breaker_get(
        &self,
        scope: conveyor_core::BreakerScope,
        name: &str,
    ) -> StoreResult<Option<conveyor_core::StoredBreaker>> {
        let name = name.to_string();
        self.read(move |conn, _| Ok(kinds::breakers_list(conn, Some((scope, &name)))?.pop()))
            .await
    }

    async fn breaker_write_valid(
        &self,
        breaker: Valid<conveyor_core::StoredBreaker>,
    ) -> StoreResult<bool> {
        self.write(move |ctx| kinds::breaker_write(ctx, &breaker))
            .await
    }
}

#[async_trait]
impl conveyor_core::StatsStore for SqliteStore {
    async fn stats_merge(&self, rollups: Vec<conveyor_core::stats::Rollup>) -> StoreResult<()> {
        conveyor_core::stats::validate_rollups(&rollups)?;
        if rollups.is_empty() {
            return Ok(());
        }
        self.write(move |ctx| stats::merge(ctx.conn, rollups)).await
    }

    async fn stats_read(
        &self,
        query: conveyor_core::stats::StatsQuery,
    ) -> StoreResult<Vec<conveyor_core::stats::Rollup>> {
        self.read(move |conn, _| stats::read(conn, &query)).await
    }

    async fn stats_prune(&self, older_than: std::time::Duration) -> StoreResult<u64> {
        self.write(move |ctx| {
            let before = conveyor_core::clock::before(ctx.now, older_than);
            stats::prune(ctx.conn, before - chrono::Duration::minutes(1))
        })
        .await
    }
}

#[async_trait]
impl KindStore for SqliteStore {
    async fn kind_put(&self, settings: KindSettings) -> StoreResult<KindSettings> {
        conveyor_core::kinds::validate_settings(&settings)?;
        self.write(move |ctx| kinds::put(ctx, settings)).await
    }

    async fn kind_get(&self, kind: &str) -> StoreResult<Option<KindSettings>> {
        let kind = kind.to_string();
        self.read(move |conn, _| Ok(kinds::list(conn)?.into_iter().find(|k| k.kind == kind)))
            .await
    }

    async fn kinds_list(&self) -> StoreResult<Vec<KindSettings>> {
        self.read(|conn, _| kinds::list(conn)).await
    }

    async fn kind_delete(&self, kind: &str) -> StoreResult<bool> {
        let kind = kind.to_string();
        self.write(move |ctx| kinds::delete(ctx, &kind)).await
    }
}

#[async_trait]
impl ScheduleStore for SqliteStore {
    async fn schedule_put(&self, schedule: Schedule) -> StoreResult<ScheduleView> {
        self.write(move |ctx| schedules::put(ctx, schedule)).await
    }

    async fn schedule_get(&self, name: &str) -> StoreResult<Option<ScheduleView>> {
        let name = name.to_string();
        self.read(move |conn, now| schedules::get(conn, &name, now))
            .await
    }

    async fn schedules_list(&self) -> StoreResult<Vec<ScheduleView>> {
        self.read(schedules::list).await
    }

    async fn schedule_delete(&self, name: &str) -> StoreResult<bool> {
        let name = name.to_string();
        self.write(move |ctx| schedules::delete(ctx, &name)).await
    }

    async fn schedule_fire(&self, request: FireRequest) -> StoreResult<FireOutcome> {
        self.write(move |ctx| injected("schedule_fire", schedules::fire(ctx, request)))
            .await
    }

    async fn schedule_runs(&self, name: &str, limit: usize) -> StoreResult<Vec<ScheduleRun>> {
        let name = name.to_string();
        self.read(move |conn, _| schedules::runs(conn, &name, limit))
            .await
    }
}

#[async_trait]
impl AccessStore for SqliteStore {
    async fn tokens_insert_valid(&self, token: Valid<NewToken>) -> StoreResult<ApiToken> {
        let token = token.into_inner();
        self.write(move |ctx| access::tokens_insert(ctx, token))
            .await
    }

    async fn tokens_list(&self) -> StoreResult<Vec<ApiToken>> {
        self.read(|conn, _| access::tokens_list(conn)).await
    }

    async fn token_revoke(&self, selector: TokenSelector) -> StoreResult<Option<ApiToken>> {
        self.write(move |ctx| access::token_revoke(ctx, &selector))
            .await
    }

    async fn token_get(&self, id: Uuid) -> StoreResult<Option<StoredToken>> {
        self.read(move |conn, _| access::token_get(conn, id)).await
    }

    async fn session_insert(&self, session: NewSession) -> StoreResult<()> {
        self.write(move |ctx| access::session_insert(ctx, session))
            .await
    }

    async fn session_get(&self, id: Uuid) -> StoreResult<Option<StoredSession>> {
        self.read(move |conn, now| access::session_get(conn, id, now))
            .await
    }

    async fn session_delete(&self, id: Uuid) -> StoreResult<bool> {
        self.write(move |ctx| access::session_delete(ctx, id)).await
    }

    async fn audit_append(&self, entry: NewAuditEntry) -> StoreResult<AuditEntry> {
        // Committed before the caller is answered, but not fsync'd on its own: the entry rides
        // on the next durable commit's fsync (as claims do), so auditing every enqueue does not
        // add a second fsync to each. A power failure can lose the latest entries.
        self.claim(move |ctx| access::audit_append(ctx, entry))
            .await
    }

    async fn audit_list(&self, params: AuditListParams) -> StoreResult<Vec<AuditEntry>> {
        self.read(move |conn, _| access::audit_list(conn, &params))
            .await
    }

    async fn audit_prune(
        &self,
        cutoff: conveyor_core::AuditCutoff,
        limit: usize,
    ) -> StoreResult<u64> {
        self.write(move |ctx| access::audit_prune(ctx, cutoff, limit))
            .await
    }
}

#[async_trait]
impl WorkerStore for SqliteStore {
    async fn workers_heartbeat(&self, beat: WorkerHeartbeat) -> StoreResult<WorkerInfo> {
        conveyor_core::workers::heartbeat(&beat)?;
        // A heartbeat lost to a power failure is repeated seconds later: no fsync of its own.
        self.claim(move |ctx| workers::heartbeat(ctx, beat)).await
    }

    async fn workers_list(&self) -> StoreResult<Vec<WorkerInfo>> {
        self.read(|conn, _| workers::list(conn)).await
    }

    async fn worker_command(
        &self,
        id: &str,
        command: Option<conveyor_core::WorkerCommand>,
    ) -> StoreResult<Option<WorkerInfo>> {
        let id = id.to_string();
        self.write(move |ctx| workers::command(ctx, &id, command))
            .await
    }

    async fn workers_mark_stale(&self, params: StaleWorkerParams) -> StoreResult<StaleReport> {
        self.write(move |ctx| workers::mark_stale(ctx, &params))
            .await
    }

    async fn jobs_stuck(&self, params: StuckParams) -> StoreResult<Vec<StuckJob>> {
        self.read(move |conn, now| workers::stuck(conn, now, &params))
            .await
    }
}

#[async_trait]
impl LeadershipStore for SqliteStore {
    async fn jobs_rescue_expired(&self, params: RescueParams) -> StoreResult<RescueReport> {
        self.write(move |ctx| injected("rescue", ops::rescue_expired(ctx, &params)))
            .await
    }

    async fn jobs_promote_due(&self) -> StoreResult<u64> {
        self.write(ops::promote_due).await
    }

    async fn leader_try_acquire(
        &self,
        holder: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<bool> {
        let holder = holder.to_string();
        // A lost renewal (power failure) only delays maintenance; no fsync of its own.
        self.claim(move |ctx| ops::leader_try_acquire(ctx, &holder, ttl))
            .await
    }

    async fn leader_release(&self, holder: &str) -> StoreResult<()> {
        let holder = holder.to_string();
        self.write(move |ctx| ops::leader_release(ctx, &holder))
            .await
    }

    async fn jobs_prune(
        &self,
        params: conveyor_core::PruneParams,
    ) -> StoreResult<conveyor_core::PruneReport> {
        self.write(move |ctx| retention::prune(ctx, &params)).await
    }
}

#[async_trait]
impl conveyor_core::ConfigStore for SqliteStore {
    async fn config_put(
        &self,
        collection: &str,
        name: &str,
        document: serde_json::Value,
    ) -> StoreResult<conveyor_core::ConfigEntry> {
        conveyor_core::config::validate_key(collection, name)?;
        conveyor_core::fields::json_without_nul("document", &document)?;
        let (collection, name) = (collection.to_string(), name.to_string());
        self.write(move |ctx| config::put(ctx, &collection, &name, document))
            .await
    }

    async fn config_get(
        &self,
        collection: &str,
        name: &str,
    ) -> StoreResult<Option<conveyor_core::ConfigEntry>> {
        let (collection, name) = (collection.to_string(), name.to_string());
        self.read(move |conn, _| config::get(conn, &collection, &name))
            .await
    }

    async fn config_list(&self, collection: &str) -> StoreResult<Vec<conveyor_core::ConfigEntry>> {
        let collection = collection.to_string();
        self.read(move |conn, _| config::list(conn, &collection))
            .await
    }

    async fn config_delete(&self, collection: &str, name: &str) -> StoreResult<bool> {
        let (collection, name) = (collection.to_string(), name.to_string());
        self.write(move |ctx| config::delete(ctx, &collection, &name))
            .await
    }
}
