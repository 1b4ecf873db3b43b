//! The `Store` traits: noun-first operations grouped by noun (jobs, leases, queues, schedules,
//! workers, leadership, flows, kinds; access, breakers, history and copying live beside their
//! nouns and are re-exported here), batch-first where it matters, each
//! state change conditional on the state (and lease token) it expects. Every store passes the
//! conformance suite in `conveyor-storetest`.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use uuid::Uuid;

pub use crate::access::AccessStore;
pub use crate::error::StoreResult;
pub use crate::job::LeaseRef;
use crate::job::{Inserted, Job, JobState, NamedQueueSettings, NewJob, QueueSettings, QueueStats};
pub use crate::lease::*;
use crate::schedule::{FireOutcome, FireRequest, Schedule, ScheduleRun, ScheduleView};
use crate::stuck::{StuckJob, StuckParams};
use crate::validate::{Valid, ValidJob};
use crate::workers::{StaleReport, StaleWorkerParams, WorkerHeartbeat, WorkerInfo};
use crate::workflow::{CreatedFlow, FlowListParams, FlowView, SignalOutcome, ValidFlow};

/// Filters for listing jobs, newest first. `after` is the cursor: the last id of the previous page.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct JobListParams {
    pub queue: Option<String>,
    pub state: Option<JobState>,
    pub kind: Option<String>,
    pub limit: usize,
    pub after: Option<Uuid>,
    /// Ids starting with this (lowercase hex and dashes, as ids are written).
    pub id_prefix: Option<String>,
    /// Jobs carrying this tag.
    pub tag: Option<String>,
    pub tenant: Option<String>,
    /// Jobs of this sequence (its stamped key, `expr=value`; see [`crate::sequence`]).
    pub sequence: Option<String>,
    /// Created at or after / before this.
    pub created_after: Option<DateTime<Utc>>,
    pub created_before: Option<DateTime<Utc>>,
    /// Jobs whose payload contains this JSON object: every key given, recursively, with the
    /// value given (scalars and arrays compared whole).
    pub payload: Option<serde_json::Value>,
}

impl JobListParams {
    /// The payload filter as (keys from the payload's root, value) pairs:
    /// `{"user": {"id": 7}, "plan": "pro"}` is `[(["plan"], "pro"), (["user", "id"], 7)]`.
    /// A job matches when each path holds exactly its value; an empty object matches any.
    pub fn payload_leaves(&self) -> Vec<(Vec<String>, Value)> {
        fn walk(path: &mut Vec<String>, value: &Value, out: &mut Vec<(Vec<String>, Value)>) {
            match value {
                Value::Object(map) => {
                    for (key, inner) in map {
                        path.push(key.clone());
                        walk(path, inner, out);
                        path.pop();
                    }
                }
                other => out.push((path.clone(), other.clone())),
            }
        }
        let mut out = Vec::new();
        if let Some(payload) = &self.payload {
            walk(&mut Vec::new(), payload, &mut out);
        }
        out
    }
}

/// Which dead jobs to replay: by ids, or every dead job matching queue and/or kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplaySelector {
    pub ids: Option<Vec<Uuid>>,
    pub queue: Option<String>,
    pub kind: Option<String>,
}

/// How long finished jobs are kept before [`LeadershipStore::jobs_prune`] deletes them, unless their
/// queue's settings say otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Completed and cancelled jobs, counted from when they finished.
    pub completed: Duration,
    /// Dead jobs, counted from when they died.
    pub dead: Duration,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            completed: Duration::from_secs(24 * 3600),
            dead: Duration::from_secs(14 * 24 * 3600),
        }
    }
}

/// One bounded pruning step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneParams {
    pub retention: RetentionPolicy,
    /// Most jobs deleted by the call, so one call stays a short transaction.
    pub limit: usize,
}

/// What a pruning step deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub completed: u64,
    pub cancelled: u64,
    pub dead: u64,
}

impl PruneReport {
    pub fn total(&self) -> u64 {
        self.completed + self.cancelled + self.dead
    }
}

