//! The worker: fetch loops, executor, heartbeats, completer and graceful shutdown.

use chrono::Utc;
use conveyor_core::{
    error_class, fetch_waiting, AttemptEvent, AttemptStatus, CompleteParams, FailParams,
    FetchParams, HeartbeatParams, Job, JobObserver, LeaseOutcome, LeaseRef, RetryPlan, RetryPolicy,
    SnoozeParams, Store, TypedJob, WorkerHeartbeat,
};
use futures::FutureExt;
use serde_json::Value;
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::handler::{ErasedHandler, JobContext, Outcome, Registered, RuntimeFailure};
use crate::maintenance::Maintenance;

/// Most jobs claimed by one fetch.
const MAX_FETCH_BATCH: usize = 100;
/// Longest a busy fetch loop waits for more free slots before fetching (see `run_fetcher`).
const FETCH_GATHER_WAIT: Duration = Duration::from_millis(2);
/// How long a cancelled handler may take to stop by itself before it is aborted.
const CANCEL_GRACE: Duration = Duration::from_millis(500);
/// Most completions written in one store call.
const MAX_COMPLETION_BATCH: usize = 1000;
/// The `tracing` target of the per-job lifecycle events (start, completion, failure), so they
/// can be filtered on their own: `CONVEYOR_LOG=info,conveyor::job=warn` keeps only failures.
pub const JOB_LOG_TARGET: &str = "conveyor::job";

#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("invalid worker configuration: {0}")]
    Config(String),
}

/// How a shutdown went.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Jobs still running when shutdown began that finished within the drain timeout.
    pub drained: usize,
    /// Jobs cancelled at the drain timeout and released for another worker.
    pub released: usize,
}

pub struct WorkerBuilder {
    store: Arc<dyn Store>,
    id: String,
    queues: Vec<(String, usize)>,
    handlers: HashMap<String, Registered>,
    lease: Duration,
    drain_timeout: Duration,
    poll: Duration,
    default_retry: RetryPolicy,
    maintenance: Option<Maintenance>,
    observer: Option<Arc<dyn JobObserver>>,
    registry_interval: Option<Duration>,
}

impl WorkerBuilder {
    /// Serve `queue` with at most `concurrency` jobs running at once.
    pub fn queue(mut self, queue: impl Into<String>, concurrency: usize) -> Self {
        self.queues.push((queue.into(), concurrency));
        self
    }

    pub fn id(mut self, id: impl Into<String>) -> Self {
        self.id = id.into();
        self
    }

