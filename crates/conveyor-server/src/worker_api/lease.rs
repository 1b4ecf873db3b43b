//! The per-job worker endpoints: fetch (long-poll, carrying batched reports), heartbeat,
//! complete, fail, release, snooze.

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use conveyor_core::{wire, workers};
use conveyor_core::{
    AttemptStatus, CompleteParams, FetchParams, HeartbeatParams, Job, LeaseOutcome, LeaseRef,
    SnoozeParams, Valid,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;
use uuid::Uuid;

use crate::api::{FetchResponse, FetchedJob};
use crate::error::{ApiError, ApiResult};
use crate::extract::{after_ms, check_json_size, ApiJson, JobId};
use crate::AppState;

use super::reports::{fail_params, lease_duration, FailError, RetryMode};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FetchRequest {
    worker_id: String,
    queues: Vec<String>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    max: Option<usize>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    lease_ms: Option<u64>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    wait_ms: Option<u64>,
    /// Claim only jobs of these kinds (those the worker has handlers for).
    #[serde(default, deserialize_with = "wire::non_null")]
    kinds: Option<Vec<String>>,
    /// One batch: up to `max` jobs of one kind (and one batch key) from one queue, waiting for
    /// the kind's batch to fill (see `conveyor_core::batch`). `max` defaults to the most a
    /// fetch may claim, so the kind's `max_size` decides.
    #[serde(default, deserialize_with = "wire::non_null")]
    batch: Option<bool>,
    /// Acknowledgements applied before claiming (as `POST /v1/ack`).
    #[serde(default)]
    complete: Vec<super::acks::AckComplete>,
    #[serde(default)]
    fail: Vec<super::acks::AckFail>,
    /// What the registry shows of the worker (`/v1/workers`).
    #[serde(default, deserialize_with = "wire::opt_int")]
    concurrency: Option<u32>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    busy: Option<u32>,
    #[serde(default, deserialize_with = "wire::non_null")]
    host: Option<String>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    pid: Option<u32>,
    #[serde(default, deserialize_with = "wire::non_null")]
    version: Option<String>,
}

/// A fetched job as the API shows it to the worker that claimed it.
fn fetched_job(job: Job) -> ApiResult<FetchedJob> {
    let lease = job.lease.ok_or_else(|| {
        ApiError::Internal(format!("store fetched job {} without a lease", job.id))
    })?;
    let (flow_id, step, parents) = match job.flow {
        Some(link) => (Some(link.flow_id), Some(link.step), Some(link.parents)),
        None => (None, None, None),
    };
    Ok(FetchedJob {
        flow_id,
        step,
        parents,
        id: job.id,
        kind: job.kind,
        queue: job.queue,
        payload: job.payload,
        attempt: job.attempt,
        max_attempts: job.max_attempts,
        timeout_ms: job.timeout_ms,
        lease_token: lease.token,
        lease_expires_at: lease.expires_at,
        tenant: job.tenant,
        tags: job.tags,
        expires_at: job.expires_at,
        traceparent: job.trace.as_ref().map(|t| t.traceparent.clone()),
        tracestate: job.trace.and_then(|t| t.tracestate),
    })
}

pub(crate) async fn fetch(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<FetchRequest>,
) -> ApiResult<Json<FetchResponse>> {
    let config = &state.config;
    workers::text("worker_id", &request.worker_id, true)?;
    if request.queues.is_empty() {
        return Err(ApiError::invalid("queues", "must name at least one queue"));
    }
    let batch = request.batch == Some(true);
    let max = request
        .max
        .unwrap_or(if batch { config.max_fetch_batch } else { 1 });
    if max == 0 || max > config.max_fetch_batch {
        return Err(ApiError::invalid(
            "max",
            format!("must be from 1 to {}", config.max_fetch_batch),
        ));
    }
    let lease = lease_duration("lease_ms", request.lease_ms, config.default_lease)?;
    let wait = Duration::from_millis(request.wait_ms.unwrap_or(0)).min(config.max_fetch_wait);
    let params = FetchParams {
        worker_id: request.worker_id,
        queues: request.queues,
        max,
        lease,
        kinds: request.kinds,
        excluded_kinds: Vec::new(),
    };
    // Names, the cap on distinct queues, repeated names dropped: once, not on every look of
    // the long-poll.
    let params = Valid::fetch(params)?;
    // Checked on every fetch, as the registry would (only on the fetches that write it).
    for (field, text) in [("host", &request.host), ("version", &request.version)] {
        if let Some(text) = text {
            workers::text(field, text, false)?;
        }
    }
    // Everything checked before anything is applied.
    let acks = super::acks::check(&state, request.complete, request.fail)?;
    let acks = if acks.is_empty() {
        Vec::new()
    } else {
        super::acks::apply(&state, acks).await?
    };
    super::acks::register(
        &state,
        super::acks::Registration {
            worker_id: &params.worker_id,
            queues: &params.queues,
            concurrency: request.concurrency,
            busy: request.busy,
            host: request.host.as_deref(),
            pid: request.pid,
            version: request.version.as_deref(),
        },
    )
    .await?;
    let worker_id = params.worker_id.clone();
    if let Some(command) = told(&state, &worker_id).await {
        // Told to quiet or stop: no jobs. The long-poll still waits, so a worker that does
        // not know the command does not spin on empty answers.
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = state.shutdown.cancelled() => {}
        }
        return Ok(Json(FetchResponse {
            jobs: Vec::new(),
            acks,
            command: Some(command),
        }));
    }
    let fetch_started = chrono::Utc::now();
    let jobs = fetch_released_if_abandoned(&state, params, wait, batch).await?;
    // Told while this long-poll waited: what it claimed goes back (available again, the
    // attempt not counted), so no job is handed out after the command is known here.
    if !jobs.is_empty() {
        if let Some(command) = told(&state, &worker_id).await {
            let leases: Vec<LeaseRef> = jobs.iter().filter_map(Job::lease_ref).collect();
            match state.store.jobs_release_many(leases).await {
                Ok(_) => {
                    return Ok(Json(FetchResponse {
                        jobs: Vec::new(),
                        acks,
                        command: Some(command),
                    }))
                }
                // Not released: better run by the worker that holds them than stranded
                // until their leases expire.
                Err(error) => {
                    tracing::warn!(%error, %worker_id, "jobs claimed for a told worker could not be released; handing them out")
                }
            }
        }
    }
    conveyor_core::trace::fetched(&jobs, &worker_id, fetch_started, chrono::Utc::now());
    crate::observe::count_waits(&state, &jobs);
    remember_leased(&state, &jobs);
    let jobs = jobs
        .into_iter()
        .map(fetched_job)
        .collect::<ApiResult<Vec<_>>>()?;
    Ok(Json(FetchResponse {
        jobs,
        acks,
        command: None,
    }))
}