/// The smallest UUIDv7 of the millisecond `at`: jobs with a smaller id were created before
/// `at`. Pruning scans ids from the oldest up to this bound, since a job cannot have finished
/// before it was created.
pub fn uuid_v7_floor(at: DateTime<Utc>) -> Uuid {
    let ms = u64::try_from(at.timestamp_millis()).unwrap_or(0) & 0xFFFF_FFFF_FFFF;
    // 48 bits of milliseconds, version 7, variant 0b10, all random bits zero.
    Uuid::from_u128((u128::from(ms) << 80) | (0x7u128 << 76) | (0x2u128 << 62))
}

/// Store-wide settings that every backend honours identically.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    /// A completed job still counts as a duplicate for its idempotency key this long after it
    /// finished. Unfinished jobs always do; dead and cancelled jobs never do.
    pub completed_idempotency_window: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        Self {
            completed_idempotency_window: Duration::from_secs(24 * 3600),
        }
    }
}

/// What a store says about itself to health probes (`/livez`, `/readyz`, `/healthz`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreHealth {
    /// False when this process cannot recover by itself and should be restarted: SQLite's
    /// writer thread died, or the database file is damaged.
    pub live: bool,
    /// Whether the store accepts writes now (SQLite: the writer answered a round trip;
    /// PostgreSQL: a pooled connection reached a primary that is not read-only).
    pub ready: bool,
    /// What is wrong, when `live` or `ready` is false.
    pub problem: Option<String>,
}

impl StoreHealth {
    pub fn ok() -> Self {
        Self {
            live: true,
            ready: true,
            problem: None,
        }
    }

    /// Alive, but not accepting writes right now (a lost database connection, say).
    pub fn not_ready(problem: impl Into<String>) -> Self {
        Self {
            live: true,
            ready: false,
            problem: Some(problem.into()),
        }
    }

    /// Broken in a way only a restart (or an operator) can fix.
    pub fn broken(problem: impl Into<String>) -> Self {
        Self {
            live: false,
            ready: false,
            problem: Some(problem.into()),
        }
    }
}

/// Jobs as producers and operators see them: enqueue, read, cancel, the dead-letter queue.
#[async_trait]
pub trait JobStore: Send + Sync {
    /// The clock this store decides time by. Whatever else in the process turns a duration into
    /// a time for the store (a delay, a retry, a schedule's tick, a breaker's window) reads it
    /// too, so that every server sharing the store counts time alike: PostgreSQL's is the
    /// database server's clock; an embedded store's is the clock it was given.
    fn clock(&self) -> Arc<dyn crate::Clock> {
        Arc::new(crate::SystemClock)
    }

    /// Whether the store is alive and accepts writes. The default reads one row; stores
    /// override it to probe their write path.
    async fn health(&self) -> StoreHealth {
        match self.job_get(Uuid::nil()).await {
            Ok(_) => StoreHealth::ok(),
            Err(error) => StoreHealth::not_ready(error.to_string()),
        }
    }

    /// Inserts all jobs or none. A job whose idempotency key matches an unfinished job (or one
    /// completed within the window) yields the existing job with `duplicate: true`; so does a
    /// job with a [`crate::UniqueSpec`] whose unique key is held by a job in one of the spec's
    /// states, created within its period (checked after the idempotency key). Within a batch,
    /// jobs count as inserted one after another.
    /// The jobs were validated once, when the [`ValidJob`] was made; stores do not check
    /// them again.
    async fn jobs_insert_valid(&self, jobs: Vec<ValidJob>) -> StoreResult<Vec<Inserted>>;

    /// Validates every job (refusing the batch with the first problem, fields named as in
    /// [`crate::validate::new_job`]), then inserts them as [`JobStore::jobs_insert_valid`] does.
    async fn jobs_insert_many(&self, jobs: Vec<NewJob>) -> StoreResult<Vec<Inserted>> {
        let jobs = jobs
            .into_iter()
            .map(ValidJob::new)
            .collect::<Result<Vec<_>, _>>()?;
        self.jobs_insert_valid(jobs).await
    }

    /// One job by id, with its full error history.
    async fn job_get(&self, id: Uuid) -> StoreResult<Option<Job>>;

    /// Jobs matching the filter, newest first.
    async fn jobs_list(&self, params: JobListParams) -> StoreResult<Vec<Job>>;

    /// Cancels an unfinished job (a running job's lease is revoked). `Conflict` when finished.
    async fn job_cancel(&self, id: Uuid) -> StoreResult<Job>;

