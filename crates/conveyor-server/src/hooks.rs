//! Signed inbound webhooks: `/v1/hooks` configures them (admin), stored in the cluster's
//! configuration; the public `POST /hooks/{name}` verifies a provider's request before storing
//! anything and answers 2xx only once its job (or what its event makes) is durable (see
//! `conveyor_core::hooks`).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use conveyor_core::config::HOOKS;
use conveyor_core::hooks::HookSpec;
use conveyor_core::{fields, AuditAction, StoreError, ValidJob};
use serde_json::{json, Value};
use std::collections::BTreeMap;

use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::observe::HOOK_OUTCOMES;
use crate::AppState;

fn spec_of(name: &str, document: Value) -> ApiResult<HookSpec> {
    HookSpec::from_json(name, document).map_err(|error| {
        ApiError::from(StoreError::backend(format!(
            "the stored hook {name} is not valid: {error}"
        )))
    })
}

/// A hook as the API shows it: its configuration without the secret, and this process's counts.
fn view(state: &AppState, spec: &HookSpec, updated_at: chrono::DateTime<chrono::Utc>) -> Value {
    let mut view = serde_json::to_value(spec).unwrap_or_else(|_| json!({}));
    if let Some(object) = view.as_object_mut() {
        object.remove("secret");
    }
    view["name"] = json!(spec.name);
    view["secret_set"] = json!(spec.secret.is_some());
    view["url"] = json!(format!("/hooks/{}", spec.name));
    let counts = state.hook_counts.of(&spec.name);
    for (outcome, count) in HOOK_OUTCOMES.iter().zip(counts) {
        view[*outcome] = json!(count);
    }
    view["updated_at"] = json!(updated_at);
    view
}

pub(crate) async fn list(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let mut hooks = Vec::new();
    for entry in state.store.config_list(HOOKS).await? {
        let spec = spec_of(&entry.name, entry.document)?;
        hooks.push(view(&state, &spec, entry.updated_at));
    }
    Ok(Json(json!({ "hooks": hooks })))
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    fields::name("name", &name)?;
    let entry = state
        .store
        .config_get(HOOKS, &name)
        .await?
        .ok_or(ApiError::HookNotFound(name.clone()))?;
    let spec = spec_of(&name, entry.document)?;
    Ok(Json(view(&state, &spec, entry.updated_at)))
}

/// Creates or replaces a hook. A body without `secret` or `secret_env` keeps the stored secret
/// (so a hook's mapping can change without handing the secret around again).
pub(crate) async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(mut body): ApiJson<Value>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    fields::name("name", &name)?;
    let stored = state.store.config_get(HOOKS, &name).await?;
    if let (Some(object), Some(stored)) = (body.as_object_mut(), &stored) {
        if !object.contains_key("secret") && !object.contains_key("secret_env") {
            for key in ["secret", "secret_env"] {
                if let Some(value) = stored.document.get(key) {
                    object.insert(key.to_string(), value.clone());
                }
            }
        }
    }
    let spec = HookSpec::from_json(&name, body)?;
    // A secret this server cannot read would turn every delivery away: say so now, naming
    // the variable, rather than answer the provider 503 later.
    if let Err(message) = spec.resolve_secret() {
        return Err(ApiError::Invalid {
            field: "secret_env".into(),
            message: format!("{message} on this server"),
        });
    }
    let document = serde_json::to_value(&spec)
        .map_err(|e| ApiError::Internal(format!("cannot serialize a hook: {e}")))?;
    let entry = state.store.config_put(HOOKS, &name, document).await?;
    let detail = json!({"scheme": spec.scheme.as_str()});
    let audit_entry = caller.audit(AuditAction::HookPut).target(name);
    audit::record(&state, audit_entry.detail(detail.to_string())).await;
    let status = if stored.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(view(&state, &spec, entry.updated_at))))
}

