//! `GET /v1/kinds`, `GET/PUT/DELETE /v1/kinds/{kind}`: settings per job kind: the payload
//! schema every enqueue of the kind is checked against (see `conveyor_core::kinds`), its
//! circuit breaker, the named limits its jobs are subject to, their sequence and batches.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use conveyor_core::kinds::{KindSchema, KindSettings};
use conveyor_core::{validate, wire, AuditAction, BreakerSettings};
use conveyor_engine::queued_violations;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::AppState;

/// `PUT /v1/kinds/{kind}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct KindRequest {
    /// JSON Schema 2020-12; `null` removes the kind's schema, absent keeps it.
    #[serde(default, deserialize_with = "crate::settings::present")]
    schema: Option<Option<Value>>,
    /// The kind's circuit breaker (`conveyor_core::breaker`); `null` removes it, absent keeps it.
    #[serde(default, deserialize_with = "crate::settings::present")]
    circuit_breaker: Option<Option<Value>>,
    /// Your version of the schema; absent keeps it when the schema is kept (a PUT of the
    /// breaker alone), else absent and `null` both mean none.
    #[serde(default, deserialize_with = "crate::settings::present")]
    version: Option<Option<Value>>,
    /// Named limits every job of the kind is subject to; `null` names none, absent keeps them.
    #[serde(default, deserialize_with = "crate::settings::present")]
    limits: Option<Option<Value>>,
    /// Jobs of the kind with the same key run one after another; `null` removes it, absent
    /// keeps it.
    #[serde(default, deserialize_with = "crate::settings::present")]
    sequence: Option<Option<Value>>,
    /// The kind's jobs go out in batches (`{"max_size", "max_wait_ms", "key"?}`, see
    /// `conveyor_core::batch`); `null` removes it, absent keeps it.
    #[serde(default, deserialize_with = "crate::settings::present")]
    batch: Option<Option<Value>>,
    /// Set the schema even if queued jobs of the kind would not pass it.
    #[serde(default, deserialize_with = "wire::non_null")]
    force: Option<bool>,
}

/// `GET /v1/kinds`.
#[derive(Debug, Serialize)]
pub(crate) struct KindList {
    kinds: Vec<KindSettings>,
}

fn kind_name(kind: &str) -> ApiResult<()> {
    validate::name("kind", kind).map_err(ApiError::from)
}

pub(crate) async fn list(State(state): State<AppState>) -> ApiResult<Json<KindList>> {
    Ok(Json(KindList {
        kinds: state.store.kinds_list().await?,
    }))
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path(kind): Path<String>,
) -> ApiResult<Json<KindSettings>> {
    kind_name(&kind)?;
    state
        .store
        .kind_get(&kind)
        .await?
        .map(Json)
        .ok_or(ApiError::KindNotFound(kind))
}

pub(crate) async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(kind): Path<String>,
    ApiJson(request): ApiJson<KindRequest>,
) -> ApiResult<Json<KindSettings>> {
    kind_name(&kind)?;
    let existing = state.store.kind_get(&kind).await?;
    let version = match &request.version {
        None if request.schema.is_none() => existing.as_ref().and_then(|k| k.version),
        None | Some(None) => None,
        Some(Some(value)) => Some(
            wire::whole_number(value)
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| {
                    ApiError::invalid("version", "must be a whole number from 0 to 4294967295")
                })?,
        ),
    };
    let breaker = match request.circuit_breaker {
        None => existing.as_ref().and_then(|k| k.circuit_breaker),
        Some(None) => None,
        Some(Some(value)) => Some(BreakerSettings::from_json("circuit_breaker", &value)?),
    };
    let limits = match &request.limits {
        None => existing
            .as_ref()
            .map(|k| k.limits.clone())
            .unwrap_or_default(),
        Some(None) => Vec::new(),
        Some(Some(value)) => crate::limits::defined_names(&state, "limits", value).await?,
    };
    let sequence = match &request.sequence {
        None => existing.as_ref().and_then(|k| k.sequence.clone()),
        Some(None) => None,
        Some(Some(value)) => Some(crate::limits::sequence_of("sequence", value)?),
    };
    let batch = match request.batch {
        None => existing.as_ref().and_then(|k| k.batch.clone()),
        Some(None) => None,
        Some(Some(value)) => {
            let spec: conveyor_core::batch::BatchSpec = crate::limits::spec_from("batch", value)?;
            spec.validate("batch")?;
            Some(spec)
        }
    };
    // A schema kept as it was is not checked against the queue again.
    let schema_changed = request.schema.is_some();
    let schema = match request.schema {
        None => existing.and_then(|k| k.schema),
        Some(schema) => schema,
    };
    if let Some(schema) = schema.as_ref().filter(|_| schema_changed) {
        let compiled = KindSchema::compile(schema)?;
        if request.force != Some(true) {
            let found = queued_violations(state.store.as_ref(), &kind, &compiled).await?;
            if found.failing > 0 {
                return Err(ApiError::SchemaRejectsQueued {
                    would_fail: found.failing,
                    message: format!(
                        "the schema would reject {} of the {} queued job(s) of kind {kind:?} \
                         (first: job {}); send \"force\": true to set it anyway",
                        found.failing,
                        found.checked,
                        found
                            .first
                            .map(|(id, why)| format!("{id}, {why}"))
                            .unwrap_or_default()
                    ),
                });
            }
        }
    }
    let stored = state
        .store
        .kind_put(KindSettings {
            kind: kind.clone(),
            schema,
            version,
            circuit_breaker: breaker,
            limits,
            sequence,
            batch,
            updated_at: state.clock.now(),
        })
        .await?;
    state.kinds.invalidate();
    state.breakers.invalidate();
    let detail = serde_json::json!({
        "schema": stored.schema.is_some(),
        "circuit_breaker": stored.circuit_breaker,
        "version": stored.version,
        "limits": stored.limits,
        "sequence": stored.sequence,
        "batch": stored.batch,
        "forced": request.force == Some(true),
    });
    let entry = caller.audit(AuditAction::KindPut).target(kind);
    audit::record(&state, entry.detail(detail.to_string())).await;
    Ok(Json(stored))
}

pub(crate) async fn delete(
    State(state): State<AppState>,
    caller: Caller,
    Path(kind): Path<String>,
) -> ApiResult<StatusCode> {
    kind_name(&kind)?;
    if !state.store.kind_delete(&kind).await? {
        return Err(ApiError::KindNotFound(kind));
    }
    state.kinds.invalidate();
    audit::record(&state, caller.audit(AuditAction::KindDelete).target(kind)).await;
    Ok(StatusCode::NO_CONTENT)
}
