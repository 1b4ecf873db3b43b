//! Conveyor's HTTP/JSON API.
//!
//! [`router`] builds an axum [`Router`] over any [`Store`]: producers enqueue and inspect jobs,
//! HTTP workers fetch (with long-poll), heartbeat, complete, fail, snooze and release them, and
//! operators manage the dead-letter queue and read per-queue counts. With access control on
//! ([`AuthOptions`]), every route but a few public ones needs an API token or a session cookie
//! whose role its rule in [`RULES`] allows, and admin actions and enqueues go to the audit log.
//! Every error answers `{"error": {"code", "field", "message"}}`; see `docs/openapi.yaml` for
//! the full contract.
//!
//! ```no_run
//! # async fn run(store: std::sync::Arc<dyn conveyor_core::Store>) -> std::io::Result<()> {
//! let app = conveyor_server::router(store, conveyor_server::ServerConfig::default());
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, app).await
//! # }
//! ```

mod admin;
pub mod alerts;
pub mod api;
mod audit;
mod auth;
mod breakers;
mod bulk;
pub use bulk::BulkResponse;
mod docs;
pub use docs::VersionInfo;
mod error;
mod extract;
mod flows;
pub mod hooks;
mod jobs;
mod kinds;
mod limits;
mod metrics;
mod observe;
mod schedules;
mod serve;
mod server;
mod settings;
pub mod sources;
mod stats;
pub mod subscriptions;
mod worker_api;
pub use stats::{flush_history_every, FLUSH_INTERVAL as HISTORY_FLUSH_INTERVAL};
mod tls;
mod tokens;
mod ui;

use axum::extract::DefaultBodyLimit;
use axum::routing::{delete, get, post};
use axum::Router;
use conveyor_core::{Clock, RetryPolicy, Store, StuckParams, SystemClock};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tower_http::trace::TraceLayer;
use worker_api::{acks, lease};

pub use auth::{rule_for, Access, AuthOptions, CSRF_HEADER, RULES, SESSION_COOKIE};
pub use error::{ApiError, ApiResult};
pub use metrics::{Metrics, MetricsError, Snapshot};
pub use serve::{serve, serve_tls, ConnectionLimits};
pub use server::{Server, ServerError, ServerSettings};
pub use tls::{TlsConfig, TlsError, TlsFiles};

/// Limits and defaults of the HTTP API.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Largest serialized `payload` of one job (and `result` of a completion), in bytes. Larger
    /// ones are answered 413. The whole request body may be up to 64 times this (at least 1 MiB)
    /// so that batches fit.
    pub max_payload_bytes: usize,
    /// Lease given to fetched jobs (and added by heartbeats) when the worker names none.
    pub default_lease: Duration,
    /// Longest a fetch or a job read may long-poll (`wait_ms` is capped to this).
    pub max_fetch_wait: Duration,
    /// How often a long-polling fetch looks again when not woken (jobs made available by
    /// another process, or scheduled jobs coming due).
    pub fetch_poll: Duration,
    /// Backoff applied by `POST /v1/jobs/{id}/fail` with `retry: "auto"`.
    pub default_retry: RetryPolicy,
    /// Most jobs one fetch may claim (`max`).
    pub max_fetch_batch: usize,
    /// Most jobs in one `POST /v1/jobs/batch` (and ids in one dead replay).
    pub max_batch_jobs: usize,
    /// What counts as a stuck job (`GET /v1/jobs/stuck`, the `conveyor_stuck_jobs` gauge).
    pub stuck: StuckParams,
    /// Payload keys (at any depth) whose values job views show as `[redacted]`: `GET
    /// /v1/jobs`, `/v1/jobs/{id}`, `/v1/dead` and the dashboard. Fetches still hand workers
    /// the whole payload.
    pub sensitive_fields: Vec<String>,
    /// The scaling signal's default target: the backlog worked off within this long
    /// (`conveyor_queue_desired_workers`, `GET /v1/queues/{name}`; `.../scale?target_s=` overrides it).
    pub scale_target: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_payload_bytes: 256 * 1024,
            default_lease: Duration::from_secs(30),
            max_fetch_wait: Duration::from_secs(30),
            fetch_poll: Duration::from_millis(100),
            default_retry: RetryPolicy::default(),
            max_fetch_batch: 1000,
            max_batch_jobs: 10_000,
            stuck: StuckParams::default(),
            sensitive_fields: Vec::new(),
            scale_target: Duration::from_secs(60),
        }
    }
}

