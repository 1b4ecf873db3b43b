//! Observability endpoints: the worker registry, stuck jobs and `GET /metrics`.

use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Utc};
use conveyor_core::{
    validate, wire, AttemptEvent, AttemptStatus, AuditAction, Job, WorkerCommand, WorkerHeartbeat,
    WorkerInfo, WorkerState,
};
use serde::Deserialize;
use uuid::Uuid;

use crate::api::{StuckResponse, WorkersResponse};
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, QueryPairs};
use crate::AppState;

/// Body of `POST /v1/workers/heartbeat`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeartbeatRequest {
    worker_id: String,
    #[serde(default, deserialize_with = "wire::non_null")]
    host: Option<String>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    pid: Option<u32>,
    queues: Vec<String>,
    #[serde(deserialize_with = "wire::int")]
    concurrency: u32,
    #[serde(default, deserialize_with = "wire::int")]
    busy: u32,
    #[serde(default, deserialize_with = "wire::non_null")]
    version: Option<String>,
    started_at: DateTime<Utc>,
    #[serde(default)]
    stopping: bool,
}

pub(crate) async fn worker_heartbeat(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<HeartbeatRequest>,
) -> ApiResult<Json<WorkerInfo>> {
    let beat = WorkerHeartbeat {
        id: request.worker_id,
        host: request.host.unwrap_or_default(),
        pid: request.pid,
        queues: request.queues,
        concurrency: request.concurrency,
        busy: request.busy,
        version: request.version.unwrap_or_default(),
        started_at: request.started_at,
        stopping: request.stopping,
    };
    Ok(Json(state.store.workers_heartbeat(beat).await?))
}

/// `POST /v1/workers/{id}/quiet`: the worker gets no more jobs (it finishes those it holds and
/// keeps running); audited as `worker.quiet`.
pub(crate) async fn worker_quiet(
    State(state): State<AppState>,
    caller: crate::auth::Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<WorkerInfo>> {
    command_worker(state, caller, id, Some(WorkerCommand::Quiet)).await
}

/// `POST /v1/workers/{id}/stop`: as quiet, and the worker exits once its jobs are done (the
/// Rust worker and `conveyor work` do; other HTTP workers stay quiet); audited as `worker.stop`.
pub(crate) async fn worker_stop(
    State(state): State<AppState>,
    caller: crate::auth::Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<WorkerInfo>> {
    command_worker(state, caller, id, Some(WorkerCommand::Stop)).await
}

/// `POST /v1/workers/{id}/resume`: clears a quiet (or a stop not yet obeyed); audited as
/// `worker.resume`.
pub(crate) async fn worker_resume(
    State(state): State<AppState>,
    caller: crate::auth::Caller,
    Path(id): Path<String>,
) -> ApiResult<Json<WorkerInfo>> {
    command_worker(state, caller, id, None).await
}

async fn command_worker(
    state: AppState,
    caller: crate::auth::Caller,
    id: String,
    command: Option<WorkerCommand>,
) -> ApiResult<Json<WorkerInfo>> {
    conveyor_core::workers::text("id", &id, true)?;
    let worker = state
        .store
        .worker_command(&id, command)
        .await?
        .ok_or(ApiError::WorkerNotFound(id.clone()))?;
    state.worker_commands.told(&id, command);
    let action = match command {
        Some(WorkerCommand::Quiet) => AuditAction::WorkerQuiet,
        Some(WorkerCommand::Stop) => AuditAction::WorkerStop,
        None => AuditAction::WorkerResume,
    };
    crate::audit::record(&state, caller.audit(action).target(id)).await;
    Ok(Json(worker))
}

/// `GET /v1/workers[?state=alive|stopped|dead]`.
pub(crate) async fn workers(
    State(state): State<AppState>,
    QueryPairs(pairs): QueryPairs,
) -> ApiResult<Json<WorkersResponse>> {
    let mut only: Option<WorkerState> = None;
    for (key, value) in pairs {
        match key.as_str() {
            "state" => only = Some(value.parse()?),
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter; expected state",
                ))
            }
        }
    }
    let mut workers = state.store.workers_list().await?;
    if let Some(only) = only {
        workers.retain(|worker| worker.state == only);
    }
    Ok(Json(WorkersResponse { workers }))
}

