//! The test kit of the server's integration tests: a real server (the router over a SQLite store
//! in a temp dir, on a loopback port), with access control on or off and tokens to call it with.
//! Waiting for conditions: `conveyor_storetest::eventually`.

// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use conveyor_core::access::{create_token, Actor};
use conveyor_core::{Role, Store};
use conveyor_server::{router_with_options, AuthOptions, RouterOptions, ServerConfig};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
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