    /// Registers the handler for a typed job. The payload is decoded into `J`; one that does not
    /// decode fails permanently (class `invalid_payload`).
    pub fn handle<J, F, Fut>(self, handler: F) -> Self
    where
        J: TypedJob,
        F: Fn(JobContext, J) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let erased: ErasedHandler = Arc::new(move |ctx: JobContext, payload: Value| {
            match serde_json::from_value::<J>(payload) {
                Ok(job) => handler(ctx, job).map(Ok).boxed(),
                Err(e) => {
                    futures::future::ready(Err(RuntimeFailure::invalid_payload(J::KIND, e))).boxed()
                }
            }
        });
        self.register(J::KIND, erased, J::retry_policy(), None)
    }

    /// Registers a handler for `kind` that takes the raw JSON payload.
    pub fn handle_json<F, Fut>(self, kind: impl Into<String>, handler: F) -> Self
    where
        F: Fn(JobContext, Value) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Outcome> + Send + 'static,
    {
        let erased: ErasedHandler =
            Arc::new(move |ctx: JobContext, payload: Value| handler(ctx, payload).map(Ok).boxed());
        let retry = self.default_retry;
        self.register(kind, erased, retry, None)
    }

    fn register(
        mut self,
        kind: impl Into<String>,
        handler: ErasedHandler,
        retry: RetryPolicy,
        timeout: Option<Duration>,
    ) -> Self {
        self.handlers.insert(
            kind.into(),
            Registered {
                handler,
                retry,
                timeout,
            },
        );
        self
    }

    /// Backoff for `kind` (overrides the job type's own policy).
    pub fn retry_policy(mut self, kind: &str, retry: RetryPolicy) -> Self {
        if let Some(registered) = self.handlers.get_mut(kind) {
            registered.retry = retry;
        }
        self
    }

    /// Default timeout for `kind` when a job sets none.
    pub fn kind_timeout(mut self, kind: &str, timeout: Duration) -> Self {
        if let Some(registered) = self.handlers.get_mut(kind) {
            registered.timeout = Some(timeout);
        }
        self
    }

    /// Backoff for jobs of unknown kind and for handlers registered without their own policy.
    pub fn default_retry(mut self, retry: RetryPolicy) -> Self {
        self.default_retry = retry;
        self
    }

    /// Lease length (default 30 s); heartbeats renew it every third of that.
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// How long running jobs may finish after shutdown begins (default 30 s).
    pub fn drain_timeout(mut self, timeout: Duration) -> Self {
        self.drain_timeout = timeout;
        self
    }

    /// Longest wait between fetch attempts when no wake-up arrives (default 1 s).
    pub fn poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll;
        self
    }

    /// Also run lease rescue and due-job promotion in this worker (what an embedded,
    /// single-process setup wants). Off by default: the server runs it.
    pub fn with_maintenance(mut self, maintenance: Maintenance) -> Self {
        self.maintenance = Some(maintenance);
        self
    }

    /// Tells `observer` of every attempt outcome this worker writes (for metrics: give it the
    /// server's metrics when the worker runs in the server's process).
    pub fn observer(mut self, observer: Arc<dyn JobObserver>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// How often the worker reports itself to the store's worker registry (default 10 s; keep
    /// it well under the maintenance's stale interval, 2 min by default).
    pub fn registry_interval(mut self, interval: Duration) -> Self {
        self.registry_interval = Some(interval);
        self
    }

    /// Does not report to the worker registry (the worker is then invisible to
    /// `GET /v1/workers`, and its jobs are rescued only when their leases expire).
    pub fn without_registry(mut self) -> Self {
        self.registry_interval = None;
        self
    }

    pub fn build(self) -> Result<Worker, WorkerError> {
        if self.queues.is_empty() {
            return Err(WorkerError::Config(
                "no queues: call .queue(name, concurrency)".into(),
            ));
        }
        for (queue, concurrency) in &self.queues {
            conveyor_core::validate::name("queue", queue)
                .map_err(|e| WorkerError::Config(e.to_string()))?;
            if *concurrency == 0 {
                return Err(WorkerError::Config(format!(
                    "queue {queue}: concurrency must be at least 1"
                )));
            }
        }
        if self.lease < Duration::from_millis(100) {
            return Err(WorkerError::Config("lease must be at least 100 ms".into()));
        }
        if self
            .registry_interval
            .is_some_and(|interval| interval < Duration::from_millis(10))
        {
            return Err(WorkerError::Config(
                "registry interval must be at least 10 ms".into(),
            ));
        }
        Ok(Worker {
            shared: Arc::new(Shared {
                store: self.store,
                id: self.id,
                handlers: self.handlers,
                lease: self.lease,
                default_retry: self.default_retry,
                running: Mutex::new(HashMap::new()),
                observer: self.observer,
            }),
            registry_interval: self.registry_interval,
            queues: self.queues,
            stop_fetching: CancellationToken::new(),
            drain_timeout: self.drain_timeout,
            poll: self.poll,
            maintenance: self.maintenance,
        })
    }
}

struct RunningJob {
    lease_token: Uuid,
    cancel: CancellationToken,
}

struct Shared {
    store: Arc<dyn Store>,
    id: String,
    handlers: HashMap<String, Registered>,
    lease: Duration,
    default_retry: RetryPolicy,
    running: Mutex<HashMap<Uuid, RunningJob>>,
    observer: Option<Arc<dyn JobObserver>>,
}

