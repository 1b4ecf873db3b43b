//! `/v1/sources`: the event sources of the cluster, stored in its shared configuration (so
//! every server runs each, see `conveyor_sources::supervisor`), with their state and counts
//! in this process.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use conveyor_core::config::SOURCES;
use conveyor_core::sources::SourceSpec;
use conveyor_core::{fields, AuditAction, Store, StoreError};
use conveyor_sources::supervisor::spec_of;
use serde_json::{json, Value};

use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::AppState;

/// Stores the sources of a sources file (`serve --sources`), before the server starts. A
/// source an operator paused stays paused unless the file pauses it too: the file says what
/// to read, not whether someone stopped it for now.
pub async fn apply(store: &dyn Store, specs: Vec<SourceSpec>) -> Result<(), StoreError> {
    for mut spec in specs {
        if let Some(stored) = store.config_get(SOURCES, &spec.name).await? {
            if stored.document.get("paused") == Some(&Value::Bool(true)) && !spec.paused {
                tracing::info!(source = %spec.name, "kept paused (resume it to read it again)");
                spec.paused = true;
            }
        }
        store
            .config_put(SOURCES, &spec.name, document(&spec)?)
            .await?;
    }
    Ok(())
}

fn document(spec: &SourceSpec) -> Result<Value, StoreError> {
    let mut document = serde_json::to_value(spec)
        .map_err(|e| StoreError::backend(format!("cannot serialize a source: {e}")))?;
    // The key names it.
    if let Some(object) = document.as_object_mut() {
        object.remove("name");
    }
    Ok(document)
}

/// A stored source: its configuration, and how it runs in this process.
async fn view(state: &AppState, name: &str) -> ApiResult<Value> {
    let entry = state
        .store
        .config_get(SOURCES, name)
        .await?
        .ok_or_else(|| ApiError::SourceNotFound(name.to_string()))?;
    let spec = spec_of(&entry).map_err(|e| ApiError::from(StoreError::backend(e)))?;
    Ok(shown(state, &spec, entry.updated_at))
}

fn shown(state: &AppState, spec: &SourceSpec, updated_at: chrono::DateTime<chrono::Utc>) -> Value {
    let mut view = state.sources.status_of(spec).view();
    view["updated_at"] = json!(updated_at);
    view
}

pub(crate) async fn list(State(state): State<AppState>) -> ApiResult<Json<Value>> {
    let entries = state.store.config_list(SOURCES).await?;
    let mut sources = Vec::with_capacity(entries.len());
    for entry in &entries {
        match spec_of(entry) {
            Ok(spec) => sources.push(shown(&state, &spec, entry.updated_at)),
            Err(error) => sources.push(json!({
                "name": entry.name, "state": "error", "last_error": error,
                "updated_at": entry.updated_at,
            })),
        }
    }
    Ok(Json(json!({ "sources": sources })))
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    fields::name("name", &name)?;
    Ok(Json(view(&state, &name).await?))
}

/// Creates or replaces a source. A body without `paused` keeps the stored source's pause.
pub(crate) async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<Value>,
) -> ApiResult<(StatusCode, Json<Value>)> {
    fields::name("name", &name)?;
    let mut spec = SourceSpec::from_json(&name, body.clone())?;
    let stored = state.store.config_get(SOURCES, &name).await?;
    if body.get("paused").is_none() {
        spec.paused = stored
            .as_ref()
            .is_some_and(|entry| entry.document.get("paused") == Some(&Value::Bool(true)));
    }
    let entry = state
        .store
        .config_put(SOURCES, &name, document(&spec)?)
        .await?;
    state.sources.changed();
    let detail = json!({"type": spec.broker.type_name(), "paused": spec.paused});
    let audit_entry = caller.audit(AuditAction::SourcePut).target(name);
    audit::record(&state, audit_entry.detail(detail.to_string())).await;
    let status = if stored.is_some() {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(shown(&state, &spec, entry.updated_at))))
}

pub(crate) async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    fields::name("name", &name)?;
    if !state.store.config_delete(SOURCES, &name).await? {
        return Err(ApiError::SourceNotFound(name));
    }
    state.sources.changed();
    audit::record(&state, caller.audit(AuditAction::SourceDelete).target(name)).await;
    Ok(StatusCode::NO_CONTENT)
}

async fn set_paused(
    state: AppState,
    caller: Caller,
    name: String,
    paused: bool,
) -> ApiResult<Json<Value>> {
    fields::name("name", &name)?;
    let entry = state
        .store
        .config_get(SOURCES, &name)
        .await?
        .ok_or_else(|| ApiError::SourceNotFound(name.clone()))?;
    let mut spec = spec_of(&entry).map_err(|e| ApiError::from(StoreError::backend(e)))?;
    spec.paused = paused;
    let entry = state
        .store
        .config_put(SOURCES, &name, document(&spec)?)
        .await?;
    state.sources.changed();
    let action = if paused { "pause" } else { "resume" };
    let audit_entry = caller.audit(AuditAction::SourcePut).target(name);
    audit::record(
        &state,
        audit_entry.detail(json!({"action": action}).to_string()),
    )
    .await;
    Ok(Json(shown(&state, &spec, entry.updated_at)))
}

pub(crate) async fn pause(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    set_paused(state, caller, name, true).await
}

pub(crate) async fn resume(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    set_paused(state, caller, name, false).await
}