    /// Dead jobs back to `available` with a fresh set of attempts; their history is kept.
    async fn dead_replay(&self, selector: ReplaySelector) -> StoreResult<u64>;

    /// Deletes a dead job. False when no dead job has that id.
    async fn dead_discard(&self, id: Uuid) -> StoreResult<bool>;

    /// Stores jobs exactly as given (ids, states, attempts, history, leases, timestamps): the
    /// target side of `conveyor store copy`. A job whose id already exists is left alone, so a
    /// copy can be resumed. Returns how many were inserted.
    async fn jobs_import(&self, jobs: Vec<Job>) -> StoreResult<u64>;
}

/// The worker's side: claiming jobs under a lease and finishing them.
#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Checks the fetch ([`Valid::fetch`]) and claims as [`LeaseStore::jobs_fetch_valid`]
    /// does; nothing at all when it cannot claim anything.
    async fn jobs_fetch(&self, params: FetchParams) -> StoreResult<Vec<Job>> {
        let params = Valid::fetch(params)?;
        if params.claims_nothing() {
            return Ok(Vec::new());
        }
        self.jobs_fetch_valid(params).await
    }

    /// Claims available jobs by priority (higher first), then run_at, then age, marking them
    /// running under a fresh lease. Never blocks waiting for work; see [`LeaseStore::wakeup`].
    async fn jobs_fetch_valid(&self, params: Valid<FetchParams>) -> StoreResult<Vec<Job>>;

    /// Extends leases; `None` for each lease that was lost.
    async fn jobs_heartbeat_many(
        &self,
        params: Vec<HeartbeatParams>,
    ) -> StoreResult<Vec<Option<DateTime<Utc>>>>;

    /// Checks the completions ([`Valid::completions`]) and records them as
    /// [`LeaseStore::jobs_complete_valid`] does.
    async fn jobs_complete_many(
        &self,
        params: Vec<CompleteParams>,
    ) -> StoreResult<Vec<LeaseOutcome>> {
        if params.is_empty() {
            return Ok(Vec::new());
        }
        self.jobs_complete_valid(Valid::completions(params)?).await
    }

    /// Marks running jobs completed, each only if its lease still holds.
    async fn jobs_complete_valid(
        &self,
        params: Valid<Vec<CompleteParams>>,
    ) -> StoreResult<Vec<LeaseOutcome>>;

    /// Makes the report storable ([`Valid::failure`]) and records it as
    /// [`LeaseStore::job_fail_valid`] does.
    async fn job_fail(&self, params: FailParams) -> StoreResult<Job> {
        self.job_fail_valid(Valid::failure(params)).await
    }

    /// Records a failed attempt and moves the job to `retryable` or `dead`. `LeaseLost` when the
    /// lease no longer holds (nothing changes then).
    async fn job_fail_valid(&self, params: Valid<FailParams>) -> StoreResult<Job>;

    /// Puts a running job back to `scheduled` until `until`, without counting the attempt.
    async fn job_snooze(&self, params: SnoozeParams) -> StoreResult<Job>;

    /// Returns running jobs to `available` at once without counting the attempt (graceful
    /// shutdown). Returns how many leases still held.
    async fn jobs_release_many(&self, leases: Vec<LeaseRef>) -> StoreResult<u64>;

    /// Records a running job's progress (0 to 100 and an optional message), only while `lease`
    /// holds. `LeaseLost` otherwise.
    async fn job_progress(
        &self,
        lease: LeaseRef,
        percent: u8,
        message: Option<String>,
    ) -> StoreResult<()>;

    /// Notified (after commit) whenever jobs may have become available in this process's view;
    /// fetchers wait on it between polls.
    fn wakeup(&self) -> Arc<Notify>;

    /// Earliest run_at among scheduled/retryable jobs in `queues`, so a waiting fetcher knows
    /// when to look again.
    async fn jobs_next_due(&self, queues: &[String]) -> StoreResult<Option<DateTime<Utc>>>;

    /// The first `limit` available jobs of `kind` in `queue`, in claim order (priority, then
    /// run_at, then id), read without claiming: what a batch fetch judges readiness by (see
    /// [`crate::batch`]).
    async fn jobs_available_of_kind(
        &self,
        queue: &str,
        kind: &str,
        limit: usize,
    ) -> StoreResult<Vec<Job>>;
}