impl Shared {
    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, RunningJob>> {
        // The map holds plain data; a panic elsewhere while holding it leaves it usable.
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn observe(&self, job: &JobMeta, status: AttemptStatus) {
        if let Some(observer) = &self.observer {
            observer.attempt_finished(&AttemptEvent {
                queue: &job.queue,
                kind: &job.kind,
                status,
                duration: job.duration,
            });
        }
    }
}

/// What the completer needs to log and count a completion it writes.
struct JobMeta {
    id: Uuid,
    queue: String,
    kind: String,
    attempt: u32,
    duration: Duration,
}

struct Completion {
    params: CompleteParams,
    job: JobMeta,
}

pub struct Worker {
    shared: Arc<Shared>,
    queues: Vec<(String, usize)>,
    /// Cancelled when shutdown begins: fetch loops stop.
    stop_fetching: CancellationToken,
    drain_timeout: Duration,
    poll: Duration,
    maintenance: Option<Maintenance>,
    registry_interval: Option<Duration>,
}

impl Worker {
    pub fn builder(store: Arc<dyn Store>) -> WorkerBuilder {
        WorkerBuilder {
            store,
            id: crate::default_worker_id(),
            queues: Vec::new(),
            handlers: HashMap::new(),
            lease: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(30),
            poll: Duration::from_secs(1),
            default_retry: RetryPolicy::default(),
            maintenance: None,
            observer: None,
            registry_interval: Some(Duration::from_secs(10)),
        }
    }

    pub fn id(&self) -> &str {
        &self.shared.id
    }

    /// Resolves once this worker has begun shutting down and stopped fetching: nothing enqueued
    /// after that is claimed by it. For readiness probes and for tests that need the moment.
    pub fn drain_started(&self) -> impl Future<Output = ()> + Send + 'static {
        self.stop_fetching.clone().cancelled_owned()
    }

    /// Runs until `shutdown` resolves, then drains and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> ShutdownReport {
        let stop_fetching = self.stop_fetching.clone();
        let stop_background = CancellationToken::new();
        let (completions, completion_rx) = mpsc::unbounded_channel();
        let completer = tokio::spawn(run_completer(self.shared.clone(), completion_rx));
        let heartbeat = tokio::spawn(run_heartbeats(self.shared.clone(), stop_background.clone()));
        let registry = self.registry_interval.map(|interval| {
            tokio::spawn(run_registry(
                self.shared.clone(),
                self.queues.clone(),
                interval,
                stop_background.clone(),
            ))
        });
        let maintenance = self
            .maintenance
            .clone()
            .map(|m| tokio::spawn(m.run(stop_background.clone())));

        let executors = Arc::new(Mutex::new(JoinSet::new()));
        let mut fetchers = JoinSet::new();
        for (queue, concurrency) in &self.queues {
            fetchers.spawn(run_fetcher(FetchLoop {
                shared: self.shared.clone(),
                queue: queue.clone(),
                slots: Arc::new(Semaphore::new(*concurrency)),
                concurrency: *concurrency,
                poll: self.poll,
                stop: stop_fetching.clone(),
                executors: executors.clone(),
                completions: completions.clone(),
            }));
        }
        tracing::info!(worker_id = %self.shared.id, queues = ?self.queues, "worker started");

        shutdown.await;
        tracing::info!(worker_id = %self.shared.id, drain_timeout = ?self.drain_timeout,
            "shutdown requested: no more fetching, draining running jobs");
        let running_at_shutdown = self.shared.running().len();
        stop_fetching.cancel();
        while fetchers.join_next().await.is_some() {}

        let mut executors = std::mem::take(
            &mut *executors
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
        );

        let drained_in_time = tokio::time::timeout(self.drain_timeout, async {
            while executors.join_next().await.is_some() {}
        })
        .await
        .is_ok();

        let mut report = ShutdownReport::default();
        if !drained_in_time {
            // Cancel what is left, wait for the handlers to be dropped, then hand the jobs back.
            let leftover: Vec<LeaseRef> = {
                let running = self.shared.running();
                running
                    .iter()
                    .map(|(id, job)| {
                        job.cancel.cancel();
                        LeaseRef {
                            id: *id,
                            lease_token: job.lease_token,
                        }
                    })
                    .collect()
            };
            while executors.join_next().await.is_some() {}
            match self.shared.store.jobs_release_many(leftover.clone()).await {
                Ok(released) => report.released = released as usize,
                Err(error) => tracing::error!(%error, jobs = leftover.len(),
                    "could not release jobs at shutdown; their leases will expire and they will be rescued"),
            }
        }
        report.drained = running_at_shutdown.saturating_sub(report.released);

