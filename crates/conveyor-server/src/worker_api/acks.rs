//! The batched worker protocol: acknowledgements (`POST /v1/ack`, and the same arrays carried
//! by `POST /v1/fetch`) and lease renewals (`POST /v1/heartbeat`) for many jobs in one
//! request, each answered per item so that one lost lease never fails the others.
//!
//! One request is one round trip and, on SQLite, one group commit: every completion of the
//! batch is one `jobs_complete_many`, and its failures are sent to the store concurrently so
//! they share the writer's round. Nothing is answered `ok` before the store has made it
//! durable.

use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};
use conveyor_core::wire;
use conveyor_core::{
    AttemptStatus, CompleteParams, FailParams, HeartbeatParams, LeaseOutcome, LeaseRef, StoreError,
    WorkerHeartbeat,
};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use uuid::Uuid;

use super::reports::{fail_params, lease_duration, FailError, RetryMode};
use crate::api::{AckResponse, ItemResult, ItemStatus};
use crate::error::{ApiError, ApiResult};
use crate::extract::{check_json_size, ApiJson};
use crate::AppState;

/// A completion in a batch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckComplete {
    id: Uuid,
    lease_token: Uuid,
    #[serde(default)]
    result: Option<Value>,
}

/// A failure in a batch.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckFail {
    id: Uuid,
    lease_token: Uuid,
    error: FailError,
    #[serde(default, deserialize_with = "wire::non_null")]
    retry: Option<RetryMode>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    retry_after_ms: Option<i64>,
}

/// `POST /v1/ack`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AckRequest {
    #[serde(default)]
    complete: Vec<AckComplete>,
    #[serde(default)]
    fail: Vec<AckFail>,
}

/// The acknowledgements of a batch, checked; errors name the item (`complete[3].result`).
pub(crate) struct Acks {
    complete: Vec<CompleteParams>,
    fail: Vec<FailParams>,
}

impl Acks {
    pub(crate) fn is_empty(&self) -> bool {
        self.complete.is_empty() && self.fail.is_empty()
    }
}

/// Checks every item of `complete` and `fail` before anything is applied: a malformed item
/// fails the whole request (400 naming it) and changes nothing.
pub(crate) fn check(
    state: &AppState,
    complete: Vec<AckComplete>,
    fail: Vec<AckFail>,
) -> ApiResult<Acks> {
    let max = state.config.max_batch_jobs;
    if complete.len() + fail.len() > max {
        return Err(ApiError::invalid(
            "complete",
            format!("at most {max} acknowledgements per request"),
        ));
    }
    let mut completions = Vec::with_capacity(complete.len());
    for (index, item) in complete.into_iter().enumerate() {
        let within = |e: ApiError| e.within(&format!("complete[{index}]"));
        if let Some(result) = &item.result {
            check_json_size("result", result, state.config.max_payload_bytes).map_err(within)?;
            conveyor_core::validate::json_without_nul("result", result)
                .map_err(ApiError::from)
                .map_err(within)?;
        }
        completions.push(CompleteParams {
            lease: LeaseRef {
                id: item.id,
                lease_token: item.lease_token,
            },
            result: item.result,
        });
    }
    let mut failures = Vec::with_capacity(fail.len());
    for (index, item) in fail.into_iter().enumerate() {
        let params = fail_params(
            state,
            LeaseRef {
                id: item.id,
                lease_token: item.lease_token,
            },
            item.error,
            item.retry,
            item.retry_after_ms,
        )
        .map_err(|e| e.within(&format!("fail[{index}]")))?;
        failures.push(params);
    }
    Ok(Acks {
        complete: completions,
        fail: failures,
    })
}

