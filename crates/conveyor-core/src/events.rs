//! Attempt outcomes as events, for metrics.
//!
//! Counters must come out right however many processes run: every ended attempt is counted
//! once, by the process that wrote its outcome to the store. The HTTP server counts the
//! outcomes HTTP workers report to it; an in-process [`Worker`] counts its own through a
//! [`JobObserver`] (the server's metrics, when it runs in the server's process). Both report
//! the same [`AttemptEvent`]s.
//!
//! [`Worker`]: https://docs.rs/conveyor-worker

use std::time::Duration;

use crate::job::JobState;

/// How an attempt ended, as written to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptStatus {
    Completed,
    /// Failed; the job will be retried (`retryable`).
    Failed,
    /// Failed for the last time; the job is in the dead-letter queue.
    Dead,
    /// Put back until later without counting the attempt.
    Snoozed,
}

impl AttemptStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptStatus::Completed => "completed",
            AttemptStatus::Failed => "failed",
            AttemptStatus::Dead => "dead",
            AttemptStatus::Snoozed => "snoozed",
        }
    }

    /// The status of a failure that left the job in `state` (`dead`, else a retry).
    pub fn of_failure(state: JobState) -> Self {
        if state == JobState::Dead {
            AttemptStatus::Dead
        } else {
            AttemptStatus::Failed
        }
    }
}

/// One ended attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttemptEvent<'a> {
    pub queue: &'a str,
    pub kind: &'a str,
    pub status: AttemptStatus,
    /// From the attempt's start to its outcome.
    pub duration: Duration,
}

/// Told of every attempt outcome a process writes. Must be cheap and must not block: it is
/// called on the job path.
pub trait JobObserver: Send + Sync + 'static {
    fn attempt_finished(&self, event: &AttemptEvent<'_>);

    /// Told of every job this process claimed, as the claim returned it (for the queue wait
    /// and the count of attempts started). Nothing by default.
    fn attempt_started(&self, _job: &crate::Job) {}

    /// Told of jobs this process stored by an enqueue (duplicates included, flagged as such).
    /// Nothing by default.
    fn jobs_enqueued(&self, _inserted: &[crate::Inserted]) {}
}

/// How long a claimed job waited to start: from its run_at, or its enqueue when that was
/// later, to its start. `None` for a job not started.
pub fn queue_wait(job: &crate::Job) -> Option<Duration> {
    let started = job.started_at?;
    let ready = job.run_at.max(job.created_at);
    Some((started - ready).to_std().unwrap_or_default())
}
