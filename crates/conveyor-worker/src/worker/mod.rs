//! The worker: fetch loops (`fetch`), executor (`job`), heartbeats, completer and registry
//! (`background`), the builder (`builder`) and graceful shutdown (here).

mod background;
mod backtraces;
mod builder;
mod fetch;
mod job;

pub(crate) use crate::contained::contained;
use background::{run_completer, run_heartbeats, run_registry};
pub use builder::WorkerBuilder;
use fetch::{run_batch_fetcher, run_fetcher, Lane};
use job::{execute, execute_batch};

use chrono::Utc;
use conveyor_core::{
    error_class, AttemptEvent, AttemptStatus, Clock, CompleteParams, FailParams, FetchParams,
    HeartbeatParams, Job, JobObserver, LeaseOutcome, LeaseRef, RetryPlan, RetryPolicy,
    SnoozeParams, Store, TypedJob, WorkerHeartbeat,
};
use conveyor_engine::{fetch_waiting_with, Gates};
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

use crate::handler::{
    BatchJob, ErasedBatchHandler, ErasedHandler, JobContext, Outcome, ProgressReporter, Registered,
    RegisteredBatch, RuntimeFailure,
};
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
/// Completion batches written at once. A batch's write is a few statements one after the other
/// on one connection (a flow's steps move in the same transaction as their jobs complete), so
/// with one write at a time the database works on one core for it while completions wait; a
/// second write overlaps with it. Jobs of one flow in both are serialized by the flow's lock.
const COMPLETION_WRITES_IN_FLIGHT: usize = 2;
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

struct RunningJob {
    lease_token: Uuid,
    cancel: CancellationToken,
}

struct Shared {
    store: Arc<dyn Store>,
    id: String,
    handlers: HashMap<String, Registered>,
    /// Kinds handled in batches (see `WorkerBuilder::handle_batch`).
    batch_handlers: HashMap<String, RegisteredBatch>,
    /// The kinds' settings: which kinds go out in batches.
    kinds: conveyor_engine::KindRegistry,
    lease: Duration,
    default_retry: RetryPolicy,
    running: Mutex<HashMap<Uuid, RunningJob>>,
    observer: Option<Arc<dyn JobObserver>>,
    /// Circuit breakers: gate the worker's fetches, count its outcomes.
    breakers: Arc<conveyor_engine::CircuitBreakers>,
    /// "Now" for the times the worker computes (a snooze's end, a retry-after's time).
    clock: Arc<dyn Clock>,
}

