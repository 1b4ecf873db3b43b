//! Running one job: its handler under the timeout, panics contained, the outcome settled.

use super::*;
use tracing::Instrument;

/// How one attempt ended, from the runtime's point of view.
#[derive(Clone)]
enum Attempt {
    Handler(Outcome),
    Failed(RuntimeFailure),
    /// Shutdown or a lost lease: the handler was dropped; someone else settles the job.
    Interrupted,
}

pub(super) async fn execute(lane: Arc<Lane>, job: Job, permit: Option<OwnedSemaphorePermit>) {
    let shared = lane.shared.clone();
    if !shared.handlers.contains_key(&job.kind) && shared.batch_handlers.contains_key(&job.kind) {
        // A kind handled in batches that a plain fetch claimed (it is not a batch kind in the
        // store): a batch of one. Boxed: inline, the batch's state machine would make every
        // job's future as large as a batch's, copied at each spawn and join.
        return Box::pin(execute_batch(lane, vec![job], permit)).await;
    }
    let Some(lease) = job.lease.as_ref() else {
        tracing::error!(job_id = %job.id, "fetched job has no lease; skipping");
        lane.slot_freed(permit);
        return;
    };
    let lease = LeaseRef {
        id: job.id,
        lease_token: lease.token,
    };
    let cancel = CancellationToken::new();
    shared.running().insert(
        job.id,
        RunningJob {
            lease_token: lease.lease_token,
            cancel: cancel.clone(),
        },
    );
    let registered = shared.handlers.get(&job.kind).cloned();
    let retry = registered
        .as_ref()
        .map_or(shared.default_retry, |r| r.retry);
    let started = std::time::Instant::now();
    let started_at = chrono::Utc::now();
    let mut handler_trace = None;
    // Lifecycle events name the job, never its payload (which may hold personal data).
    let trace_id = job
        .trace
        .as_ref()
        .map(|t| t.trace_id().to_string())
        .unwrap_or_default();
    tracing::info!(target: JOB_LOG_TARGET, job_id = %job.id, trace_id = %trace_id,
        queue = %job.queue, kind = %job.kind, attempt = job.attempt, worker_id = %shared.id,
        "job started");

    let attempt = match registered {
        None => Attempt::Failed(RuntimeFailure {
            class: error_class::UNKNOWN_KIND,
            message: format!(
                "no handler registered for kind {:?} on worker {}",
                job.kind, shared.id
            ),
            backtrace: None,
            retryable: true,
        }),
        Some(registered) => {
            let timeout = job
                .timeout_ms
                .map(Duration::from_millis)
                .or(registered.timeout);
            let reporter = job.lease_ref().map(|lease| ProgressReporter {
                store: shared.store.clone(),
                lease,
            });
            let ctx = JobContext::new(&job, cancel.clone(), reporter);
            handler_trace = ctx.trace.clone();
            // Whatever the handler logs carries the job's id and, when the producer gave one,
            // its trace id and the handler's span id (a child of the producer's span).
            let span = tracing::info_span!(
                "job",
                job_id = %job.id,
                trace_id = ctx.trace.as_ref().map(|t| t.trace_id()).unwrap_or_default(),
                span_id = ctx.trace.as_ref().map(|t| t.parent_id()).unwrap_or_default(),
            );
            run_handler(&registered, ctx, job.payload.clone(), timeout, &cancel)
                .instrument(span)
                .await
        }
    };
    shared.running().remove(&job.id);
    lane.slot_freed(permit);
    if let (Some(handler), Some(producer)) = (&handler_trace, &job.trace) {
        execute_span(&job, handler, producer, started_at, &attempt);
    }
    settle(&lane, job, lease, attempt, retry, started, trace_id).await;
}

