//! The job model and its lifecycle.
//!
//! ```text
//! scheduled ──(run_at reached)──▶ available ──(fetch)──▶ running ──▶ completed
//!     ▲                              ▲                      │
//!     │ snooze                       │ release / replay     ├──▶ retryable ──(run_at)──▶ available
//!     └──────────────────────────────┴──────────────────────┤
//!                                                           ├──▶ dead (attempts exhausted or permanent)
//!                                      any unfinished ──▶ cancelled
//! ```

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::str::FromStr;
use uuid::Uuid;

use crate::error::ValidationError;
pub use crate::state::JobState;
use crate::unique::UniqueSpec;
use std::collections::BTreeMap;

pub const DEFAULT_QUEUE: &str = "default";
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;

/// Parses a state as the API and CLI spell it.
impl FromStr for JobState {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                ValidationError::new(
                    "state",
                    format!(
                        "unknown state {s:?}; expected one of scheduled, available, running, \
                         retryable, completed, dead, cancelled, expired, blocked"
                    ),
                )
            })
    }
}

/// Identifies a running job and the lease its worker holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseRef {
    pub id: Uuid,
    pub lease_token: Uuid,
}

/// A job's link to its flow, carried by the job (and handed to its worker).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowLink {
    pub flow_id: Uuid,
    pub step: String,
    /// The results of the step's completed parents by step name (for a compensation job: the
    /// compensated step's result under its name).
    #[serde(default)]
    pub parents: BTreeMap<String, Value>,
}

/// Error classes recorded in a job's history. Handlers may use their own classes too.
pub mod error_class {
    /// The handler asked for a retry (transient failure).
    pub const ERROR: &str = "error";
    /// The handler asked for a retry at a given time (e.g. a 429 with Retry-After).
    pub const RETRY_AFTER: &str = "retry_after";
    /// The handler said retrying cannot help.
    pub const PERMANENT: &str = "permanent";
    pub const PANIC: &str = "panic";
    pub const TIMEOUT: &str = "timeout";
    /// No handler is registered for the job's kind on the worker that fetched it.
    pub const UNKNOWN_KIND: &str = "unknown_kind";
    /// The payload did not deserialize into the handler's job type.
    pub const INVALID_PAYLOAD: &str = "invalid_payload";
    /// The worker stopped heartbeating (crashed, hung or partitioned) and its lease ran out.
    pub const LEASE_EXPIRED: &str = "lease_expired";
    /// The handler succeeded but its result cannot be stored (a NUL character in a string):
    /// retrying would produce the same result, so the job goes to the dead-letter queue.
    pub const INVALID_RESULT: &str = "invalid_result";
    /// A batch handler answered no outcome for the job (fewer outcomes than jobs): nothing
    /// says its work was done, so it retries.
    pub const MISSING_OUTCOME: &str = "missing_outcome";
    /// A handler with durable steps took another path than the run that stored them (see
    /// [`crate::steps`]): running the same code again would meet the same mismatch.
    pub const NONDETERMINISTIC: &str = "nondeterministic";
    /// A job's compensations were still pending after its compensating runs.
    pub const COMPENSATION_FAILED: &str = "compensation_failed";
}

/// One failed attempt in a job's history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorRecord {
    pub attempt: u32,
    pub at: DateTime<Utc>,
    pub class: String,
    pub message: String,
    /// The worker that ran the attempt (as the store's lease named it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_id: Option<String>,
    /// When the attempt started; with `at`, its duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<DateTime<Utc>>,
    /// A Rust panic's backtrace, or the traceback a client reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backtrace: Option<String>,
    /// When the job was replayed from the dead-letter queue (or from `expired`) after this,
    /// its last failure: the attempts after it are a new run, counted from 1 again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_at: Option<DateTime<Utc>>,
}

/// Longest backtrace kept with a failure (longer ones keep their start).
pub const MAX_BACKTRACE_BYTES: usize = 32 * 1024;