/// The command an operator gave `worker_id`, if any. A registry that cannot be read is no
/// reason to refuse work: the fetch goes on as if none (and the failure is logged).
async fn told(state: &AppState, worker_id: &str) -> Option<conveyor_core::WorkerCommand> {
    state
        .worker_commands
        .of(worker_id)
        .await
        .unwrap_or_else(|error| {
            tracing::warn!(%error, "worker commands not read; fetching as if none");
            None
        })
}

/// Long-polls on a task of its own, so that a client that goes away mid-fetch (a closed
/// connection drops this handler) neither keeps the wait going nor strands jobs: dropping the
/// handler cancels the wait, and jobs claimed that nobody will receive are released at once
/// (available again, the attempt not counted) instead of waiting for their leases to expire.
async fn fetch_released_if_abandoned(
    state: &AppState,
    params: Valid<FetchParams>,
    wait: Duration,
    batch: bool,
) -> ApiResult<Vec<Job>> {
    let abandoned = state.shutdown.child_token();
    let _cancel_on_drop = abandoned.clone().drop_guard();
    let (answer, receive) = tokio::sync::oneshot::channel();
    let store = state.store.clone();
    let breakers = state.breakers.clone();
    let kinds = state.kinds.clone();
    let poll = state.config.fetch_poll;
    let idle_looks = state.idle_looks.clone();
    tokio::spawn(async move {
        let gates = conveyor_engine::Gates {
            breakers: Some(breakers.as_ref()),
            kinds: Some(kinds.as_ref()),
            batch,
        };
        let fetched = conveyor_engine::fetch_waiting_with(
            store.as_ref(),
            gates,
            params,
            wait,
            poll,
            Some(&idle_looks),
            abandoned.cancelled(),
        )
        .await;
        // Test builds can slow the answer down here (a client leaving mid-answer).
        let _ = conveyor_core::faults::inject("server_fetch_answer");
        if let Err(Ok(jobs)) = answer.send(fetched) {
            let leases: Vec<LeaseRef> = jobs.iter().filter_map(Job::lease_ref).collect();
            if !leases.is_empty() {
                match store.jobs_release_many(leases).await {
                    Ok(released) => {
                        tracing::info!(released, "released jobs claimed for a client that left")
                    }
                    Err(error) => tracing::warn!(%error,
                        "could not release jobs claimed for a client that left; their leases will expire"),
                }
            }
        }
    });
    receive
        .await
        .map_err(|_| ApiError::Internal("the fetch task ended without answering".to_string()))?
        .map_err(ApiError::from)
}

