//! The harness and the helpers every behaviour shares: insert, fetch and finish jobs the plain
//! way, asserting as they go. Behaviours import them from here, not through the crate root: the
//! root re-exports every behaviour, so taking helpers through it would make each behaviour
//! module import all the others.

use chrono::{DateTime, Utc};
use conveyor_core::{
    CompleteParams, FailParams, FetchParams, Inserted, Job, JobListParams, LeaseOutcome, LeaseRef,
    ManualClock, NewJob, RetryPlan, RetryPolicy, Store, StoreResult,
};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// A store under test and the clock it reads "now" from.
#[derive(Clone)]
pub struct Harness {
    pub store: Arc<dyn Store>,
    pub clock: Arc<ManualClock>,
    /// Dropped with the harness: the store's temp dir, database or schema.
    _cleanup: Option<Arc<dyn std::any::Any + Send + Sync>>,
}

impl Harness {
    pub fn new(store: Arc<dyn Store>, clock: Arc<ManualClock>) -> Self {
        Self {
            store,
            clock,
            _cleanup: None,
        }
    }

    /// Keeps `guard` (e.g. a `tempfile::TempDir`) alive until the behaviour has run.
    pub fn with_cleanup(mut self, guard: impl std::any::Any + Send + Sync) -> Self {
        self._cleanup = Some(Arc::new(guard));
        self
    }

    /// The store's "now".
    pub fn now(&self) -> DateTime<Utc> {
        conveyor_core::Clock::now(&*self.clock)
    }

    /// Moves the store's clock forward.
    pub fn advance(&self, by: Duration) {
        self.clock.advance(by);
    }
}

/// The worker id the helpers fetch with.
pub const WORKER: &str = "worker-1";
/// The lease the helpers fetch with.
pub const LEASE: Duration = Duration::from_secs(30);

pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

pub fn millis(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `std` duration as a `chrono` duration, for date arithmetic.
pub fn span(d: Duration) -> chrono::Duration {
    chrono::Duration::from_std(d).expect("duration fits chrono")
}

/// A job of `kind` in the default queue with an empty payload.
pub fn new_job(kind: &str) -> NewJob {
    NewJob::new(kind, serde_json::json!({}))
}

/// A job of `kind` in `queue`.
pub fn job_in(queue: &str, kind: &str) -> NewJob {
    let mut job = new_job(kind);
    job.queue = queue.to_string();
    job
}

/// A deterministic backoff: `base`, `2 * base`, `4 * base`, ... capped at one hour.
pub fn backoff(base: Duration) -> RetryPolicy {
    RetryPolicy::fixed_exponential(base, Duration::from_secs(3600))
}

/// Inserts one job and returns its single result, duplicate or not.
pub async fn insert_one(h: &Harness, job: NewJob) -> Inserted {
    let mut inserted = h
        .store
        .jobs_insert_many(vec![job])
        .await
        .expect("insert should succeed");
    assert_eq!(inserted.len(), 1, "one insert result per job");
    inserted.pop().expect("one result")
}

/// Inserts one job, asserting it is new (not an idempotency duplicate).
pub async fn insert(h: &Harness, job: NewJob) -> Job {
    let inserted = insert_one(h, job).await;
    assert!(!inserted.duplicate, "a fresh job is not a duplicate");
    inserted.job
}

/// The stored job with `id`, which must exist.
pub async fn get(h: &Harness, id: Uuid) -> Job {
    h.store
        .job_get(id)
        .await
        .expect("job_get should succeed")
        .unwrap_or_else(|| panic!("job {id} should exist"))
}

pub fn fetch_params(queues: &[&str], max: usize) -> FetchParams {
    FetchParams {
        worker_id: WORKER.to_string(),
        queues: queues.iter().map(|q| q.to_string()).collect(),
        max,
        lease: LEASE,
        kinds: None,
        excluded_kinds: Vec::new(),
    }
}

/// Fetches up to `max` jobs from `queues` as [`WORKER`] with a [`LEASE`] lease.
pub async fn fetch(h: &Harness, queues: &[&str], max: usize) -> Vec<Job> {
    h.store
        .jobs_fetch(fetch_params(queues, max))
        .await
        .expect("fetch should succeed")
}

/// Fetches from `queue` with `max: 1`, asserting a job comes back.
pub async fn fetch_one(h: &Harness, queue: &str) -> Job {
    let mut jobs = fetch(h, &[queue], 1).await;
    assert_eq!(
        jobs.len(),
        1,
        "expected exactly one job from queue {queue:?}, got {jobs:?}"
    );
    jobs.pop().expect("one job")
}

/// Asserts nothing is fetchable from `queue`.
pub async fn fetch_none(h: &Harness, queue: &str, why: &str) {
    let jobs = fetch(h, &[queue], 10).await;
    assert!(
        jobs.is_empty(),
        "nothing should be fetchable from {queue:?} ({why}), got {jobs:?}"
    );
}

/// The lease a fetched job is held under.
pub fn lease_of(job: &Job) -> LeaseRef {
    let lease = job
        .lease
        .as_ref()
        .unwrap_or_else(|| panic!("job {} should hold a lease: {job:?}", job.id));
    LeaseRef {
        id: job.id,
        lease_token: lease.token,
    }
}

/// A lease for `id` with a token nobody was given.
pub fn bogus_lease(id: Uuid) -> LeaseRef {
    LeaseRef {
        id,
        lease_token: Uuid::new_v4(),
    }
}

/// Completes one job under `lease` and returns the outcome.
pub async fn complete(
    h: &Harness,
    lease: LeaseRef,
    result: Option<serde_json::Value>,
) -> LeaseOutcome {
    let outcomes = h
        .store
        .jobs_complete_many(vec![CompleteParams { lease, result }])
        .await
        .expect("complete should succeed");
    assert_eq!(outcomes.len(), 1, "one outcome per completion");
    outcomes[0]
}

/// Fails one attempt under `lease` with class "error".
pub async fn fail(
    h: &Harness,
    lease: LeaseRef,
    message: &str,
    retry: RetryPlan,
) -> StoreResult<Job> {
    h.store
        .job_fail(FailParams {
            lease,
            class: conveyor_core::error_class::ERROR.to_string(),
            message: message.to_string(),
            retry,
            backtrace: None,
        })
        .await
}

/// Inserts `job` with one attempt and sends it to the dead-letter queue (fetch, fail `Never`).
/// Only call it while no other job is available in that queue.
pub async fn make_dead(h: &Harness, mut job: NewJob) -> Job {
    job.max_attempts = 1;
    let queue = job.queue.clone();
    let inserted = insert(h, job).await;
    let fetched = fetch_one(h, &queue).await;
    assert_eq!(fetched.id, inserted.id, "the only available job is fetched");
    let dead = fail(h, lease_of(&fetched), "fatal", RetryPlan::Never)
        .await
        .expect("fail should succeed");
    assert_eq!(dead.state, conveyor_core::JobState::Dead, "{dead:?}");
    dead
}

/// Every job in the store, newest first.
pub async fn list_all(h: &Harness) -> Vec<Job> {
    list(h, {
        let mut params = JobListParams::default();
        params.limit = 10_000;
        params
    })
    .await
}

pub async fn list(h: &Harness, params: JobListParams) -> Vec<Job> {
    h.store
        .jobs_list(params)
        .await
        .expect("jobs_list should succeed")
}

/// Ids of `jobs`, in order.
pub fn ids(jobs: &[Job]) -> Vec<Uuid> {
    jobs.iter().map(|j| j.id).collect()
}
