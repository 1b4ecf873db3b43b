//! `GET /metrics`: Prometheus text exposition.
//!
//! Two kinds of series, counted in two ways:
//! - **Counters and the duration histogram** (`conveyor_jobs_processed_total`, `conveyor_jobs_retried_total`,
//!   `conveyor_job_duration_seconds`) count attempt outcomes this process wrote to the store: those HTTP
//!   workers report to this server (complete, fail, snooze), and those of in-process workers
//!   given these metrics as their [`JobObserver`]. Each outcome is written by exactly one
//!   process, so summing a counter over every server gives the cluster's total.
//! - **Gauges** (`conveyor_queue_depth`, `conveyor_queue_oldest_age_seconds`, `conveyor_dead_jobs`, `conveyor_worker_utilization`,
//!   `conveyor_workers_alive`, `conveyor_stuck_jobs`, `conveyor_limit_in_use`) describe the
//!   whole store, read at scrape time (cached for [`SNAPSHOT_TTL`], so frequent scrapes cost
//!   one set of reads a second). Every server reports
//!   the same values: aggregate them with `max`, not `sum`.

use conveyor_core::limits::LimitSpec;
use conveyor_core::scaling::ThroughputMeter;
use conveyor_core::{
    AttemptEvent, AttemptStatus, Clock, JobObserver, JobState, QueueStats, Store, StoreResult,
    StuckJob, StuckParams, SystemClock, WorkerInfo, WorkerState,
};
use conveyor_engine::StatsRecorder;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Series also exposed under their names before the `conveyor_` prefix, for one release, so
/// dashboards and alerts built on them keep working while they move (their HELP says so).
pub const DEPRECATED_NAMES: &[&str] = &[
    "jobs_processed_total",
    "jobs_retried_total",
    "job_duration_seconds",
    "queue_depth",
    "queue_oldest_age_seconds",
    "dead_jobs",
    "worker_utilization",
    "workers_alive",
    "stuck_jobs",
    "queue_desired_workers",
];

/// How long the store-wide gauges are reused before being read again.
pub const SNAPSHOT_TTL: Duration = Duration::from_secs(1);

/// The `Content-Type` of the text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Buckets of `conveyor_job_duration_seconds`: from 5 ms to an hour, as background jobs range widely.
const DURATION_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("metrics registry: {0}")]
    Registry(#[from] prometheus::Error),
}

/// What the store-wide gauges are computed from.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    pub queues: Vec<QueueStats>,
    pub workers: Vec<WorkerInfo>,
    pub stuck: Vec<StuckJob>,
    /// Circuit breakers as stored (see `conveyor_core::breaker`).
    pub breakers: Vec<conveyor_core::StoredBreaker>,
    /// Running jobs under each named limit, over all its keys, by limit name.
    pub limits_in_use: BTreeMap<String, u64>,
}

impl Snapshot {
    /// Reads the queues, the worker registry and the stuck jobs.
    pub async fn read(store: &dyn Store, stuck: &StuckParams) -> StoreResult<Self> {
        Ok(Self {
            queues: store.queues_stats().await?,
            workers: store.workers_list().await?,
            stuck: store.jobs_stuck(stuck.clone()).await?,
            breakers: store.breakers_list().await?,
            limits_in_use: limits_in_use(store).await?,
        })
    }
}

/// Running jobs under each named limit (see `conveyor_core::limits::named`). A stored limit
/// that no longer reads as one is left out here; `GET /v1/limits/{name}` reports it.
async fn limits_in_use(store: &dyn Store) -> StoreResult<BTreeMap<String, u64>> {
    let mut in_use = BTreeMap::new();
    for entry in store.config_list(conveyor_core::config::LIMITS).await? {
        let Ok(spec) = LimitSpec::from_json(&entry.name, entry.document) else {
            continue;
        };
        let usage = store
            .limit_usage(&spec.name, spec.rate.map(|rate| rate.period_ms))
            .await?;
        in_use.insert(spec.name, crate::limits::in_use(&usage));
    }
    Ok(in_use)
}