/// A backtrace as stored: no NUL characters, at most [`MAX_BACKTRACE_BYTES`].
pub fn storable_backtrace(text: &str) -> String {
    let mut end = text.len().min(MAX_BACKTRACE_BYTES);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].replace('\0', "\u{FFFD}")
}

impl ErrorRecord {
    /// The history entry a store writes when it rescues a job whose worker was marked dead
    /// (stopped heartbeating in the registry): the same class as an expired lease.
    pub fn worker_lost(attempt: u32, at: DateTime<Utc>, worker: &str) -> Self {
        Self {
            attempt,
            at,
            class: error_class::LEASE_EXPIRED.to_string(),
            message: format!(
                "worker {worker} stopped heartbeating and was marked dead before the job finished"
            ),
            worker_id: Some(worker.to_string()),
            started_at: None,
            backtrace: None,
            replayed_at: None,
        }
    }

    /// The history entry a store writes when it rescues a job whose lease ran out.
    pub fn lease_expired(attempt: u32, at: DateTime<Utc>, worker: Option<&str>) -> Self {
        Self {
            attempt,
            at,
            class: error_class::LEASE_EXPIRED.to_string(),
            message: format!(
                "lease held by worker {} expired before the job finished",
                worker.unwrap_or("(unknown)")
            ),
            worker_id: worker.map(str::to_string),
            started_at: None,
            backtrace: None,
            replayed_at: None,
        }
    }
}

/// Who holds a running job, and until when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    pub worker_id: String,
    /// Only the worker that fetched the job learns the token (from the fetch itself); job views
    /// never serialize it, so reading a job does not let anyone settle it.
    #[serde(skip_serializing, default = "Uuid::nil")]
    pub token: Uuid,
    pub expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: Uuid,
    pub kind: String,
    pub queue: String,
    pub payload: Value,
    /// Higher runs first within a queue.
    pub priority: i32,
    pub run_at: DateTime<Utc>,
    /// Attempts started so far (incremented at fetch).
    pub attempt: u32,
    pub max_attempts: u32,
    pub timeout_ms: Option<u64>,
    pub idempotency_key: Option<String>,
    pub tags: Vec<String>,
    pub tenant: Option<String>,
    pub state: JobState,
    pub errors: Vec<ErrorRecord>,
    pub lease: Option<Lease>,
    pub result: Option<Value>,
    pub created_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
    /// Set for jobs enqueued with a [`UniqueSpec`]: the identity later unique enqueues are
    /// compared on (see [`crate::unique::unique_key`]). Absent from JSON when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_key: Option<String>,
    /// Set for a step (or compensation) of a workflow: its flow, step and parents' results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<FlowLink>,
    /// The latest progress its handler reported (while running and after).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<Progress>,
    /// Not started by then, the job moves to `expired` instead of running (see
    /// [`JobState::Expired`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// The producer's W3C trace context, handed to the worker with the job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace_context::TraceContext>,
    /// The limit keys it holds (`limit:value`, see [`crate::limits::named`]): a claim starts
    /// it only while each has room.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limit_keys: Vec<String>,
    /// Its sequence and place in it, when it was enqueued into one (see [`crate::sequence`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<crate::sequence::JobSequence>,
}

impl Job {
    /// Whether the job waits (scheduled, available, retryable) past its expiry: it will never
    /// run, even if no sweep has moved it to `expired` yet, so it holds no idempotency or
    /// unique key and no claim may take it.
    pub fn is_past_expiry(&self, now: DateTime<Utc>) -> bool {
        self.expires_at.is_some_and(|at| at <= now) && JobState::WAITING.contains(&self.state)
    }

    /// Whether the job still holds its idempotency key at `now`: an unfinished job always (unless
    /// it waits past its expiry), a completed one for `window` after it finished, a dead,
    /// cancelled or expired one never (see `StoreOptions::completed_idempotency_window`).
    pub fn holds_idempotency_key(&self, now: DateTime<Utc>, window: std::time::Duration) -> bool {
        if self.is_past_expiry(now) {
            return false;
        }
        match self.state {
            JobState::Completed => self
                .finished_at
                .is_some_and(|finished| crate::clock::after(finished, window) > now),
            JobState::Dead | JobState::Cancelled | JobState::Expired => false,
            _ => true,
        }
    }
}

