//! Stamping jobs with their named-limit keys and their sequence as they enter the store
//! ([`LimitStamps`]), so every way in (HTTP, the Rust client, sources, hooks, events, flows)
//! gets the same rule, computed once above the stores by `conveyor_core::limits::LimitBook`
//! and before a payload is encrypted (the decorator sits outside encryption).

use std::sync::Arc;
use std::time::Duration;

use conveyor_core::async_trait::async_trait;
use conveyor_core::kinds::KindSettings;
use conveyor_core::limits::named::KeyUsage;
use conveyor_core::limits::{LimitBook, LimitSpec};
use conveyor_core::schedule::{
    FireOutcome, FireRequest, RunStamp, Schedule, ScheduleRun, ScheduleView,
};
use conveyor_core::workflow::{CreatedFlow, FlowListParams, FlowView, SignalOutcome, ValidFlow};
use conveyor_core::{
    Accepted, Clock, ConfigEntry, ConfigStore, FlowStarts, FlowStore, Inserted, Job, JobListParams,
    JobStore, KindStore, NamedQueueSettings, PruneParams, QueueSettings, QueueStats, QueueStore,
    ReplaySelector, ScheduleStore, Store, StoreHealth, StoreResult, Valid, ValidJob,
    ValidationError,
};
use serde_json::Value;
use uuid::Uuid;

use crate::refreshed::Refreshed;

/// A store that stamps every job it is given with the limit keys it holds. Limits, and the
/// queues and kinds naming them, are re-read about once a second, so a change made through any
/// server applies to what every server enqueues within a second.
pub struct LimitStamps {
    inner: Arc<dyn Store>,
    book: Refreshed<LimitBook>,
}

impl LimitStamps {
    /// How old the limits this process stamps with may be.
    pub const REFRESH: Duration = Duration::from_secs(1);

    pub fn wrap(inner: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(Self {
            inner,
            book: Refreshed::new(Self::REFRESH),
        })
    }

    async fn book(&self) -> StoreResult<Arc<LimitBook>> {
        self.book.get(|| load_book(&*self.inner)).await
    }

    /// `job` with its limit keys; refused, naming `limits[i]`, when it names a limit that is
    /// not defined.
    fn stamp(book: &LimitBook, job: ValidJob) -> StoreResult<ValidJob> {
        if let Some((index, name)) = book.unknown(&job.job().limits) {
            return Err(ValidationError::new(
                format!("limits[{index}]"),
                format!("no limit is named {name:?} (define it with PUT /v1/limits/{name})"),
            )
            .into());
        }
        let keys = book.stamp(job.job());
        let sequence = book.sequence(job.job());
        let fold = conveyor_core::limits::named::fold_key(job.job());
        Ok(job
            .with_limit_keys(keys)
            .with_sequence_key(sequence)
            .with_fold_key(fold))
    }

    fn stamp_all(book: &LimitBook, jobs: Vec<ValidJob>) -> StoreResult<Vec<ValidJob>> {
        jobs.into_iter().map(|job| Self::stamp(book, job)).collect()
    }

    fn stamp_flow(book: &LimitBook, flow: ValidFlow) -> StoreResult<ValidFlow> {
        let mut unknown = None;
        let stamped = flow.map_jobs(|job| {
            if let Some((index, name)) = book.unknown(&job.limits) {
                unknown.get_or_insert_with(|| (index, name.to_string()));
                return;
            }
            job.limit_keys = book.stamp(job);
            // A flow orders its own steps: they enter no sequence.
        });
        match unknown {
            Some((index, name)) => Err(ValidationError::new(
                format!("limits[{index}]"),
                format!("no limit is named {name:?}"),
            )
            .into()),
            None => Ok(stamped),
        }
    }
}

