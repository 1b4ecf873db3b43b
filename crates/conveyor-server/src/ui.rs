//! The dashboard: static HTML, CSS and JavaScript compiled into the binary and served at `/`
//! and `/ui/*`. The page holds no data of its own; its scripts call the JSON API
//! (`/v1/...`) with the session cookie, so it sees and may do exactly what its token allows.
//!
//! There is no front-end build step: the files under `crates/conveyor-server/ui/` are served
//! as they are, with a strict Content-Security-Policy (scripts and styles only from this
//! origin, no inline code, no framing).

use axum::extract::Path;
use axum::http::header::{self, HeaderMap, HeaderName, HeaderValue};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::error::ApiError;
use crate::AppState;

/// Everything the page may load comes from this origin. No inline scripts or styles (the JS
/// sets styles through the CSSOM, which CSP allows), no plugins, no `<base>` tricks, and no
/// framing (clickjacking of the replay and discard buttons).
const CONTENT_SECURITY_POLICY: &str = "default-src 'self'; script-src 'self'; \
     style-src 'self'; img-src 'self' data:; connect-src 'self'; font-src 'self'; \
     object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'";

struct Asset {
    /// The path under `/ui/`.
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
    /// Computed at compile time from the body, so it changes exactly when the file does.
    etag: u64,
}

macro_rules! asset {
    ($name:literal, $content_type:expr) => {
        Asset {
            name: $name,
            content_type: $content_type,
            body: include_bytes!(concat!("../ui/", $name)),
            etag: fnv1a(include_bytes!(concat!("../ui/", $name))),
        }
    };
}

const JS: &str = "text/javascript; charset=utf-8";

static ASSETS: &[Asset] = &[
    asset!("index.html", "text/html; charset=utf-8"),
    asset!("app.css", "text/css; charset=utf-8"),
    asset!("favicon.svg", "image/svg+xml"),
    asset!("app.js", JS),
    asset!("api.js", JS),
    asset!("dom.js", JS),
    asset!("charts.js", JS),
    asset!("views/shared.js", JS),
    asset!("views/login.js", JS),
    asset!("views/overview.js", JS),
    asset!("views/jobs.js", JS),
    asset!("views/job.js", JS),
    asset!("views/dead.js", JS),
    asset!("views/workers.js", JS),
    asset!("views/schedules.js", JS),
    asset!("views/kinds.js", JS),
    asset!("views/sources.js", JS),
    asset!("views/limits.js", JS),
    asset!("views/history.js", JS),
    asset!("views/flows.js", JS),
    asset!("api-docs.html", "text/html; charset=utf-8"),
    asset!("api-docs.js", JS),
];

/// FNV-1a (64 bit): a content fingerprint for ETags that a `const fn` can compute. Not a
/// security measure; it only has to change when the bytes do.
const fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

/// `GET /` (the page) and `GET /ui/{path}` (its scripts, styles and icon). These carry no
/// data, so they need no token: the login page is one of them.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(index))
        .route("/docs", get(api_docs))
        .route("/ui/{*path}", get(asset))
}

async fn index(headers: HeaderMap) -> Response {
    match find("index.html") {
        Some(asset) => serve(asset, &headers),
        None => missing("/"),
    }
}

/// `GET /docs`: every operation of the API, rendered in the page from `/openapi.json`.
async fn api_docs(headers: HeaderMap) -> Response {
    match find("api-docs.html") {
        Some(asset) => serve(asset, &headers),
        None => missing("/docs"),
    }
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    match find(&path) {
        Some(asset) => serve(asset, &headers),
        None => missing(&format!("/ui/{path}")),
    }
}

fn find(name: &str) -> Option<&'static Asset> {
    ASSETS.iter().find(|asset| asset.name == name)
}

fn missing(path: &str) -> Response {
    ApiError::RouteNotFound {
        method: "GET".to_string(),
        path: path.to_string(),
    }
    .into_response()
}

fn serve(asset: &'static Asset, request: &HeaderMap) -> Response {
    let etag = format!("\"{:016x}\"", asset.etag);
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.split(',').any(|tag| tag.trim() == etag));
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(asset.content_type),
    );
    // The URLs are not versioned (no build step to fingerprint them), so the browser keeps the
    // files but revalidates them on every load: a new binary's dashboard is never mixed with an
    // old cached script, and an unchanged one costs a 304.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    if let Ok(value) = HeaderValue::from_str(&etag) {
        headers.insert(header::ETAG, value);
    }
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    if fresh {
        (StatusCode::NOT_MODIFIED, headers).into_response()
    } else {
        (StatusCode::OK, headers, asset.body).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_asset_has_a_distinct_name_and_a_body() {
        for (i, asset) in ASSETS.iter().enumerate() {
            assert!(!asset.body.is_empty(), "{} is empty", asset.name);
            assert!(
                ASSETS[i + 1..].iter().all(|other| other.name != asset.name),
                "{} listed twice",
                asset.name
            );
        }
    }

    #[test]
    fn fingerprints_follow_the_bytes() {
        assert_ne!(fnv1a(b"a"), fnv1a(b"b"));
        assert_eq!(fnv1a(b"conveyor"), fnv1a(b"conveyor"));
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