/// Writes how one attempt ended: the completion (through the completer), a snooze, or the
/// failure with its retry plan.
async fn settle(
    lane: &Arc<Lane>,
    job: Job,
    lease: LeaseRef,
    attempt: Attempt,
    retry: RetryPolicy,
    started: std::time::Instant,
    trace_id: String,
) {
    let shared = &lane.shared;
    let meta = JobMeta {
        id: job.id,
        queue: job.queue,
        kind: job.kind,
        attempt: job.attempt,
        duration: started.elapsed(),
        trace_id,
    };
    let duration_ms = meta.duration.as_millis() as u64;
    let backtrace = match &attempt {
        Attempt::Failed(failure) => failure.backtrace.clone(),
        _ => None,
    };
    let (class, message, plan) = match attempt {
        Attempt::Interrupted => {
            tracing::info!(target: JOB_LOG_TARGET, job_id = %meta.id, trace_id = %meta.trace_id, queue = %meta.queue,
                kind = %meta.kind, attempt = meta.attempt, duration_ms, outcome = "interrupted",
                "job interrupted (shutdown or lost lease)");
            return;
        }
        Attempt::Handler(Outcome::Complete(Some(result)))
            if conveyor_core::validate::json_without_nul("result", &result).is_err() =>
        {
            // Checked here, not by the completer's batch: one unstorable result must not fail
            // the completions it would be written with.
            let problem = conveyor_core::validate::json_without_nul("result", &result)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            (
                error_class::INVALID_RESULT,
                format!("the handler's result cannot be stored: {problem}"),
                RetryPlan::Never,
            )
        }
        Attempt::Handler(Outcome::Complete(result)) => {
            // Batched by the completer, which logs and counts it once written; if the worker
            // dies first, the lease expires and the job reruns.
            let _ = lane.completions.send(Completion {
                params: CompleteParams { lease, result },
                job: meta,
            });
            return;
        }
        Attempt::Handler(Outcome::Snooze(delay)) => {
            let until = conveyor_core::clock::after(shared.clock.now(), delay);
            match shared.store.job_snooze(SnoozeParams { lease, until }).await {
                Ok(_) => {
                    tracing::info!(target: JOB_LOG_TARGET, job_id = %meta.id, trace_id = %meta.trace_id,
                        queue = %meta.queue, kind = %meta.kind, attempt = meta.attempt,
                        duration_ms, outcome = "snoozed", "job snoozed");
                    shared.observe(&meta, AttemptStatus::Snoozed, None);
                }
                Err(error) => {
                    tracing::warn!(job_id = %meta.id, trace_id = %meta.trace_id, %error, "snooze not recorded")
                }
            }
            return;
        }
        Attempt::Handler(Outcome::Retry(message)) => {
            (error_class::ERROR, message, RetryPlan::Backoff(retry))
        }
        Attempt::Handler(Outcome::RetryAfter(delay, message)) => {
            let at = conveyor_core::clock::after(shared.clock.now(), delay);
            (error_class::RETRY_AFTER, message, RetryPlan::At(at))
        }
        Attempt::Handler(Outcome::Permanent(message)) => {
            (error_class::PERMANENT, message, RetryPlan::Never)
        }
        Attempt::Failed(failure) => {
            let plan = if failure.retryable {
                RetryPlan::Backoff(retry)
            } else {
                RetryPlan::Never
            };
            (failure.class, failure.message, plan)
        }
    };
    let retry_at = match plan {
        RetryPlan::At(at) => Some(at),
        _ => None,
    };
    let failed = shared
        .store
        .job_fail(FailParams {
            lease,
            class: class.to_string(),
            message: message.clone(),
            retry: plan,
            backtrace,
        })
        .await;
    match failed {
        Ok(after) => {
            let status = AttemptStatus::of_failure(after.state);
            tracing::warn!(target: JOB_LOG_TARGET, job_id = %meta.id, trace_id = %meta.trace_id, queue = %meta.queue,
                kind = %meta.kind, attempt = meta.attempt, duration_ms,
                outcome = status.as_str(), state = %after.state, error_class = class,
                error = %message, "job failed");
            shared.observe(&meta, status, retry_at);
        }
        Err(error) => {
            tracing::warn!(job_id = %meta.id, trace_id = %meta.trace_id, %error, "failure not recorded")
        }
    }
}