        drop(completions);
        let _ = completer.await;
        stop_background.cancel();
        let _ = heartbeat.await;
        if let Some(registry) = registry {
            let _ = registry.await;
        }
        if let Some(maintenance) = maintenance {
            let _ = maintenance.await;
        }
        tracing::info!(worker_id = %self.shared.id, drained = report.drained,
            released = report.released, "worker stopped");
        report
    }
}

struct FetchLoop {
    shared: Arc<Shared>,
    queue: String,
    slots: Arc<Semaphore>,
    concurrency: usize,
    poll: Duration,
    stop: CancellationToken,
    executors: Arc<Mutex<JoinSet<()>>>,
    completions: mpsc::UnboundedSender<Completion>,
}

fn take_free_permits(slots: &Arc<Semaphore>, permits: &mut Vec<OwnedSemaphorePermit>) {
    while permits.len() < MAX_FETCH_BATCH {
        match slots.clone().try_acquire_owned() {
            Ok(permit) => permits.push(permit),
            Err(_) => break,
        }
    }
}

async fn run_fetcher(lp: FetchLoop) {
    let mut error_backoff = Duration::from_millis(100);
    let mut busy = false;
    loop {
        let first = tokio::select! {
            _ = lp.stop.cancelled() => return,
            permit = lp.slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => return,
            },
        };
        let mut permits: Vec<OwnedSemaphorePermit> = vec![first];
        take_free_permits(&lp.slots, &mut permits);
        // Under load slots free up one by one; fetching for each alone would cost a commit per
        // job. When the last fetch found work, wait a moment for a quarter of the slots so each
        // fetch claims a batch. An idle worker (all slots free) fetches at once.
        let batch_target = (lp.concurrency / 4).clamp(1, MAX_FETCH_BATCH);
        if busy && permits.len() < batch_target {
            let gather = async {
                while permits.len() < batch_target {
                    match lp.slots.clone().acquire_owned().await {
                        Ok(permit) => permits.push(permit),
                        Err(_) => break,
                    }
                }
            };
            let _ = tokio::time::timeout(FETCH_GATHER_WAIT, gather).await;
            take_free_permits(&lp.slots, &mut permits);
        }
        let params = FetchParams {
            worker_id: lp.shared.id.clone(),
            queues: vec![lp.queue.clone()],
            max: permits.len(),
            lease: lp.shared.lease,
            // Any kind: one without a handler fails as `unknown_kind`, visibly, rather than
            // waiting unclaimed.
            kinds: None,
        };
        let fetched = contained(async {
            conveyor_core::faults::inject("worker_fetch")?;
            fetch_waiting(
                lp.shared.store.as_ref(),
                params,
                Duration::from_secs(30),
                lp.poll,
                lp.stop.cancelled(),
            )
            .await
        })
        .await;
        let jobs = match fetched {
            Ok(jobs) => {
                error_backoff = Duration::from_millis(100);
                busy = !jobs.is_empty();
                jobs
            }
            Err(error) => {
                tracing::error!(%error, queue = %lp.queue, retry_in = ?error_backoff, "fetch failed");
                tokio::select! {
                    _ = lp.stop.cancelled() => return,
                    _ = tokio::time::sleep(error_backoff) => {}
                }
                error_backoff = (error_backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        if lp.stop.is_cancelled() && !jobs.is_empty() {
            // Claimed by a fetch that was in flight when shutdown began: hand them straight
            // back rather than start new work while draining.
            let leases: Vec<LeaseRef> = jobs
                .iter()
                .filter_map(|job| {
                    job.lease.as_ref().map(|lease| LeaseRef {
                        id: job.id,
                        lease_token: lease.token,
                    })
                })
                .collect();
            if let Err(error) = lp.shared.store.jobs_release_many(leases).await {
                tracing::warn!(%error, "could not release jobs fetched during shutdown; they will be rescued");
            }
            return;
        }
        let mut executors = lp.executors.lock().unwrap_or_else(|p| p.into_inner());
        for job in jobs {
            let Some(permit) = permits.pop() else {
                // The store returned more than asked for; it still holds the lease, so run it.
                let shared = lp.shared.clone();
                let completions = lp.completions.clone();
                executors.spawn(execute(shared, job, completions, None));
                continue;
            };
            let shared = lp.shared.clone();
            let completions = lp.completions.clone();
            executors.spawn(execute(shared, job, completions, Some(permit)));
        }
        // Reap finished executors so the set does not grow without bound.
        while executors.try_join_next().is_some() {}
    }
}

/// How one attempt ended, from the runtime's point of view.
enum Attempt {
    Handler(Outcome),
    Failed(RuntimeFailure),
    /// Shutdown or a lost lease: the handler was dropped; someone else settles the job.
    Interrupted,
}

async fn execute(
    shared: Arc<Shared>,
    job: Job,
    completions: mpsc::UnboundedSender<Completion>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let Some(lease) = job.lease.as_ref() else {
        tracing::error!(job_id = %job.id, "fetched job has no lease; skipping");
        return;
    };
    let lease = LeaseRef {
        id: job.id,
        lease_token: lease.token,
    };
    let cancel = CancellationToken::new();
    shared.running().insert(
        job.id,
        RunningJob {
            lease_token: lease.lease_token,
            cancel: cancel.clone(),
        },
    );
    let registered = shared.handlers.get(&job.kind).cloned();
    let retry = registered
        .as_ref()
        .map_or(shared.default_retry, |r| r.retry);
    let started = std::time::Instant::now();
    // Lifecycle events name the job, never its payload (which may hold personal data).
    tracing::info!(target: JOB_LOG_TARGET, job_id = %job.id, queue = %job.queue,
        kind = %job.kind, attempt = job.attempt, worker_id = %shared.id, "job started");

    let attempt = match registered {
        None => Attempt::Failed(RuntimeFailure {
            class: error_class::UNKNOWN_KIND,
            message: format!(
                "no handler registered for kind {:?} on worker {}",
                job.kind, shared.id
            ),
            retryable: true,
        }),
        Some(registered) => {
            let timeout = job
                .timeout_ms
                .map(Duration::from_millis)
                .or(registered.timeout);
            let ctx = JobContext::new(&job, cancel.clone());
            run_handler(&registered, ctx, job.payload.clone(), timeout, &cancel).await
        }
    };
    shared.running().remove(&job.id);
    drop(permit);

    let meta = JobMeta {
        id: job.id,
        queue: job.queue,
        kind: job.kind,
        attempt: job.attempt,
        duration: started.elapsed(),
    };
    let duration_ms = meta.duration.as_millis() as u64;
    let (class, message, plan) = match attempt {
        Attempt::Interrupted => {
            tracing::info!(target: JOB_LOG_TARGET, job_id = %meta.id, queue = %meta.queue,
                kind = %meta.kind, attempt = meta.attempt, duration_ms, outcome = "interrupted",
                "job interrupted (shutdown or lost lease)");
            return;
        }
        Attempt::Handler(Outcome::Complete(Some(result)))
            if conveyor_core::validate::json_without_nul("result", &result).is_err() =>
        {
            // Checked here, not by the completer's batch: one unstorable result must not fail
            // the completions it would be written with.
            let problem = conveyor_core::validate::json_without_nul("result", &result)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            (
                error_class::INVALID_RESULT,
                format!("the handler's result cannot be stored: {problem}"),
                RetryPlan::Never,
            )
        }
        Attempt::Handler(Outcome::Complete(result)) => {
            // Batched by the completer, which logs and counts it once written; if the worker
            // dies first, the lease expires and the job reruns.
            let _ = completions.send(Completion {
                params: CompleteParams { lease, result },
                job: meta,
            });
            return;
        }
        Attempt::Handler(Outcome::Snooze(delay)) => {
            let until = conveyor_core::clock::after(Utc::now(), delay);
            match shared.store.job_snooze(SnoozeParams { lease, until }).await {
                Ok(_) => {
                    tracing::info!(target: JOB_LOG_TARGET, job_id = %meta.id,
                        queue = %meta.queue, kind = %meta.kind, attempt = meta.attempt,
                        duration_ms, outcome = "snoozed", "job snoozed");
                    shared.observe(&meta, AttemptStatus::Snoozed);
                }
                Err(error) => tracing::warn!(job_id = %meta.id, %error, "snooze not recorded"),
            }
            return;
        }
        Attempt::Handler(Outcome::Retry(message)) => {
            (error_class::ERROR, message, RetryPlan::Backoff(retry))
        }
        Attempt::Handler(Outcome::RetryAfter(delay, message)) => {
            let at = conveyor_core::clock::after(Utc::now(), delay);
            (error_class::RETRY_AFTER, message, RetryPlan::At(at))
        }
        Attempt::Handler(Outcome::Permanent(message)) => {
            (error_class::PERMANENT, message, RetryPlan::Never)
        }
        Attempt::Failed(failure) => {
            let plan = if failure.retryable {
                RetryPlan::Backoff(retry)
            } else {
                RetryPlan::Never
            };
            (failure.class, failure.message, plan)
        }
    };
    let failed = shared
        .store
        .job_fail(FailParams {
            lease,
            class: class.to_string(),
            message: message.clone(),
            retry: plan,
        })
        .await;
    match failed {
        Ok(after) => {
            let status = AttemptStatus::of_failure(after.state);
            tracing::warn!(target: JOB_LOG_TARGET, job_id = %meta.id, queue = %meta.queue,
                kind = %meta.kind, attempt = meta.attempt, duration_ms,
                outcome = status.as_str(), state = %after.state, error_class = class,
                error = %message, "job failed");
            shared.observe(&meta, status);
        }
        Err(error) => tracing::warn!(job_id = %meta.id, %error, "failure not recorded"),
    }
}

async fn run_handler(
    registered: &Registered,
    ctx: JobContext,
    payload: Value,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
) -> Attempt {
    // The handler runs in its own task so a panic is contained and reported, not propagated.
    let mut task = tokio::spawn((registered.handler)(ctx, payload));
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        joined = &mut task => match joined {
            Ok(Ok(outcome)) => Attempt::Handler(outcome),
            Ok(Err(failure)) => Attempt::Failed(failure),
            Err(join_error) if join_error.is_panic() => Attempt::Failed(RuntimeFailure {
                class: error_class::PANIC,
                message: panic_message(join_error.into_panic()),
                retryable: true,
            }),
            Err(_) => Attempt::Interrupted,
        },
        _ = deadline => {
            task.abort();
            Attempt::Failed(RuntimeFailure {
                class: error_class::TIMEOUT,
                message: format!("handler exceeded its timeout of {} ms", timeout.map_or(0, |t| t.as_millis())),
                retryable: true,
            })
        }
        _ = cancel.cancelled() => {
            // Give a cooperative handler (one awaiting `ctx.cancelled()`) a moment to stop
            // cleanly before it is dropped.
            if tokio::time::timeout(CANCEL_GRACE, &mut task).await.is_err() {
                task.abort();
                let _ = task.await;
            }
            Attempt::Interrupted
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "handler panicked".to_string());
    format!("handler panicked: {text}")
}

/// A store call whose panic (a bug in a store, an injected fault) becomes an error: the fetch
/// loop, completer and heartbeat task then retry as they do after any store error, instead of
/// dying and leaving the worker fetching jobs it can no longer finish or keep leased.
pub(crate) async fn contained<T>(
    call: impl std::future::Future<Output = conveyor_core::StoreResult<T>>,
) -> conveyor_core::StoreResult<T> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(outcome) => outcome,
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            Err(conveyor_core::StoreError::Internal(format!(
                "store call panicked: {text}"
            )))
        }
    }
}

