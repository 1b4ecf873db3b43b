//! Workflow endpoints: create, read (with a long-poll), list, cancel, signal.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use conveyor_core::wire;
use conveyor_core::workflow::{
    FlowFailurePolicy, FlowListParams, FlowState, FlowView, NewFlow, NewStep, ParentFailurePolicy,
    StepAction, ValidFlow, WaitSpec,
};
use conveyor_core::{validate, AuditAction, Role};
use serde::Deserialize;
use serde_json::Value;
use uuid::Uuid;

use crate::api::{CreatedFlow, FlowPage, SignalResponse};
use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{check_json_size, parse_uuid, ApiJson, QueryPairs};
use crate::jobs::{self, EnqueueRequest, DEFAULT_LIST_LIMIT, MAX_LIST_LIMIT};
use crate::AppState;

/// Body of `POST /v1/flows`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateFlowRequest {
    #[serde(default, deserialize_with = "wire::non_null")]
    name: Option<String>,
    steps: Vec<StepRequest>,
    #[serde(default, deserialize_with = "wire::non_null")]
    on_failure: Option<FlowFailurePolicy>,
    #[serde(default, deserialize_with = "wire::non_null")]
    idempotency_key: Option<String>,
    #[serde(default, deserialize_with = "wire::non_null")]
    tags: Option<Vec<String>>,
}

/// One step: `job` or `wait`, exactly one.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StepRequest {
    name: String,
    #[serde(default, deserialize_with = "wire::non_null")]
    job: Option<EnqueueRequest>,
    #[serde(default, deserialize_with = "wire::non_null")]
    wait: Option<WaitRequest>,
    #[serde(default, deserialize_with = "wire::non_null")]
    after: Option<Vec<String>>,
    #[serde(default, deserialize_with = "wire::non_null")]
    on_parent_failure: Option<ParentFailurePolicy>,
    #[serde(default, deserialize_with = "wire::non_null")]
    compensate: Option<EnqueueRequest>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct WaitRequest {
    signal: String,
    #[serde(default, deserialize_with = "wire::opt_int")]
    timeout_ms: Option<u64>,
}

impl CreateFlowRequest {
    fn into_valid_flow(self, state: &AppState, caller: &Caller) -> ApiResult<ValidFlow> {
        let now = state.clock.now();
        let max = conveyor_core::workflow::MAX_FLOW_STEPS;
        if self.steps.len() > max {
            return Err(ApiError::invalid(
                "steps",
                format!("must hold 1 to {max} steps"),
            ));
        }
        let mut flow = NewFlow::new();
        flow.name = self.name;
        flow.on_failure = self.on_failure.unwrap_or_default();
        flow.idempotency_key = self.idempotency_key;
        flow.tags = self.tags.unwrap_or_default();
        jobs::claim_ownership(caller, &mut flow.tags)?;
        for (i, step) in self.steps.into_iter().enumerate() {
            let within = |e: ApiError| e.within(&format!("steps[{i}]"));
            let action = match (step.job, step.wait) {
                (Some(job), None) => StepAction::Job(
                    job.into_new_job(state, caller, now)
                        .map_err(|e| e.within("job"))
                        .map_err(within)?,
                ),
                (None, Some(wait)) => StepAction::Wait(WaitSpec {
                    signal: wait.signal,
                    timeout_ms: wait.timeout_ms,
                }),
                _ => {
                    return Err(ApiError::invalid(
                        format!("steps[{i}]"),
                        "give a step either a job or a wait, not both or neither",
                    ))
                }
            };
            let compensate = step
                .compensate
                .map(|job| job.into_new_job(state, caller, now))
                .transpose()
                .map_err(|e| e.within("compensate"))
                .map_err(within)?;
            flow.steps.push(NewStep {
                name: step.name,
                action,
                after: step.after.unwrap_or_default(),
                on_parent_failure: step.on_parent_failure.unwrap_or_default(),
                compensate,
            });
        }
        Ok(ValidFlow::new(flow)?)
    }
}

/// Whether `caller` may see `flow`: a producer sees only the flows its token created.
fn may_read(caller: &Caller, flow: &FlowView) -> bool {
    caller.role != Role::Producer
        || jobs::owner_tag(caller).is_some_and(|tag| flow.tags.contains(&tag))
}

/// The flow `id` as `caller` may see it: another producer's flow answers as if it did not exist.
async fn readable(state: &AppState, caller: &Caller, id: Uuid) -> ApiResult<FlowView> {
    match state.store.flow_get(id).await? {
        Some(flow) if may_read(caller, &flow) => Ok(flow),
        _ => Err(ApiError::FlowNotFound(id)),
    }
}

