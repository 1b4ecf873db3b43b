//! The cron scheduler: fires due schedule ticks (see `conveyor_core::schedule`).
//!
//! Each pass lists the schedules, plans each at the clock's now and fires what is due with
//! [`conveyor_core::ScheduleStore::schedule_fire`], which records a tick once however many nodes try:
//! a node that lost the race gets `Conflict` and moves on. Passes run every `interval`, and
//! sooner when a tick comes due first, so a per-second schedule fires within milliseconds of
//! each tick. [`crate::Maintenance`] runs one while its node leads, so normally a single node
//! fires; the store's check keeps a brief overlap of two leaders harmless.

use chrono::{DateTime, Utc};
use conveyor_core::schedule::DEFAULT_MISFIRE_THRESHOLD;
use conveyor_core::{Clock, FireOutcome, FireRequest, ScheduleRun, Store, StoreResult};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The shortest misfire threshold accepted: passes are a few hundred milliseconds apart, and a
/// shorter threshold would count ticks as missed while the scheduler runs normally.
const MIN_MISFIRE_THRESHOLD: Duration = Duration::from_secs(1);
/// The longest wait between passes while the store keeps failing.
const MAX_ERROR_BACKOFF: Duration = Duration::from_secs(5);

/// What [`Scheduler::on_pass`] is told of each pass with.
type PassObserver = Arc<dyn Fn(&SchedulerPass) + Send + Sync>;

/// Fires due cron schedule ticks. Cheap to clone.
#[derive(Clone)]
pub struct Scheduler {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    interval: Duration,
    misfire: Duration,
    /// Told of every pass that listed the schedules (metrics count the jobs it enqueued).
    on_pass: Option<PassObserver>,
}

/// What one pass did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SchedulerPass {
    /// Runs recorded by this pass, oldest tick first per schedule.
    pub runs: Vec<ScheduleRun>,
    /// Schedules another node fired (or that changed) between reading and firing.
    pub conflicts: usize,
    /// The earliest upcoming tick of any schedule.
    pub next_tick: Option<DateTime<Utc>>,
    /// The queue and kind of each job the pass enqueued (one per run that enqueued).
    pub enqueued: Vec<(String, String)>,
}

impl Scheduler {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            // Ticks are planned on the store's clock, which every node sharing it agrees on.
            clock: store.clock(),
            store,
            interval: Duration::from_millis(250),
            misfire: DEFAULT_MISFIRE_THRESHOLD,
            on_pass: None,
        }
    }

    /// Calls `observe` after every pass that could list the schedules: how the server's
    /// metrics and history count the jobs schedules enqueue.
    pub fn on_pass(mut self, observe: impl Fn(&SchedulerPass) + Send + Sync + 'static) -> Self {
        self.on_pass = Some(Arc::new(observe));
        self
    }

    /// Where "now" comes from; the store's clock by default ([`conveyor_core::JobStore::clock`]).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The longest wait between passes (default 250 ms); passes also run when a tick is due.
    /// Bounds how late a tick fires after a schedule is created or changed by another node.
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(1));
        self
    }

    /// How late a tick may fire and still count as on time (default 5 s, at least 1 s). Older
    /// due ticks were missed (downtime, a leader failover) and follow the schedule's `missed`
    /// policy.
    pub fn misfire_threshold(mut self, threshold: Duration) -> Self {
        self.misfire = threshold.max(MIN_MISFIRE_THRESHOLD);
        self
    }

    /// One pass over every schedule. A schedule whose firing fails is logged and left for the
    /// next pass; only failing to list the schedules is an error.
    pub async fn run_once(&self) -> StoreResult<SchedulerPass> {
        let mut pass = SchedulerPass::default();
        for view in self.store.schedules_list().await? {
            let now = self.clock.now();
            let plan = view.schedule.plan(view.due_after, now, self.misfire);
            pass.next_tick = match (pass.next_tick, plan.next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let Some(request) = FireRequest::from_plan(&view, &plan) else {
                continue;
            };
            let name = view.schedule.name();
            if plan.dropped > 0 {
                tracing::warn!(
                    schedule = name,
                    dropped = plan.dropped,
                    caught_up = plan.fire.iter().filter(|t| t.catch_up).count(),
                    "ticks were missed while no scheduler ran"
                );
            }
            match self.store.schedule_fire(request).await {
                Ok(FireOutcome::Fired(runs)) => {
                    let job = view.schedule.job();
                    for run in &runs {
                        if run.status == conveyor_core::schedule::RunStatus::Enqueued {
                            pass.enqueued.push((job.queue.clone(), job.kind.clone()));
                        }
                        tracing::debug!(
                            schedule = name,
                            tick = %run.tick,
                            status = run.status.as_str(),
                            job_id = ?run.job_id,
                            "schedule fired"
                        );
                    }
                    pass.runs.extend(runs);
                }
                Ok(FireOutcome::Conflict) => pass.conflicts += 1,
                Err(error) => {
                    tracing::error!(schedule = name, %error, "firing a schedule failed; will retry");
                }
            }
        }
        Ok(pass)
    }

    /// Runs passes until `stop` is cancelled, on every node that calls it (the store still
    /// fires each tick once). [`crate::Maintenance`] instead runs it only while leading.
    pub async fn run(self, stop: CancellationToken) {
        self.run_while(stop, Arc::new(AtomicBool::new(true))).await;
    }

    /// Runs passes while `active` is true (checked every interval) until `stop` is cancelled.
    pub(crate) async fn run_while(self, stop: CancellationToken, active: Arc<AtomicBool>) {
        let mut failures: u32 = 0;
        loop {
            let mut wait = self.interval;
            if active.load(Ordering::Relaxed) {
                match self.run_once().await {
                    Ok(pass) => {
                        if let Some(observe) = &self.on_pass {
                            observe(&pass);
                        }
                        failures = 0;
                        wait = self.until_next(pass.next_tick);
                    }
                    Err(error) => {
                        // Back off while the store is down, rather than log four errors a second.
                        failures = failures.saturating_add(1);
                        wait = (self.interval * 2u32.saturating_pow(failures.min(5)))
                            .min(MAX_ERROR_BACKOFF);
                        tracing::error!(%error, "listing schedules failed; will retry");
                    }
                }
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// How long to sleep before the next pass: the interval, or less when a tick comes first.
    fn until_next(&self, next_tick: Option<DateTime<Utc>>) -> Duration {
        let Some(next) = next_tick else {
            return self.interval;
        };
        // One millisecond past the tick, so that the clock (in milliseconds) has reached it.
        let until = (next - self.clock.now()).num_milliseconds().max(0) as u64 + 1;
        self.interval.min(Duration::from_millis(until))
    }
}