/// `GET /v1/jobs/stuck[?queue=NAME]`: running jobs past their stuck threshold, longest first.
pub(crate) async fn stuck(
    State(state): State<AppState>,
    QueryPairs(pairs): QueryPairs,
) -> ApiResult<Json<StuckResponse>> {
    let mut queue: Option<String> = None;
    for (key, value) in pairs {
        match key.as_str() {
            "queue" => {
                validate::name("queue", &value)?;
                queue = Some(value);
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter; expected queue",
                ))
            }
        }
    }
    let mut jobs = state.store.jobs_stuck(state.config.stuck.clone()).await?;
    if let Some(queue) = queue {
        jobs.retain(|job| job.queue == queue);
    }
    Ok(Json(StuckResponse { jobs }))
}

/// `GET /metrics`. A store failure still answers 200 with the counters (the gauges keep their
/// last values), so one bad read does not blank every graph; it is logged.
pub(crate) async fn metrics(State(state): State<AppState>) -> Response {
    let Some(metrics) = &state.metrics else {
        return ApiError::Internal("metrics are disabled (see the server's log)".to_string())
            .into_response();
    };
    let (text, problem) = metrics
        .render(state.store.as_ref(), &state.config.stuck)
        .await;
    if let Some(error) = problem {
        tracing::warn!(%error, "metrics: store-wide gauges not refreshed");
    }
    let text =
        text + &source_metrics(&state.sources.statuses()) + &hook_metrics(&state.hook_counts);
    ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response()
}

/// The event sources' counts in this process, in the text format: read from each source's
/// status at scrape time rather than kept twice in the registry. Source names are checked
/// names (`[A-Za-z0-9_.:-]`), so they need no escaping as label values.
fn source_metrics(sources: &[std::sync::Arc<conveyor_sources::SourceStatus>]) -> String {
    if sources.is_empty() {
        return String::new();
    }
    let mut text = String::from(
        "# HELP conveyor_source_messages_total Messages an event source read, by what became of \
         them (received, enqueued, duplicate, invalid, unmatched: an event no subscription takes; \
         refused counts batches a full queue turned back).\n# TYPE conveyor_source_messages_total counter\n",
    );
    for source in sources {
        for (outcome, count) in source.counts() {
            text.push_str(&format!(
                "conveyor_source_messages_total{{source=\"{}\",outcome=\"{outcome}\"}} {count}\n",
                source.spec.name
            ));
        }
    }
    text.push_str(
        "# HELP conveyor_source_paused 1 while an event source does not read: paused by an \
         operator, or holding a batch its target queue refused (backing_off); else 0.\n\
         # TYPE conveyor_source_paused gauge\n",
    );
    for source in sources {
        let paused = u8::from(matches!(
            source.state(),
            conveyor_sources::SourceState::BackingOff | conveyor_sources::SourceState::Paused
        ));
        text.push_str(&format!(
            "conveyor_source_paused{{source=\"{}\"}} {paused}\n",
            source.spec.name
        ));
    }
    text.push_str(
        "# HELP conveyor_source_lag Messages waiting at the broker for an event source, where \
         the broker reports it.\n# TYPE conveyor_source_lag gauge\n",
    );
    for source in sources {
        if let Some(lag) = source.lag() {
            text.push_str(&format!(
                "conveyor_source_lag{{source=\"{}\"}} {lag}\n",
                source.spec.name
            ));
        }
    }
    text
}

/// What became of each hook's requests in this process, by hook.
#[derive(Debug, Default)]
pub struct HookCounts(std::sync::Mutex<std::collections::BTreeMap<String, [u64; 5]>>);

/// The outcomes counted, in [`HookCounts`]' order.
pub const HOOK_OUTCOMES: [&str; 5] = ["enqueued", "duplicate", "refused", "invalid", "unmatched"];

impl HookCounts {
    pub(crate) fn add(&self, hook: &str, outcome: usize) {
        if let Ok(mut counts) = self.0.lock() {
            counts.entry(hook.to_string()).or_default()[outcome] += 1;
        }
    }

    /// Each hook's counts by outcome (see [`HOOK_OUTCOMES`]).
    pub fn snapshot(&self) -> Vec<(String, [u64; 5])> {
        self.0
            .lock()
            .map(|counts| counts.iter().map(|(k, v)| (k.clone(), *v)).collect())
            .unwrap_or_default()
    }

    pub(crate) fn of(&self, hook: &str) -> [u64; 5] {
        self.0
            .lock()
            .ok()
            .and_then(|counts| counts.get(hook).copied())
            .unwrap_or_default()
    }
}

