//! `GET /v1/sources` and `GET /v1/sources/{name}`: the event sources this server runs, with
//! their state and counts in this process.

use axum::extract::{Path, State};
use axum::Json;
use serde_json::{json, Value};

use crate::error::{ApiError, ApiResult};
use crate::AppState;

pub(crate) async fn list(State(state): State<AppState>) -> Json<Value> {
    let sources: Vec<Value> = state.sources.iter().map(|source| source.view()).collect();
    Json(json!({ "sources": sources }))
}

pub(crate) async fn get(
    State(state): State<AppState>,
    Path(name): Path<String>,
) -> ApiResult<Json<Value>> {
    state
        .sources
        .iter()
        .find(|source| source.spec.name == name)
        .map(|source| Json(source.view()))
        .ok_or(ApiError::SourceNotFound(name))
}