/// How far a running job has come, as its handler reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// 0 to 100.
    pub percent: u8,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    pub at: DateTime<Utc>,
}

/// Longest progress message kept.
pub const MAX_PROGRESS_MESSAGE_LEN: usize = 1024;

impl Progress {
    /// Checks a report: `percent` 0 to 100 (field `progress`), a message of at most
    /// [`MAX_PROGRESS_MESSAGE_LEN`] characters without NUL (field `message`).
    pub fn new(
        percent: u8,
        message: Option<String>,
        at: DateTime<Utc>,
    ) -> Result<Self, crate::ValidationError> {
        if percent > 100 {
            return Err(crate::ValidationError::new("progress", "must be 0 to 100"));
        }
        if let Some(text) = &message {
            if text.chars().count() > MAX_PROGRESS_MESSAGE_LEN {
                return Err(crate::ValidationError::new(
                    "message",
                    format!("at most {MAX_PROGRESS_MESSAGE_LEN} characters"),
                ));
            }
            crate::fields::text_without_nul("message", text)?;
        }
        Ok(Self {
            percent,
            message,
            at,
        })
    }
}

impl Job {
    /// The lease a worker holds this job under, when it is running.
    pub fn lease_ref(&self) -> Option<LeaseRef> {
        self.lease.as_ref().map(|lease| LeaseRef {
            id: self.id,
            lease_token: lease.token,
        })
    }
}

/// A job to insert. Build one with [`NewJob::new`] and set fields directly; `validate` checks them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NewJob {
    pub kind: String,
    pub queue: String,
    pub payload: Value,
    pub priority: i32,
    /// `None` (or a time not in the future) makes the job available at once.
    pub run_at: Option<DateTime<Utc>>,
    pub max_attempts: u32,
    pub timeout_ms: Option<u64>,
    pub idempotency_key: Option<String>,
    pub tags: Vec<String>,
    pub tenant: Option<String>,
    /// Makes the enqueue unique by the job's kind, queue and payload (see [`UniqueSpec`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique: Option<UniqueSpec>,
    /// A job not started by then expires (`None`: the queue's `default_ttl_ms` from enqueue,
    /// if it has one, else never).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// The producer's W3C trace context (see [`crate::trace`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<crate::trace_context::TraceContext>,
    /// Named limits this job is subject to besides its queue's and kind's (see
    /// [`crate::limits::named`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limits: Vec<String>,
    /// The limit keys the job is stamped with at enqueue ([`crate::limits::LimitBook::stamp`]):
    /// set by the engine, not by producers.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub limit_keys: Vec<String>,
    /// Runs after every earlier job with the same key and not beside them (see
    /// [`crate::sequence`]); overrides its kind's and queue's sequence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence: Option<crate::sequence::SequenceSpec>,
    /// The sequence the job enters, stamped at enqueue from `sequence`, its kind's or its
    /// queue's: set by the engine, not by producers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sequence_key: Option<crate::sequence::SequenceKey>,
    /// Folds a burst of enqueues with the same key into one job (see [`crate::debounce`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounce: Option<crate::debounce::DebounceSpec>,
    /// At most one job with the same key per period; the rest are dropped (see
    /// [`crate::debounce`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub throttle: Option<crate::debounce::ThrottleSpec>,
    /// The fold the job enters, stamped at enqueue from `debounce` or `throttle`: set by the
    /// engine, not by producers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fold_key: Option<crate::debounce::FoldKey>,
}