impl ServerConfig {
    /// A job as people see it: sensitive payload fields redacted.
    pub(crate) fn redacted(&self, mut job: conveyor_core::Job) -> conveyor_core::Job {
        conveyor_core::redact::redact_fields(&mut job.payload, &self.sensitive_fields);
        job
    }

    /// The overall request body limit: 64 payloads, and never below 1 MiB.
    pub fn body_limit(&self) -> usize {
        self.max_payload_bytes.saturating_mul(64).max(1024 * 1024)
    }
}

/// Extra wiring for [`router_with_options`].
#[derive(Clone)]
pub struct RouterOptions {
    /// Where `delay_ms`, `retry_after_ms`, snooze delays, breaker windows and history minutes
    /// count from. The default ([`SystemClock`]) stands for the store's clock
    /// ([`conveyor_core::JobStore::clock`]); any other clock is used as given.
    pub clock: Arc<dyn Clock>,
    /// Cancel on shutdown: long-polling fetches then stop waiting and answer `{"jobs": []}` at
    /// once (a fetch already claiming jobs still returns them), so a graceful shutdown of the
    /// HTTP server is not held up by `wait_ms`.
    pub shutdown: CancellationToken,
    /// Whether this node currently leads maintenance (shown by `GET /healthz`); `None` when
    /// the process runs no maintenance.
    pub leading: Option<Arc<AtomicBool>>,
    /// Access control (off by default: everyone acts as the anonymous admin).
    pub auth: AuthOptions,
    /// The process's metrics, to share them with in-process workers (as their observer);
    /// `None`: the router makes its own.
    pub metrics: Option<Arc<Metrics>>,
    /// The event sources this server runs (see `conveyor-sources`); `None`: a set that runs
    /// nothing, for a router without a [`Server`] (the API still stores sources).
    pub sources: Option<Arc<conveyor_sources::Sources>>,
}

impl Default for RouterOptions {
    fn default() -> Self {
        Self {
            clock: Arc::new(SystemClock),
            shutdown: CancellationToken::new(),
            leading: None,
            auth: AuthOptions::default(),
            metrics: None,
            sources: None,
        }
    }
}

/// Shared by every handler.
#[derive(Clone)]
pub(crate) struct AppState {
    pub store: Arc<dyn Store>,
    pub config: Arc<ServerConfig>,
    pub clock: Arc<dyn Clock>,
    pub shutdown: CancellationToken,
    pub leading: Option<Arc<AtomicBool>>,
    pub body_limit: usize,
    pub auth: Arc<auth::AuthState>,
    /// `None` only if the metrics registry could not be built.
    pub metrics: Option<Arc<Metrics>>,
    /// HTTP workers seen in fetches and heartbeats (see `acks::register`).
    pub registry: Arc<acks::Registry>,
    /// Jobs this server handed out, by id, until completed (see `acks::LeasedJob`).
    pub leased: Arc<std::sync::Mutex<std::collections::HashMap<uuid::Uuid, acks::LeasedJob>>>,
    /// The empty looks of the long-polls waiting here, shared (see `conveyor_engine::IdleLooks`).
    pub idle_looks: Arc<conveyor_engine::IdleLooks>,
    /// Notified whenever this server may have finished a job (a completion, a failure, a
    /// cancellation), so `GET /v1/jobs/{id}?wait_ms=` answers at once; jobs finished through
    /// other processes are seen by that wait's polling.
    pub finished: Arc<tokio::sync::Notify>,
    /// Circuit breakers: gate this server's fetches, count its workers' outcomes.
    pub breakers: Arc<conveyor_engine::CircuitBreakers>,
    /// The payload schemas enqueues are checked against (see `conveyor_core::kinds`).
    pub kinds: Arc<conveyor_engine::KindRegistry>,
    /// Each queue's measured throughput, for the scaling signal.
    pub throughput: Arc<std::sync::Mutex<conveyor_core::scaling::ThroughputMeter>>,
    /// Operators' commands to workers: fetches of a worker told to quiet or stop get nothing.
    pub worker_commands: Arc<conveyor_engine::WorkerCommands>,
    /// The event sources this server runs.
    pub sources: Arc<conveyor_sources::Sources>,
    /// What became of each webhook's requests in this process.
    pub hook_counts: Arc<observe::HookCounts>,
}

