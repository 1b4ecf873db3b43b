//! `GET /v1/stats`: the history kept in the store (see `conveyor_core::stats`).
//!
//! Before reading, this server flushes what it counted since its last flush, so its own
//! recent work is always in the answer; other servers' counts arrive with their next flush
//! (every [`FLUSH_INTERVAL`]).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::Json;
use conveyor_core::stats::{parse_duration, StatsReport, StatsRequest};

use crate::error::{ApiError, ApiResult};
use crate::extract::QueryPairs;
use crate::jobs::rfc3339;
use crate::{AppState, Metrics};
use conveyor_core::Store;
use tokio_util::sync::CancellationToken;

/// How often a server writes its counts to the store (see [`flush_history`]).
pub const FLUSH_INTERVAL: Duration = Duration::from_secs(10);

/// The span asked for when `from` is not given.
const DEFAULT_SPAN: chrono::Duration = chrono::Duration::hours(1);

/// Writes this process's counted history to the store; failures are logged and the counts kept
/// for the next try.
pub(crate) async fn flush(state: &AppState) {
    if let Some(metrics) = &state.metrics {
        flush_once(metrics, state.store.as_ref()).await;
    }
}

async fn flush_once(metrics: &Metrics, store: &dyn Store) {
    if let Err(error) = metrics.history().flush(store).await {
        tracing::warn!(%error, "history not flushed to the store; will retry");
    }
}

/// Flushes `metrics`' history to `store` every `interval` until `stop`, then once more, so a
/// graceful shutdown loses none of it (a crash loses at most one interval of counts).
pub async fn flush_history_every(
    metrics: Arc<Metrics>,
    store: Arc<dyn Store>,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
        }
        flush_once(&metrics, store.as_ref()).await;
    }
    flush_once(&metrics, store.as_ref()).await;
}

/// `GET /v1/stats?from=&to=&step=&queue=&kind=`: per-step counts, totals and a summary per
/// queue and kind. `from`/`to` are RFC 3339 (default: the last hour); `step` is seconds or a
/// number with s/m/h/d, a whole number of minutes (default: about 120 points).
pub(crate) async fn get(
    State(state): State<AppState>,
    QueryPairs(pairs): QueryPairs,
) -> ApiResult<Json<StatsReport>> {
    let (mut from, mut to, mut step, mut queue, mut kind) = (None, None, None, None, None);
    for (key, value) in pairs {
        match key.as_str() {
            "from" => from = Some(rfc3339("from", &value)?),
            "to" => to = Some(rfc3339("to", &value)?),
            "step" => step = Some(parse_duration("step", &value)?),
            "queue" => queue = Some(value),
            "kind" => kind = Some(value),
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown query parameter; expected from, to, step, queue or kind",
                ))
            }
        }
    }
    let to = to.unwrap_or_else(|| state.clock.now());
    let from = from.unwrap_or(to - DEFAULT_SPAN);
    let request = StatsRequest::new(from, to, step, queue, kind)?;
    flush(&state).await;
    let rollups = state.store.stats_read(request.query()).await?;
    Ok(Json(StatsReport::build(&request, &rollups)))
}