impl NewJob {
    pub fn new(kind: impl Into<String>, payload: Value) -> Self {
        Self {
            kind: kind.into(),
            queue: DEFAULT_QUEUE.to_string(),
            payload,
            priority: 0,
            run_at: None,
            max_attempts: DEFAULT_MAX_ATTEMPTS,
            timeout_ms: None,
            idempotency_key: None,
            tags: Vec::new(),
            tenant: None,
            unique: None,
            expires_at: None,
            trace: None,
            limits: Vec::new(),
            limit_keys: Vec::new(),
            sequence: None,
            sequence_key: None,
            debounce: None,
            throttle: None,
            fold_key: None,
        }
    }

    /// The job as first stored under `id` at `now`: not yet attempted, `scheduled` when its
    /// `run_at` is in the future, else `available`.
    pub fn into_stored(self, id: Uuid, now: DateTime<Utc>) -> Job {
        let unique_key = self.unique_key();
        let run_at = self
            .run_at
            .map(crate::clock::truncate_to_millis)
            .unwrap_or(now);
        Job {
            id,
            state: if run_at > now {
                JobState::Scheduled
            } else {
                JobState::Available
            },
            // A past run_at keeps its place in the order (older first).
            run_at,
            kind: self.kind,
            queue: self.queue,
            payload: self.payload,
            priority: self.priority,
            attempt: 0,
            max_attempts: self.max_attempts,
            timeout_ms: self.timeout_ms,
            idempotency_key: self.idempotency_key,
            tags: self.tags,
            tenant: self.tenant,
            errors: Vec::new(),
            lease: None,
            result: None,
            created_at: now,
            started_at: None,
            finished_at: None,
            unique_key,
            flow: None,
            progress: None,
            expires_at: self.expires_at.map(crate::clock::truncate_to_millis),
            trace: self.trace,
            limit_keys: self.limit_keys,
            // Numbered by the store as it inserts the job.
            sequence: self.sequence_key.map(|stamp| crate::sequence::JobSequence {
                key: stamp.key,
                no: 0,
                on_dead: stamp.on_dead,
            }),
        }
    }

    /// The unique key this job is stored with, when it has a [`UniqueSpec`].
    pub fn unique_key(&self) -> Option<String> {
        self.unique
            .as_ref()
            .map(|spec| crate::unique::unique_key(&self.kind, &self.queue, &self.payload, spec))
    }
}

/// The result of inserting one job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inserted {
    pub job: Job,
    /// True when an existing job with the same idempotency key, or the same unique key in one
    /// of the spec's states, was returned instead (or the enqueue was debounced or throttled
    /// into it).
    pub duplicate: bool,
    /// Set when the enqueue was folded into the job that stands (debounce, throttle): its id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub debounced_into: Option<Uuid>,
}

impl Inserted {
    /// A job stored by this insert.
    pub fn new(job: Job) -> Self {
        Self {
            job,
            duplicate: false,
            debounced_into: None,
        }
    }

    /// An existing job returned instead of a new one.
    pub fn duplicate_of(job: Job) -> Self {
        Self {
            job,
            duplicate: true,
            debounced_into: None,
        }
    }

    /// The job an enqueue was debounced or throttled into.
    pub fn folded_into(job: Job) -> Self {
        Self {
            debounced_into: Some(job.id),
            job,
            duplicate: true,
        }
    }
}

/// Per-queue counts by state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct QueueStats {
    pub name: String,
    pub available: u64,
    pub scheduled: u64,
    pub running: u64,
    pub retryable: u64,
    pub dead: u64,
    pub completed: u64,
    pub cancelled: u64,
    /// Jobs that were not started before their `expires_at`.
    #[serde(default)]
    pub expired: u64,
    /// Jobs waiting behind an earlier job of their sequence.
    #[serde(default)]
    pub blocked: u64,
    /// Age of the oldest available job (time since its `run_at`), 0 when none waits.
    pub oldest_available_age_ms: u64,
    /// Whether fetching from the queue is paused.
    #[serde(default)]
    pub paused: bool,
}