/// Runs one batch through its kind's batch handler and settles each job by its own outcome
/// (the outcome at the same place in the handler's answer; a job without one fails). The
/// batch holds one slot; every job's lease is heartbeated while it runs.
pub(super) async fn execute_batch(
    lane: Arc<Lane>,
    jobs: Vec<Job>,
    permit: Option<OwnedSemaphorePermit>,
) {
    let shared = lane.shared.clone();
    let Some(first) = jobs.first() else {
        lane.slot_freed(permit);
        return;
    };
    let Some(registered) = shared.batch_handlers.get(&first.kind).cloned() else {
        tracing::error!(kind = %first.kind, "batch fetched for a kind without a batch handler");
        lane.slot_freed(permit);
        let leases = jobs.iter().filter_map(Job::lease_ref).collect();
        lane.hand_back(leases, "no batch handler").await;
        return;
    };
    // A token per job: a lost lease (the job cancelled, rescued) drops that job's outcome
    // only; the handler stops when every job's token is cancelled (shutdown past the drain).
    let mut tokens = Vec::with_capacity(jobs.len());
    let mut items = Vec::with_capacity(jobs.len());
    let mut leases = Vec::with_capacity(jobs.len());
    for job in &jobs {
        let Some(lease) = job.lease_ref() else {
            continue;
        };
        let cancel = CancellationToken::new();
        tokens.push(cancel.clone());
        shared.running().insert(
            job.id,
            RunningJob {
                lease_token: lease.lease_token,
                cancel: cancel.clone(),
            },
        );
        let reporter = Some(ProgressReporter {
            store: shared.store.clone(),
            lease,
        });
        items.push(crate::handler::BatchJob {
            context: JobContext::new(job, cancel.clone(), reporter),
            payload: job.payload.clone(),
        });
        leases.push(lease);
        tracing::info!(target: JOB_LOG_TARGET, job_id = %job.id, queue = %job.queue,
            kind = %job.kind, attempt = job.attempt, worker_id = %shared.id, batch = jobs.len(),
            "job started");
    }
    let started = std::time::Instant::now();
    let timeout = jobs
        .iter()
        .filter_map(|job| job.timeout_ms)
        .min()
        .map(Duration::from_millis)
        .or(registered.timeout);
    let count = items.len();
    let outcomes = run_batch_handler(&registered, items, timeout, &tokens).await;
    for job in &jobs {
        shared.running().remove(&job.id);
    }
    lane.slot_freed(permit);
    let mut outcomes = match outcomes {
        Ok(outcomes) => outcomes
            .into_iter()
            .map(Attempt::Handler)
            .collect::<Vec<_>>(),
        Err(attempt) => (0..count).map(|_| attempt.clone()).collect(),
    };
    outcomes.truncate(count);
    // A job the handler gave no outcome for failed: nothing says its work was done.
    let answered = outcomes.len();
    while outcomes.len() < count {
        outcomes.push(Attempt::Failed(RuntimeFailure {
            class: error_class::MISSING_OUTCOME,
            message: format!(
                "the batch handler returned {answered} outcome(s) for a batch of {count}"
            ),
            backtrace: None,
            retryable: true,
        }));
    }
    // A job whose lease was lost meanwhile is someone else's to settle.
    for (attempt, token) in outcomes.iter_mut().zip(&tokens) {
        if token.is_cancelled() {
            *attempt = Attempt::Interrupted;
        }
    }
    let jobs = jobs.into_iter().filter(|job| job.lease.is_some());
    for ((job, lease), attempt) in jobs.zip(leases).zip(outcomes) {
        let trace_id = job
            .trace
            .as_ref()
            .map(|t| t.trace_id().to_string())
            .unwrap_or_default();
        settle(
            &lane,
            job,
            lease,
            attempt,
            registered.retry,
            started,
            trace_id,
        )
        .await;
    }
}

/// Runs a batch handler in a task of its own (see [`supervise`]) until it answers or every
/// job's token is cancelled; `Err` carries what every job of the batch gets when the handler
/// gave no outcomes.
async fn run_batch_handler(
    registered: &crate::handler::RegisteredBatch,
    items: Vec<crate::handler::BatchJob>,
    timeout: Option<Duration>,
    tokens: &[CancellationToken],
) -> Result<Vec<Outcome>, Attempt> {
    let every_one_cancelled = async {
        for token in tokens {
            token.cancelled().await;
        }
    };
    let task = tokio::spawn((registered.handler)(items));
    supervise(task, timeout, every_one_cancelled, "batch handler").await
}