/// Writes completions in batches: one store call (one commit) for everything finished meanwhile.
async fn run_completer(shared: Arc<Shared>, mut rx: mpsc::UnboundedReceiver<Completion>) {
    let mut batch = Vec::with_capacity(64);
    while rx.recv_many(&mut batch, MAX_COMPLETION_BATCH).await > 0 {
        let (params, jobs): (Vec<CompleteParams>, Vec<JobMeta>) = std::mem::take(&mut batch)
            .into_iter()
            .map(|completion| (completion.params, completion.job))
            .unzip();
        let mut delay = Duration::from_millis(50);
        // Retry store errors a few times; a completion that never lands is rescued and rerun.
        for _ in 0..5 {
            let written = contained(async {
                conveyor_core::faults::inject("worker_complete")?;
                shared.store.jobs_complete_many(params.clone()).await
            })
            .await;
            match written {
                Ok(outcomes) => {
                    for (job, outcome) in jobs.iter().zip(outcomes) {
                        if outcome == LeaseOutcome::LeaseLost {
                            tracing::warn!(target: JOB_LOG_TARGET, job_id = %job.id,
                                queue = %job.queue, kind = %job.kind, attempt = job.attempt,
                                outcome = "lease_lost",
                                "completion rejected: lease was lost (job rescued or cancelled)");
                            continue;
                        }
                        tracing::info!(target: JOB_LOG_TARGET, job_id = %job.id,
                            queue = %job.queue, kind = %job.kind, attempt = job.attempt,
                            duration_ms = job.duration.as_millis() as u64,
                            outcome = "completed", "job completed");
                        shared.observe(job, AttemptStatus::Completed);
                    }
                    break;
                }
                Err(error) => {
                    tracing::error!(%error, jobs = jobs.len(), "completion batch failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay *= 2;
                }
            }
        }
    }
}

/// Reports the worker to the store's registry every `interval`, and once more at shutdown as
/// `stopping`, so a graceful stop is never mistaken for a crash.
async fn run_registry(
    shared: Arc<Shared>,
    queues: Vec<(String, usize)>,
    interval: Duration,
    stop: CancellationToken,
) {
    let concurrency = queues.iter().map(|(_, slots)| *slots).sum::<usize>();
    let mut beat = WorkerHeartbeat {
        id: shared.id.clone(),
        host: crate::hostname(),
        pid: Some(std::process::id()),
        queues: queues.into_iter().map(|(queue, _)| queue).collect(),
        concurrency: u32::try_from(concurrency).unwrap_or(u32::MAX),
        busy: 0,
        version: env!("CARGO_PKG_VERSION").to_string(),
        started_at: Utc::now(),
        stopping: false,
    };
    loop {
        beat.busy = u32::try_from(shared.running().len()).unwrap_or(u32::MAX);
        if let Err(error) = shared.store.workers_heartbeat(beat.clone()).await {
            tracing::warn!(%error, "worker registry heartbeat failed; will retry");
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
        }
    }
    beat.busy = 0;
    beat.stopping = true;
    if let Err(error) = shared.store.workers_heartbeat(beat).await {
        tracing::warn!(%error, "could not record the worker's stop in the registry");
    }
}

/// Renews the leases of running jobs every third of the lease; cancels jobs whose lease is gone.
async fn run_heartbeats(shared: Arc<Shared>, stop: CancellationToken) {
    let period = shared.lease / 3;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(period) => {}
        }
        let beats: Vec<(Uuid, Uuid)> = shared
            .running()
            .iter()
            .map(|(id, job)| (*id, job.lease_token))
            .collect();
        if beats.is_empty() {
            continue;
        }
        let params = beats
            .iter()
            .map(|(id, token)| HeartbeatParams {
                lease: LeaseRef {
                    id: *id,
                    lease_token: *token,
                },
                extend_by: shared.lease,
            })
            .collect();
        let renewed = contained(async {
            conveyor_core::faults::inject("worker_heartbeat")?;
            shared.store.jobs_heartbeat_many(params).await
        })
        .await;
        match renewed {
            Ok(results) => {
                let running = shared.running();
                for ((id, _), extended) in beats.iter().zip(results) {
                    if extended.is_none() {
                        if let Some(job) = running.get(id) {
                            tracing::warn!(job_id = %id, "lease lost (cancelled or rescued); stopping the handler");
                            job.cancel.cancel();
                        }
                    }
                }
            }
            Err(error) => tracing::error!(%error, "heartbeat failed; will retry"),
        }
    }
}