/// Remembers what metrics need of each job handed out (see `acks::LeasedJob`).
fn remember_leased(state: &AppState, jobs: &[Job]) {
    // Only metrics and breakers read what is remembered; without them, nothing to keep.
    if jobs.is_empty() || (state.metrics.is_none() && !state.breakers.watching()) {
        return;
    }
    let Ok(mut leased) = state.leased.lock() else {
        return;
    };
    if leased.len() + jobs.len() > super::acks::MAX_REMEMBERED {
        leased.clear();
    }
    let started = std::time::Instant::now();
    for job in jobs {
        leased.insert(
            job.id,
            super::acks::LeasedJob {
                queue: job.queue.clone(),
                kind: job.kind.clone(),
                started,
            },
        );
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeartbeatRequest {
    lease_token: Uuid,
    #[serde(default, deserialize_with = "wire::opt_int")]
    lease_ms: Option<u64>,
}

#[derive(Serialize)]
pub(crate) struct HeartbeatResponse {
    lease_expires_at: DateTime<Utc>,
}

pub(crate) async fn heartbeat(
    State(state): State<AppState>,
    JobId(id): JobId,
    ApiJson(request): ApiJson<HeartbeatRequest>,
) -> ApiResult<Json<HeartbeatResponse>> {
    let extend_by = lease_duration("lease_ms", request.lease_ms, state.config.default_lease)?;
    let params = HeartbeatParams {
        lease: LeaseRef {
            id,
            lease_token: request.lease_token,
        },
        extend_by,
    };
    let outcome = state
        .store
        .jobs_heartbeat_many(vec![params])
        .await?
        .pop()
        .ok_or_else(|| ApiError::Internal("store answered no heartbeat outcome".to_string()))?;
    match outcome {
        Some(lease_expires_at) => Ok(Json(HeartbeatResponse { lease_expires_at })),
        None => Err(ApiError::LeaseLost(id)),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CompleteRequest {
    lease_token: Uuid,
    #[serde(default)]
    result: Option<Value>,
}

#[derive(Serialize)]
pub(crate) struct CompleteResponse {
    state: &'static str,
}

pub(crate) async fn complete(
    State(state): State<AppState>,
    JobId(id): JobId,
    ApiJson(request): ApiJson<CompleteRequest>,
) -> ApiResult<Json<CompleteResponse>> {
    if let Some(result) = &request.result {
        check_json_size("result", result, state.config.max_payload_bytes)?;
    }
    let params = CompleteParams {
        lease: LeaseRef {
            id,
            lease_token: request.lease_token,
        },
        result: request.result,
    };
    let outcome = state
        .store
        .jobs_complete_many(vec![params])
        .await?
        .pop()
        .ok_or_else(|| ApiError::Internal("store answered no completion outcome".to_string()))?;
    state.finished.notify_waiters();
    match outcome {
        LeaseOutcome::Applied => {
            crate::observe::count_completed(&state, id).await;
            Ok(Json(CompleteResponse { state: "completed" }))
        }
        LeaseOutcome::LeaseLost => Err(ApiError::LeaseLost(id)),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ProgressRequest {
    lease_token: Uuid,
    #[serde(deserialize_with = "conveyor_core::wire::int")]
    progress: u64,
    #[serde(default, deserialize_with = "conveyor_core::wire::non_null")]
    message: Option<String>,
}

/// `POST /v1/jobs/{id}/progress`: a running job's handler reports how far it has come.
pub(crate) async fn progress(
    State(state): State<AppState>,
    JobId(id): JobId,
    ApiJson(request): ApiJson<ProgressRequest>,
) -> ApiResult<Json<CompleteResponse>> {
    let lease = LeaseRef {
        id,
        lease_token: request.lease_token,
    };
    state
        .store
        // Anything above 100 is refused by the store's check, naming `progress`.
        .job_progress(lease, request.progress.min(255) as u8, request.message)
        .await?;
    Ok(Json(CompleteResponse { state: "running" }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FailRequest {
    lease_token: Uuid,
    error: FailError,
    #[serde(default, deserialize_with = "wire::non_null")]
    retry: Option<RetryMode>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    retry_after_ms: Option<i64>,
}

pub(crate) async fn fail(
    State(state): State<AppState>,
    JobId(id): JobId,
    ApiJson(request): ApiJson<FailRequest>,
) -> ApiResult<Json<Job>> {
    let params = fail_params(
        &state,
        LeaseRef {
            id,
            lease_token: request.lease_token,
        },
        request.error,
        request.retry,
        request.retry_after_ms,
    )?;
    let retry_at = crate::observe::retry_at_of(&params);
    let job = state.store.job_fail(params).await?;
    state.finished.notify_waiters();
    crate::observe::count_reported(&state, &job, AttemptStatus::of_failure(job.state), retry_at);
    Ok(Json(job))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReleaseRequest {
    lease_token: Uuid,
}

#[derive(Serialize)]
pub(crate) struct ReleaseResponse {
    released: bool,
}

pub(crate) async fn release(
    State(state): State<AppState>,
    JobId(id): JobId,
    ApiJson(request): ApiJson<ReleaseRequest>,
) -> ApiResult<Json<ReleaseResponse>> {
    let released = state
        .store
        .jobs_release_many(vec![LeaseRef {
            id,
            lease_token: request.lease_token,
        }])
        .await?;
    Ok(Json(ReleaseResponse {
        released: released > 0,
    }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SnoozeRequest {
    lease_token: Uuid,
    #[serde(deserialize_with = "wire::int")]
    delay_ms: i64,
}

pub(crate) async fn snooze(
    State(state): State<AppState>,
    JobId(id): JobId,
    ApiJson(request): ApiJson<SnoozeRequest>,
) -> ApiResult<Json<Job>> {
    let until = after_ms("delay_ms", state.clock.now(), request.delay_ms)?;
    let params = SnoozeParams {
        lease: LeaseRef {
            id,
            lease_token: request.lease_token,
        },
        until,
    };
    let job = state.store.job_snooze(params).await?;
    crate::observe::count_reported(&state, &job, AttemptStatus::Snoozed, None);
    Ok(Json(job))
}