pub(crate) async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    fields::name("name", &name)?;
    if !state.store.config_delete(HOOKS, &name).await? {
        return Err(ApiError::HookNotFound(name));
    }
    audit::record(&state, caller.audit(AuditAction::HookDelete).target(name)).await;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /hooks/{name}`: a provider's request. Verified first (a bad, missing or stale
/// signature is a 401 that stores nothing, counted and logged without the body); then its job
/// is stored, keyed by the provider's event id, and only then answered: 202 for a new job, 200
/// for a delivery already seen. A hook that emits an event stores what the event's
/// subscriptions make instead, in one transaction: 202, or 200 when all of it was there
/// already; an event no subscription takes is answered 202, counted `unmatched`.
pub(crate) async fn receive(
    State(state): State<AppState>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> ApiResult<(StatusCode, Json<Value>)> {
    if fields::name("name", &name).is_err() {
        return Err(ApiError::HookNotFound(name));
    }
    let entry = state
        .store
        .config_get(HOOKS, &name)
        .await?
        .ok_or(ApiError::HookNotFound(name.clone()))?;
    let spec = spec_of(&name, entry.document)?;
    let secret = spec.resolve_secret().map_err(|error| {
        tracing::error!(hook = %name, %error, "webhook secret unavailable");
        ApiError::HookUnavailable(name.clone())
    })?;
    let headers: BTreeMap<String, String> = headers
        .iter()
        .filter_map(|(key, value)| {
            Some((
                key.as_str().to_ascii_lowercase(),
                value.to_str().ok()?.to_string(),
            ))
        })
        .collect();
    if let Err(refusal) = spec.verify(&secret, &headers, &body, state.clock.now()) {
        state.hook_counts.add(&name, 2);
        tracing::warn!(hook = %name, reason = %refusal, bytes = body.len(), "webhook request refused");
        return Err(ApiError::BadSignature(format!("hook {name}: {refusal}")));
    }
    let counted_invalid = |error: ApiError| {
        state.hook_counts.add(&name, 3);
        error
    };
    if spec.event.is_some() {
        let mapped = spec
            .event_for(&headers, &body)
            .map_err(ApiError::from)
            .map_err(counted_invalid)?;
        let event = mapped.event;
        let event_id = event.id.clone().unwrap_or_default();
        let made = match crate::subscriptions::accept(&state, &event, &event_id).await {
            Ok(made) => made,
            Err(error @ ApiError::Invalid { .. }) => return Err(counted_invalid(error)),
            Err(error) => return Err(error),
        };
        let (outcome, status) = if made.is_empty() {
            (4, StatusCode::ACCEPTED)
        } else if made.all_duplicates() {
            (1, StatusCode::OK)
        } else {
            (0, StatusCode::ACCEPTED)
        };
        state.hook_counts.add(&name, outcome);
        let body = json!({
            "event": {"id": event_id, "name": event.name},
            "jobs": made.jobs,
            "flows": made.flows,
            "duplicate": made.all_duplicates(),
        });
        return Ok((status, Json(body)));
    }
    let mapped = spec
        .job_for(&headers, &body)
        .map_err(ApiError::from)
        .map_err(counted_invalid)?;
    let job = ValidJob::new(mapped.job)
        .map_err(ApiError::from)
        .map_err(counted_invalid)?;
    state
        .kinds
        .check(&job.job().kind, &job.job().payload)
        .await
        .map_err(ApiError::from)
        .map_err(counted_invalid)?;
    let inserted = state
        .store
        .jobs_insert_valid(vec![job])
        .await?
        .pop()
        .ok_or_else(|| ApiError::Internal("store returned no row for an insert".to_string()))?;
    crate::observe::count_enqueued(&state, std::slice::from_ref(&inserted));
    state
        .hook_counts
        .add(&name, if inserted.duplicate { 1 } else { 0 });
    let status = if inserted.duplicate {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((
        status,
        Json(json!({"job_id": inserted.job.id, "duplicate": inserted.duplicate})),
    ))
}