/// Applies a checked batch: completions first, then failures, one result per item in order.
/// A store failure (the database unreachable) fails the request; a retry of it answers
/// `lease_lost` for whatever the first attempt did apply.
pub(crate) async fn apply(state: &AppState, acks: Acks) -> ApiResult<Vec<ItemResult>> {
    let Acks { complete, fail } = acks;
    let complete_ids: Vec<Uuid> = complete.iter().map(|c| c.lease.id).collect();
    let completions = async {
        if complete.is_empty() {
            Ok(Vec::new())
        } else {
            state.store.jobs_complete_many(complete).await
        }
    };
    let failures = futures::future::join_all(fail.into_iter().map(|params| {
        let id = params.lease.id;
        let retry_at = crate::observe::retry_at_of(&params);
        async move { (id, retry_at, state.store.job_fail(params).await) }
    }));
    let (completed, failed) = tokio::join!(completions, failures);
    state.finished.notify_waiters();
    let completed = completed?;
    if completed.len() != complete_ids.len() {
        return Err(ApiError::Internal(format!(
            "store answered {} outcomes for {} completions",
            completed.len(),
            complete_ids.len()
        )));
    }
    let mut results = Vec::with_capacity(complete_ids.len() + failed.len());
    for (id, outcome) in complete_ids.into_iter().zip(completed) {
        let status = match outcome {
            LeaseOutcome::Applied => {
                crate::observe::count_completed(state, id).await;
                ItemStatus::Ok
            }
            LeaseOutcome::LeaseLost => lost_or_missing(state, id).await?,
        };
        results.push(ItemResult::new(id, status));
    }
    for (id, retry_at, outcome) in failed {
        let status = match outcome {
            Ok(job) => {
                let status = AttemptStatus::of_failure(job.state);
                crate::observe::count_reported(state, &job, status, retry_at);
                ItemStatus::Ok
            }
            Err(StoreError::LeaseLost(_)) => lost_or_missing(state, id).await?,
            Err(StoreError::NotFound(_)) => ItemStatus::NotFound,
            Err(error) => return Err(error.into()),
        };
        results.push(ItemResult::new(id, status));
    }
    Ok(results)
}

/// `lease_lost` for a job that exists, `not_found` for one that does not (an unknown id, or a
/// finished job already pruned). Read only on this rare path.
async fn lost_or_missing(state: &AppState, id: Uuid) -> ApiResult<ItemStatus> {
    Ok(match state.store.job_get(id).await? {
        Some(_) => ItemStatus::LeaseLost,
        None => ItemStatus::NotFound,
    })
}

pub(crate) async fn ack(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<AckRequest>,
) -> ApiResult<Json<AckResponse>> {
    let acks = check(&state, request.complete, request.fail)?;
    let results = apply(&state, acks).await?;
    Ok(Json(AckResponse { results }))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LeaseItem {
    id: Uuid,
    lease_token: Uuid,
}

/// `POST /v1/heartbeat`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HeartbeatManyRequest {
    leases: Vec<LeaseItem>,
    #[serde(default, deserialize_with = "wire::opt_int")]
    lease_ms: Option<u64>,
    /// The worker holding the leases: refreshes its registration (see [`register`]).
    #[serde(default, deserialize_with = "wire::non_null")]
    worker_id: Option<String>,
    /// Jobs the worker is running now (default: the number of leases sent, which counts
    /// prefetched jobs too).
    #[serde(default, deserialize_with = "wire::opt_int")]
    busy: Option<u32>,
}

pub(crate) async fn heartbeat(
    State(state): State<AppState>,
    ApiJson(request): ApiJson<HeartbeatManyRequest>,
) -> ApiResult<Json<AckResponse>> {
    let max = state.config.max_batch_jobs;
    if request.leases.len() > max {
        return Err(ApiError::invalid(
            "leases",
            format!("at most {max} leases per request"),
        ));
    }
    let extend_by = lease_duration("lease_ms", request.lease_ms, state.config.default_lease)?;
    if let Some(worker_id) = &request.worker_id {
        // Checked on every heartbeat, as the registry would (only on those that write it).
        conveyor_core::workers::text("worker_id", worker_id, true)?;
        let held = request
            .busy
            .unwrap_or_else(|| u32::try_from(request.leases.len()).unwrap_or(u32::MAX));
        register(
            &state,
            Registration {
                worker_id,
                queues: &[],
                concurrency: None,
                busy: Some(held),
                host: None,
                pid: None,
                version: None,
            },
        )
        .await?;
    }
    let ids: Vec<Uuid> = request.leases.iter().map(|lease| lease.id).collect();
    let params = request
        .leases
        .into_iter()
        .map(|lease| HeartbeatParams {
            lease: LeaseRef {
                id: lease.id,
                lease_token: lease.lease_token,
            },
            extend_by,
        })
        .collect();
    let renewed = if ids.is_empty() {
        Vec::new()
    } else {
        state.store.jobs_heartbeat_many(params).await?
    };
    let mut results = Vec::with_capacity(ids.len());
    for (id, expires) in ids.into_iter().zip(renewed) {
        let result = match expires {
            Some(at) => ItemResult {
                id,
                status: ItemStatus::Ok,
                lease_expires_at: Some(at),
            },
            None => ItemResult::new(id, lost_or_missing(&state, id).await?),
        };
        results.push(result);
    }
    Ok(Json(AckResponse { results }))
}