impl QueueStats {
    pub fn add(&mut self, state: JobState, count: u64) {
        match state {
            JobState::Scheduled => self.scheduled += count,
            JobState::Available => self.available += count,
            JobState::Running => self.running += count,
            JobState::Retryable => self.retryable += count,
            JobState::Completed => self.completed += count,
            JobState::Dead => self.dead += count,
            JobState::Cancelled => self.cancelled += count,
            JobState::Expired => self.expired += count,
            JobState::Blocked => self.blocked += count,
        }
    }

    /// How many of the queue's jobs are in `state`.
    pub fn count(&self, state: JobState) -> u64 {
        match state {
            JobState::Scheduled => self.scheduled,
            JobState::Available => self.available,
            JobState::Running => self.running,
            JobState::Retryable => self.retryable,
            JobState::Completed => self.completed,
            JobState::Dead => self.dead,
            JobState::Cancelled => self.cancelled,
            JobState::Expired => self.expired,
            JobState::Blocked => self.blocked,
        }
    }
}

/// Per-queue settings, persisted in the store. Unset limits mean "no limit".
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct QueueSettings {
    /// Fetching stops while paused; enqueuing continues.
    #[serde(default)]
    pub paused: bool,
    /// Back-pressure: enqueues are refused while the queue holds this many unfinished jobs
    /// (scheduled, available, running, retryable).
    #[serde(default)]
    pub max_depth: Option<u64>,
    /// Back-pressure per tenant: the same, counting one tenant's unfinished jobs in the queue.
    #[serde(default)]
    pub max_depth_per_tenant: Option<u64>,
    /// At most this many of the queue's jobs run at once, across every worker and node.
    #[serde(default)]
    pub concurrency_limit: Option<u64>,
    /// At most this many jobs of one key (the job's `tenant`) run at once, across every worker
    /// and node. Jobs without a tenant are not limited by it.
    #[serde(default)]
    pub per_key_concurrency_limit: Option<u64>,
    /// At most `count` of the queue's jobs start in any window of `period_ms`, across every
    /// worker and node.
    #[serde(default)]
    pub rate_limit: Option<RateLimit>,
    /// The same per key (the job's `tenant`); jobs without a tenant are not limited by it.
    #[serde(default)]
    pub per_key_rate_limit: Option<RateLimit>,
    /// A fetch serving several queues shares its capacity among them in proportion to their
    /// weights (a queue without one weighs 1), so a flood in one cannot starve another. A
    /// fetch where no queue has a weight takes jobs in priority order across its queues.
    #[serde(default)]
    pub weight: Option<u32>,
    /// Completed and cancelled jobs are deleted this long after they finished (default: the
    /// server's retention, 24 h).
    #[serde(default)]
    pub completed_retention_secs: Option<u64>,
    /// Dead jobs are deleted this long after they died (default: the server's, 14 days).
    #[serde(default)]
    pub dead_retention_secs: Option<u64>,
    /// Jobs enqueued without an expiry of their own expire this long after their enqueue
    /// (or after their `run_at`, when that is later).
    #[serde(default)]
    pub default_ttl_ms: Option<u64>,
    /// Stops handing out the queue's jobs while too many of them fail (see
    /// [`crate::breaker`]).
    #[serde(default)]
    pub circuit_breaker: Option<crate::breaker::BreakerSettings>,
    /// Named limits every job enqueued into the queue is subject to (see
    /// [`crate::limits::named`]).
    #[serde(default)]
    pub limits: Vec<String>,
    /// Jobs enqueued into the queue with the same key run one after another (see
    /// [`crate::sequence`]), unless their kind or the job names another sequence.
    #[serde(default)]
    pub sequence: Option<crate::sequence::SequenceSpec>,
}

impl QueueSettings {
    /// When a job enqueued at `now` with `run_at` expires by this queue's default, if it has
    /// one: `default_ttl_ms` after whichever is later.
    pub fn default_expiry(
        &self,
        now: DateTime<Utc>,
        run_at: Option<DateTime<Utc>>,
    ) -> Option<DateTime<Utc>> {
        let ttl = self.default_ttl_ms?;
        let from = run_at.map_or(now, |run_at| run_at.max(now));
        from.checked_add_signed(chrono::Duration::milliseconds(
            i64::try_from(ttl).unwrap_or(i64::MAX),
        ))
    }
}