/// Per-queue counts and settings (pause, limits, depth, retention).
#[async_trait]
pub trait QueueStore: Send + Sync {
    /// Counts per queue and state.
    async fn queues_stats(&self) -> StoreResult<Vec<QueueStats>>;

    /// A queue's settings (defaults when never set).
    async fn queue_settings_get(&self, queue: &str) -> StoreResult<QueueSettings>;

    /// Replaces a queue's settings. Pausing stops `jobs_fetch` from claiming the queue's jobs;
    /// depth limits make `jobs_insert_many` refuse (`StoreError::QueueFull`, nothing stored)
    /// batches that would take the queue's unfinished jobs, or a tenant's share of them, past
    /// the limit. Only jobs a batch would add count: an idempotent duplicate is answered with
    /// the existing job even when the queue is full. Jobs without a tenant count towards the
    /// queue's limit only.
    ///
    /// Checks the name and settings ([`Valid::queue_settings`]) and stores them as
    /// [`QueueStore::queue_settings_put_valid`] does.
    async fn queue_settings_put(
        &self,
        queue: &str,
        settings: QueueSettings,
    ) -> StoreResult<QueueSettings> {
        self.queue_settings_put_valid(Valid::queue_settings(queue, settings)?)
            .await
    }

    /// Replaces a queue's settings (see [`QueueStore::queue_settings_put`]).
    async fn queue_settings_put_valid(
        &self,
        settings: Valid<NamedQueueSettings>,
    ) -> StoreResult<QueueSettings>;

    /// Every queue with settings of its own.
    async fn queue_settings_list(&self) -> StoreResult<Vec<NamedQueueSettings>>;

    /// What each key of the named limit `limit` uses now, counted as a claim counts it: its
    /// running jobs, and its starts within `rate_period_ms` (when the limit has a rate). Keys
    /// using nothing are left out; ordered by key.
    async fn limit_usage(
        &self,
        limit: &str,
        rate_period_ms: Option<u64>,
    ) -> StoreResult<Vec<crate::limits::named::KeyUsage>>;
}

/// Cron schedules (see `crate::schedule`).
#[async_trait]
pub trait ScheduleStore: Send + Sync {
    /// Creates or replaces the schedule of that name. A new schedule, or one whose expression
    /// or time zone changed, counts ticks from now on; changing only its job or policies keeps
    /// its place (so re-applying an unchanged definition at every start loses no tick).
    async fn schedule_put(&self, schedule: Schedule) -> StoreResult<ScheduleView>;

    /// One schedule with its state, next run and [`crate::schedule::RECENT_RUNS`] latest runs.
    async fn schedule_get(&self, name: &str) -> StoreResult<Option<ScheduleView>>;

    /// Every schedule by name, each with its last run (and no `recent_runs`).
    async fn schedules_list(&self) -> StoreResult<Vec<ScheduleView>>;

    /// Deletes a schedule and its run history (its jobs stay). False when there was none.
    async fn schedule_delete(&self, name: &str) -> StoreResult<bool>;

    /// Fires ticks atomically: if the schedule is still at `request.revision`, records one run
    /// per tick (enqueuing the schedule's job, unless `overlap: skip` finds the previous run's
    /// job unfinished or the store refuses the job) and moves the schedule's `due_after`, all
    /// in one transaction. Otherwise nothing changes and the outcome is `Conflict`: of two
    /// nodes racing to fire the same tick, exactly one records it.
    async fn schedule_fire(&self, request: FireRequest) -> StoreResult<FireOutcome>;

    /// A schedule's latest runs, newest first, with their jobs' states.
    async fn schedule_runs(&self, name: &str, limit: usize) -> StoreResult<Vec<ScheduleRun>>;
}

/// Observability: the worker registry and stuck jobs (see `crate::workers`, `crate::stuck`).
#[async_trait]
pub trait WorkerStore: Send + Sync {
    /// Records a worker's heartbeat (creating or updating its registry entry) at the store's
    /// "now": `alive`, or `stopped` when `beat.stopping`. A worker marked dead that heartbeats
    /// again is alive again (its rescued jobs stay rescued).
    async fn workers_heartbeat(&self, beat: WorkerHeartbeat) -> StoreResult<WorkerInfo>;