/// The process's metrics. Cheap to share (`Arc`); implements [`JobObserver`] for in-process
/// workers.
pub struct Metrics {
    registry: Registry,
    processed: IntCounterVec,
    retried: IntCounterVec,
    duration: HistogramVec,
    queue_depth: IntGaugeVec,
    desired_workers: IntGaugeVec,
    /// Each queue's throughput from successive snapshots, and the target the gauge uses.
    meter: Arc<std::sync::Mutex<ThroughputMeter>>,
    scale_target_s: std::sync::Mutex<f64>,
    oldest_age: GaugeVec,
    dead_jobs: IntGaugeVec,
    utilization: GaugeVec,
    workers_alive: IntGauge,
    stuck_jobs: IntGaugeVec,
    breaker_state: IntGaugeVec,
    limit_in_use: IntGaugeVec,
    limit_throttled: IntCounterVec,
    /// The totals `limit_throttled` last caught up with (the counts live in core).
    throttled_seen: std::sync::Mutex<BTreeMap<String, u64>>,
    enqueued: IntCounterVec,
    queue_wait: HistogramVec,
    pruned: IntCounterVec,
    /// When the gauges were last read from the store; the lock also makes concurrent scrapes
    /// wait for one read instead of each reading.
    refreshed: Mutex<Option<Instant>>,
    /// The same events, per minute, for the history kept in the store (`GET /v1/stats`).
    history: Arc<StatsRecorder>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    pub fn new() -> Result<Self, MetricsError> {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// Like [`Metrics::new`], with the history's minutes read from `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let processed = IntCounterVec::new(
            Opts::new(
                "conveyor_jobs_processed_total",
                "Attempts that ended, by outcome (completed, failed: will retry, dead, snoozed), \
                 as written by this process",
            ),
            &["queue", "kind", "status"],
        )?;
        let retried = IntCounterVec::new(
            Opts::new(
                "conveyor_jobs_retried_total",
                "Failed attempts that scheduled a retry, as written by this process",
            ),
            &["queue", "kind"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "conveyor_job_duration_seconds",
                "Time from an attempt's start to its completion or failure",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
            &["queue", "kind"],
        )?;
        let queue_depth = IntGaugeVec::new(
            Opts::new(
                "conveyor_queue_depth",
                "Jobs per queue and state (store-wide)",
            ),
            &["queue", "state"],
        )?;
        let oldest_age = GaugeVec::new(
            Opts::new(
                "conveyor_queue_oldest_age_seconds",
                "How long the oldest available job of the queue has waited (store-wide)",
            ),
            &["queue"],
        )?;
        let dead_jobs = IntGaugeVec::new(
            Opts::new(
                "conveyor_dead_jobs",
                "Jobs in the dead-letter queue (store-wide)",
            ),
            &["queue"],
        )?;
        let utilization = GaugeVec::new(
            Opts::new(
                "conveyor_worker_utilization",
                "Busy slots over all slots of the live workers serving the queue (a worker's \
                 slots count for every queue it serves)",
            ),
            &["queue"],
        )?;
        let workers_alive =
            IntGauge::new("conveyor_workers_alive", "Registered workers heartbeating")?;
        let stuck_jobs = IntGaugeVec::new(
            Opts::new(
                "conveyor_stuck_jobs",
                "Running jobs past their stuck threshold (see GET /v1/jobs/stuck)",
            ),
            &["queue"],
        )?;
        registry.register(Box::new(processed.clone()))?;
        registry.register(Box::new(retried.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        registry.register(Box::new(queue_depth.clone()))?;
        let desired_workers = IntGaugeVec::new(
            Opts::new(
                "conveyor_queue_desired_workers",
                "Workers that would work off the queue's backlog (available and running jobs) \
                 within the scale target at the measured rate per worker",
            ),
            &["queue"],
        )?;
        registry.register(Box::new(desired_workers.clone()))?;
        registry.register(Box::new(oldest_age.clone()))?;
        registry.register(Box::new(dead_jobs.clone()))?;
        registry.register(Box::new(utilization.clone()))?;
        registry.register(Box::new(workers_alive.clone()))?;
        registry.register(Box::new(stuck_jobs.clone()))?;
        let breaker_state = IntGaugeVec::new(
            Opts::new(
                "conveyor_circuit_breaker_state",
                "Each circuit breaker's state: 0 closed, 1 half-open (probing), 2 open \
                 (store-wide; scope is queue or kind)",
            ),
            &["scope", "name"],
        )?;
        registry.register(Box::new(breaker_state.clone()))?;
        let limit_in_use = IntGaugeVec::new(
            Opts::new(
                "conveyor_limit_in_use",
                "Running jobs under each named limit, over all its keys (store-wide; see GET \
                 /v1/limits/{name} for each key)",
            ),
            &["limit"],
        )?;
        registry.register(Box::new(limit_in_use.clone()))?;
        let limit_throttled = IntCounterVec::new(
            Opts::new(
                "conveyor_limit_throttled_total",
                "Candidate jobs a named limit held back from a claim in this process (a job \
                 passed over by several claims counts once per claim)",
            ),
            &["limit"],
        )?;
        registry.register(Box::new(limit_throttled.clone()))?;
        let enqueued = IntCounterVec::new(
            Opts::new(
                "conveyor_jobs_enqueued_total",
                "Jobs stored by enqueues through this process (duplicates of an idempotency or \
                 unique key not counted)",
            ),
            &["queue", "kind"],
        )?;
        registry.register(Box::new(enqueued.clone()))?;
        let queue_wait = HistogramVec::new(
            HistogramOpts::new(
                "conveyor_job_queue_wait_seconds",
                "Time from when a job could start (its run_at, or its enqueue) to when a worker \
                 was handed it, for the jobs this process handed out",
            )
            .buckets(DURATION_BUCKETS.to_vec()),
            &["queue", "kind"],
        )?;
        registry.register(Box::new(queue_wait.clone()))?;
        let pruned = IntCounterVec::new(
            Opts::new(
                "conveyor_maintenance_pruned_total",
                "Records deleted for retention by this process while it led maintenance, by \
                 record (jobs, flows, audit, stats)",
            ),
            &["record"],
        )?;
        registry.register(Box::new(pruned.clone()))?;
        let build_info = IntGaugeVec::new(
            Opts::new(
                "conveyor_build_info",
                "Always 1; the labels say which Conveyor serves (version)",
            ),
            &["version"],
        )?;
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        registry.register(Box::new(build_info))?;
        Ok(Self {
            enqueued,
            queue_wait,
            pruned,
            registry,
            processed,
            retried,
            duration,
            queue_depth,
            desired_workers,
            meter: Arc::default(),
            scale_target_s: std::sync::Mutex::new(conveyor_core::scaling::DEFAULT_TARGET_SECS),
            oldest_age,
            dead_jobs,
            utilization,
            workers_alive,
            stuck_jobs,
            breaker_state,
            limit_in_use,
            limit_throttled,
            throttled_seen: std::sync::Mutex::new(BTreeMap::new()),
            refreshed: Mutex::new(None),
            history: Arc::new(StatsRecorder::new(clock)),
        })
    }

    /// Counts records maintenance deleted for retention (`record`: jobs, flows, audit, stats).
    pub fn pruned(&self, record: &str, count: u64) {
        if count > 0 {
            self.pruned.with_label_values(&[record]).inc_by(count);
        }
    }

    /// The per-minute counts not yet flushed to the store (see `conveyor_core::stats`).
    pub fn history(&self) -> Arc<StatsRecorder> {
        self.history.clone()
    }

    /// Counts a job stored by an enqueue.
    pub fn enqueued(&self, queue: &str, kind: &str) {
        self.enqueued.with_label_values(&[queue, kind]).inc();
        self.history.enqueued(queue, kind);
    }

    /// Counts an attempt handed out and observes how long its job waited between becoming
    /// startable and being handed out.
    pub fn waited(&self, queue: &str, kind: &str, wait: Duration) {
        self.queue_wait
            .with_label_values(&[queue, kind])
            .observe(wait.as_secs_f64());
        self.history.started(queue, kind, wait);
    }

    /// Counts one ended attempt.
    pub fn record(&self, event: &AttemptEvent<'_>) {
        self.history.finished(event);
        self.processed
            .with_label_values(&[event.queue, event.kind, event.status.as_str()])
            .inc();
        if event.status == AttemptStatus::Failed {
            self.retried
                .with_label_values(&[event.queue, event.kind])
                .inc();
        }
        if event.status != AttemptStatus::Snoozed {
            self.duration
                .with_label_values(&[event.queue, event.kind])
                .observe(event.duration.as_secs_f64());
        }
    }

    /// Sets the store-wide gauges from `snapshot`. Series of queues that no longer appear are
    /// dropped.
    pub fn set_gauges(&self, snapshot: &Snapshot) {
        self.queue_depth.reset();
        self.desired_workers.reset();
        let target_s = self
            .scale_target_s
            .lock()
            .map_or(conveyor_core::scaling::DEFAULT_TARGET_SECS, |target| {
                *target
            });
        if let Ok(mut meter) = self.meter.lock() {
            meter.observe(&snapshot.queues, Instant::now());
            for queue in &snapshot.queues {
                let signal = meter.signal(queue, &snapshot.workers, target_s);
                self.desired_workers
                    .with_label_values(&[queue.name.as_str()])
                    .set(i64::from(signal.desired_workers));
            }
        }
        self.oldest_age.reset();
        self.dead_jobs.reset();
        self.utilization.reset();
        self.stuck_jobs.reset();
        for queue in &snapshot.queues {
            let name = queue.name.as_str();
            for state in JobState::ALL {
                let count = queue.count(state);
                self.queue_depth
                    .with_label_values(&[name, state.as_str()])
                    .set(gauge_int(count));
            }
            self.oldest_age
                .with_label_values(&[name])
                .set(queue.oldest_available_age_ms as f64 / 1000.0);
            self.dead_jobs
                .with_label_values(&[name])
                .set(gauge_int(queue.dead));
            self.stuck_jobs.with_label_values(&[name]).set(0);
        }
        for job in &snapshot.stuck {
            self.stuck_jobs.with_label_values(&[&job.queue]).inc();
        }
        self.breaker_state.reset();
        for breaker in &snapshot.breakers {
            self.breaker_state
                .with_label_values(&[breaker.scope.as_str(), breaker.name.as_str()])
                .set(breaker.record.state.gauge());
        }
        self.limit_in_use.reset();
        for (limit, running) in &snapshot.limits_in_use {
            self.limit_in_use
                .with_label_values(&[limit.as_str()])
                .set(gauge_int(*running));
        }

        let alive: Vec<&WorkerInfo> = snapshot
            .workers
            .iter()
            .filter(|w| w.state == WorkerState::Alive)
            .collect();
        self.workers_alive.set(alive.len() as i64);
        let mut slots: BTreeMap<&str, (u64, u64)> = BTreeMap::new();
        for worker in alive {
            for queue in &worker.queues {
                let entry = slots.entry(queue).or_default();
                entry.0 += u64::from(worker.busy);
                entry.1 += u64::from(worker.concurrency);
            }
        }
        for (queue, (busy, total)) in slots {
            if total > 0 {
                self.utilization
                    .with_label_values(&[queue])
                    .set(busy as f64 / total as f64);
            }
        }
    }

    /// The throughput meter the gauge reads, for the API's scaling signal to share (one set of
    /// readings per server).
    pub fn throughput(&self) -> Arc<std::sync::Mutex<ThroughputMeter>> {
        self.meter.clone()
    }

    /// The target `conveyor_queue_desired_workers` is computed for.
    pub fn set_scale_target(&self, target: Duration) {
        if let Ok(mut target_s) = self.scale_target_s.lock() {
            *target_s = target.as_secs_f64();
        }
    }

    /// The exposition text, with the gauges refreshed from `store` when older than
    /// [`SNAPSHOT_TTL`]. A store error leaves the previous gauges and is returned after the
    /// counters were still rendered (so a scrape during an outage keeps the counters).
    pub async fn render(&self, store: &dyn Store, stuck: &StuckParams) -> (String, Option<String>) {
        let mut problem = None;
        {
            let mut refreshed = self.refreshed.lock().await;
            if refreshed.is_none_or(|at| at.elapsed() >= SNAPSHOT_TTL) {
                match Snapshot::read(store, stuck).await {
                    Ok(snapshot) => {
                        self.set_gauges(&snapshot);
                        *refreshed = Some(Instant::now());
                    }
                    Err(error) => problem = Some(error.to_string()),
                }
            }
        }
        self.catch_up_throttled();
        (self.encode(), problem)
    }

    /// Brings `conveyor_limit_throttled_total` up to the counts this process's claims kept
    /// (in core, `named::throttled_totals`): cheap and local, so at every scrape.
    fn catch_up_throttled(&self) {
        if let Ok(mut seen) = self.throttled_seen.lock() {
            for (limit, total) in conveyor_core::limits::named::throttled_totals() {
                let before = seen.insert(limit.clone(), total).unwrap_or(0);
                self.limit_throttled
                    .with_label_values(&[limit.as_str()])
                    .inc_by(total.saturating_sub(before));
            }
        }
    }

    /// The exposition text of everything as it stands.
    pub fn encode(&self) -> String {
        let mut buffer = Vec::new();
        // Encoding into memory only fails on a malformed family, which the typed vectors above
        // cannot produce; an empty scrape is the safe answer if it ever does.
        let mut families = self.registry.gather();
        let aliases: Vec<_> = families
            .iter()
            .filter_map(|family| {
                let old = family.name().strip_prefix("conveyor_")?;
                DEPRECATED_NAMES.contains(&old).then(|| {
                    let mut alias = family.clone();
                    alias.set_name(old.to_string());
                    alias.set_help(format!(
                        "Deprecated: renamed {}; this name goes in the next release. {}",
                        family.name(),
                        family.help()
                    ));
                    alias
                })
            })
            .collect();
        families.extend(aliases);
        if let Err(error) = TextEncoder::new().encode(&families, &mut buffer) {
            tracing::error!(%error, "cannot encode metrics");
            return String::new();
        }
        String::from_utf8_lossy(&buffer).into_owned()
    }
}

impl JobObserver for Metrics {
    fn jobs_enqueued(&self, inserted: &[conveyor_core::Inserted]) {
        for one in inserted.iter().filter(|one| !one.duplicate) {
            self.enqueued(&one.job.queue, &one.job.kind);
        }
    }

    fn attempt_started(&self, job: &conveyor_core::Job) {
        if let Some(wait) = conveyor_core::events::queue_wait(job) {
            self.waited(&job.queue, &job.kind, wait);
        }
    }

    fn attempt_finished(&self, event: &AttemptEvent<'_>) {
        self.record(event);
    }
}

fn gauge_int(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_are_counted_by_status_and_retries_separately() {
        let metrics = Metrics::new().expect("metrics");
        for status in [
            AttemptStatus::Completed,
            AttemptStatus::Failed,
            AttemptStatus::Failed,
            AttemptStatus::Dead,
            AttemptStatus::Snoozed,
        ] {
            metrics.record(&AttemptEvent {
                queue: "q",
                kind: "k",
                status,
                duration: Duration::from_millis(20),
            });
        }
        let text = metrics.encode();
        assert!(text.contains(r#"jobs_processed_total{kind="k",queue="q",status="failed"} 2"#));
        assert!(text.contains(r#"jobs_retried_total{kind="k",queue="q"} 2"#));
        // Snoozes are not attempts that ran to an end: no duration.
        assert!(text.contains(r#"job_duration_seconds_count{kind="k",queue="q"} 4"#));
    }
}