impl QueueSettings {
    /// Whether claims from this queue must count running jobs or recent starts, and so take the
    /// stores' limited claim path rather than the plain one.
    pub fn limits_starts(&self) -> bool {
        self.concurrency_limit.is_some()
            || self.per_key_concurrency_limit.is_some()
            || self.rate_limit.is_some()
            || self.per_key_rate_limit.is_some()
    }

    /// How old a start record must be before it may be pruned: the queue's longest rate
    /// period plus [`START_RECORD_MARGIN_MS`]. The margin matters with several claimers: each
    /// reads "now" before it waits for the claim lock, so one that waited counts its window
    /// from a slightly older now than the claimer before it, and must still find the records
    /// that one's window no longer needed.
    pub fn rate_record_ttl_ms(&self) -> Option<u64> {
        [self.rate_limit, self.per_key_rate_limit]
            .into_iter()
            .flatten()
            .map(|rate| rate.period_ms)
            .max()
            .map(|longest| longest.saturating_add(START_RECORD_MARGIN_MS))
    }
}

/// See [`QueueSettings::rate_record_ttl_ms`]: a minute covers lock waits and the clock skew
/// between nodes many times over.
pub const START_RECORD_MARGIN_MS: u64 = 60_000;

/// At most `count` starts in any window of `period_ms` milliseconds (a sliding window: the
/// stores keep the start times, so a burst at the end of one period cannot be followed by a
/// full one at the start of the next).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimit {
    pub count: u64,
    pub period_ms: u64,
}

impl RateLimit {
    pub fn period(&self) -> chrono::Duration {
        chrono::Duration::milliseconds(self.period_ms.min(i64::MAX as u64) as i64)
    }
}

/// A queue's settings with its name.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NamedQueueSettings {
    pub name: String,
    #[serde(flatten)]
    pub settings: QueueSettings,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn job_in(state: JobState, finished_at: Option<DateTime<Utc>>) -> Job {
        let mut job = Job {
            id: Uuid::now_v7(),
            kind: "k".into(),
            queue: "q".into(),
            payload: Value::Null,
            priority: 0,
            run_at: Utc::now(),
            attempt: 0,
            max_attempts: 1,
            timeout_ms: None,
            idempotency_key: Some("key".into()),
            tags: Vec::new(),
            tenant: None,
            state,
            errors: Vec::new(),
            lease: None,
            result: None,
            created_at: Utc::now(),
            started_at: None,
            finished_at: None,
            unique_key: None,
            flow: None,
            progress: None,
            expires_at: None,
            trace: None,
            limit_keys: Vec::new(),
            sequence: None,
        };
        job.finished_at = finished_at;
        job
    }

    #[test]
    fn completed_jobs_hold_their_key_only_within_the_window() {
        let now = Utc::now();
        let window = Duration::from_secs(60);
        let hour = chrono::Duration::hours(1);
        let minute = chrono::Duration::seconds(60);
        let recent = job_in(
            JobState::Completed,
            Some(now - chrono::Duration::seconds(59)),
        );
        let expired = job_in(JobState::Completed, Some(now - minute));
        assert!(recent.holds_idempotency_key(now, window));
        assert!(
            !expired.holds_idempotency_key(now, window),
            "the window is exclusive"
        );
        assert!(!job_in(JobState::Dead, Some(now)).holds_idempotency_key(now, window));
        assert!(!job_in(JobState::Cancelled, Some(now)).holds_idempotency_key(now, window));
        for state in [
            JobState::Scheduled,
            JobState::Available,
            JobState::Running,
            JobState::Retryable,
        ] {
            assert!(
                job_in(state, None).holds_idempotency_key(now, window),
                "{state}"
            );
        }
        let old = job_in(JobState::Completed, Some(now - hour));
        assert!(
            old.holds_idempotency_key(now, Duration::MAX),
            "an unbounded window never ends"
        );
    }
}