/// Reads the limits and which queues and kinds name them, and the queues' and kinds'
/// sequences. A stored document that does not read as a limit is left out (the API checks what
/// it stores).
async fn load_book(store: &dyn Store) -> StoreResult<LimitBook> {
    let mut book = LimitBook::default();
    for entry in store.config_list(conveyor_core::config::LIMITS).await? {
        if let Ok(mut spec) = serde_json::from_value::<LimitSpec>(entry.document) {
            spec.name = entry.name.clone();
            book.specs.insert(entry.name, spec);
        }
    }
    for queue in store.queue_settings_list().await? {
        if let Some(sequence) = queue.settings.sequence {
            book.queue_sequences.insert(queue.name.clone(), sequence);
        }
        if !queue.settings.limits.is_empty() {
            book.queues.insert(queue.name, queue.settings.limits);
        }
    }
    for kind in store.kinds_list().await? {
        if let Some(sequence) = kind.sequence {
            book.kind_sequences.insert(kind.kind.clone(), sequence);
        }
        if !kind.limits.is_empty() {
            book.kinds.insert(kind.kind, kind.limits);
        }
    }
    Ok(book)
}

conveyor_core::delegate_store!(LimitStamps => inner:
    LeaseStore, AccessStore, WorkerStore, LeadershipStore, BreakerStore, StatsStore, CopyStore);

#[async_trait]
impl ScheduleStore for LimitStamps {
    async fn schedule_put(&self, schedule: Schedule) -> StoreResult<ScheduleView> {
        self.inner.schedule_put(schedule).await
    }
    async fn schedule_get(&self, name: &str) -> StoreResult<Option<ScheduleView>> {
        self.inner.schedule_get(name).await
    }
    async fn schedules_list(&self) -> StoreResult<Vec<ScheduleView>> {
        self.inner.schedules_list().await
    }
    async fn schedule_delete(&self, name: &str) -> StoreResult<bool> {
        self.inner.schedule_delete(name).await
    }
    /// The runs' jobs are stamped like any enqueue's, from the schedule as it is at the
    /// request's revision (another revision will not fire: the store refuses it).
    async fn schedule_fire(&self, mut request: FireRequest) -> StoreResult<FireOutcome> {
        if let Some(view) = self.inner.schedule_get(&request.name).await? {
            if view.revision == request.revision {
                let book = self.book().await?;
                let job = view.schedule.job_for(request.due_after);
                request.stamp = RunStamp {
                    limit_keys: book.stamp(&job),
                    sequence_key: book.sequence(&job),
                };
            }
        }
        self.inner.schedule_fire(request).await
    }
    async fn schedule_runs(&self, name: &str, limit: usize) -> StoreResult<Vec<ScheduleRun>> {
        self.inner.schedule_runs(name, limit).await
    }
}

// Writes of what the stamp is read from, made through this process, mark the book stale, so
// this process's next enqueue stamps with them (other processes within `REFRESH`).

#[async_trait]
impl ConfigStore for LimitStamps {
    async fn config_put(
        &self,
        collection: &str,
        name: &str,
        document: Value,
    ) -> StoreResult<ConfigEntry> {
        let entry = self.inner.config_put(collection, name, document).await;
        if collection == conveyor_core::config::LIMITS {
            self.book.invalidate();
        }
        entry
    }
    async fn config_get(&self, collection: &str, name: &str) -> StoreResult<Option<ConfigEntry>> {
        self.inner.config_get(collection, name).await
    }
    async fn config_list(&self, collection: &str) -> StoreResult<Vec<ConfigEntry>> {
        self.inner.config_list(collection).await
    }
    async fn config_delete(&self, collection: &str, name: &str) -> StoreResult<bool> {
        let deleted = self.inner.config_delete(collection, name).await;
        if collection == conveyor_core::config::LIMITS {
            self.book.invalidate();
        }
        deleted
    }
}

#[async_trait]
impl QueueStore for LimitStamps {
    async fn queues_stats(&self) -> StoreResult<Vec<QueueStats>> {
        self.inner.queues_stats().await
    }
    async fn queue_settings_get(&self, queue: &str) -> StoreResult<QueueSettings> {
        self.inner.queue_settings_get(queue).await
    }
    async fn queue_settings_put_valid(
        &self,
        settings: Valid<NamedQueueSettings>,
    ) -> StoreResult<QueueSettings> {
        let stored = self.inner.queue_settings_put_valid(settings).await;
        self.book.invalidate();
        stored
    }
    async fn queue_settings_list(&self) -> StoreResult<Vec<NamedQueueSettings>> {
        self.inner.queue_settings_list().await
    }
    async fn limit_usage(
        &self,
        limit: &str,
        rate_period_ms: Option<u64>,
    ) -> StoreResult<Vec<KeyUsage>> {
        self.inner.limit_usage(limit, rate_period_ms).await
    }
}

