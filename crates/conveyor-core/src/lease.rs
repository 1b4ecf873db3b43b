//! The lease protocol's requests and answers: a fetch claims jobs under leases, a heartbeat
//! extends one, a completion or failure ends one, a rescue ends those whose worker went
//! silent. The traits that take them are in [`crate::store`].

use chrono::{DateTime, Utc};
use serde_json::Value;
use std::time::Duration;
use uuid::Uuid;

use crate::events::AttemptStatus;
use crate::job::{storable_backtrace, ErrorRecord, Job, LeaseRef};
use crate::retry::RetryPolicy;
use crate::state::JobState;

/// Claim up to `max` available jobs from `queues` for `worker_id`.
#[derive(Debug, Clone)]
pub struct FetchParams {
    pub worker_id: String,
    pub queues: Vec<String>,
    pub max: usize,
    pub lease: Duration,
    /// Claim only jobs of these kinds (`None`: any kind). A worker names the kinds it has
    /// handlers for, so during a rolling deploy an old worker never claims a new kind.
    pub kinds: Option<Vec<String>>,
    /// Claim no job of these kinds (their circuit breaker is open). Folded into `kinds` when
    /// the fetch names kinds (`validate::fetch`), so a store sees it only for a fetch of any
    /// kind.
    pub excluded_kinds: Vec<String>,
}

#[derive(Debug, Clone)]
pub struct HeartbeatParams {
    pub lease: LeaseRef,
    pub extend_by: Duration,
}

#[derive(Debug, Clone)]
pub struct CompleteParams {
    pub lease: LeaseRef,
    pub result: Option<Value>,
}

/// Whether a lease-conditional change was applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseOutcome {
    Applied,
    /// The token no longer matches a running job: nothing changed.
    LeaseLost,
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum RetryPlan {
    /// Retry after the policy's backoff for this attempt (dead when attempts are exhausted).
    Backoff(RetryPolicy),
    /// Retry at this time (dead when attempts are exhausted).
    At(DateTime<Utc>),
    /// Straight to the dead-letter queue.
    Never,
}

impl RetryPlan {
    /// When the job should run again after failing attempt number `attempt` at `now`; `None`
    /// for "never" (the store then moves it to `dead`, as it does when attempts run out).
    pub fn retry_at(&self, now: DateTime<Utc>, attempt: u32) -> Option<DateTime<Utc>> {
        match self {
            RetryPlan::Backoff(policy) => Some(policy.next_run_at(now, attempt)),
            RetryPlan::At(at) => Some((*at).max(now)),
            RetryPlan::Never => None,
        }
    }
}

#[derive(Debug, Clone)]
pub struct FailParams {
    pub lease: LeaseRef,
    pub class: String,
    pub message: String,
    pub retry: RetryPlan,
    /// A panic's backtrace or a client's traceback, kept with the failure.
    pub backtrace: Option<String>,
}

impl FailParams {
    /// What a store records for this failure of `attempt` (the held job's attempt) at `now`: the
    /// history entry, and when the job runs again if it has attempts left (`None`: no retry).
    pub fn failure(self, now: DateTime<Utc>, attempt: u32) -> (ErrorRecord, Option<DateTime<Utc>>) {
        let retry_at = self.retry.retry_at(now, attempt);
        let error = ErrorRecord {
            attempt,
            at: now,
            class: self.class,
            message: self.message,
            // The store adds who ran the attempt and when it started.
            worker_id: None,
            started_at: None,
            backtrace: self.backtrace.as_deref().map(storable_backtrace),
            replayed_at: None,
        };
        (error, retry_at)
    }
}

#[derive(Debug, Clone)]
pub struct SnoozeParams {
    pub lease: LeaseRef,
    pub until: DateTime<Utc>,
}

#[derive(Debug, Clone)]
pub struct RescueParams {
    /// Most jobs rescued in one call, so one call stays a short transaction.
    pub limit: usize,
    pub retry: RetryPolicy,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RescueReport {
    pub retried: Vec<Uuid>,
    pub dead: Vec<Uuid>,
    /// Each rescued attempt's queue, kind, outcome and run time: what metrics and history count
    /// of attempts no worker reported.
    pub attempts: Vec<RescuedAttempt>,
}

/// An attempt ended by a rescue (its lease expired, or its worker was marked dead).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RescuedAttempt {
    pub queue: String,
    pub kind: String,
    /// `Failed` (it will be retried) or `Dead`.
    pub status: AttemptStatus,
    /// From the attempt's start to its rescue.
    pub duration: Duration,
}

impl RescueReport {
    /// Counts a rescued job under what became of it.
    pub fn add(&mut self, job: &Job) {
        let status = if job.state == JobState::Dead {
            self.dead.push(job.id);
            AttemptStatus::Dead
        } else {
            self.retried.push(job.id);
            AttemptStatus::Failed
        };
        // A rescue's error records when it happened; the attempt began when the job started.
        let duration = job
            .errors
            .last()
            .and_then(|error| {
                (error.at - error.started_at.or(job.started_at)?)
                    .to_std()
                    .ok()
            })
            .unwrap_or_default();
        self.attempts.push(RescuedAttempt {
            queue: job.queue.clone(),
            kind: job.kind.clone(),
            status,
            duration,
        });
    }

    /// Adds another report's jobs to this one.
    pub fn extend(&mut self, other: RescueReport) {
        self.retried.extend(other.retried);
        self.dead.extend(other.dead);
        self.attempts.extend(other.attempts);
    }
}
