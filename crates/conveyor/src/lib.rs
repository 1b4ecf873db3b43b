//! Conveyor: durable background jobs.
//!
//! This facade re-exports the public API of the workspace crates and opens stores from URLs.
//!
//! ```no_run
//! use conveyor::{Client, JobOptions, Outcome, TypedJob, Worker};
//! # async fn demo() -> anyhow::Result<()> {
//! #[derive(serde::Serialize, serde::Deserialize)]
//! struct SendWelcomeEmail { user_id: u64 }
//! impl TypedJob for SendWelcomeEmail { const KIND: &'static str = "send_welcome_email"; }
//!
//! let store = conveyor::open_store("sqlite://./conveyor-data/conveyor.db", Default::default()).await?;
//! let client = Client::new(store.clone());
//! client.enqueue_with(SendWelcomeEmail { user_id: 7 }, JobOptions::default().queue("mail")).await?;
//!
//! let worker = Worker::builder(store)
//!     .queue("mail", 10)
//!     .handle(|_ctx, job: SendWelcomeEmail| async move {
//!         println!("sending to {}", job.user_id);
//!         Outcome::ok()
//!     })
//!     .build()?;
//! worker.run(conveyor::shutdown_signal()).await;
//! # Ok(()) }
//! ```

pub use conveyor_core::*;
pub use conveyor_engine::{
    fetch_waiting, fetch_waiting_with, queued_violations, CircuitBreakers, Client, Gates,
    IdleLooks, KindRegistry, QueuedViolations, StatsRecorder, WorkerCommands,
};

// The modules where core's rules and the engine's services on them were one module before
// `conveyor-engine` was split off: both halves under the names users import.
/// Circuit breakers: the rules ([`conveyor_core::breaker`]) and the running gate.
pub mod breaker {
    pub use conveyor_core::breaker::*;
    pub use conveyor_engine::breakers::*;
}
/// The typed producer: job types, options and the [`Client`](crate::Client).
pub mod client {
    pub use conveyor_core::client::*;
    pub use conveyor_engine::client::*;
}
/// Kinds: settings and schemas, and the registry that enforces them.
pub mod kinds {
    pub use conveyor_core::kinds::*;
    pub use conveyor_engine::kinds::*;
}
/// History: rollups and reports, and the recorder that counts them.
pub mod stats {
    pub use conveyor_core::stats::*;
    pub use conveyor_engine::stats::*;
}
/// The store traits and their parameters, and the long-poll over them.
pub mod store {
    pub use conveyor_core::store::*;
    pub use conveyor_engine::waiting::*;
}
/// Workers: heartbeats and commands, and the commands as last read.
pub mod workers {
    pub use conveyor_core::workers::*;
    pub use conveyor_engine::workers::*;
}
#[cfg(feature = "postgres")]
pub use conveyor_postgres::{PgOptions, PgStore};
#[cfg(feature = "sqlite")]
pub use conveyor_sqlite::{Durability, SqliteOptions, SqliteStore};
pub use conveyor_worker::{
    default_worker_id, JobContext, Maintenance, Outcome, ShutdownReport, Worker, WorkerBuilder,
};
pub use conveyor_worker::{hostname, MaintenancePass, JOB_LOG_TARGET};
pub use conveyor_worker::{Scheduler, SchedulerPass};
pub use encryption::{EncryptedStore, EncryptionError, PayloadKeys};
pub use schedule_file::{load_schedules, parse_schedules, ScheduleFileError};
pub use source_file::{load_sources, SourceFileError};

/// Webhook alerts (they live beside the server they run in).
#[cfg(feature = "server")]
pub use conveyor_server::alerts;
pub mod encryption;
#[cfg(feature = "otlp")]
pub mod otlp;
pub mod schedule_file;
pub mod source_file;

use std::path::PathBuf;
use std::sync::Arc;

/// The store `conveyor serve` uses when given none.
pub const DEFAULT_STORE_URL: &str = "sqlite://./conveyor-data/conveyor.db";

/// Options for [`open_store`].
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// SQLite only: whether each commit is fsync'd (PostgreSQL follows its own
    /// `synchronous_commit`).
    #[cfg(feature = "sqlite")]
    pub durability: Durability,
    /// Store-wide behaviour (e.g. how long a completed job still deduplicates its idempotency key).
    pub store: StoreOptions,
    /// PostgreSQL only: the schema holding Conveyor's tables, unless the URL names one with
    /// `?schema=NAME`.
    pub schema: String,
    /// PostgreSQL only: apply pending migrations when opening (SQLite always does).
    pub run_migrations: bool,
    /// Encrypt payloads at rest with these keys ([`EncryptedStore`]). When `None`,
    /// [`open_store`] reads them from `CONVEYOR_ENCRYPTION_KEYS` if that is set.
    pub payload_keys: Option<Arc<PayloadKeys>>,
    /// SQLite only: refuse to open a file another process holds open (see
    /// `SqliteOptions::exclusive`). Off only for tools that write nothing a server caches.
    pub exclusive: bool,
    /// SQLite only: check the file's integrity at open and refuse a damaged one.
    pub integrity_check: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        Self {
            #[cfg(feature = "sqlite")]
            durability: Durability::default(),
            store: StoreOptions::default(),
            schema: DEFAULT_POSTGRES_SCHEMA.to_string(),
            run_migrations: true,
            payload_keys: None,
            exclusive: true,
            integrity_check: true,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error(
        "unsupported store URL {0:?}: expected sqlite://PATH (e.g. {DEFAULT_STORE_URL}) or \
         postgres://USER@HOST:PORT/DATABASE[?schema=NAME]"
    )]
    UnsupportedUrl(String),
    /// The URL names a store this build was compiled without.
    #[error("this build of conveyor has no {0} store: enable the crate's `{0}` feature")]
    NotBuiltIn(&'static str),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Encryption(#[from] EncryptionError),
}

