//! The test kit of the server's integration tests: a real server (the router over a SQLite store
//! in a temp dir, on a loopback port).

// Each test binary compiles this module and uses a different part of it.
#![allow(dead_code)]

use conveyor_core::Store;
use conveyor_server::{router_with_options, RouterOptions, ServerConfig};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use std::sync::Arc;

/// A running server; it stops when the test's runtime ends, and its store's directory is removed
/// when this is dropped.
pub struct TestServer {
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub http: reqwest::Client,
    /// The store behind the server, for arranging and checking what HTTP cannot.
    pub store: Arc<dyn Store>,
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
        tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
        Self {
            base: format!("http://{addr}"),
            http: reqwest::Client::new(),
            store,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}
