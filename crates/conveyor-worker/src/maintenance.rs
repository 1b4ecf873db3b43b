//! Periodic upkeep: rescue expired leases, promote due jobs, fire cron schedules.

use conveyor_core::{RescueParams, RetryPolicy, Store};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use crate::scheduler::Scheduler;

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
    scheduler: Option<Scheduler>,
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
            scheduler: Some(Scheduler::new(store.clone())),
            store,
        }
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

    /// One pass: rescues in batches until none is left, then promotes due jobs.
    pub async fn run_once(&self) -> conveyor_core::StoreResult<(usize, u64)> {
        let mut rescued = 0;
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
            if count < self.batch {
                break;
            }
        }
        let promoted = self.store.jobs_promote_due().await?;
        Ok((rescued, promoted))
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
            let now_leading = match self
                .store
                .leader_try_acquire(&self.holder, self.leader_ttl)
                .await
            {
                Ok(lead) => lead,
                Err(error) => {
                    tracing::error!(%error, "leader election failed; will retry");
                    false
                }
            };
            if now_leading != leading {
                leading = now_leading;
                self.leading.store(leading, Ordering::Relaxed);
                if leading {
                    tracing::info!(holder = %self.holder, "this node now leads maintenance");
                } else {
                    tracing::info!(holder = %self.holder, "this node no longer leads maintenance");
                }
            }
            if !leading {
                continue;
            }
            if let Err(error) = self.run_once().await {
                tracing::error!(%error, "maintenance pass failed; will retry");
            }
        }
        self.leading.store(false, Ordering::Relaxed);
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

    /// True while this node leads (for health endpoints and status displays).
    pub fn leading(&self) -> Arc<AtomicBool> {
        self.leading.clone()
    }

    /// This node's identity in leader election.
    pub fn holder(&self) -> &str {
        &self.holder
    }
}
