//! `GET/PUT /v1/queues/{name}`: per-queue settings (pause, back-pressure, concurrency limit).

use axum::extract::{Path, State};
use axum::Json;
use conveyor_core::{validate, NamedQueueSettings};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::error::{ApiError, ApiResult};
use crate::extract::ApiJson;
use crate::AppState;

/// A partial update: an absent field keeps its value, `null` clears a limit, a value sets it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettingsPatch {
    paused: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    max_depth: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    max_depth_per_tenant: Option<Option<u64>>,
    #[serde(default, deserialize_with = "present")]
    concurrency_limit: Option<Option<u64>>,
    // Settings of the full queue-settings API that this version does not enforce yet. They are
    // named here so that a request using them is refused clearly rather than half-applied.
    per_key_concurrency_limit: Option<Value>,
    rate_limit: Option<Value>,
    weight: Option<Value>,
}

/// Distinguishes a field given as `null` (`Some(None)`) from an absent one (`None`).
fn present<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Option<Option<u64>>, D::Error> {
    Option::<u64>::deserialize(deserializer).map(Some)
}

fn queue_name(name: &str) -> ApiResult<()> {
    validate::name("name", name).map_err(ApiError::from)
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<NamedQueueSettings>> {
    queue_name(&name)?;
    let settings = state.store.queue_settings_get(&name).await?;
    Ok(Json(NamedQueueSettings { name, settings }))
}

pub(crate) async fn put(
    State(state): State<AppState>,
    Path(name): Path<String>,
    ApiJson(patch): ApiJson<SettingsPatch>,
) -> ApiResult<Json<NamedQueueSettings>> {
    queue_name(&name)?;
    let unsupported = [
        (
            "per_key_concurrency_limit",
            patch.per_key_concurrency_limit.is_some(),
        ),
        ("rate_limit", patch.rate_limit.is_some()),
        ("weight", patch.weight.is_some()),
    ];
    if let Some((field, _)) = unsupported.iter().find(|(_, given)| *given) {
        return Err(ApiError::invalid(
            *field,
            "not supported yet by this version of Conveyor (pause, depth and concurrency limits are)",));
    }
    for (field, value) in [
        ("max_depth", patch.max_depth),
        ("max_depth_per_tenant", patch.max_depth_per_tenant),
        ("concurrency_limit", patch.concurrency_limit),
    ] {
        if value == Some(Some(0)) {
            return Err(ApiError::invalid(
                field,
                "must be at least 1 (or null for no limit)",
            ));
        }
    }
    let mut settings = state.store.queue_settings_get(&name).await?;
    if let Some(paused) = patch.paused {
        settings.paused = paused;
    }
    if let Some(max_depth) = patch.max_depth {
        settings.max_depth = max_depth;
    }
    if let Some(max_depth_per_tenant) = patch.max_depth_per_tenant {
        settings.max_depth_per_tenant = max_depth_per_tenant;
    }
    if let Some(concurrency_limit) = patch.concurrency_limit {
        settings.concurrency_limit = concurrency_limit;
    }
    let settings = state.store.queue_settings_put(&name, settings).await?;
    Ok(Json(NamedQueueSettings { name, settings }))
}
