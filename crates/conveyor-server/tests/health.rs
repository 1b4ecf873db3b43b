//! Liveness and readiness answer what the store can do, not just whether it can be read: a
//! dead SQLite writer makes both fail (restart me), a server shutting down is live but not
//! ready.

mod common;

use common::TestServer;
use conveyor_core::NewJob;
use conveyor_server::{RouterOptions, ServerConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// The test server and the token that tells it to shut down.
struct Api {
    server: TestServer,
    shutdown: CancellationToken,
}

impl std::ops::Deref for Api {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.server
    }
}

async fn start() -> Api {
    let shutdown = CancellationToken::new();
    let server = TestServer::start_with_options(
        ServerConfig::default(),
        RouterOptions {
            shutdown: shutdown.clone(),
            ..RouterOptions::default()
        },
    )
    .await;
    Api { server, shutdown }
}

/// Before the fix `/healthz` only read, so it said ok while every write failed.
#[tokio::test]
async fn a_dead_writer_fails_liveness_and_readiness() {
    let api = start().await;
    assert_eq!(api.get_json("/livez").await.0, StatusCode::OK);
    fail::cfg("sqlite_commit", "1*panic(writer killed by the test)").expect("failpoint");
    let killed = api
        .store
        .jobs_insert_many(vec![NewJob::new("x", json!({}))])
        .await;
    fail::remove("sqlite_commit");
    assert!(killed.is_err());
    for path in ["/livez", "/readyz", "/healthz"] {
        let (status, health) = api.get_json(path).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{path}: {health}");
        assert_eq!(health["status"], "failing");
        assert_eq!(
            (health["live"].clone(), health["ready"].clone()),
            (json!(false), json!(false))
        );
        assert!(
            health["problem"]
                .as_str()
                .is_some_and(|p| p.contains("writer thread died")),
            "{health}"
        );
    }
}

/// Once shutdown begins the server stops being ready (so no new work is routed to it) while
/// staying live.
#[tokio::test]
async fn a_server_shutting_down_is_live_but_not_ready() {
    let api = start().await;
    assert_eq!(api.get_json("/readyz").await.0, StatusCode::OK);
    api.shutdown.cancel();
    let (status, health) = api.get_json("/readyz").await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{health}");
    assert_eq!(health["status"], "unavailable");
    assert_eq!(health["problem"], "shutting down");
    assert_eq!(api.get_json("/livez").await.0, StatusCode::OK);
}

/// `/version`, `/openapi.json` and `/docs` answer anyone, even with access control on: the
/// build's version, the contract (the repository's docs/openapi.yaml as JSON) and a page
/// rendering it under the dashboard's CSP.
#[tokio::test]
async fn version_contract_and_docs_page_are_public() {
    let server = TestServer::start_with_options(ServerConfig::default(), common::auth(true)).await;
    let version: Value = server
        .http
        .get(server.url("/version"))
        .send()
        .await
        .expect("GET /version")
        .json()
        .await
        .expect("JSON");
    assert_eq!(version["name"], "conveyor");
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(version["api_version"], "0.1.0");
    let response = server
        .http
        .get(server.url("/openapi.json"))
        .send()
        .await
        .expect("GET /openapi.json");
    assert_eq!(response.status(), StatusCode::OK);
    let spec: Value = response.json().await.expect("JSON");
    assert_eq!(spec["info"]["title"], "Conveyor HTTP API");
    assert!(spec["paths"]["/v1/fetch"]["post"].is_object());
    let page = server
        .http
        .get(server.url("/docs"))
        .send()
        .await
        .expect("GET /docs");
    assert_eq!(page.status(), StatusCode::OK);
    let csp = page
        .headers()
        .get("content-security-policy")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    assert!(csp.contains("script-src 'self'"), "{csp}");
    let html = page.text().await.expect("HTML");
    assert!(html.contains("/ui/api-docs.js"), "{html}");
    let script = server
        .http
        .get(server.url("/ui/api-docs.js"))
        .send()
        .await
        .expect("script");
    assert_eq!(script.status(), StatusCode::OK);
}
