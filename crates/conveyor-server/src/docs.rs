//! What a client needs to find its way: `GET /openapi.json` (the API's contract, the same
//! document as `docs/openapi.yaml`, which the contract tests hold the server to), `GET /docs`
//! (a page listing every operation, rendered from it) and `GET /version`.

use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ApiError;

/// The OpenAPI document, compiled in.
const SPEC_YAML: &str = include_str!("../../../docs/openapi.yaml");

/// The document as JSON, converted once.
fn spec() -> Result<&'static Value, ApiError> {
    static SPEC: OnceLock<Result<Value, String>> = OnceLock::new();
    SPEC.get_or_init(|| serde_norway::from_str::<Value>(SPEC_YAML).map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| ApiError::Internal(format!("the built-in OpenAPI document: {e}")))
}

pub(crate) async fn openapi() -> Response {
    match spec() {
        Ok(spec) => ([(header::CACHE_CONTROL, "no-cache")], Json(spec.clone())).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `GET /version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    pub name: String,
    /// This build's version (`conveyor_build_info{version}` in the metrics says the same).
    pub version: String,
    /// The API's version as its OpenAPI document states it.
    pub api_version: String,
}

pub(crate) async fn version() -> Json<VersionInfo> {
    let api_version = spec()
        .ok()
        .and_then(|spec| spec["info"]["version"].as_str())
        .unwrap_or_default()
        .to_string();
    Json(VersionInfo {
        name: "conveyor".to_string(),
        version: env!("CARGO_PKG_VERSION").to_string(),
        api_version,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_built_in_spec_converts_and_names_these_routes() {
        let spec = spec().expect("the OpenAPI document parses");
        for path in ["/openapi.json", "/version", "/v1/jobs", "/v1/breakers"] {
            assert!(spec["paths"][path].is_object(), "{path} documented");
        }
        assert!(spec["info"]["version"].is_string());
    }
}