impl Shared {
    /// What this worker's fetches claim through: its breakers and the kinds' batch settings.
    fn gates(&self, batch: bool) -> Gates<'_> {
        Gates {
            breakers: Some(self.breakers.as_ref()),
            kinds: Some(&self.kinds),
            batch,
        }
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, RunningJob>> {
        // The map holds plain data; a panic elsewhere while holding it leaves it usable.
        self.running
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Tells the observer and the breakers that `job`'s attempt ended (see
    /// `conveyor_engine::report`).
    fn observe(
        &self,
        job: &JobMeta,
        status: AttemptStatus,
        retry_at: Option<chrono::DateTime<Utc>>,
    ) {
        let event = AttemptEvent {
            queue: &job.queue,
            kind: &job.kind,
            status,
            duration: job.duration,
        };
        conveyor_engine::report::attempt_finished(
            self.observer.as_deref(),
            &self.breakers,
            &event,
            retry_at,
        );
    }
}

/// What the completer needs to log and count a completion it writes.
struct JobMeta {
    id: Uuid,
    queue: String,
    kind: String,
    attempt: u32,
    duration: Duration,
    /// The producer's trace id, empty without a trace context: every log line of the job
    /// carries it beside `job_id`.
    trace_id: String,
}

struct Completion {
    params: CompleteParams,
    job: JobMeta,
}

pub struct Worker {
    shared: Arc<Shared>,
    queues: Vec<(String, usize)>,
    /// Cancelled when shutdown begins: fetch loops stop for good.
    stop_fetching: CancellationToken,
    /// Cancelled the first time an operator tells the worker to quiet (see `drain_started`).
    quieted: CancellationToken,
    drain_timeout: Duration,
    poll: Duration,
    prefetch: usize,
    maintenance: Option<Maintenance>,
    registry_interval: Option<Duration>,
}

impl Worker {
    pub fn builder(store: Arc<dyn Store>) -> WorkerBuilder {
        WorkerBuilder {
            clock: store.clock(),
            store,
            id: crate::default_worker_id(),
            queues: Vec::new(),
            handlers: HashMap::new(),
            batch_handlers: HashMap::new(),
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

    /// Resolves once this worker has stopped fetching (it began shutting down, or an operator
    /// told it to quiet): nothing enqueued after that is claimed by it. For readiness probes
    /// and for tests that need the moment.
    pub fn drain_started(&self) -> impl Future<Output = ()> + Send + 'static {
        let (stopping, quieted) = (self.stop_fetching.clone(), self.quieted.clone());
        async move {
            tokio::select! {
                _ = stopping.cancelled() => {}
                _ = quieted.cancelled() => {}
            }
        }
    }

    /// One fetch loop per queue, each ending when `stop` is cancelled (and handing back what
    /// it holds prefetched then).
    /// `slots` (one semaphore per queue) outlive a quiet, so jobs still running from before it
    /// count against the concurrency of the fetchers started on `resume`.
    fn start_fetchers(
        &self,
        stop: &CancellationToken,
        slots: &[Arc<Semaphore>],
        batch_slots: &[Arc<Semaphore>],
        executors: &Arc<Mutex<JoinSet<()>>>,
        completions: &mpsc::UnboundedSender<Completion>,
    ) -> JoinSet<()> {
        let mut fetchers = JoinSet::new();
        for (((queue, concurrency), slots), batch_slots) in
            self.queues.iter().zip(slots).zip(batch_slots)
        {
            let lane = Arc::new(Lane {
                shared: self.shared.clone(),
                queue: queue.clone(),
                slots: slots.clone(),
                batch_slots: batch_slots.clone(),
                concurrency: *concurrency,
                prefetch: self.prefetch,
                max_wait: PREFETCH_MAX_WAIT.min(self.shared.lease / 3),
                buffer: Mutex::new(VecDeque::new()),
                drained: tokio::sync::Notify::new(),
                finished: AtomicU64::new(0),
                stop: stop.clone(),
                executors: executors.clone(),
                completions: completions.clone(),
            });
            if !self.shared.batch_handlers.is_empty() {
                fetchers.spawn(run_batch_fetcher(lane.clone(), self.poll));
            }
            // The fetch loop hands back whatever it still holds prefetched when it stops.
            fetchers.spawn(run_fetcher(lane, self.poll));
        }
        fetchers
    }

    /// Runs until `shutdown` resolves, then drains and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> ShutdownReport {
        let stop_fetching = self.stop_fetching.clone();
        let stop_background = CancellationToken::new();
        let told_to_stop = CancellationToken::new();
        // Whether an operator keeps this worker quiet: its fetch loops end while it does, and
        // start again on `resume`.
        let (quiet_tx, mut quiet) = tokio::sync::watch::channel(false);
        let (completions, completion_rx) = mpsc::unbounded_channel();
        let completer = tokio::spawn(run_completer(self.shared.clone(), completion_rx));
        let heartbeat = tokio::spawn(run_heartbeats(self.shared.clone(), stop_background.clone()));
        let registry = self.registry_interval.map(|interval| {
            tokio::spawn(run_registry(
                self.shared.clone(),
                self.queues.clone(),
                interval,
                stop_background.clone(),
                background::Obey {
                    quiet: quiet_tx,
                    stop: told_to_stop.clone(),
                },
            ))
        });
        let maintenance = self
            .maintenance
            .clone()
            .map(|m| tokio::spawn(m.run(stop_background.clone())));

        let executors = Arc::new(Mutex::new(JoinSet::new()));
        // Each run of fetching (until a quiet, or shutdown) has a token of its own.
        let mut fetching = stop_fetching.child_token();
        let slots: Vec<Arc<Semaphore>> = self
            .queues
            .iter()
            .map(|(_, concurrency)| Arc::new(Semaphore::new(*concurrency)))
            .collect();
        // Batches run on slots of their own (as many per queue as its concurrency): a plain
        // fetch loop long-polls holding its free slots, which would leave a batch none.
        let batch_slots: Vec<Arc<Semaphore>> = self
            .queues
            .iter()
            .map(|(_, concurrency)| Arc::new(Semaphore::new(*concurrency)))
            .collect();
        let mut fetchers =
            self.start_fetchers(&fetching, &slots, &batch_slots, &executors, &completions);
        tracing::info!(worker_id = %self.shared.id, queues = ?self.queues, "worker started");

        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = told_to_stop.cancelled() => break,
                changed = quiet.changed() => {
                    if changed.is_err() {
                        // No registry any more (it ends only at shutdown): nothing to obey.
                        tokio::select! {
                            _ = &mut shutdown => {}
                            _ = told_to_stop.cancelled() => {}
                        }
                        break;
                    }
                    let quiet_now = *quiet.borrow_and_update();
                    if quiet_now && !fetching.is_cancelled() {
                        fetching.cancel();
                        while fetchers.join_next().await.is_some() {}
                        self.quieted.cancel();
                    } else if !quiet_now && fetching.is_cancelled() {
                        tracing::info!(worker_id = %self.shared.id, "resumed: fetching again");
                        fetching = stop_fetching.child_token();
                        fetchers =
                            self.start_fetchers(
                                &fetching,
                                &slots,
                                &batch_slots,
                                &executors,
                                &completions,
                            );
                    }
                }
            }
        }
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