    /// Every registered worker, alive ones first, then by id.
    async fn workers_list(&self) -> StoreResult<Vec<WorkerInfo>>;

    /// Records an operator's command for the worker `id` (`None` clears it); the worker as
    /// stored, or `None` when no worker of that id is registered. Heartbeats keep it, until
    /// the worker registers again after it ended (see [`WorkerInfo::command`]).
    async fn worker_command(
        &self,
        id: &str,
        command: Option<crate::workers::WorkerCommand>,
    ) -> StoreResult<Option<WorkerInfo>>;

    /// In one transaction: marks `dead` every alive worker not heard from for
    /// `params.older_than`, rescues the running jobs leased to them as an expired lease would
    /// be (`retryable` with backoff, or `dead` when out of attempts, recording a
    /// `lease_expired` error), and forgets workers that ended more than `params.forget_after`
    /// ago.
    async fn workers_mark_stale(&self, params: StaleWorkerParams) -> StoreResult<StaleReport>;

    /// Running jobs past their stuck threshold (see `crate::stuck`), longest-running first.
    async fn jobs_stuck(&self, params: StuckParams) -> StoreResult<Vec<StuckJob>>;
}

/// What the maintenance leader runs: leadership itself, promotion of due jobs, rescue of
/// expired leases, retention, and the database's own housekeeping.
#[async_trait]
pub trait LeadershipStore: Send + Sync {
    /// Housekeeping the database would otherwise need an operator for (PostgreSQL with
    /// autovacuum off: vacuuming the jobs table, whose dead rows every claim would otherwise
    /// step over). Called by the maintenance leader every pass; quick when there is nothing to
    /// do. The default does nothing.
    async fn storage_maintenance(&self) -> StoreResult<()> {
        Ok(())
    }

    /// Moves running jobs whose lease expired to `retryable` (or `dead` when out of attempts),
    /// recording a `lease_expired` error.
    async fn jobs_rescue_expired(&self, params: RescueParams) -> StoreResult<RescueReport>;

    /// Makes `scheduled` and `retryable` jobs whose run_at has come `available`. Returns how many.
    async fn jobs_promote_due(&self) -> StoreResult<u64>;

    /// Deletes up to `limit` finished jobs past their retention (their queue's
    /// `completed_retention_secs` / `dead_retention_secs`, else `params.retention`), oldest
    /// first. Run repeatedly by the maintenance leader until it deletes fewer than `limit`.
    async fn jobs_prune(&self, params: PruneParams) -> StoreResult<PruneReport>;

    /// Takes or renews the maintenance leadership for `holder` for `ttl`: true while `holder`
    /// leads. Exactly one holder leads at a time across every process sharing the store; when
    /// the leader stops renewing, another takes over once `ttl` has passed. The default suits
    /// stores that only one process opens (embedded SQLite): the caller always leads.
    async fn leader_try_acquire(&self, holder: &str, ttl: Duration) -> StoreResult<bool> {
        let _ = (holder, ttl);
        Ok(true)
    }

    /// Gives up the leadership if `holder` has it, so another node takes over at once.
    async fn leader_release(&self, holder: &str) -> StoreResult<()> {
        let _ = holder;
        Ok(())
    }
}

/// Workflows (see `crate::workflow`): a flow's steps start as their parents finish, in the
/// same transaction as the parent's change, whichever path finishes it (completion, failure,
/// lease rescue, cancellation, replay).
#[async_trait]
pub trait FlowStore: Send + Sync {
    /// Stores the flow and starts its steps without parents, all or nothing. A flow with the
    /// idempotency key of a stored flow returns that flow with `duplicate: true`.
    async fn flow_create(&self, flow: ValidFlow) -> StoreResult<CreatedFlow>;

    /// Creates `flows` (each as [`FlowStore::flow_create`] does) and inserts `jobs` (as
    /// [`JobStore::jobs_insert_valid`] does) in one transaction: all or none. This is how what
    /// an event makes (`crate::subscriptions`) is stored with the event's acceptance, and with
    /// the rest of a source's batch. Duplicates are found by their idempotency keys, as those
    /// two methods find them.
    async fn events_accept(
        &self,
        jobs: Vec<ValidJob>,
        flows: Vec<ValidFlow>,
    ) -> StoreResult<Accepted>;

    /// A flow with every step.
    async fn flow_get(&self, id: Uuid) -> StoreResult<Option<FlowView>>;