/// The API over `store`, using the wall clock and no shutdown signal.
pub fn router(store: Arc<dyn Store>, config: ServerConfig) -> Router {
    router_with_options(store, config, RouterOptions::default())
}

/// Like [`router`], with an injected clock and a shutdown token (see [`RouterOptions`]).
pub fn router_with_options(
    store: Arc<dyn Store>,
    config: ServerConfig,
    options: RouterOptions,
) -> Router {
    let body_limit = config.body_limit();
    let clock = if options.clock.is_system() {
        store.clock()
    } else {
        options.clock
    };
    // Building the registry fails only on a programming error (a clashing metric name); the
    // API then serves everything but `/metrics` rather than not at all.
    let metrics = match options.metrics {
        Some(metrics) => Some(metrics),
        None => Metrics::with_clock(clock.clone())
            .map(Arc::new)
            .map_err(|error| tracing::error!(%error, "metrics disabled"))
            .ok(),
    };
    let kinds = Arc::new(conveyor_engine::KindRegistry::new(store.clone()));
    if let Some(metrics) = &metrics {
        metrics.set_scale_target(config.scale_target);
        // The store enqueues a flow's steps itself, inside other operations (a parent's
        // completion, a signal), where no request path sees them: it tells of them here, and
        // these metrics count them as enqueued like every other job (`FlowStarts`).
        store.flow_starts().observe(metrics.clone());
    }
    let breakers = conveyor_engine::CircuitBreakers::new(store.clone(), clock.clone());
    let worker_commands = Arc::new(conveyor_engine::WorkerCommands::new(store.clone()));
    let sources = options
        .sources
        .unwrap_or_else(|| conveyor_sources::Sources::new(store.clone()));
    let state = AppState {
        worker_commands,
        store,
        breakers,
        kinds,
        throughput: metrics
            .as_ref()
            .map_or_else(Arc::default, |metrics| metrics.throughput()),
        config: Arc::new(config),
        clock,
        shutdown: options.shutdown,
        leading: options.leading,
        body_limit,
        auth: Arc::new(auth::AuthState::new(options.auth)),
        metrics,
        registry: Arc::default(),
        leased: Arc::default(),
        idle_looks: Arc::default(),
        finished: Arc::default(),
        sources,
        hook_counts: Arc::default(),
    };
    Router::new()
        .route("/v1/jobs", post(jobs::enqueue).get(jobs::list))
        .route("/v1/jobs/batch", post(jobs::enqueue_batch))
        .route("/v1/jobs/bulk", post(bulk::bulk))
        .route("/v1/jobs/{id}", get(jobs::get))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel))
        .route("/v1/jobs/{id}/progress", post(lease::progress))
        .route("/v1/flows", post(flows::create).get(flows::list))
        .route("/v1/flows/{id}", get(flows::get))
        .route("/v1/flows/{id}/cancel", post(flows::cancel))
        .route("/v1/flows/{id}/signal", post(flows::signal))
        .route("/v1/fetch", post(lease::fetch))
        .route("/v1/ack", post(acks::ack))
        .route("/v1/heartbeat", post(acks::heartbeat))
        .route("/v1/jobs/{id}/heartbeat", post(lease::heartbeat))
        .route("/v1/jobs/{id}/complete", post(lease::complete))
        .route("/v1/jobs/{id}/fail", post(lease::fail))
        .route("/v1/jobs/{id}/release", post(lease::release))
        .route("/v1/jobs/{id}/snooze", post(lease::snooze))
        .route("/v1/dead", get(admin::dead_list))
        .route("/v1/dead/replay", post(admin::dead_replay))
        .route("/v1/dead/{id}", delete(admin::dead_discard))
        .route("/v1/queues", get(admin::queues))
        .route("/v1/queues/{name}", get(settings::get).put(settings::put))
        .route("/v1/queues/{name}/scale", get(settings::scale))
        .route("/v1/queues/{name}/circuit/open", post(breakers::queue_open))
        .route(
            "/v1/queues/{name}/circuit/close",
            post(breakers::queue_close),
        )
        .route("/v1/kinds/{kind}/circuit/open", post(breakers::kind_open))
        .route("/v1/kinds/{kind}/circuit/close", post(breakers::kind_close))
        .route("/v1/breakers", get(breakers::list))
        .route("/v1/stats", get(stats::get))
        .route("/v1/kinds", get(kinds::list))
        .route(
            "/v1/kinds/{kind}",
            get(kinds::get).put(kinds::put).delete(kinds::delete),
        )
        .route("/v1/sources", get(sources::list))
        .route(
            "/v1/sources/{name}",
            get(sources::get).put(sources::put).delete(sources::delete),
        )
        .route("/v1/hooks", get(hooks::list))
        .route(
            "/v1/hooks/{name}",
            get(hooks::get).put(hooks::put).delete(hooks::delete),
        )
        .route("/hooks/{name}", post(hooks::receive))
        .route("/v1/events", post(subscriptions::send))
        .route("/v1/subscriptions", get(subscriptions::list))
        .route(
            "/v1/subscriptions/{name}",
            get(subscriptions::get)
                .put(subscriptions::put)
                .delete(subscriptions::delete),
        )
        .route("/v1/limits", get(limits::list))
        .route(
            "/v1/limits/{name}",
            get(limits::get).put(limits::put).delete(limits::delete),
        )
        .route("/v1/sources/{name}/pause", post(sources::pause))
        .route("/v1/sources/{name}/resume", post(sources::resume))
        .route("/v1/schedules", get(schedules::list))
        .route(
            "/v1/schedules/{name}",
            get(schedules::get)
                .put(schedules::put)
                .delete(schedules::delete),
        )
        .route("/v1/schedules/{name}/runs", get(schedules::runs))
        .route("/v1/schedules/{name}/pause", post(schedules::pause))
        .route("/v1/schedules/{name}/resume", post(schedules::resume))
        .route("/v1/schedules/{name}/trigger", post(schedules::trigger))
        .route("/healthz", get(admin::healthz))
        .route("/readyz", get(admin::healthz))
        .route("/livez", get(admin::livez))
        .route("/version", get(docs::version))
        .route("/openapi.json", get(docs::openapi))
        .route("/metrics", get(observe::metrics))
        .route("/v1/jobs/stuck", get(observe::stuck))
        .route("/v1/workers", get(observe::workers))
        .route("/v1/workers/heartbeat", post(observe::worker_heartbeat))
        .route("/v1/workers/{id}/quiet", post(observe::worker_quiet))
        .route("/v1/workers/{id}/stop", post(observe::worker_stop))
        .route("/v1/workers/{id}/resume", post(observe::worker_resume))
        .route(
            "/v1/session",
            post(auth::login).get(auth::whoami).delete(auth::logout),
        )
        .route("/v1/tokens", get(tokens::list).post(tokens::create))
        .route("/v1/tokens/{token}", delete(tokens::revoke))
        .route("/v1/audit", get(audit::list))
        .merge(ui::router())
        .fallback(admin::not_found)
        .method_not_allowed_fallback(admin::method_not_allowed)
        // After every route: a layer covers only the routes added before it.
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::guard,
        ))
        .layer(axum::middleware::from_fn(error::json_client_errors))
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(TraceLayer::new_for_http())
        .with_state(state)
}
