//! Circuit breakers over HTTP: `GET /v1/breakers`, and operators' manual
//! `POST /v1/queues/{name}/circuit/open|close` and `POST /v1/kinds/{kind}/circuit/open|close`.
//! A breaker's settings are part of the queue's (`PUT /v1/queues/{name}`) and the kind's
//! (`PUT /v1/kinds/{kind}`) settings; the rules are in `conveyor_core::breaker`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::Json;
use conveyor_core::{validate, wire, BreakerScope, BreakerView};
use serde::Deserialize;
use serde_json::Value;

use crate::api::BreakersResponse;
use crate::auth::Caller;
use crate::error::{ApiError, ApiResult};
use crate::extract::parse_json;
use crate::AppState;

/// `POST .../circuit/open` and `.../circuit/close`; the body is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CircuitRequest {
    /// How long to stay open (then it probes); absent: until closed by hand.
    #[serde(default)]
    open_ms: Option<Value>,
    /// Why, for the audit log and the dashboard.
    #[serde(default, deserialize_with = "wire::non_null")]
    reason: Option<String>,
}

/// Longest manual open with an end: a year (longer means "until closed": leave `open_ms` out).
const MAX_OPEN_MS: u64 = 365 * 24 * 3_600_000;

fn request(body: &Bytes) -> ApiResult<CircuitRequest> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(CircuitRequest::default());
    }
    let request: CircuitRequest = parse_json(body)?;
    if let Some(reason) = &request.reason {
        validate::text_without_nul("reason", reason)?;
        if reason.chars().count() > 500 {
            return Err(ApiError::invalid("reason", "at most 500 characters"));
        }
    }
    Ok(request)
}

fn open_for(request: &CircuitRequest) -> ApiResult<Option<Duration>> {
    match &request.open_ms {
        None | Some(Value::Null) => Ok(None),
        Some(value) => wire::whole_number(value)
            .and_then(|n| u64::try_from(n).ok())
            .filter(|n| (1..=MAX_OPEN_MS).contains(n))
            .map(|ms| Some(Duration::from_millis(ms)))
            .ok_or_else(|| {
                ApiError::invalid(
                    "open_ms",
                    format!("must be a whole number from 1 to {MAX_OPEN_MS} (or left out: open until closed)"),
                )
            }),
    }
}

pub(crate) async fn list(State(state): State<AppState>) -> ApiResult<Json<BreakersResponse>> {
    Ok(Json(BreakersResponse {
        breakers: state.breakers.list().await?,
    }))
}

async fn change(
    state: &AppState,
    caller: &Caller,
    scope: BreakerScope,
    name: &str,
    open: bool,
    body: &Bytes,
) -> ApiResult<Json<BreakerView>> {
    let field = match scope {
        BreakerScope::Queue => "name",
        BreakerScope::Kind => "kind",
    };
    validate::name(field, name)?;
    let request = request(body)?;
    let view = if open {
        let until = open_for(&request)?;
        state
            .breakers
            .open(scope, name, until, request.reason, &caller.actor)
            .await?
    } else {
        if request.open_ms.is_some() {
            return Err(ApiError::invalid("open_ms", "only for opening a breaker"));
        }
        state
            .breakers
            .close(scope, name, request.reason, &caller.actor)
            .await?
    };
    // Fetchers blocked by it look again now rather than at their next poll.
    state.store.wakeup().notify_waiters();
    Ok(Json(view))
}

pub(crate) async fn queue_open(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<BreakerView>> {
    change(&state, &caller, BreakerScope::Queue, &name, true, &body).await
}

pub(crate) async fn queue_close(
    State(state): State<AppState>,
    caller: Caller,
    Path(name): Path<String>,
    body: Bytes,
) -> ApiResult<Json<BreakerView>> {
    change(&state, &caller, BreakerScope::Queue, &name, false, &body).await
}

pub(crate) async fn kind_open(
    State(state): State<AppState>,
    caller: Caller,
    Path(kind): Path<String>,
    body: Bytes,
) -> ApiResult<Json<BreakerView>> {
    change(&state, &caller, BreakerScope::Kind, &kind, true, &body).await
}

pub(crate) async fn kind_close(
    State(state): State<AppState>,
    caller: Caller,
    Path(kind): Path<String>,
    body: Bytes,
) -> ApiResult<Json<BreakerView>> {
    change(&state, &caller, BreakerScope::Kind, &kind, false, &body).await
}