    /// Flows newest first, without their steps (with `step_counts`).
    async fn flows_list(&self, params: FlowListParams) -> StoreResult<Vec<FlowView>>;

    /// Cancels a running (or stopped, failed) flow: every unfinished step is cancelled, a
    /// running job loses its lease. `FlowConflict` when the flow has ended otherwise.
    async fn flow_cancel(&self, id: Uuid) -> StoreResult<FlowView>;

    /// Delivers a signal to the flow's wait step for it: a waiting step completes with
    /// `payload` as its result; a step not waiting yet keeps it and completes when it begins.
    /// `Invalid` naming `signal` when no step waits for it; `FlowConflict` when that step has
    /// finished or the flow has ended.
    ///
    /// Checks the payload ([`Valid::payload`]) first.
    async fn flow_signal(
        &self,
        id: Uuid,
        signal: &str,
        payload: Value,
    ) -> StoreResult<SignalOutcome> {
        self.flow_signal_valid(id, signal, Valid::payload(payload)?)
            .await
    }

    /// Delivers a signal (see [`FlowStore::flow_signal`]).
    async fn flow_signal_valid(
        &self,
        id: Uuid,
        signal: &str,
        payload: Valid<Value>,
    ) -> StoreResult<SignalOutcome>;

    /// Fails (class `timeout`) up to `limit` wait steps whose deadline passed. Run by the
    /// maintenance leader.
    async fn flows_expire_waits(&self, limit: usize) -> StoreResult<u64>;

    /// Where this store tells of the jobs flows start in it, after their commit (see
    /// [`crate::FlowStarts`]): how they are counted as enqueued. The same for every call.
    fn flow_starts(&self) -> Arc<crate::FlowStarts>;

    /// Deletes up to `params.limit` finished flows with their steps, oldest first: completed,
    /// compensated and cancelled ones `params.retention.completed` after they finished, failed
    /// ones (which a replay could still resume) after `params.retention.dead`. Their jobs are
    /// pruned by [`LeadershipStore::jobs_prune`]. Returns how many flows were deleted.
    async fn flows_prune(&self, params: PruneParams) -> StoreResult<u64>;
}

/// What [`FlowStore::events_accept`] stored: a result per job and per flow, in the order given.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Accepted {
    pub jobs: Vec<Inserted>,
    pub flows: Vec<CreatedFlow>,
}

/// Settings per job kind (see [`crate::kinds`]).
#[async_trait]
pub trait KindStore: Send + Sync {
    /// Creates or replaces a kind's settings; `updated_at` is set from the store's clock.
    async fn kind_put(
        &self,
        settings: crate::kinds::KindSettings,
    ) -> StoreResult<crate::kinds::KindSettings>;

    /// A kind's settings, `None` when it has none.
    async fn kind_get(&self, kind: &str) -> StoreResult<Option<crate::kinds::KindSettings>>;

    /// Every kind with settings, by name.
    async fn kinds_list(&self) -> StoreResult<Vec<crate::kinds::KindSettings>>;

    /// Deletes a kind's settings (its jobs stay). False when it had none.
    async fn kind_delete(&self, kind: &str) -> StoreResult<bool>;
}

/// Everything a store does, bundled for callers: a store implements each part, and a decorator
/// (say, one that encrypts payloads) implements the parts it changes and forwards the rest with
/// [`crate::delegate_store!`]. Every store passes the conformance suite in `conveyor-storetest`.
pub trait Store:
    JobStore
    + LeaseStore
    + QueueStore
    + ScheduleStore
    + AccessStore
    + WorkerStore
    + LeadershipStore
    + FlowStore
    + KindStore
    + crate::breaker::BreakerStore
    + crate::stats::StatsStore
    + crate::copy::CopyStore
    + crate::config::ConfigStore
    + 'static
{
}

impl<T> Store for T where
    T: JobStore
        + LeaseStore
        + QueueStore
        + ScheduleStore
        + AccessStore
        + WorkerStore
        + LeadershipStore
        + FlowStore
        + KindStore
        + crate::breaker::BreakerStore
        + crate::stats::StatsStore
        + crate::copy::CopyStore
        + crate::config::ConfigStore
        + 'static
{
}

#[cfg(test)]
mod retention_tests;
