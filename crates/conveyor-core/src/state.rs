//! The states a job passes through (the lifecycle is drawn in [`crate::job`]). A leaf, with no
//! import of the crate: the errors name a job's state and every other module names both (its
//! parsing from text, which answers a `ValidationError`, is in `job.rs`).

use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum JobState {
    /// Waiting for its `run_at`.
    Scheduled,
    /// Ready to be fetched.
    Available,
    /// Held by a worker under a lease.
    Running,
    /// Failed an attempt; waits for its backoff `run_at`, then runs again.
    Retryable,
    Completed,
    /// In the dead-letter queue: attempts exhausted, or a permanent failure.
    Dead,
    Cancelled,
    /// Not started before its `expires_at`: never run (or not run again), kept like dead jobs
    /// and replayable like them.
    Expired,
    /// Waits behind an earlier job of its sequence (see [`crate::sequence`]): becomes scheduled
    /// or available when every earlier job of the sequence has finished.
    Blocked,
}

impl JobState {
    pub const ALL: [JobState; 9] = [
        JobState::Scheduled,
        JobState::Available,
        JobState::Running,
        JobState::Retryable,
        JobState::Completed,
        JobState::Dead,
        JobState::Cancelled,
        JobState::Expired,
        JobState::Blocked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Scheduled => "scheduled",
            JobState::Available => "available",
            JobState::Running => "running",
            JobState::Retryable => "retryable",
            JobState::Completed => "completed",
            JobState::Dead => "dead",
            JobState::Cancelled => "cancelled",
            JobState::Expired => "expired",
            JobState::Blocked => "blocked",
        }
    }

    /// Finished jobs never run again unless replayed from `dead` or `expired`.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            JobState::Completed | JobState::Dead | JobState::Cancelled | JobState::Expired
        )
    }

    /// States of a job that has not finished: waiting (blocked behind its sequence too) or
    /// running. A queue's depth (`max_depth`, `max_depth_per_tenant`) counts these, and unique
    /// jobs are unique among them by default.
    pub const UNFINISHED: [JobState; 5] = [
        JobState::Scheduled,
        JobState::Available,
        JobState::Running,
        JobState::Retryable,
        JobState::Blocked,
    ];

    /// States a job waits in before it (next) starts: the ones that expire.
    pub const WAITING: [JobState; 3] = [
        JobState::Scheduled,
        JobState::Available,
        JobState::Retryable,
    ];
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