async fn run_handler(
    registered: &Registered,
    ctx: JobContext,
    payload: Value,
    timeout: Option<Duration>,
    cancel: &CancellationToken,
) -> Attempt {
    let task = tokio::spawn((registered.handler)(ctx, payload));
    match supervise(task, timeout, cancel.cancelled(), "handler").await {
        Ok(Ok(outcome)) => Attempt::Handler(outcome),
        Ok(Err(failure)) => Attempt::Failed(failure),
        Err(attempt) => attempt,
    }
}

/// Waits for a handler's task (spawned, so a panic is contained and reported with its
/// backtrace, not propagated) under `timeout`, or until `cancelled` resolves. `Err` is how the
/// attempt ended without an answer: interrupted, panicked or timed out (`what` names the
/// handler in the timeout's message).
async fn supervise<T: Send + 'static>(
    mut task: tokio::task::JoinHandle<T>,
    timeout: Option<Duration>,
    cancelled: impl std::future::Future<Output = ()>,
    what: &str,
) -> Result<T, Attempt> {
    super::backtraces::install();
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    // Cancellation is checked first: a handler that awaits `ctx.cancelled()` and then returns
    // finishes in the same instant as the cancellation, and an unbiased select would then take
    // its outcome half of the time, completing a job that shutdown means to release (and
    // reporting it drained). Once cancelled, the attempt is interrupted, whatever it returns.
    tokio::select! {
        biased;
        _ = cancelled => {
            // Give a cooperative handler (one awaiting `ctx.cancelled()`) a moment to stop
            // cleanly before it is dropped.
            if tokio::time::timeout(CANCEL_GRACE, &mut task).await.is_err() {
                task.abort();
                let _ = task.await;
            }
            Err(Attempt::Interrupted)
        }
        joined = &mut task => match joined {
            Ok(answer) => Ok(answer),
            Err(join_error) if join_error.is_panic() => {
                let backtrace = super::backtraces::take(join_error.id());
                Err(Attempt::Failed(RuntimeFailure {
                    class: error_class::PANIC,
                    message: panic_message(join_error.into_panic()),
                    backtrace,
                    retryable: true,
                }))
            }
            Err(_) => Err(Attempt::Interrupted),
        },
        _ = deadline => {
            task.abort();
            Err(Attempt::Failed(RuntimeFailure {
                class: error_class::TIMEOUT,
                message: format!(
                    "{what} exceeded its timeout of {} ms",
                    timeout.map_or(0, |t| t.as_millis())
                ),
                backtrace: None,
                retryable: true,
            }))
        }
    }
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let text = payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "handler panicked".to_string());
    format!("handler panicked: {text}")
}

/// Exports the handler's run as a `conveyor.execute` span (when spans are exported): the span
/// whose id the handler got in `JobContext::trace`, a child of the job's stored context.
fn execute_span(
    job: &Job,
    handler: &conveyor_core::trace::TraceContext,
    producer: &conveyor_core::trace::TraceContext,
    start: chrono::DateTime<chrono::Utc>,
    attempt: &Attempt,
) {
    if !conveyor_core::trace::exporting() {
        return;
    }
    let (outcome, error) = match attempt {
        Attempt::Handler(Outcome::Complete(_)) => ("completed", None),
        Attempt::Handler(Outcome::Snooze(_)) => ("snoozed", None),
        Attempt::Handler(Outcome::Retry(message))
        | Attempt::Handler(Outcome::RetryAfter(_, message))
        | Attempt::Handler(Outcome::Permanent(message)) => ("failed", Some(message.clone())),
        Attempt::Failed(failure) => ("failed", Some(failure.message.clone())),
        Attempt::Interrupted => ("interrupted", None),
    };
    let mut attributes = conveyor_core::trace::job_attributes(job);
    attributes.push(("conveyor.outcome", outcome.to_string()));
    conveyor_core::trace::emit(conveyor_core::trace::FinishedSpan {
        name: "conveyor.execute",
        kind: conveyor_core::trace::SpanKind::Consumer,
        trace_id: handler.trace_id().to_string(),
        span_id: handler.parent_id().to_string(),
        parent_span_id: Some(producer.parent_id().to_string()),
        start,
        end: chrono::Utc::now(),
        attributes,
        error,
    });
}
