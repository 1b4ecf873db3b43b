//! Periodic upkeep: rescue expired leases, mark silent workers dead (rescuing their jobs),
//! promote due jobs, fire cron schedules.

use conveyor_core::{
    PruneParams, RescueParams, RetentionPolicy, RetryPolicy, StaleWorkerParams, Store,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::scheduler::Scheduler;

/// The default for [`Maintenance::stats_retention`]: a week of history with a week to spare.
pub const DEFAULT_STATS_RETENTION: Duration = Duration::from_secs(14 * 24 * 3600);

/// The default for [`Maintenance::worker_stale_after`].
pub const DEFAULT_WORKER_STALE_AFTER: Duration = Duration::from_secs(120);

/// What [`Maintenance::on_pass`] is told of each pass with.
type PassObserver = Arc<dyn Fn(&MaintenancePass) + Send + Sync>;

/// Rescues jobs whose lease expired (their worker crashed, hung or was partitioned) and makes
/// due scheduled and retryable jobs available; while leading, it also runs the cron
/// [`Scheduler`]. Run one per store: in the server, or in an embedded worker.
#[derive(Clone)]
pub struct Maintenance {
    store: Arc<dyn Store>,
    interval: Duration,
    retry: RetryPolicy,
    batch: usize,
    holder: String,
    leader_ttl: Duration,
    leading: Arc<AtomicBool>,
    /// The same, for those who must act the moment it changes (the alert engine).
    leadership: Arc<watch::Sender<bool>>,
    scheduler: Option<Scheduler>,
    worker_stale_after: Option<Duration>,
    retention: Option<RetentionPolicy>,
    stats_retention: Option<Duration>,
    audit_retention: Option<Duration>,
    /// Told of every pass this node ran (metrics count what it pruned).
    on_pass: Option<PassObserver>,
}
/// Most prune steps per pass (each deletes up to the batch size), so a backlog of expired jobs
/// is worked off over several passes rather than in one long one.
const MAX_PRUNE_STEPS: usize = 10;

/// What one maintenance pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MaintenancePass {
    /// Jobs whose lease expired, rescued (retried or dead).
    pub rescued: usize,
    /// Workers marked dead for not heartbeating.
    pub dead_workers: Vec<String>,
    /// Jobs of those workers, rescued at once.
    pub rescued_from_dead_workers: usize,
    /// Scheduled and retryable jobs made available.
    pub promoted: u64,
    /// Finished jobs deleted for retention.
    pub pruned: u64,
    /// Workflow wait steps failed for passing their timeout.
    pub waits_expired: usize,
    /// Finished flows deleted for retention (with the finished jobs' retention).
    pub flows_pruned: u64,
    /// Minutes of history (rows per queue and kind) deleted for retention.
    pub stats_pruned: u64,
    /// Audit log entries deleted for retention.
    pub audit_pruned: u64,
    /// Every attempt the rescues above ended (expired leases and dead workers' jobs), with
    /// its queue, kind and outcome: metrics and history count them as failures.
    pub rescued_attempts: Vec<conveyor_core::RescuedAttempt>,
}