/// Each webhook's requests in this process, by outcome (hook names are checked names).
fn hook_metrics(counts: &HookCounts) -> String {
    let counts = counts.snapshot();
    if counts.is_empty() {
        return String::new();
    }
    let mut text = String::from(
        "# HELP conveyor_hook_requests_total Webhook requests, by what became of them (enqueued, \
         duplicate: a delivery seen before, refused: a bad or stale signature, invalid: a \
         request the hook's mapping or the kind's schema refused, unmatched: an event no \
         subscription takes).\n\
         # TYPE conveyor_hook_requests_total counter\n",
    );
    for (hook, counts) in counts {
        for (outcome, count) in HOOK_OUTCOMES.iter().zip(counts) {
            text.push_str(&format!(
                "conveyor_hook_requests_total{{hook=\"{hook}\",outcome=\"{outcome}\"}} {count}\n"
            ));
        }
    }
    text
}

/// Counts an attempt a worker reported ended (failed, dead or snoozed), as the store's answer
/// shows it; `retry_at` when the failure asked for a retry at a given time.
pub(crate) fn count_reported(
    state: &AppState,
    job: &Job,
    status: AttemptStatus,
    retry_at: Option<DateTime<Utc>>,
) {
    let ended = job
        .errors
        .last()
        .filter(|_| matches!(status, AttemptStatus::Failed | AttemptStatus::Dead))
        .map(|error| error.at)
        .unwrap_or_else(|| state.clock.now());
    attempt_finished(
        state,
        &job.queue,
        &job.kind,
        status,
        ran_for(job, ended),
        retry_at,
    );
}

/// Counts a completion a worker reported. The store's answer to a completion carries no job:
/// what the fetch that handed the job out remembered serves (no read), else the job is read
/// back (one primary-key read) for its queue, kind and times.
pub(crate) async fn count_completed(state: &AppState, id: Uuid) {
    let remembered = state
        .leased
        .lock()
        .ok()
        .and_then(|mut leased| leased.remove(&id));
    if let Some(job) = remembered {
        let status = AttemptStatus::Completed;
        attempt_finished(
            state,
            &job.queue,
            &job.kind,
            status,
            job.started.elapsed(),
            None,
        );
        return;
    }
    if state.metrics.is_none() && !state.breakers.watching() {
        return;
    }
    match state.store.job_get(id).await {
        Ok(Some(job)) => {
            let ended = job.finished_at.unwrap_or_else(|| state.clock.now());
            let duration = ran_for(&job, ended);
            attempt_finished(
                state,
                &job.queue,
                &job.kind,
                AttemptStatus::Completed,
                duration,
                None,
            );
        }
        // Completed but gone already (another node pruned it): nothing to label it with.
        Ok(None) => {}
        Err(error) => {
            tracing::warn!(job_id = %id, %error, "metrics: completion not counted")
        }
    }
}

fn ran_for(job: &Job, ended: DateTime<Utc>) -> std::time::Duration {
    job.started_at
        .map(|started| (ended - started).to_std().unwrap_or_default())
        .unwrap_or_default()
}

/// A finished attempt, told once (`conveyor_engine::report::attempt_finished`) to the metrics
/// (and the history behind them) and to its queue's and kind's circuit breakers.
fn attempt_finished(
    state: &AppState,
    queue: &str,
    kind: &str,
    status: AttemptStatus,
    duration: std::time::Duration,
    retry_at: Option<DateTime<Utc>>,
) {
    let observer = state
        .metrics
        .as_deref()
        .map(|metrics| metrics as &dyn conveyor_core::JobObserver);
    let event = AttemptEvent {
        queue,
        kind,
        status,
        duration,
    };
    conveyor_engine::report::attempt_finished(observer, &state.breakers, &event, retry_at);
}

/// When a failure asked to be retried at a given time (a dependency's retry-after).
pub(crate) fn retry_at_of(params: &conveyor_core::FailParams) -> Option<DateTime<Utc>> {
    match params.retry {
        conveyor_core::RetryPlan::At(at) => Some(at),
        _ => None,
    }
}

/// Counts jobs stored by an enqueue (`conveyor_jobs_enqueued_total`; duplicates are not new).
pub(crate) fn count_enqueued(state: &AppState, inserted: &[conveyor_core::Inserted]) {
    if let Some(metrics) = &state.metrics {
        conveyor_core::JobObserver::jobs_enqueued(metrics.as_ref(), inserted);
    }
}

/// Observes how long each job handed out waited to start (`conveyor_job_queue_wait_seconds`,
/// and the history's `started` and queue wait).
pub(crate) fn count_waits(state: &AppState, jobs: &[Job]) {
    if let Some(metrics) = &state.metrics {
        jobs.iter()
            .for_each(|job| conveyor_core::JobObserver::attempt_started(metrics.as_ref(), job));
    }
}
