//! One event, many jobs and flows: `/v1/subscriptions` (admin) says which events make which
//! jobs or flows, stored in the cluster's configuration; `POST /v1/events` (producer) stores
//! what every matching subscription makes in one transaction (see
//! `conveyor_core::subscriptions`; the fan-out is `conveyor_engine::events`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use conveyor_core::config::SUBSCRIPTIONS;
use conveyor_core::subscriptions::{Event, SubscriptionSpec};
use conveyor_core::{fields, AuditAction, StoreError};
use conveyor_engine::events;
use serde_json::{json, Value};

use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::AppState;

fn spec_of(name: &str, document: Value) -> ApiResult<SubscriptionSpec> {
    SubscriptionSpec::from_json(name, document).map_err(|error| {
        ApiError::from(StoreError::backend(format!(
            "the stored subscription {name} is not valid: {error}"
        )))
    })
}

fn view(spec: &SubscriptionSpec, updated_at: chrono::DateTime<chrono::Utc>) -> Value {
    let mut view = serde_json::to_value(spec).unwrap_or_else(|_| json!({}));
    view["name"] = json!(spec.name);
    view["updated_at"] = json!(updated_at);
    view
}

async fn all(
    state: &AppState,
) -> ApiResult<Vec<(SubscriptionSpec, chrono::DateTime<chrono::Utc>)>> {
    let mut specs = Vec::new();
    for entry in state.store.config_list(SUBSCRIPTIONS).await? {
        specs.push((spec_of(&entry.name, entry.document)?, entry.updated_at));
    }
    Ok(specs)
}

pub(crate) async fn list(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let subscriptions: Vec<Value> = all(&state)
        .await?
        .iter()
        .map(|(spec, at)| view(spec, *at))
        .collect();
    Ok(Json(json!({ "subscriptions": subscriptions })))
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    fields::name("name", &name)?;
    let entry = state
        .store
        .config_get(SUBSCRIPTIONS, &name)
        .await?
        .ok_or(ApiError::SubscriptionNotFound(name.clone()))?;
    Ok(Json(view(
        &spec_of(&name, entry.document)?,
        entry.updated_at,
    )))
}

pub(crate) async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    fields::name("name", &name)?;
    let spec = SubscriptionSpec::from_json(&name, body)?;
    let existed = state
        .store
        .config_get(SUBSCRIPTIONS, &name)
        .await?
        .is_some();
    let document = serde_json::to_value(&spec)
        .map_err(|e| ApiError::Internal(format!("cannot serialize a subscription: {e}")))?;
    let entry = state
        .store
        .config_put(SUBSCRIPTIONS, &name, document)
        .await?;
    let detail = json!({
        "event": spec.event,
        "kind": spec.job.as_ref().map(|job| &job.kind),
        "flow": spec.flow.as_ref().map(|flow| flow.name.as_deref().unwrap_or(&name)),
    });
    let audit_entry = caller.audit(AuditAction::SubscriptionPut).target(name);
    audit::record(&state, audit_entry.detail(detail.to_string())).await;
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(view(&spec, entry.updated_at))))
}

pub(crate) async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    fields::name("name", &name)?;
    if !state.store.config_delete(SUBSCRIPTIONS, &name).await? {
        return Err(ApiError::SubscriptionNotFound(name));
    }
    audit::record(
        &state,
        caller.audit(AuditAction::SubscriptionDelete).target(name),
    )
    .await;
    Ok(StatusCode::NO_CONTENT)
}

/// What an accepted event made, as answered: `jobs` (`subscription`, `job_id`, `duplicate`)
/// and `flows` (`subscription`, `flow_id`, `duplicate`), each in the order of the
/// subscriptions.
pub(crate) struct Made {
    pub(crate) jobs: Vec<Value>,
    pub(crate) flows: Vec<Value>,
}

impl Made {
    /// Whether the event matched no subscription.
    pub(crate) fn is_empty(&self) -> bool {
        self.jobs.is_empty() && self.flows.is_empty()
    }

    /// Whether it matched some, and everything they make was there already (an event sent
    /// again).
    pub(crate) fn all_duplicates(&self) -> bool {
        !self.is_empty()
            && self
                .jobs
                .iter()
                .chain(&self.flows)
                .all(|made| made["duplicate"] == json!(true))
    }
}

/// Fans `event` out (checked as enqueues are: a job or a flow any check refuses refuses the
/// whole event, naming `subscriptions.{name}.{field}`) and stores what it makes in one
/// transaction: all or none. Used by `POST /v1/events` and by the hooks that emit events.
pub(crate) async fn accept(state: &AppState, event: &Event, event_id: &str) -> ApiResult<Made> {
    let subscriptions = events::subscriptions(state.store.as_ref()).await?;
    let mut fanout = events::fan_out(&subscriptions, event, event_id, &state.kinds).await?;
    let job_subscriptions = std::mem::take(&mut fanout.job_subscriptions);
    let flow_subscriptions = std::mem::take(&mut fanout.flow_subscriptions);
    let accepted = fanout.accept(state.store.as_ref()).await?;
    crate::observe::count_enqueued(state, &accepted.jobs);
    let jobs = job_subscriptions
        .iter()
        .zip(&accepted.jobs)
        .map(|(name, inserted)| {
            json!({"subscription": name, "job_id": inserted.job.id, "duplicate": inserted.duplicate})
        })
        .collect();
    let flows = flow_subscriptions
        .iter()
        .zip(&accepted.flows)
        .map(|(name, created)| {
            json!({"subscription": name, "flow_id": created.id, "duplicate": created.duplicate})
        })
        .collect();
    Ok(Made { jobs, flows })
}

/// `POST /v1/events`: the jobs and flows of every subscription the event matches, stored in
/// one transaction (see [`accept`]).
pub(crate) async fn send(
    State(state): State<AppState>,
    ApiJson(event): ApiJson<Event>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    event.validate()?;
    fields::json_without_nul("payload", &event.payload)?;
    let event_id = event
        .id
        .clone()
        .unwrap_or_else(|| uuid::Uuid::now_v7().to_string());
    let made = accept(&state, &event, &event_id).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": event_id, "name": event.name, "jobs": made.jobs, "flows": made.flows})),
    ))
}
