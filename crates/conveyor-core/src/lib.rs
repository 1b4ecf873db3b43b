//! Conveyor's core: the job model and its state machine, retry policy, typed errors, the
//! [`Store`] trait every backend implements, and the typed [`Client`] producers use.
//!
//! Nothing here does I/O of its own; stores (`conveyor-sqlite`, ...) and the worker runtime
//! (`conveyor-worker`) build on these types.

pub mod access;
pub mod breaker;
pub mod client;
pub mod clock;
pub mod copy;
mod delegate;
pub mod error;
pub mod events;
pub mod faults;
pub mod limits;
/// The former name of [`limits`], kept so existing imports (`conveyor::flow::...`) build.
#[doc(hidden)]
pub use limits as flow;
pub mod job;
pub mod kinds;
pub mod redact;
mod refreshed;
pub mod retry;
pub mod scaling;
pub mod schedule;
pub mod stats;
pub mod store;
pub mod stuck;
pub mod trace;
pub mod unique;
pub mod validate;
pub mod wire;
pub mod workers;
pub mod workflow;

pub use access::{
    ApiToken, AuditAction, AuditCutoff, AuditEntry, AuditListParams, NewAuditEntry, NewSession,
    NewToken, Role, StoredSession, StoredToken, TokenSelector,
};
pub use breaker::{
    BreakerScope, BreakerSettings, BreakerState, BreakerStore, BreakerView, CircuitBreakers,
    StoredBreaker,
};
pub use client::{Client, JobOptions, TypedJob};
pub use clock::{AnchoredClock, Clock, ManualClock, SystemClock, WallSteps};
pub use copy::CopyStore;
pub use error::{StoreError, ValidationError};
pub use events::{AttemptEvent, AttemptStatus, FlowStarts, JobObserver};
pub use job::{
    error_class, ErrorRecord, Inserted, Job, JobState, Lease, NamedQueueSettings, NewJob, Progress,
    QueueSettings, QueueStats, RateLimit, DEFAULT_QUEUE,
};
pub use retry::RetryPolicy;
pub use schedule::{
    FireOutcome, FireRequest, JobTemplate, MissedPolicy, OverlapPolicy, Schedule, ScheduleRun,
    ScheduleSpec, ScheduleView,
};
pub use stats::{StatsRecorder, StatsStore};
pub use store::*;
pub use stuck::{StuckBasis, StuckJob, StuckParams};
pub use unique::UniqueSpec;
pub use validate::{Valid, ValidJob};

// For `delegate_store!`, whose expansion implements async traits in the caller's crate.
#[doc(hidden)]
pub use async_trait;
pub use workers::{
    StaleReport, StaleWorkerParams, WorkerCommand, WorkerHeartbeat, WorkerInfo, WorkerState,
};
