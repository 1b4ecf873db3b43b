//! `GET/PUT /v1/queues/{name}`: per-queue settings (pause, back-pressure, concurrency and rate
//! limits, weights, the named limits its jobs are subject to).

use axum::extract::{Path, State};
use axum::Json;
use conveyor_core::scaling::ScaleSignal;
use conveyor_core::{
    validate, wire, AuditAction, BreakerScope, BreakerSettings, BreakerView, NamedQueueSettings,
    QueueStats, RateLimit,
};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::audit;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::{ApiJson, QueryPairs};
use crate::AppState;

/// A partial update: an absent field keeps its value, `null` clears a limit, a value sets it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SettingsPatch {
    #[serde(default, deserialize_with = "wire::non_null")]
    paused: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    max_depth: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    max_depth_per_tenant: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    concurrency_limit: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    per_key_concurrency_limit: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    rate_limit: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    per_key_rate_limit: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    weight: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    completed_retention_secs: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    dead_retention_secs: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    default_ttl_ms: Option<Option<Value>>,
    #[serde(default, deserialize_with = "present")]
    circuit_breaker: Option<Option<Value>>,
    /// Named limits every job enqueued into the queue is subject to; `null` names none.
    #[serde(default, deserialize_with = "present")]
    limits: Option<Option<Value>>,
    /// Jobs of the queue with the same key run one after another; `null` removes it.
    #[serde(default, deserialize_with = "present")]
    sequence: Option<Option<Value>>,
}

/// Distinguishes a field given as `null` (`Some(None)`) from an absent one (`None`). Values
/// are checked field by field afterwards, so a wrong type is reported with its field's name.
pub(crate) fn present<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Option<Value>>, D::Error> {
    Option::<Value>::deserialize(deserializer).map(Some)
}

fn queue_name(name: &str) -> ApiResult<()> {
    validate::name("name", name).map_err(ApiError::from)
}

/// A limit: a whole number of at least 1 (written in any notation: `5`, `5.0`, `5e0`).
fn positive(field: &str, value: &Value) -> ApiResult<u64> {
    wire::whole_number(value)
        .filter(|n| *n >= 1)
        .and_then(|n| u64::try_from(n).ok())
        .ok_or_else(|| ApiError::invalid(field, "must be a whole number of at least 1 (or null)"))
}

fn rate(field: &str, value: &Value) -> ApiResult<RateLimit> {
    let Some(object) = value.as_object() else {
        return Err(ApiError::invalid(
            field,
            "must be an object {\"count\": N, \"period_ms\": MS} (or null)",
        ));
    };
    if let Some(unknown) = object.keys().find(|k| *k != "count" && *k != "period_ms") {
        return Err(ApiError::invalid(
            format!("{field}.{unknown}"),
            "unknown field; expected count and period_ms",
        ));
    }
    let part = |name: &str| -> ApiResult<u64> {
        let path = format!("{field}.{name}");
        match object.get(name) {
            Some(value) => positive(&path, value),
            None => Err(ApiError::invalid(path, "is required")),
        }
    };
    Ok(RateLimit {
        count: part("count")?,
        period_ms: part("period_ms")?,
    })
}

/// Applies one field of a patch: absent keeps `current`, null clears it, a value is parsed.
fn patched<T>(
    current: &mut Option<T>,
    change: Option<Option<Value>>,
    parse: impl FnOnce(&Value) -> ApiResult<T>,
) -> ApiResult<()> {
    match change {
        None => {}
        Some(None) => *current = None,
        Some(Some(value)) => *current = Some(parse(&value)?),
    }
    Ok(())
}