/// What a fetch or heartbeat says about the worker making it.
pub(crate) struct Registration<'a> {
    pub worker_id: &'a str,
    pub queues: &'a [String],
    pub concurrency: Option<u32>,
    pub busy: Option<u32>,
    pub host: Option<&'a str>,
    pub pid: Option<u32>,
    pub version: Option<&'a str>,
}

/// How often one worker's registration is written from its fetches and heartbeats.
const REGISTRATION_EVERY: Duration = Duration::from_secs(1);

/// What this server remembers of the HTTP workers it has seen.
#[derive(Default)]
pub(crate) struct Registry {
    workers: Mutex<HashMap<String, SeenWorker>>,
}

struct SeenWorker {
    started_at: DateTime<Utc>,
    written: Instant,
    queues: Vec<String>,
    concurrency: u32,
}

/// Registers (or refreshes) an HTTP worker in the store's registry from the calls it makes
/// anyway, at most once a second per worker and server, so operators see HTTP workers in
/// `/v1/workers` without the worker sending registry heartbeats of its own.
pub(crate) async fn register(state: &AppState, seen: Registration<'_>) -> ApiResult<()> {
    let now = state.clock.now();
    let beat = {
        let Ok(mut workers) = state.registry.workers.lock() else {
            return Ok(());
        };
        if workers.len() > 10_000 {
            workers.retain(|_, worker| worker.written.elapsed() < Duration::from_secs(600));
        }
        // Every fetch passes here: look up without allocating the key.
        if !workers.contains_key(seen.worker_id) {
            workers.insert(
                seen.worker_id.to_string(),
                SeenWorker {
                    started_at: now,
                    written: Instant::now() - REGISTRATION_EVERY * 2,
                    queues: Vec::new(),
                    concurrency: 0,
                },
            );
        }
        let Some(worker) = workers.get_mut(seen.worker_id) else {
            return Ok(());
        };
        if !seen.queues.is_empty() && worker.queues != seen.queues {
            worker.queues = seen.queues.to_vec();
        }
        if let Some(concurrency) = seen.concurrency {
            worker.concurrency = concurrency;
        }
        if worker.written.elapsed() < REGISTRATION_EVERY {
            return Ok(());
        }
        worker.written = Instant::now();
        WorkerHeartbeat {
            id: seen.worker_id.to_string(),
            host: seen.host.unwrap_or_default().to_string(),
            pid: seen.pid,
            queues: worker.queues.clone(),
            // Slots as the worker said; only when it never did, what it is seen to hold.
            concurrency: if worker.concurrency > 0 {
                worker.concurrency
            } else {
                seen.busy.unwrap_or(0)
            },
            busy: seen.busy.unwrap_or(0),
            version: seen.version.unwrap_or_default().to_string(),
            started_at: worker.started_at,
            stopping: false,
        }
    };
    state.store.workers_heartbeat(beat).await?;
    Ok(())
}

/// A job handed out by this server's fetch, remembered until its completion so that metrics
/// need not read it back.
pub(crate) struct LeasedJob {
    pub queue: String,
    pub kind: String,
    pub started: Instant,
}

/// Most jobs remembered at once; past it the memory is dropped (a miss costs one read).
pub(crate) const MAX_REMEMBERED: usize = 200_000;
