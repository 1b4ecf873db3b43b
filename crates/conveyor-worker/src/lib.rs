//! Conveyor's worker runtime.
//!
//! A [`Worker`] fetches jobs from its queues (each with its own concurrency), runs the registered
//! handler for each job's kind under a timeout, keeps leases alive with batched heartbeats,
//! reports outcomes (completions batched), and shuts down gracefully: on the shutdown signal it
//! stops fetching, lets running jobs finish within the drain timeout, then cancels the rest and
//! releases them at once for another worker.
//!
//! [`Maintenance`] returns expired leases (crashed or hung workers) and promotes due jobs, and
//! while its node leads runs the [`Scheduler`], which fires cron schedules.

mod contained;
mod handler;
mod maintenance;
mod scheduler;
mod worker;

pub use handler::{BatchJob, JobContext, Outcome};
pub use maintenance::{
    Maintenance, MaintenancePass, DEFAULT_STATS_RETENTION, DEFAULT_WORKER_STALE_AFTER,
};
pub use scheduler::{Scheduler, SchedulerPass};
pub use worker::{ShutdownReport, Worker, WorkerBuilder, WorkerError, JOB_LOG_TARGET};

/// This machine's host name, as workers report it to the registry.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".to_string())
}

/// A default worker id: host, process id and a random suffix, so restarts are distinguishable.
pub fn default_worker_id() -> String {
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..6];
    format!("{}-{}-{suffix}", hostname(), std::process::id())
}
