//! Periodic upkeep: rescue expired leases, promote due jobs.

use conveyor_core::{RescueParams, RetryPolicy, Store};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Rescues jobs whose lease expired (their worker crashed, hung or was partitioned) and makes
/// due scheduled and retryable jobs available. Run one per store: in the server, or in an
/// embedded worker.
#[derive(Clone)]
pub struct Maintenance {
    store: Arc<dyn Store>,
    interval: Duration,
    retry: RetryPolicy,
    batch: usize,
}

impl Maintenance {
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self {
            store,
            interval: Duration::from_secs(1),
            retry: RetryPolicy::default(),
            batch: 1000,
        }
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

    /// Runs passes every interval until `stop` is cancelled. Store errors are logged and retried.
    pub async fn run(self, stop: CancellationToken) {
        let mut ticker = tokio::time::interval(self.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = ticker.tick() => {}
            }
            if let Err(error) = self.run_once().await {
                tracing::error!(%error, "maintenance pass failed; will retry");
            }
        }
    }
}
