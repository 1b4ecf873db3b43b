//! The test kit of the server's integration tests: a real server (the router over a SQLite store
//! in a temp dir, on a loopback port), with access control on or off and tokens to call it with.
//! Waiting for conditions: `conveyor_storetest::eventually`.

// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use conveyor_core::access::{create_token, Actor};
use conveyor_core::{Role, Store};
use conveyor_server::{router_with_options, AuthOptions, RouterOptions, ServerConfig};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use reqwest::{RequestBuilder, Response, StatusCode};
use serde_json::Value;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;

/// A running server; it stops when the test's runtime ends, and its store's directory is removed
/// when this is dropped.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub addr: SocketAddr,
    pub http: reqwest::Client,
    /// The store behind the server, for arranging and checking what HTTP cannot.
    pub store: Arc<dyn Store>,
    /// The task serving the router; it ends only if the server stops (or panics).
    pub task: JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl TestServer {
    pub async fn start() -> Self {
        Self::start_with(ServerConfig::default()).await
    }

    pub async fn start_with(config: ServerConfig) -> Self {
        Self::start_with_options(config, RouterOptions::default()).await
    }

    /// With router options: a shutdown token, metrics and the like.
    pub async fn start_with_options(config: ServerConfig, options: RouterOptions) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let store: Arc<dyn Store> = Arc::new(
            SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
                .expect("open store"),
        );
        let app = router_with_options(store.clone(), config, options);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let addr = listener.local_addr().expect("local addr");
        let task = tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        Self {
            base: format!("http://{addr}"),
            addr,
            http: reqwest::Client::new(),
            store,
            task,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// Sends `request`: its status and body, a body that is not JSON (or is empty) read as
    /// `Value::Null`.
    pub async fn call(&self, request: RequestBuilder) -> (StatusCode, Value) {
        let response = request.send().await.expect("send");
        let status = response.status();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Sends `request` and demands a JSON answer: a JSON content type and a body that parses.
    pub async fn call_json(&self, request: RequestBuilder) -> (StatusCode, Value) {
        Self::read_json(request.send().await.expect("send")).await
    }

    /// Reads an answer that must be JSON: a JSON content type and a body that parses.
    pub async fn read_json(response: Response) -> (StatusCode, Value) {
        let status = response.status();
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let text = response.text().await.expect("body");
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("non-JSON answer ({status}, {content_type}): {e}: {text}"));
        assert!(
            content_type.starts_with("application/json"),
            "content type {content_type:?} for {text}"
        );
        (status, value)
    }

    /// `POST path` with a JSON body; a non-JSON or empty answer reads as `Value::Null`.
    pub async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call(self.http.post(self.url(path)).json(&body)).await
    }

    /// `GET path`; a non-JSON or empty answer reads as `Value::Null`.
    pub async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.call(self.http.get(self.url(path))).await
    }

    /// `DELETE path`; a non-JSON or empty answer reads as `Value::Null`.
    pub async fn delete(&self, path: &str) -> (StatusCode, Value) {
        self.call(self.http.delete(self.url(path))).await
    }

    /// `POST path` with a JSON body; the answer must be JSON (see `read_json`).
    pub async fn post_json(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.call_json(self.http.post(self.url(path)).json(&body))
            .await
    }

    /// `GET path`; the answer must be JSON (see `read_json`).
    pub async fn get_json(&self, path: &str) -> (StatusCode, Value) {
        self.call_json(self.http.get(self.url(path))).await
    }

    /// `DELETE path`; the answer must be JSON (see `read_json`).
    pub async fn delete_json(&self, path: &str) -> (StatusCode, Value) {
        self.call_json(self.http.delete(self.url(path))).await
    }

    /// Creates an API token of `role` named `name` straight in the store; its secret.
    pub async fn token(&self, role: Role, name: &str) -> String {
        create_token(
            self.store.as_ref(),
            role,
            Some(name.to_string()),
            Actor::anonymous(),
        )
        .await
        .expect("create token")
        .secret
        .plaintext
    }
}

/// Router options with access control on (`true`) or off, the rest default.
pub fn auth(enabled: bool) -> RouterOptions {
    auth_with(AuthOptions {
        enabled,
        ..AuthOptions::default()
    })
}

/// Router options with these access-control options, the rest default.
pub fn auth_with(auth: AuthOptions) -> RouterOptions {
    RouterOptions {
        auth,
        ..RouterOptions::default()
    }
}