/// `GET /v1/queues/{name}`: the settings, and the queue's scaling signal.
#[derive(Debug, Serialize)]
pub(crate) struct QueueView {
    #[serde(flatten)]
    named: NamedQueueSettings,
    /// Workers that would work off the backlog within the server's scale target.
    desired_workers: u32,
    scale: ScaleSignal,
    /// The queue's circuit breaker: its state (closed without one).
    circuit: BreakerView,
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<QueueView>> {
    queue_name(&name)?;
    let settings = state.store.queue_settings_get(&name).await?;
    let scale = scale_signal(&state, &name, state.config.scale_target.as_secs_f64()).await?;
    let circuit = state.breakers.view(BreakerScope::Queue, &name).await?;
    Ok(Json(QueueView {
        named: NamedQueueSettings { name, settings },
        desired_workers: scale.desired_workers,
        scale,
        circuit,
    }))
}

/// The queue's scaling signal for `target_s`, measuring its throughput on the way (each call
/// is a reading; see `conveyor_core::scaling`).
async fn scale_signal(state: &AppState, queue: &str, target_s: f64) -> ApiResult<ScaleSignal> {
    let queues = state.store.queues_stats().await?;
    let workers = state.store.workers_list().await?;
    let stats = queues
        .iter()
        .find(|q| q.name == queue)
        .cloned()
        .unwrap_or_else(|| QueueStats {
            name: queue.to_string(),
            ..QueueStats::default()
        });
    let mut meter = state
        .throughput
        .lock()
        .map_err(|_| ApiError::Internal("throughput meter poisoned".to_string()))?;
    meter.observe(&queues, std::time::Instant::now());
    Ok(meter.signal(&stats, &workers, target_s))
}

/// `GET /v1/queues/{name}/scale[?target_s=N]`: the scaling signal alone, for autoscalers
/// (KEDA's metrics-api scaler reads `desired_workers`). `target_s` (1 to 86,400) overrides the
/// server's target for this queue.
pub(crate) async fn scale(
    State(state): State<AppState>,
    Path(name): Path<String>,
    QueryPairs(pairs): QueryPairs,
) -> ApiResult<Json<ScaleSignal>> {
    queue_name(&name)?;
    let mut target_s = state.config.scale_target.as_secs_f64();
    for (key, value) in pairs {
        match key.as_str() {
            "target_s" => {
                target_s = value
                    .parse::<f64>()
                    .ok()
                    .filter(|t| t.is_finite() && (1.0..=86_400.0).contains(t))
                    .ok_or_else(|| {
                        ApiError::invalid("target_s", "must be a number of seconds from 1 to 86400")
                    })?;
            }
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter; expected target_s",
                ))
            }
        }
    }
    Ok(Json(scale_signal(&state, &name, target_s).await?))
}

pub(crate) async fn put(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    ApiJson(patch): ApiJson<SettingsPatch>,
) -> ApiResult<Json<QueueView>> {
    queue_name(&name)?;
    let mut settings = state.store.queue_settings_get(&name).await?;
    if let Some(paused) = patch.paused {
        settings.paused = paused;
    }
    patched(&mut settings.max_depth, patch.max_depth, |v| {
        positive("max_depth", v)
    })?;
    patched(
        &mut settings.max_depth_per_tenant,
        patch.max_depth_per_tenant,
        |v| positive("max_depth_per_tenant", v),
    )?;
    patched(
        &mut settings.concurrency_limit,
        patch.concurrency_limit,
        |v| positive("concurrency_limit", v),
    )?;
    patched(
        &mut settings.per_key_concurrency_limit,
        patch.per_key_concurrency_limit,
        |v| positive("per_key_concurrency_limit", v),
    )?;
    patched(&mut settings.rate_limit, patch.rate_limit, |v| {
        rate("rate_limit", v)
    })?;
    patched(
        &mut settings.per_key_rate_limit,
        patch.per_key_rate_limit,
        |v| rate("per_key_rate_limit", v),
    )?;
    patched(&mut settings.weight, patch.weight, |v| {
        let weight = positive("weight", v)?;
        u32::try_from(weight).map_err(|_| ApiError::invalid("weight", "must be at most 4294967295"))
    })?;
    patched(
        &mut settings.completed_retention_secs,
        patch.completed_retention_secs,
        |v| positive("completed_retention_secs", v),
    )?;
    patched(
        &mut settings.dead_retention_secs,
        patch.dead_retention_secs,
        |v| positive("dead_retention_secs", v),
    )?;
    patched(&mut settings.default_ttl_ms, patch.default_ttl_ms, |v| {
        let ttl = positive("default_ttl_ms", v)?;
        if ttl > conveyor_core::validate::MAX_DELAY_MS as u64 {
            return Err(ApiError::invalid(
                "default_ttl_ms",
                format!(
                    "must be at most {} (100 years)",
                    conveyor_core::validate::MAX_DELAY_MS
                ),
            ));
        }
        Ok(ttl)
    })?;
    patched(&mut settings.circuit_breaker, patch.circuit_breaker, |v| {
        Ok(BreakerSettings::from_json("circuit_breaker", v)?)
    })?;
    match patch.limits {
        None => {}
        Some(None) => settings.limits = Vec::new(),
        Some(Some(value)) => {
            settings.limits = crate::limits::defined_names(&state, "limits", &value).await?;
        }
    }
    patched(&mut settings.sequence, patch.sequence, |v| {
        crate::limits::sequence_of("sequence", v)
    })?;
    // The store checks the ranges again (and the Rust API relies on that).
    let settings = state.store.queue_settings_put(&name, settings).await?;
    state.breakers.invalidate();
    // The settings as stored (limits and the pause flag; nothing from any job).
    let detail = serde_json::to_string(&settings).unwrap_or_default();
    let entry = caller
        .audit(AuditAction::QueueSettings)
        .target(name.clone());
    audit::record(&state, entry.detail(detail)).await;
    let scale = scale_signal(&state, &name, state.config.scale_target.as_secs_f64()).await?;
    let circuit = state.breakers.view(BreakerScope::Queue, &name).await?;
    Ok(Json(QueueView {
        named: NamedQueueSettings { name, settings },
        desired_workers: scale.desired_workers,
        scale,
        circuit,
    }))
}
