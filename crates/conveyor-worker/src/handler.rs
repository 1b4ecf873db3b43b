//! What handlers receive and return.

use conveyor_core::{error_class, Job, LeaseRef, RetryPolicy, Store};
use futures::future::BoxFuture;
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// What a handler knows about the job it runs.
#[derive(Debug, Clone)]
pub struct JobContext {
    pub id: Uuid,
    pub kind: String,
    pub queue: String,
    /// 1 on the first attempt.
    pub attempt: u32,
    pub max_attempts: u32,
    pub tenant: Option<String>,
    pub tags: Vec<String>,
    /// For a workflow's step: its flow and step name (for a compensation job, the step it
    /// compensates).
    pub flow: Option<(Uuid, String)>,
    /// For a workflow's step: its completed parents' results by step name (for a compensation
    /// job, the compensated step's result).
    pub parents: BTreeMap<String, Value>,
    /// The handler's own span as a W3C trace context, a child of the producer's (the job's
    /// `trace`): pass `trace.traceparent` on to keep one trace across the calls it makes.
    /// `None` when the producer gave no trace context.
    pub trace: Option<conveyor_core::trace::TraceContext>,
    cancel: CancellationToken,
    reporter: Option<ProgressReporter>,
}

/// Where a handler's progress reports go: the store, under the job's lease.
#[derive(Clone)]
pub(crate) struct ProgressReporter {
    pub store: Arc<dyn Store>,
    pub lease: LeaseRef,
}

impl std::fmt::Debug for ProgressReporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProgressReporter")
            .field("job", &self.lease.id)
            .finish_non_exhaustive()
    }
}

impl JobContext {
    pub(crate) fn new(
        job: &Job,
        cancel: CancellationToken,
        reporter: Option<ProgressReporter>,
    ) -> Self {
        Self {
            id: job.id,
            kind: job.kind.clone(),
            queue: job.queue.clone(),
            attempt: job.attempt,
            max_attempts: job.max_attempts,
            tenant: job.tenant.clone(),
            tags: job.tags.clone(),
            flow: job.flow.as_ref().map(|f| (f.flow_id, f.step.clone())),
            parents: job
                .flow
                .as_ref()
                .map(|f| f.parents.clone())
                .unwrap_or_default(),
            trace: job
                .trace
                .as_ref()
                .map(|t| t.child(&conveyor_core::trace::TraceContext::new_span_id())),
            cancel,
            reporter,
        }
    }

    /// Records how far the job has come (0 to 100, with an optional message), shown in the job
    /// and flow views. `LeaseLost` once the job no longer runs here.
    pub async fn progress(
        &self,
        percent: u8,
        message: Option<&str>,
    ) -> conveyor_core::StoreResult<()> {
        match &self.reporter {
            Some(reporter) => {
                reporter
                    .store
                    .job_progress(reporter.lease, percent, message.map(str::to_string))
                    .await
            }
            None => Ok(()),
        }
    }

    /// A parent step's result, by the parent's name.
    pub fn parent(&self, step: &str) -> Option<&Value> {
        self.parents.get(step)
    }

    /// Resolves when the job should stop: shutdown past the drain timeout, or the lease was lost
    /// (cancelled, rescued). Long handlers can select on it to stop cleanly; otherwise they are
    /// dropped at their next await point.
    pub async fn cancelled(&self) {
        self.cancel.cancelled().await
    }

    pub fn is_cancelled(&self) -> bool {
        self.cancel.is_cancelled()
    }
}

/// A handler's verdict on one attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Done; the optional JSON result is stored with the job.
    Complete(Option<Value>),
    /// A transient failure: retry after the kind's backoff (dead once attempts are exhausted).
    Retry(String),
    /// Retry no sooner than this (e.g. the dependency answered 429 with Retry-After).
    RetryAfter(Duration, String),
    /// Retrying cannot help: straight to the dead-letter queue.
    Permanent(String),
    /// Not now: run again after this delay without counting an attempt.
    Snooze(Duration),
}

impl Outcome {
    pub fn ok() -> Self {
        Outcome::Complete(None)
    }
    pub fn complete_with(result: Value) -> Self {
        Outcome::Complete(Some(result))
    }
    pub fn retry(error: impl std::fmt::Display) -> Self {
        Outcome::Retry(error.to_string())
    }
    pub fn retry_after(delay: Duration, error: impl std::fmt::Display) -> Self {
        Outcome::RetryAfter(delay, error.to_string())
    }
    pub fn permanent(error: impl std::fmt::Display) -> Self {
        Outcome::Permanent(error.to_string())
    }
    pub fn snooze(delay: Duration) -> Self {
        Outcome::Snooze(delay)
    }
}

/// Results from a handler's `Result`: `Ok(())` completes, `Err(e)` retries with backoff.
impl<E: std::fmt::Display> From<Result<(), E>> for Outcome {
    fn from(result: Result<(), E>) -> Self {
        match result {
            Ok(()) => Outcome::ok(),
            Err(e) => Outcome::retry(e),
        }
    }
}

/// A failure the runtime itself detected (not a handler verdict).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RuntimeFailure {
    pub class: &'static str,
    pub message: String,
    /// A panic's backtrace, kept with the failure.
    pub backtrace: Option<String>,
    /// False for failures that cannot succeed on retry (an undecodable payload).
    pub retryable: bool,
}

impl RuntimeFailure {
    pub fn invalid_payload(kind: &str, error: impl std::fmt::Display) -> Self {
        Self {
            class: error_class::INVALID_PAYLOAD,
            message: format!("payload does not match job type {kind}: {error}"),
            backtrace: None,
            retryable: false,
        }
    }
}

pub(crate) type HandlerFuture = BoxFuture<'static, Result<Outcome, RuntimeFailure>>;
pub(crate) type ErasedHandler = Arc<dyn Fn(JobContext, Value) -> HandlerFuture + Send + Sync>;

/// One job of a batch, as a batch handler receives it (see `WorkerBuilder::handle_batch`).
#[derive(Debug, Clone)]
pub struct BatchJob {
    pub context: JobContext,
    pub payload: Value,
}

pub(crate) type BatchFuture = BoxFuture<'static, Vec<Outcome>>;
pub(crate) type ErasedBatchHandler = Arc<dyn Fn(Vec<BatchJob>) -> BatchFuture + Send + Sync>;

#[derive(Clone)]
pub(crate) struct RegisteredBatch {
    pub handler: ErasedBatchHandler,
    pub retry: RetryPolicy,
    pub timeout: Option<Duration>,
}

#[derive(Clone)]
pub(crate) struct Registered {
    pub handler: ErasedHandler,
    pub retry: RetryPolicy,
    pub timeout: Option<Duration>,
}
