//! Cron and interval schedules: `PUT/GET/DELETE /v1/schedules/{name}`, `GET /v1/schedules`,
//! `GET /v1/schedules/{name}/runs`, `POST /v1/schedules/{name}/pause|resume|trigger`.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use conveyor_core::{validate, AuditAction, Schedule, ScheduleSpec, ScheduleView};
use serde::Serialize;

use crate::api::RunList;
use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{check_json_size, ApiJson, QueryPairs};
use crate::AppState;

/// Runs listed when the request names no `limit`, and the most it may name.
const DEFAULT_RUNS_LIMIT: usize = 50;
const MAX_RUNS_LIMIT: usize = 1000;

fn schedule_name(name: &str) -> ApiResult<()> {
    validate::name("name", name).map_err(ApiError::from)
}

/// Creates or replaces a schedule. The body is a [`ScheduleSpec`]; every 400 names its field
/// (`cron`, `every`, `timezone`, `job.kind`, `max_catch_up`, ...).
pub(crate) async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(spec): ApiJson<ScheduleSpec>,
) -> ApiResult<Json<ScheduleView>> {
    schedule_name(&name)?;
    check_json_size(
        "job.payload",
        &spec.job.payload,
        state.config.max_payload_bytes,
    )?;
    // The when and the what, never the job's payload.
    let detail = match &spec.every {
        Some(every) => format!("every={every:?} kind={}", spec.job.kind),
        None => format!(
            "cron={:?} timezone={} kind={}",
            spec.cron, spec.timezone, spec.job.kind
        ),
    };
    let schedule = Schedule::from_spec(name.clone(), spec)?;
    let view = state.store.schedule_put(schedule).await?;
    let entry = caller.audit(AuditAction::SchedulePut).target(name);
    audit::record(&state, entry.detail(detail)).await;
    Ok(Json(view))
}

/// `POST /v1/schedules/{name}/pause`: the schedule fires nothing until resumed; its ticks pass
/// as skipped (audited as `schedule.put`, like any change of its definition).
pub(crate) async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<ScheduleView>> {
    set_paused(state, caller, name, true).await
}

/// `POST /v1/schedules/{name}/resume`: fires again from its next tick.
pub(crate) async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<ScheduleView>> {
    set_paused(state, caller, name, false).await
}

async fn set_paused(
    state: AppState,
    caller: Caller,
    name: String,
    paused: bool,
) -> ApiResult<Json<ScheduleView>> {
    schedule_name(&name)?;
    let view = state
        .store
        .schedule_get(&name)
        .await?
        .ok_or_else(|| ApiError::ScheduleNotFound(name.clone()))?;
    if view.schedule.spec().paused == paused {
        return Ok(Json(view));
    }
    let spec = view.schedule.spec().clone().paused(paused);
    let schedule = Schedule::from_spec(name.clone(), spec)?;
    let view = state.store.schedule_put(schedule).await?;
    let entry = caller.audit(AuditAction::SchedulePut).target(name);
    let detail = if paused { "paused" } else { "resumed" };
    audit::record(&state, entry.detail(detail.to_string())).await;
    Ok(Json(view))
}

/// `POST /v1/schedules/{name}/trigger`: enqueues the schedule's job now, outside its ticks
/// (tagged `schedule:{name}` and `manual`); 201 with the job's id.
pub(crate) async fn trigger(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<(StatusCode, Json<TriggeredRun>)> {
    schedule_name(&name)?;
    let view = state
        .store
        .schedule_get(&name)
        .await?
        .ok_or_else(|| ApiError::ScheduleNotFound(name.clone()))?;
    let schedule = view.schedule;
    let mut inserted = state
        .store
        .jobs_insert_many(vec![schedule.manual_job(state.clock.now())])
        .await?;
    crate::observe::count_enqueued(&state, &inserted);
    let job = inserted
        .pop()
        .ok_or_else(|| ApiError::Internal("the store stored no job".to_string()))?
        .job;
    let entry = caller.audit(AuditAction::ScheduleTrigger).target(name);
    audit::record(
        &state,
        entry.detail(format!("job={} kind={}", job.id, job.kind)),
    )
    .await;
    Ok((
        StatusCode::CREATED,
        Json(TriggeredRun {
            id: job.id,
            job: job.kind,
            queue: job.queue,
        }),
    ))
}

/// The answer of a manual trigger: the job enqueued.
#[derive(Serialize)]
pub(crate) struct TriggeredRun {
    id: uuid::Uuid,
    /// Its kind.
    job: String,
    queue: String,
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<ScheduleView>> {
    schedule_name(&name)?;
    state
        .store
        .schedule_get(&name)
        .await?
        .map(Json)
        .ok_or(ApiError::ScheduleNotFound(name))
}

pub(crate) async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    schedule_name(&name)?;
    if state.store.schedule_delete(&name).await? {
        let entry = caller.audit(AuditAction::ScheduleDelete).target(name);
        audit::record(&state, entry).await;
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::ScheduleNotFound(name))
    }
}

/// What `GET /v1/schedules` writes; clients read it as [`crate::api::ScheduleList`].
#[derive(Serialize)]
pub(crate) struct ScheduleList {
    schedules: Vec<ScheduleView>,
}

pub(crate) async fn list(State(state): State<AppState>) -> ApiResult<Json<ScheduleList>> {
    Ok(Json(ScheduleList {
        schedules: state.store.schedules_list().await?,
    }))
}

/// A schedule's latest runs, newest first (`?limit=`, default 50, at most 1000).
pub(crate) async fn runs(
    State(state): State<AppState>,
    Path(name): Path<String>,
    QueryPairs(pairs): QueryPairs,
) -> ApiResult<Json<RunList>> {
    schedule_name(&name)?;
    let mut limit = DEFAULT_RUNS_LIMIT;
    for (key, value) in pairs {
        match key.as_str() {
            "limit" => {
                limit = value
                    .parse::<usize>()
                    .ok()
                    .filter(|limit| (1..=MAX_RUNS_LIMIT).contains(limit))
                    .ok_or_else(|| {
                        ApiError::invalid(
                            "limit",
                            format!("must be an integer from 1 to {MAX_RUNS_LIMIT}"),
                        )
                    })?;
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter; expected limit",
                ))
            }
        }
    }
    if state.store.schedule_get(&name).await?.is_none() {
        return Err(ApiError::ScheduleNotFound(name));
    }
    Ok(Json(RunList {
        runs: state.store.schedule_runs(&name, limit).await?,
    }))
}