#[async_trait]
impl KindStore for LimitStamps {
    async fn kind_put(&self, settings: KindSettings) -> StoreResult<KindSettings> {
        let stored = self.inner.kind_put(settings).await;
        self.book.invalidate();
        stored
    }
    async fn kind_get(&self, kind: &str) -> StoreResult<Option<KindSettings>> {
        self.inner.kind_get(kind).await
    }
    async fn kinds_list(&self) -> StoreResult<Vec<KindSettings>> {
        self.inner.kinds_list().await
    }
    async fn kind_delete(&self, kind: &str) -> StoreResult<bool> {
        let deleted = self.inner.kind_delete(kind).await;
        self.book.invalidate();
        deleted
    }
}

#[async_trait]
impl JobStore for LimitStamps {
    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock()
    }
    async fn health(&self) -> StoreHealth {
        self.inner.health().await
    }
    async fn jobs_insert_valid(&self, jobs: Vec<ValidJob>) -> StoreResult<Vec<Inserted>> {
        let book = self.book().await?;
        self.inner
            .jobs_insert_valid(Self::stamp_all(&book, jobs)?)
            .await
    }
    // `jobs_insert_many` keeps its provided body: it validates, then calls `jobs_insert_valid`
    // above, so its jobs are stamped too.
    async fn job_get(&self, id: Uuid) -> StoreResult<Option<Job>> {
        self.inner.job_get(id).await
    }
    async fn jobs_list(&self, params: JobListParams) -> StoreResult<Vec<Job>> {
        self.inner.jobs_list(params).await
    }
    async fn job_cancel(&self, id: Uuid) -> StoreResult<Job> {
        self.inner.job_cancel(id).await
    }
    async fn dead_replay(&self, selector: ReplaySelector) -> StoreResult<u64> {
        self.inner.dead_replay(selector).await
    }
    async fn dead_discard(&self, id: Uuid) -> StoreResult<bool> {
        self.inner.dead_discard(id).await
    }
    async fn jobs_import(&self, jobs: Vec<Job>) -> StoreResult<u64> {
        // Copied jobs keep the keys they were stamped with.
        self.inner.jobs_import(jobs).await
    }
}

#[async_trait]
impl FlowStore for LimitStamps {
    async fn flow_create(&self, flow: ValidFlow) -> StoreResult<CreatedFlow> {
        let book = self.book().await?;
        self.inner.flow_create(Self::stamp_flow(&book, flow)?).await
    }
    async fn events_accept(
        &self,
        jobs: Vec<ValidJob>,
        flows: Vec<ValidFlow>,
    ) -> StoreResult<Accepted> {
        let book = self.book().await?;
        let jobs = Self::stamp_all(&book, jobs)?;
        let flows = flows
            .into_iter()
            .map(|flow| Self::stamp_flow(&book, flow))
            .collect::<StoreResult<Vec<_>>>()?;
        self.inner.events_accept(jobs, flows).await
    }
    async fn flow_get(&self, id: Uuid) -> StoreResult<Option<FlowView>> {
        self.inner.flow_get(id).await
    }
    async fn flows_list(&self, params: FlowListParams) -> StoreResult<Vec<FlowView>> {
        self.inner.flows_list(params).await
    }
    async fn flow_cancel(&self, id: Uuid) -> StoreResult<FlowView> {
        self.inner.flow_cancel(id).await
    }
    async fn flow_signal_valid(
        &self,
        id: Uuid,
        signal: &str,
        payload: Valid<Value>,
    ) -> StoreResult<SignalOutcome> {
        self.inner.flow_signal_valid(id, signal, payload).await
    }
    async fn flows_expire_waits(&self, limit: usize) -> StoreResult<u64> {
        self.inner.flows_expire_waits(limit).await
    }
    fn flow_starts(&self) -> Arc<FlowStarts> {
        self.inner.flow_starts()
    }
    async fn flows_prune(&self, params: PruneParams) -> StoreResult<u64> {
        self.inner.flows_prune(params).await
    }
}
