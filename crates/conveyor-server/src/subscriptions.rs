//! One event, many jobs: `/v1/subscriptions` (admin) says which events make which jobs, stored
//! in the cluster's configuration; `POST /v1/events` (producer) stores the jobs of every
//! matching subscription in one transaction (see `conveyor_core::subscriptions`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use conveyor_core::config::SUBSCRIPTIONS;
use conveyor_core::subscriptions::{Event, SubscriptionSpec};
use conveyor_core::{fields, AuditAction, StoreError, ValidJob};
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
    let detail = json!({"event": spec.event, "kind": spec.job.kind});
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

/// `POST /v1/events`: the jobs of every subscription the event matches, checked as enqueues
/// are (a job any check refuses refuses the whole event, naming
/// `subscriptions.{name}.{field}`), then stored in one transaction: all or none.
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
    let mut names = Vec::new();
    let mut jobs = Vec::new();
    for (spec, _) in all(&state).await? {
        if !spec.matches(&event) {
            continue;
        }
        let prefix = format!("subscriptions.{}", spec.name);
        let job = ValidJob::new(spec.job_for(&event, &event_id))
            .map_err(|error| ApiError::from(error).within(&prefix))?;
        state
            .kinds
            .check(&job.job().kind, &job.job().payload)
            .await
            .map_err(|error| ApiError::from(error).within(&prefix))?;
        names.push(spec.name);
        jobs.push(job);
    }
    let inserted = if jobs.is_empty() {
        Vec::new()
    } else {
        state.store.jobs_insert_valid(jobs).await?
    };
    crate::observe::count_enqueued(&state, &inserted);
    let made: Vec<Value> = names
        .iter()
        .zip(&inserted)
        .map(|(name, inserted)| {
            json!({"subscription": name, "job_id": inserted.job.id, "duplicate": inserted.duplicate})
        })
        .collect();
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"id": event_id, "name": event.name, "jobs": made})),
    ))
}
