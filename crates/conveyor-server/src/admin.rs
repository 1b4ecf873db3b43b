//! Operator endpoints: the dead-letter queue, queue counts, health, and the JSON fallbacks.

use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::Json;
use conveyor_core::{validate, wire, AuditAction, JobState, ReplaySelector};
use serde::Deserialize;
use uuid::Uuid;

use crate::api::JobPage;
use crate::api::{DiscardResponse, Health, QueuesResponse, ReplayResponse};
use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, JobId, QueryPairs};
use crate::jobs::{list_params, page};
use crate::AppState;

pub(crate) async fn dead_list(
    State(state): State<AppState>,
    query: QueryPairs,
) -> ApiResult<Json<JobPage>> {
    let params = list_params(query, Some(JobState::Dead))?;
    page(&state, params).await
}

/// Which dead jobs to replay. At least one of `ids`, `queue`, `kind` must be given, or
/// `all: true` to replay every dead job; `ids` cannot be combined with the filters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReplayRequest {
    #[serde(default, deserialize_with = "wire::non_null")]
    ids: Option<Vec<Uuid>>,
    #[serde(default, deserialize_with = "wire::non_null")]
    queue: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    kind: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    all: Option<bool>,
}

pub(crate) async fn dead_replay(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<ReplayRequest>,
) -> ApiResult<Json<ReplayResponse>> {
    let all = request.all.unwrap_or(false);
    let filtered = request.queue.is_some() || request.kind.is_some();
    if let Some(queue) = &request.queue {
        validate::name("queue", queue)?;
    }
    if let Some(kind) = &request.kind {
        validate::name("kind", kind)?;
    }
    let selector =
        match request.ids {
            Some(_) if all => {
                return Err(ApiError::invalid(
                    "all",
                    "\"all\" cannot be combined with ids",
                ))
            }
            Some(_) if filtered => {
                return Err(ApiError::invalid(
                    "ids",
                    "give either ids or queue/kind filters, not both",
                ))
            }
            Some(ids) if ids.is_empty() => {
                return Err(ApiError::invalid("ids", "must contain at least one id"))
            }
            Some(ids) if ids.len() > state.config.max_batch_jobs => {
                return Err(ApiError::invalid(
                    "ids",
                    format!("at most {} ids per replay", state.config.max_batch_jobs),
                ))
            }
            Some(ids) => ReplaySelector {
                ids: Some(ids),
                queue: None,
                kind: None,
            },
            None if all && filtered => {
                return Err(ApiError::invalid(
                    "all",
                    "\"all\" cannot be combined with queue or kind",
                ))
            }
            None if filtered || all => ReplaySelector {
                ids: None,
                queue: request.queue,
                kind: request.kind,
            },
            None => return Err(ApiError::invalid(
                "ids",
                "give ids, a queue and/or kind filter, or \"all\": true to replay every dead job",
            )),
        };
    let replayed = state.store.dead_replay(selector.clone()).await?;
    audit::record(&state, audit::replayed(&caller, &selector, replayed)).await;
    Ok(Json(ReplayResponse { replayed }))
}

pub(crate) async fn dead_discard(
    State(state): State<AppState>,
    caller: Caller,
    JobId(id): JobId,
) -> ApiResult<Json<DiscardResponse>> {
    if state.store.dead_discard(id).await? {
        let entry = caller.audit(AuditAction::DeadDiscard).jobs(vec![id]);
        audit::record(&state, entry).await;
        Ok(Json(DiscardResponse { discarded: true }))
    } else {
        Err(ApiError::JobNotFound(id))
    }
}

pub(crate) async fn queues(State(state): State<AppState>) -> ApiResult<Json<QueuesResponse>> {
    let queues = state.store.queues_stats().await?;
    let breakers = state.breakers.list().await?;
    Ok(Json(QueuesResponse { queues, breakers }))
}

async fn health(state: &AppState) -> Health {
    let mut store = state.store.health().await;
    if state.shutdown.is_cancelled() && store.ready {
        store.ready = false;
        store.problem = Some("shutting down".to_string());
    }
    let status = match (store.live, store.ready) {
        (true, true) => "ok",
        (true, false) => "unavailable",
        (false, _) => "failing",
    };
    Health {
        status: status.to_string(),
        live: store.live,
        ready: store.ready,
        leader: state
            .leading
            .as_ref()
            .map(|leading| leading.load(std::sync::atomic::Ordering::Relaxed)),
        problem: store.problem,
    }
}

fn answer(health: Health, healthy: bool) -> (StatusCode, Json<Health>) {
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, Json(health))
}

/// Readiness (`/healthz`, `/readyz`): 200 when the store accepts writes (SQLite: the writer
/// answered a round trip; PostgreSQL: a primary answered), else 503 with the problem. An
/// orchestrator stops routing requests to a server that is not ready.
pub(crate) async fn healthz(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    let health = health(&state).await;
    let ready = health.ready;
    answer(health, ready)
}

/// Liveness (`/livez`): 503 only when the process cannot recover by itself (SQLite's writer
/// thread died, the database file is damaged), so an orchestrator restarts it. A database that
/// is merely unreachable keeps it live: restarting would not help.
pub(crate) async fn livez(State(state): State<AppState>) -> (StatusCode, Json<Health>) {
    let health = health(&state).await;
    let live = health.live;
    answer(health, live)
}

pub(crate) async fn not_found(method: Method, uri: Uri) -> ApiError {
    ApiError::RouteNotFound {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}

pub(crate) async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::MethodNotAllowed {
        method: method.to_string(),
        path: uri.path().to_string(),
    }
}