/// The file path in a `sqlite://PATH` URL (`sqlite:///abs/path` or `sqlite://relative/path`).
pub fn sqlite_path(url: &str) -> Option<PathBuf> {
    let rest = url
        .strip_prefix("sqlite://")
        .or_else(|| url.strip_prefix("sqlite:"))?;
    (!rest.is_empty()).then(|| PathBuf::from(rest))
}

/// The schema Conveyor's PostgreSQL tables live in unless told otherwise.
pub const DEFAULT_POSTGRES_SCHEMA: &str = "conveyor";

/// The schema a postgres URL's `?schema=NAME` names, else the default one.
pub fn postgres_schema(url: &str) -> String {
    split_schema(url)
        .1
        .unwrap_or_else(|| DEFAULT_POSTGRES_SCHEMA.to_string())
}

/// Splits a `schema=NAME` query parameter (Conveyor's, not PostgreSQL's) off a postgres URL.
fn split_schema(url: &str) -> (String, Option<String>) {
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), None);
    };
    let mut schema = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix("schema=") {
            Some(name) => {
                schema = Some(name.to_string());
                false
            }
            None => !pair.is_empty(),
        })
        .collect();
    let url = if rest.is_empty() {
        base.to_string()
    } else {
        format!("{base}?{}", rest.join("&"))
    };
    (url, schema)
}

/// Opens the store a URL names: `sqlite://PATH` (embedded) or `postgres://...` (scale-out).
pub async fn open_store(url: &str, options: OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    let keys = match options.payload_keys.clone() {
        Some(keys) => Some(keys),
        None => match std::env::var(encryption::KEYS_ENV) {
            Ok(spec) if !spec.trim().is_empty() => Some(Arc::new(PayloadKeys::parse(&spec)?)),
            _ => None,
        },
    };
    let store = open_plain_store(url, options).await?;
    let store: Arc<dyn Store> = match keys {
        Some(keys) => Arc::new(EncryptedStore::new(store, keys)),
        None => store,
    };
    // Outside encryption: limit keys taken from a payload are read from the plaintext.
    Ok(conveyor_engine::LimitStamps::wrap(store))
}

async fn open_plain_store(url: &str, options: OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        return open_postgres(url, options).await;
    }
    match sqlite_path(url) {
        Some(path) => open_sqlite(path, options),
        None => Err(OpenError::UnsupportedUrl(url.to_string())),
    }
}

#[cfg(feature = "postgres")]
async fn open_postgres(url: &str, options: OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    let (url, schema) = split_schema(url);
    let store = PgStore::connect(
        &url,
        PgOptions {
            schema: schema.unwrap_or(options.schema),
            store: options.store,
            run_migrations: options.run_migrations,
            ..PgOptions::default()
        },
    )
    .await?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "postgres"))]
async fn open_postgres(_url: &str, _options: OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    Err(OpenError::NotBuiltIn("postgres"))
}

#[cfg(feature = "sqlite")]
fn open_sqlite(path: PathBuf, options: OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    let store = SqliteStore::open(
        path,
        SqliteOptions {
            durability: options.durability,
            store: options.store,
            exclusive: options.exclusive,
            integrity_check: options.integrity_check,
            ..SqliteOptions::default()
        },
    )?;
    Ok(Arc::new(store))
}

#[cfg(not(feature = "sqlite"))]
fn open_sqlite(_path: PathBuf, _options: OpenOptions) -> Result<Arc<dyn Store>, OpenError> {
    Err(OpenError::NotBuiltIn("sqlite"))
}

/// Resolves on SIGTERM or SIGINT (Ctrl-C): the signal to pass to [`Worker::run`].
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {}
        _ = terminate => {}
    }
}

#[cfg(test)]
mod tests {
    use super::split_schema;

    #[cfg(feature = "postgres")]
    #[test]
    fn the_default_schema_is_the_postgres_store_s_own() {
        assert_eq!(
            super::DEFAULT_POSTGRES_SCHEMA,
            super::PgOptions::default().schema
        );
    }

    #[test]
    fn schema_parameter_is_taken_off_the_url() {
        assert_eq!(
            split_schema("postgres://u@h/db?schema=jobs"),
            ("postgres://u@h/db".to_string(), Some("jobs".to_string()))
        );
        assert_eq!(
            split_schema("postgres://u@h/db?sslmode=disable&schema=jobs&application_name=x"),
            (
                "postgres://u@h/db?sslmode=disable&application_name=x".to_string(),
                Some("jobs".to_string())
            )
        );
        assert_eq!(
            split_schema("postgres://u@h/db"),
            ("postgres://u@h/db".to_string(), None)
        );
    }
}