pub(crate) async fn create(
    State(state): State<AppState>,
    caller: Caller,
    ApiJson(request): ApiJson<CreateFlowRequest>,
) -> ApiResult<(StatusCode, Json<CreatedFlow>)> {
    let flow = request.into_valid_flow(&state, &caller)?;
    let places: Vec<String> = flow.step_jobs().map(|(place, _, _)| place).collect();
    state
        .kinds
        .check_all(
            flow.step_jobs().map(|(_, kind, payload)| (kind, payload)),
            |index| places.get(index).cloned().unwrap_or_default(),
        )
        .await?;
    crate::limits::check_names_defined(
        &state,
        flow.step_new_jobs()
            .map(|(place, job)| (format!("{place}.limits"), job.limits.as_slice())),
    )
    .await?;
    let name = flow.flow().name.clone();
    let created = state.store.flow_create(flow).await?;
    let entry = caller
        .audit(AuditAction::FlowCreate)
        .target(name.unwrap_or_else(|| created.id.to_string()))
        .jobs(created.steps.values().copied().collect());
    audit::record(&state, entry).await;
    let status = if created.duplicate {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(created)))
}

fn flow_id(raw: &str) -> ApiResult<Uuid> {
    parse_uuid("id", raw)
}

/// `GET /v1/flows/{id}[?wait_ms=N]`: the flow with every step; with `wait_ms`, once it has
/// finished (completed, failed, compensated, cancelled) or the wait passes.
pub(crate) async fn get(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
    QueryPairs(pairs): QueryPairs,
) -> ApiResult<Json<FlowView>> {
    let id = flow_id(&raw)?;
    let wait = jobs::wait_param(&state, pairs)?;
    let flow = jobs::wait_until(&state, wait, || async {
        let flow = readable(&state, &caller, id).await?;
        let finished = flow.state.is_finished();
        Ok((flow, finished))
    })
    .await?;
    Ok(Json(flow))
}

pub(crate) async fn list(
    State(state): State<AppState>,
    QueryPairs(pairs): QueryPairs,
) -> ApiResult<Json<FlowPage>> {
    let mut params = FlowListParams::newest(DEFAULT_LIST_LIMIT);
    for (key, value) in pairs {
        match key.as_str() {
            "state" => params.state = Some(value.parse::<FlowState>()?),
            "name" => {
                validate::name("name", &value)?;
                params.name = Some(value);
            }
            "limit" => {
                params.limit = jobs::list_limit(&value)?;
            }
            "after" => params.after = Some(parse_uuid("after", &value)?),
            _ => {
                return Err(ApiError::invalid(
                    key.clone(),
                    format!(
                        "unknown query parameter {key:?}; expected state, name, limit or after"
                    ),
                ))
            }
        }
    }
    let limit = params.limit.min(MAX_LIST_LIMIT);
    let flows = state.store.flows_list(params).await?;
    let next = if flows.len() >= limit {
        flows.last().map(|flow| flow.id)
    } else {
        None
    };
    Ok(Json(FlowPage { flows, next }))
}

pub(crate) async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
) -> ApiResult<Json<FlowView>> {
    let id = flow_id(&raw)?;
    readable(&state, &caller, id).await?;
    let flow = state.store.flow_cancel(id).await?;
    state.finished.notify_waiters();
    let entry = caller
        .audit(AuditAction::FlowCancel)
        .target(id.to_string())
        .jobs(flow.steps.iter().filter_map(|s| s.job_id).collect());
    audit::record(&state, entry).await;
    Ok(Json(flow))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SignalRequest {
    signal: String,
    #[serde(default)]
    payload: Option<Value>,
}

pub(crate) async fn signal(
    State(state): State<AppState>,
    caller: Caller,
    Path(raw): Path<String>,
    ApiJson(request): ApiJson<SignalRequest>,
) -> ApiResult<Json<SignalResponse>> {
    let id = flow_id(&raw)?;
    validate::name("signal", &request.signal)?;
    let payload = request.payload.unwrap_or(Value::Null);
    check_json_size("payload", &payload, state.config.max_payload_bytes)?;
    readable(&state, &caller, id).await?;
    let outcome = state
        .store
        .flow_signal(id, &request.signal, payload)
        .await?;
    state.finished.notify_waiters();
    let entry = caller
        .audit(AuditAction::FlowSignal)
        .target(format!("{id} {}", request.signal));
    audit::record(&state, entry).await;
    Ok(Json(SignalResponse { outcome }))
}
