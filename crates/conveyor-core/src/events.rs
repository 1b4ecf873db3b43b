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

use crate::state::JobState;

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

    /// Told of jobs this process stored by an enqueue (duplicates included, flagged as such),
    /// and of those its store started for flows (see [`FlowStarts`]). Nothing by default.
    fn jobs_enqueued(&self, _inserted: &[crate::Inserted]) {}
}

/// Where a store tells of the jobs flows start in it, once the transaction holding them has
/// committed: a step's job, inserted as the step starts ([`crate::workflow::Effect::Start`]),
/// and a compensation's ([`crate::workflow::Effect::Compensate`]).
///
/// No caller enqueues these jobs: the store inserts them inside another operation (a flow's
/// creation, a parent's completion or failure, a signal, a wait's timeout, a replay), so no
/// request path sees them to count them. They are enqueued all the same, and the rule that
/// counts them as such is this: the store whose commit started them tells the process's
/// observer here (the server's metrics, which count enqueues in `conveyor_jobs_enqueued_total`
/// and the history), so each is counted once, by the process that started it, like every other
/// enqueue. A store tells one observer, the first one given (a process has one).
///
/// Stores keep nothing for it until an observer is given ([`FlowStarts::observed`]).
#[derive(Default)]
pub struct FlowStarts {
    observer: std::sync::OnceLock<std::sync::Arc<dyn JobObserver>>,
}

impl FlowStarts {
    /// Tells `observer` of every job started from now on. False, and nothing changes, when the
    /// store already has an observer.
    pub fn observe(&self, observer: std::sync::Arc<dyn JobObserver>) -> bool {
        self.observer.set(observer).is_ok()
    }

    /// Whether anyone listens: stores keep the jobs they start only then.
    pub fn observed(&self) -> bool {
        self.observer.get().is_some()
    }

    /// For stores, after the commit that stored `started` (never duplicates).
    pub fn started(&self, started: &[crate::Inserted]) {
        if let Some(observer) = self.observer.get().filter(|_| !started.is_empty()) {
            observer.jobs_enqueued(started);
        }
    }
}

impl std::fmt::Debug for FlowStarts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlowStarts")
            .field("observed", &self.observed())
            .finish()
    }
}

/// How long a claimed job waited to start: from its run_at, or its enqueue when that was
/// later, to its start. `None` for a job not started.
pub fn queue_wait(job: &crate::Job) -> Option<Duration> {
    let started = job.started_at?;
    let ready = job.run_at.max(job.created_at);
    Some((started - ready).to_std().unwrap_or_default())
}
