//! Conveyor's core: the job model and its state machine, the rules (retry policy, limits,
//! breakers, schedules, workflows, validation), typed errors, and the [`Store`] traits every
//! backend implements.
//!
//! Nothing here does I/O: the stores (`conveyor-sqlite`, `conveyor-postgres`) implement the
//! traits, and the services that read and write through them at run time (breakers, the kind
//! registry, the history recorder, the typed client, the long-poll) live in `conveyor-engine`.

pub mod access;
pub mod batch;
pub mod breaker;
pub mod client;
pub mod clock;
pub mod config;
pub mod copy;
pub mod debounce;
mod delegate;
pub mod error;
pub mod events;
pub mod faults;
pub mod fields;
pub mod hooks;
pub mod limits;
/// The former name of [`limits`], kept so existing imports (`conveyor::flow::...`) build.
#[doc(hidden)]
pub use limits as flow;
pub mod job;
pub mod kinds;
pub mod lease;
pub mod redact;
pub mod retry;
pub mod scaling;
pub mod schedule;
pub mod sequence;
pub mod sources;
pub mod state;
pub mod stats;
pub mod steps;
pub mod store;
pub mod stuck;
pub mod subscriptions;
pub mod trace;
pub mod trace_context;
pub mod unique;
pub mod valid;
pub mod validate;
pub mod wire;
pub mod workers;
pub mod workflow;

pub use access::{
    ApiToken, AuditAction, AuditCutoff, AuditEntry, AuditListParams, NewAuditEntry, NewSession,
    NewToken, Role, StoredSession, StoredToken, TokenSelector,
};
pub use breaker::{
    BreakerScope, BreakerSettings, BreakerState, BreakerStore, BreakerView, StoredBreaker,
};
pub use client::{JobOptions, TypedJob};
pub use clock::{AnchoredClock, Clock, ManualClock, SystemClock, WallSteps};
pub use config::{ConfigEntry, ConfigStore};
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
pub use stats::StatsStore;
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
