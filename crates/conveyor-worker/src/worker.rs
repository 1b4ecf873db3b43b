//! The worker: fetch loops, executor, heartbeats, completer and graceful shutdown.

use chrono::Utc;
use conveyor_core::{
    error_class, fetch_waiting, AttemptEvent, AttemptStatus, CompleteParams, FailParams,
    FetchParams, HeartbeatParams, Job, JobObserver, LeaseOutcome, LeaseRef, RetryPlan, RetryPolicy,
    SnoozeParams, Store, TypedJob, WorkerHeartbeat,
};
use futures::FutureExt;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::handler::{ErasedHandler, JobContext, Outcome, Registered, RuntimeFailure};
use crate::maintenance::Maintenance;

/// Most jobs claimed by one fetch.
const MAX_FETCH_BATCH: usize = 250;
/// Longest a busy fetch loop waits for more free slots before fetching (see `fetch_loop`).
const FETCH_GATHER_WAIT: Duration = Duration::from_millis(2);
/// Default bound on the jobs one queue's fetch loop keeps claimed ahead of its free slots
/// (see `Lane`); `WorkerBuilder::prefetch` changes it.
const DEFAULT_PREFETCH: usize = 200;
/// Longest a prefetched job waits for a slot before it is handed back to the queue (never more
/// than a third of the lease either: see `Lane::max_wait`).
const PREFETCH_MAX_WAIT: Duration = Duration::from_secs(1);
/// The buffer holds this many fetch latencies' worth of work (so a prefetched job waits about
/// that long for its slot): enough for one fetch to come back before the buffer runs dry even
/// when the rate or the latency jumps.
const PREFETCH_HEADROOM: f64 = 4.0;
/// Departure rate samples are taken over at least this long.
const RATE_SAMPLE: Duration = Duration::from_millis(10);
/// A fetch that took longer than this probably waited for jobs (a long-poll), so it says
/// nothing about the store's latency.
const LATENCY_SAMPLE_MAX: Duration = Duration::from_millis(50);
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
    prefetch: usize,
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

    /// At most how many jobs each queue's fetch loop may hold claimed but not yet started
    /// (default 200; 0 turns prefetching off). The loop keeps only as many as its slots free
    /// during a few fetches (departure rate × fetch latency × 4), so jobs that run longer
    /// than a few milliseconds are hardly ever prefetched; a prefetched job not started
    /// within a second (or a third of the lease) goes back to the queue, and shutdown hands
    /// every prefetched job back at once. See docs/architecture.md, "Prefetch".
    pub fn prefetch(mut self, max: usize) -> Self {
        self.prefetch = max;
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
            prefetch: self.prefetch,
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
    prefetch: usize,
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
            prefetch: DEFAULT_PREFETCH,
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
            let lane = Arc::new(Lane {
                shared: self.shared.clone(),
                queue: queue.clone(),
                slots: Arc::new(Semaphore::new(*concurrency)),
                concurrency: *concurrency,
                prefetch: self.prefetch,
                max_wait: PREFETCH_MAX_WAIT.min(self.shared.lease / 3),
                buffer: Mutex::new(VecDeque::new()),
                drained: tokio::sync::Notify::new(),
                finished: AtomicU64::new(0),
                stop: stop_fetching.clone(),
                executors: executors.clone(),
                completions: completions.clone(),
            });
            // The fetch loop hands back whatever it still holds prefetched when it stops.
            fetchers.spawn(run_fetcher(lane, self.poll));
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

/// A job claimed ahead of a free slot, waiting in its lane's buffer.
struct Prefetched {
    job: Job,
    claimed: Instant,
}

/// One queue's part of a running worker: its slots, the jobs its fetch loop claimed ahead of
/// free slots (prefetched), and what an executor needs to start the next of them itself.
///
/// Why prefetch: a fetch is one round of the store's writer, and on SQLite that round usually
/// also holds completions, so it waits for their fsync. A loop that fetches only for slots
/// already free leaves them idle for that whole round trip; with short jobs, a worker of
/// concurrency 10 then spends most of its time waiting. Keeping about as many jobs claimed as
/// the slots take during a few fetches (Little's law: departure rate × fetch latency, times
/// `PREFETCH_HEADROOM`, bounded by `prefetch`) hides the round trip: a slot that frees up
/// starts the next buffered job at once, from the executor that freed it, while the loop
/// refills the buffer.
struct Lane {
    shared: Arc<Shared>,
    queue: String,
    slots: Arc<Semaphore>,
    concurrency: usize,
    /// Most jobs `buffer` may hold.
    prefetch: usize,
    /// A buffered job not started within this goes back to the queue. At most a third of the
    /// lease: a buffered job is not heartbeated, yet its lease cannot run out while it waits,
    /// and once started the heartbeat (every third of the lease) renews it in time.
    max_wait: Duration,
    /// Claimed jobs waiting for a slot, in claim order. Nothing leaves it for an executor once
    /// `stop` is cancelled (checked under its lock), so whoever takes it after that hands back
    /// everything it held.
    buffer: Mutex<VecDeque<Prefetched>>,
    /// Signalled when a buffered job starts, so the fetch loop tops the buffer up.
    drained: tokio::sync::Notify,
    /// Jobs that gave their slot back, for the departure rate.
    finished: AtomicU64,
    stop: CancellationToken,
    executors: Arc<Mutex<JoinSet<()>>>,
    completions: mpsc::UnboundedSender<Completion>,
}

impl Lane {
    fn buffer(&self) -> std::sync::MutexGuard<'_, VecDeque<Prefetched>> {
        // Plain data; a panic elsewhere while holding it leaves it usable.
        self.buffer
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Starts buffered jobs, on `permits` first, then on whatever slots are free. The fetch
    /// loop calls it after filling the buffer and every executor after giving its slot back:
    /// whichever of the two comes second sees both the job and the free slot, so a buffered job
    /// never waits beside an idle slot.
    fn start_buffered(self: &Arc<Self>, permits: &mut Vec<OwnedSemaphorePermit>) {
        let mut started = false;
        {
            let mut buffer = self.buffer();
            if self.stop.is_cancelled() {
                return;
            }
            let mut executors = None;
            while !buffer.is_empty() {
                let permit = match permits.pop() {
                    Some(permit) => permit,
                    None => match self.slots.clone().try_acquire_owned() {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                };
                let Some(next) = buffer.pop_front() else {
                    break;
                };
                // Lock order: the buffer, then the executors (nowhere the other way round).
                let executors = executors.get_or_insert_with(|| {
                    self.executors
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner())
                });
                executors.spawn(execute(self.clone(), next.job, Some(permit)));
                started = true;
            }
        }
        if started {
            self.drained.notify_one();
        }
    }

    /// Gives a finished job's slot back and starts the next buffered job on it, if any.
    fn slot_freed(self: &Arc<Self>, permit: Option<OwnedSemaphorePermit>) {
        self.finished.fetch_add(1, Ordering::Relaxed);
        // Given back first, then taken again: see `start_buffered`.
        drop(permit);
        self.start_buffered(&mut Vec::new());
    }

    /// When the oldest buffered job is due to go back, if any.
    fn next_due(&self) -> Option<tokio::time::Instant> {
        self.buffer()
            .front()
            .map(|oldest| tokio::time::Instant::from_std(oldest.claimed + self.max_wait))
    }

    /// Takes buffered jobs out: those that waited longer than `max_wait`, or all of them.
    fn take_buffered(&self, all: bool) -> Vec<LeaseRef> {
        let mut buffer = self.buffer();
        let mut taken = Vec::new();
        while let Some(front) = buffer.front() {
            if !all && front.claimed.elapsed() < self.max_wait {
                break;
            }
            if let Some(stale) = buffer.pop_front() {
                if let Some(lease) = &stale.job.lease {
                    taken.push(LeaseRef {
                        id: stale.job.id,
                        lease_token: lease.token,
                    });
                }
            }
        }
        taken
    }

    /// Hands claimed jobs that never started back to the queue (available at once, the
    /// attempt not counted).
    async fn hand_back(&self, leases: Vec<LeaseRef>, why: &str) {
        if leases.is_empty() {
            return;
        }
        let count = leases.len();
        match contained(self.shared.store.jobs_release_many(leases)).await {
            Ok(released) => tracing::debug!(queue = %self.queue, released, why,
                "handed prefetched jobs back"),
            Err(error) => tracing::warn!(%error, queue = %self.queue, jobs = count, why,
                "could not hand prefetched jobs back; their leases will expire and they will be rescued"),
        }
    }
}

/// How many jobs a lane should keep prefetched: what its slots take during one fetch.
struct Demand {
    /// Jobs per second giving their slot back (moving average).
    rate: f64,
    /// Seconds one fetch takes (moving average).
    latency: f64,
    rate_known: bool,
    latency_known: bool,
    sampled_at: Instant,
    finished_then: u64,
}

impl Demand {
    fn new() -> Self {
        Self {
            rate: 0.0,
            latency: 0.0,
            rate_known: false,
            latency_known: false,
            sampled_at: Instant::now(),
            finished_then: 0,
        }
    }

    fn sample_rate(&mut self, finished: u64) {
        let elapsed = self.sampled_at.elapsed();
        if elapsed < RATE_SAMPLE {
            return;
        }
        let rate = finished.saturating_sub(self.finished_then) as f64 / elapsed.as_secs_f64();
        // The first sample is taken as it is: averaging it with "nothing known" would hold
        // the buffer back for several samples while a burst starts.
        self.rate = if self.rate_known {
            0.5 * self.rate + 0.5 * rate
        } else {
            rate
        };
        self.rate_known = true;
        self.sampled_at = Instant::now();
        self.finished_then = finished;
    }

    fn sample_latency(&mut self, took: Duration) {
        if took <= LATENCY_SAMPLE_MAX {
            let took = took.as_secs_f64();
            self.latency = if self.latency_known {
                0.7 * self.latency + 0.3 * took
            } else {
                took
            };
            self.latency_known = true;
        }
    }

    /// Little's law with `PREFETCH_HEADROOM`, within `cap`. Jobs that run longer than a few
    /// fetch latencies give less than one: nothing is prefetched for them.
    fn target(&self, cap: usize) -> usize {
        let want = PREFETCH_HEADROOM * self.rate * self.latency;
        if want.is_finite() && want >= 1.0 {
            (want as usize).min(cap)
        } else {
            0
        }
    }
}

fn take_free_permits(slots: &Arc<Semaphore>, permits: &mut Vec<OwnedSemaphorePermit>) {
    while permits.len() < MAX_FETCH_BATCH {
        match slots.clone().try_acquire_owned() {
            Ok(permit) => permits.push(permit),
            Err(_) => break,
        }
    }
}

/// One queue's fetch loop; when it stops, it hands back every job still prefetched.
async fn run_fetcher(lane: Arc<Lane>, poll: Duration) {
    fetch_loop(&lane, poll).await;
    // `stop` is cancelled, so no executor takes from the buffer any more.
    let leftover = lane.take_buffered(true);
    lane.hand_back(leftover, "shutdown").await;
}

async fn fetch_loop(lane: &Arc<Lane>, poll: Duration) {
    let mut error_backoff = Duration::from_millis(100);
    let mut busy = false;
    // Whether the last fetch got all it asked for: only then is it worth fetching ahead.
    let mut more_waiting = false;
    let mut demand = Demand::new();
    loop {
        if lane.stop.is_cancelled() {
            return;
        }
        let stale = lane.take_buffered(false);
        lane.hand_back(stale, "not started in time").await;
        demand.sample_rate(lane.finished.load(Ordering::Relaxed));
        let target = if more_waiting {
            demand.target(lane.prefetch)
        } else {
            0
        };
        let buffered = lane.buffer().len();
        // Refill once the buffer is down to half the target, so each fetch brings a batch
        // rather than one job per job started.
        if let Some(due) = lane.next_due().filter(|_| buffered > target / 2) {
            // Enough prefetched: executors start it as slots free up. Look again when one
            // starts, or when the oldest is due to go back.
            tokio::select! {
                _ = lane.stop.cancelled() => return,
                _ = lane.drained.notified() => {}
                _ = tokio::time::sleep_until(due) => {}
            }
            continue;
        }
        // Slots free up only while the buffer is empty (executors start buffered jobs on the
        // slots they free), so permits are for the buffer-empty case.
        let mut permits: Vec<OwnedSemaphorePermit> = Vec::new();
        if buffered == 0 && target > 0 {
            take_free_permits(&lane.slots, &mut permits);
        } else if buffered == 0 {
            let first = tokio::select! {
                _ = lane.stop.cancelled() => return,
                permit = lane.slots.clone().acquire_owned() => match permit {
                    Ok(permit) => permit,
                    Err(_) => return,
                },
            };
            permits.push(first);
            take_free_permits(&lane.slots, &mut permits);
            // Under load slots free up one by one; fetching for each alone would cost a commit
            // per job. When the last fetch found work, wait a moment for a quarter of the slots
            // so each fetch claims a batch. An idle worker (all slots free) fetches at once.
            let batch_target = (lane.concurrency / 4).clamp(1, MAX_FETCH_BATCH);
            if busy && permits.len() < batch_target {
                let gather = async {
                    while permits.len() < batch_target {
                        match lane.slots.clone().acquire_owned().await {
                            Ok(permit) => permits.push(permit),
                            Err(_) => break,
                        }
                    }
                };
                let _ = tokio::time::timeout(FETCH_GATHER_WAIT, gather).await;
                take_free_permits(&lane.slots, &mut permits);
            }
        }
        let room = target.saturating_sub(buffered);
        let max = (permits.len() + room).clamp(1, MAX_FETCH_BATCH);
        let params = FetchParams {
            worker_id: lane.shared.id.clone(),
            queues: vec![lane.queue.clone()],
            max,
            lease: lane.shared.lease,
            // Any kind: one without a handler fails as `unknown_kind`, visibly, rather than
            // waiting unclaimed.
            kinds: None,
        };
        // Long-poll only for free slots; fetching ahead asks once and moves on.
        let wait = if permits.is_empty() {
            Duration::ZERO
        } else {
            Duration::from_secs(30)
        };
        let asked = Instant::now();
        let fetched = contained(async {
            conveyor_core::faults::inject("worker_fetch")?;
            fetch_waiting(
                lane.shared.store.as_ref(),
                params,
                wait,
                poll,
                lane.stop.cancelled(),
            )
            .await
        })
        .await;
        let jobs = match fetched {
            Ok(jobs) => {
                error_backoff = Duration::from_millis(100);
                busy = !jobs.is_empty();
                more_waiting = jobs.len() >= max;
                if !jobs.is_empty() {
                    demand.sample_latency(asked.elapsed());
                }
                jobs
            }
            Err(error) => {
                tracing::error!(%error, queue = %lane.queue, retry_in = ?error_backoff, "fetch failed");
                more_waiting = false;
                drop(permits);
                // Back off, but still hand back buffered jobs on time (their leases run).
                let until = tokio::time::Instant::now() + error_backoff;
                loop {
                    let wake = lane.next_due().map_or(until, |due| due.min(until));
                    tokio::select! {
                        _ = lane.stop.cancelled() => return,
                        _ = tokio::time::sleep_until(wake) => {}
                    }
                    let stale = lane.take_buffered(false);
                    lane.hand_back(stale, "not started in time").await;
                    if tokio::time::Instant::now() >= until {
                        break;
                    }
                }
                error_backoff = (error_backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        if lane.stop.is_cancelled() && !jobs.is_empty() {
            // Claimed by a fetch that was in flight when shutdown began: hand them straight
            // back rather than start new work while draining.
            let leases: Vec<LeaseRef> = jobs.iter().filter_map(Job::lease_ref).collect();
            if let Err(error) = lane.shared.store.jobs_release_many(leases).await {
                tracing::warn!(%error, "could not release jobs fetched during shutdown; they will be rescued");
            }
            return;
        }
        let mut ahead = Vec::new();
        {
            let mut executors = lane.executors.lock().unwrap_or_else(|p| p.into_inner());
            for job in jobs {
                match permits.pop() {
                    Some(permit) => {
                        executors.spawn(execute(lane.clone(), job, Some(permit)));
                    }
                    // Fetched ahead (or more than asked for): it waits for a slot.
                    None => ahead.push(job),
                }
            }
            // Reap finished executors so the set does not grow without bound.
            while executors.try_join_next().is_some() {}
        }
        drop(permits);
        if !ahead.is_empty() {
            let claimed = Instant::now();
            lane.buffer()
                .extend(ahead.into_iter().map(|job| Prefetched { job, claimed }));
        }
        // Slots may have freed up while the fetch was out.
        lane.start_buffered(&mut Vec::new());
    }
}

/// How one attempt ended, from the runtime's point of view.
enum Attempt {
    Handler(Outcome),
    Failed(RuntimeFailure),
    /// Shutdown or a lost lease: the handler was dropped; someone else settles the job.
    Interrupted,
}

async fn execute(lane: Arc<Lane>, job: Job, permit: Option<OwnedSemaphorePermit>) {
    let shared = lane.shared.clone();
    let Some(lease) = job.lease.as_ref() else {
        tracing::error!(job_id = %job.id, "fetched job has no lease; skipping");
        lane.slot_freed(permit);
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
    lane.slot_freed(permit);

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
            let _ = lane.completions.send(Completion {
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

#[cfg(test)]
mod prefetch_tests {
    use super::*;
    use conveyor_core::{JobState, NewJob};
    use conveyor_sqlite::{SqliteOptions, SqliteStore};
    use std::sync::atomic::AtomicUsize;

    fn store(dir: &tempfile::TempDir) -> Arc<dyn Store> {
        Arc::new(
            SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
                .expect("open store"),
        )
    }

    async fn insert(store: &Arc<dyn Store>, count: usize) -> Vec<Uuid> {
        let jobs = (0..count)
            .map(|n| NewJob::new("quick", serde_json::json!({ "n": n })))
            .collect();
        store
            .jobs_insert_many(jobs)
            .await
            .expect("insert")
            .into_iter()
            .map(|inserted| inserted.job.id)
            .collect()
    }

    #[test]
    fn the_buffer_covers_a_few_fetches_of_short_jobs_and_nothing_of_long_ones() {
        let mut demand = Demand::new();
        // 20,000 jobs/s leaving, 0.5 ms per fetch: 10 jobs per fetch, four fetches' worth.
        demand.rate = 20_000.0;
        demand.latency = 0.0005;
        assert_eq!(demand.target(100), 40);
        assert_eq!(demand.target(25), 25, "never above the bound");
        assert_eq!(demand.target(0), 0, "prefetch 0 turns it off");
        // 100 jobs/s (10 ms jobs on one slot): a fifth of a job per four fetches.
        demand.rate = 100.0;
        assert_eq!(demand.target(100), 0);
        demand.rate = f64::NAN;
        assert_eq!(demand.target(100), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn short_jobs_never_exceed_the_concurrency_and_shutdown_hands_prefetched_ones_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir);
        let ids = insert(&store, 3000).await;
        let (running, peak, handled) = (
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
            Arc::new(AtomicUsize::new(0)),
        );
        let halfway = Arc::new(tokio::sync::Notify::new());
        let (r, p, h, half) = (
            running.clone(),
            peak.clone(),
            handled.clone(),
            halfway.clone(),
        );
        let worker = Worker::builder(store.clone())
            .queue("default", 3)
            .handle_json("quick", move |_, _| {
                let (r, p, h, half) = (r.clone(), p.clone(), h.clone(), half.clone());
                async move {
                    let now = r.fetch_add(1, Ordering::SeqCst) + 1;
                    p.fetch_max(now, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    r.fetch_sub(1, Ordering::SeqCst);
                    if h.fetch_add(1, Ordering::SeqCst) + 1 == 1500 {
                        half.notify_one();
                    }
                    Outcome::ok()
                }
            })
            .build()
            .expect("worker");
        let report = worker.run(async move { halfway.notified().await }).await;
        assert_eq!(report.released, 0);
        assert!(peak.load(Ordering::SeqCst) <= 3, "ran more than 3 at once");
        let (mut completed, mut available) = (0, 0);
        for id in ids {
            let job = store.job_get(id).await.expect("get").expect("job");
            match job.state {
                JobState::Completed => completed += 1,
                JobState::Available => {
                    assert_eq!(job.attempt, 0, "a handed-back job's attempt is not counted");
                    available += 1;
                }
                other => panic!("job {id} left {other:?} after shutdown"),
            }
        }
        assert_eq!(completed + available, 3000);
        assert!(completed >= 1500);
        assert_eq!(completed, handled.load(Ordering::SeqCst));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn prefetched_jobs_not_started_in_time_go_back_to_the_queue() {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = store(&dir);
        insert(&store, 3).await;
        let worker = Worker::builder(store.clone())
            .queue("default", 1)
            .build()
            .expect("worker");
        let (completions, _rx) = mpsc::unbounded_channel();
        let lane = Lane {
            shared: worker.shared.clone(),
            queue: "default".to_string(),
            slots: Arc::new(Semaphore::new(1)),
            concurrency: 1,
            prefetch: 10,
            max_wait: Duration::from_millis(50),
            buffer: Mutex::new(VecDeque::new()),
            drained: tokio::sync::Notify::new(),
            finished: AtomicU64::new(0),
            stop: CancellationToken::new(),
            executors: Arc::new(Mutex::new(JoinSet::new())),
            completions,
        };
        let fetch = |max| FetchParams {
            worker_id: "test".to_string(),
            queues: vec!["default".to_string()],
            max,
            lease: Duration::from_secs(30),
            kinds: None,
        };
        let old = store.jobs_fetch(fetch(2)).await.expect("fetch");
        let claimed = Instant::now();
        lane.buffer()
            .extend(old.iter().cloned().map(|job| Prefetched { job, claimed }));
        tokio::time::sleep(Duration::from_millis(100)).await;
        let fresh = store.jobs_fetch(fetch(1)).await.expect("fetch");
        lane.buffer()
            .extend(fresh.iter().cloned().map(|job| Prefetched {
                job,
                claimed: Instant::now(),
            }));
        let stale = lane.take_buffered(false);
        assert_eq!(stale.len(), 2, "only the two that waited past max_wait");
        lane.hand_back(stale, "test").await;
        for job in &old {
            let back = store.job_get(job.id).await.expect("get").expect("job");
            assert_eq!(back.state, JobState::Available);
            assert_eq!(back.attempt, 0);
        }
        let kept = store.job_get(fresh[0].id).await.expect("get").expect("job");
        assert_eq!(kept.state, JobState::Running);
        assert_eq!(lane.take_buffered(true).len(), 1);
    }
}