impl Maintenance {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            interval: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            batch: 1000,
            holder: crate::default_worker_id(),
            leader_ttl: Duration::from_secs(10),
            leading: Arc::new(AtomicBool::new(false)),
            leadership: Arc::new(watch::Sender::new(false)),
            scheduler: Some(Scheduler::new(store.clone())),
            worker_stale_after: Some(DEFAULT_WORKER_STALE_AFTER),
            retention: Some(RetentionPolicy::default()),
            stats_retention: Some(DEFAULT_STATS_RETENTION),
            audit_retention: Some(conveyor_core::access::DEFAULT_AUDIT_RETENTION),
            on_pass: None,
            store,
        }
    }

    /// How long finished jobs are kept (default: completed and cancelled 24 h, dead 14 days;
    /// a queue's own retention settings win). `None` never deletes jobs.
    pub fn retention(mut self, retention: Option<RetentionPolicy>) -> Self {
        self.retention = retention;
        self
    }

    /// How long the per-minute history (`GET /v1/stats`) is kept (default 14 days). `None`
    /// keeps it forever.
    pub fn stats_retention(mut self, retention: Option<Duration>) -> Self {
        self.stats_retention = retention;
        self
    }

    /// How long audit log entries are kept (default 90 days). `None` keeps them forever.
    pub fn audit_retention(mut self, retention: Option<Duration>) -> Self {
        self.audit_retention = retention;
        self
    }

    /// Calls `observe` after every pass this node runs as leader (a failed pass is not
    /// reported): how metrics learn what maintenance pruned.
    pub fn on_pass(mut self, observe: impl Fn(&MaintenancePass) + Send + Sync + 'static) -> Self {
        self.on_pass = Some(Arc::new(observe));
        self
    }

    /// How long a registered worker may go without heartbeating before it is marked dead and
    /// the jobs it holds are rescued (default 2 min). Workers heartbeat every 10 s by default.
    pub fn worker_stale_after(mut self, after: Duration) -> Self {
        self.worker_stale_after = Some(after);
        self
    }

    /// Never marks workers dead: their jobs are rescued only when their leases expire.
    pub fn without_stale_workers(mut self) -> Self {
        self.worker_stale_after = None;
        self
    }

    /// The cron scheduler to run while this node leads (default: [`Scheduler::new`] on the
    /// same store, with the wall clock).
    pub fn scheduler(mut self, scheduler: Scheduler) -> Self {
        self.scheduler = Some(scheduler);
        self
    }

    /// Runs no cron scheduler (another process fires the schedules).
    pub fn without_scheduler(mut self) -> Self {
        self.scheduler = None;
        self
    }

    /// Who this node is in leader election (default: host, pid and a random suffix).
    pub fn holder_id(mut self, holder: impl Into<String>) -> Self {
        self.holder = holder.into();
        self
    }

    /// How long leadership lasts without renewal: the longest a dead leader's maintenance is
    /// missed before another node takes over (default 10 s). Renewed every interval.
    pub fn leader_ttl(mut self, ttl: Duration) -> Self {
        self.leader_ttl = ttl;
        self
    }

    /// How often to look for expired leases and due jobs (default 1 s).
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval;
        self
    }

    /// Backoff applied to rescued jobs before their next attempt.
    pub fn rescue_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// One pass: rescues expired leases in batches until none is left, marks silent workers
    /// dead (rescuing their jobs), then promotes due jobs.
    pub async fn run_once(&self) -> conveyor_core::StoreResult<MaintenancePass> {
        let mut rescued = 0;
        let mut rescued_attempts = Vec::new();
        loop {
            let report = self
                .store
                .jobs_rescue_expired(RescueParams {
                    limit: self.batch,
                    retry: self.retry,
                })
                .await?;
            let count = report.retried.len() + report.dead.len();
            for id in &report.retried {
                tracing::warn!(job_id = %id, "lease expired; job will be retried");
            }
            for id in &report.dead {
                tracing::warn!(job_id = %id, "lease expired on the last attempt; job moved to dead");
            }
            rescued += count;
            rescued_attempts.extend(report.attempts);
            if count < self.batch {
                break;
            }
        }
        let mut pass = MaintenancePass {
            rescued,
            rescued_attempts,
            ..MaintenancePass::default()
        };
        if let Some(older_than) = self.worker_stale_after {
            let report = self
                .store
                .workers_mark_stale({
                    let mut params = StaleWorkerParams::default();
                    params.older_than = older_than;
                    params.retry = self.retry;
                    params
                })
                .await?;
            for worker in &report.workers {
                tracing::warn!(worker_id = %worker, stale_after = ?older_than,
                    "worker stopped heartbeating; marked dead, its jobs rescued");
            }
            for id in &report.rescued.retried {
                tracing::warn!(job_id = %id, "worker marked dead; job will be retried");
            }
            for id in &report.rescued.dead {
                tracing::warn!(job_id = %id, "worker marked dead on the job's last attempt; job moved to dead");
            }
            pass.rescued_from_dead_workers =
                report.rescued.retried.len() + report.rescued.dead.len();
            pass.rescued_attempts.extend(report.rescued.attempts);
            pass.dead_workers = report.workers;
        }
        pass.promoted = self.store.jobs_promote_due().await?;
        loop {
            let expired = self.store.flows_expire_waits(self.batch).await?;
            pass.waits_expired += expired as usize;
            if expired < self.batch as u64 {
                break;
            }
        }
        // Not worth failing the pass for: the next one tries again.
        if let Err(error) = self.store.storage_maintenance().await {
            tracing::warn!(%error, "storage maintenance failed; will retry");
        }
        if let Some(retention) = self.stats_retention {
            pass.stats_pruned = self.store.stats_prune(retention).await?;
        }
        if let Some(retention) = self.audit_retention {
            for _ in 0..MAX_PRUNE_STEPS {
                let pruned = self
                    .store
                    .audit_prune(conveyor_core::AuditCutoff::OlderThan(retention), self.batch)
                    .await?;
                pass.audit_pruned += pruned;
                if pruned < self.batch as u64 {
                    break;
                }
            }
        }
        if let Some(retention) = self.retention {
            for _ in 0..MAX_PRUNE_STEPS {
                let report = self
                    .store
                    .jobs_prune(PruneParams {
                        retention,
                        limit: self.batch,
                    })
                    .await?;
                pass.pruned += report.total();
                if report.total() < self.batch as u64 {
                    break;
                }
            }
            for _ in 0..MAX_PRUNE_STEPS {
                let pruned = self
                    .store
                    .flows_prune(PruneParams {
                        retention,
                        limit: self.batch,
                    })
                    .await?;
                pass.flows_pruned += pruned;
                if pruned < self.batch as u64 {
                    break;
                }
            }
            if pass.pruned > 0 {
                tracing::info!(
                    pruned = pass.pruned,
                    "deleted finished jobs past their retention"
                );
            }
        }
        Ok(pass)
    }

    /// Runs passes every interval until `stop` is cancelled, but only while this node holds the
    /// store's maintenance leadership (renewed each pass; given up at stop). Store errors are
    /// logged and retried.
    pub async fn run(self, stop: CancellationToken) {
        // The scheduler ticks faster than maintenance (per-second schedules), so it runs beside
        // this loop, gated by the leadership this loop maintains.
        let scheduler = self.scheduler.clone().map(|scheduler| {
            tokio::spawn(scheduler.run_while(stop.child_token(), self.leading.clone()))
        });
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut leading = false;
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = ticker.tick() => {}
            }
            // A renewal asked now holds at most a TTL from now. A node cut off from its store
            // (a partition, a stalled connection) can neither renew nor learn it lost: it gives
            // the leadership up by itself when the lease would lapse, so it never acts, or says
            // it leads, past it while another node takes over.
            let lease_ends = tokio::time::Instant::now() + self.leader_ttl;
            let asked = self.store.leader_try_acquire(&self.holder, self.leader_ttl);
            let now_leading = match tokio::time::timeout_at(lease_ends, asked).await {
                Ok(Ok(lead)) => lead,
                Ok(Err(error)) => {
                    tracing::error!(%error, "leader election failed; will retry");
                    false
                }
                Err(_) => {
                    tracing::error!(
                        "leader election got no answer within the leader TTL; will retry"
                    );
                    false
                }
            };
            self.lead(&mut leading, now_leading);
            if !leading {
                continue;
            }
            // A panicking pass (a store bug) must not end maintenance for good: lease rescue
            // and promotion would silently stop on this, the leading, node.
            let pass = crate::contained::contained(self.run_once());
            match tokio::time::timeout_at(lease_ends, pass).await {
                Ok(Ok(pass)) => {
                    if let Some(observe) = &self.on_pass {
                        observe(&pass);
                    }
                }
                Ok(Err(error)) => tracing::error!(%error, "maintenance pass failed; will retry"),
                Err(_) => {
                    tracing::error!(
                        "maintenance pass outlasted the leadership it ran under; cut short"
                    );
                    self.lead(&mut leading, false);
                }
            }
        }
        self.leading.store(false, Ordering::Relaxed);
        self.leadership.send_replace(false);
        if let Some(scheduler) = scheduler {
            // Stopped by `stop` too; wait so that no firing runs past the leadership's release.
            let _ = scheduler.await;
        }
        if leading {
            if let Err(error) = self.store.leader_release(&self.holder).await {
                tracing::warn!(%error, "could not give up leadership; it will expire");
            }
        }
    }

    /// Records whether this node leads, telling the scheduler and the health endpoint.
    fn lead(&self, leading: &mut bool, now_leading: bool) {
        if now_leading == *leading {
            return;
        }
        *leading = now_leading;
        self.leading.store(now_leading, Ordering::Relaxed);
        self.leadership.send_replace(now_leading);
        if now_leading {
            tracing::info!(holder = %self.holder, "this node now leads maintenance");
        } else {
            tracing::info!(holder = %self.holder, "this node no longer leads maintenance");
        }
    }

    /// True while this node leads (for health endpoints and status displays).
    pub fn leading(&self) -> Arc<AtomicBool> {
        self.leading.clone()
    }

    /// Follows this node's leadership as it changes (for tasks that must act at once when it
    /// begins or ends, such as the alert engine).
    pub fn leadership(&self) -> watch::Receiver<bool> {
        self.leadership.subscribe()
    }

    /// This node's identity in leader election.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}
