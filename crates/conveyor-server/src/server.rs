//! The server assembled: the HTTP API and the work a running server does beside it
//! (maintenance and its scheduler, the history flusher, webhook alerts), started together and
//! stopped together. `conveyor serve` only turns its flags into [`ServerSettings`]; an
//! application embedding the server does the same with its own configuration.

use crate::alerts::{AlertConfig, AlertEngine, AlertError};
use crate::{
    flush_history_every, router_with_options, AuthOptions, ConnectionLimits, Metrics, MetricsError,
    RouterOptions, ServerConfig, TlsConfig, HISTORY_FLUSH_INTERVAL,
};
use axum::Router;
use conveyor_core::{AttemptEvent, RetentionPolicy, Store};
use conveyor_sources::Sources;
use conveyor_worker::{Maintenance, Scheduler};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// Everything a server is configured with besides its store.
pub struct ServerSettings {
    /// Limits and defaults of the HTTP API.
    pub config: ServerConfig,
    /// Access control.
    pub auth: AuthOptions,
    /// How often the maintenance leader runs a pass.
    pub maintenance_interval: Duration,
    /// How long maintenance leadership lasts unrenewed.
    pub leader_ttl: Duration,
    /// After how long without a heartbeat a worker is marked dead and its jobs rescued.
    pub worker_stale_after: Duration,
    /// Deletes finished jobs past their retention; `None` keeps them.
    pub retention: Option<RetentionPolicy>,
    /// How long the per-minute history is kept; `None` keeps it.
    pub stats_retention: Option<Duration>,
    /// How long the audit log is kept; `None` keeps it.
    pub audit_retention: Option<Duration>,
    /// How late a schedule's tick may fire before it counts as missed.
    pub schedule_misfire: Duration,
    /// Webhook alerts; `None`: off.
    pub alerts: Option<AlertConfig>,
    /// Whether attempt outcomes are written to the per-minute history.
    pub history: bool,
    /// Whether this server reads the cluster's event sources (off: it stores and shows them
    /// only, e.g. an API-only node).
    pub run_sources: bool,
    /// Connection limits and timeouts of the HTTP listener.
    pub limits: ConnectionLimits,
    /// TLS for the listener; `None`: plain HTTP.
    pub tls: Option<TlsConfig>,
}

/// Why a server could not be assembled.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("building the metrics registry")]
    Metrics(#[from] MetricsError),
    #[error("configuring alerts")]
    Alerts(#[from] AlertError),
}

/// A server ready to run: the router built, its background work configured.
pub struct Server {
    store: Arc<dyn Store>,
    router: Router,
    maintenance: Maintenance,
    alerts: Option<AlertEngine>,
    metrics: Arc<Metrics>,
    limits: ConnectionLimits,
    tls: Option<TlsConfig>,
    sources: Arc<Sources>,
    run_sources: bool,
    shutdown: CancellationToken,
}

impl Server {
    /// Assembles a server on `store`; cancelling `shutdown` stops it (see [`Server::run`]).
    pub fn new(
        store: Arc<dyn Store>,
        settings: ServerSettings,
        shutdown: CancellationToken,
    ) -> Result<Self, ServerError> {
        // One registry for the process: HTTP workers' outcomes, maintenance's rescues and
        // anything else in the process that reports to it (`Server::metrics`).
        let metrics = Arc::new(Metrics::new()?);
        // Before anything can report an outcome (an in-process worker started next to it).
        metrics.history().set_enabled(settings.history);
        let maintenance = Maintenance::new(store.clone())
            .interval(settings.maintenance_interval)
            .leader_ttl(settings.leader_ttl)
            .worker_stale_after(settings.worker_stale_after)
            .retention(settings.retention)
            .stats_retention(settings.stats_retention)
            .audit_retention(settings.audit_retention)
            .on_pass({
                let metrics = metrics.clone();
                move |pass| {
                    metrics.pruned("jobs", pass.pruned);
                    metrics.pruned("flows", pass.flows_pruned);
                    metrics.pruned("audit", pass.audit_pruned);
                    metrics.pruned("stats", pass.stats_pruned);
                    // Attempts no worker reported: their leases expired or their worker died.
                    for attempt in &pass.rescued_attempts {
                        metrics.record(&AttemptEvent {
                            queue: &attempt.queue,
                            kind: &attempt.kind,
                            status: attempt.status,
                            duration: attempt.duration,
                        });
                    }
                }
            })
            .scheduler(
                Scheduler::new(store.clone())
                    .misfire_threshold(settings.schedule_misfire)
                    .on_pass({
                        let metrics = metrics.clone();
                        move |pass| {
                            for (queue, kind) in &pass.enqueued {
                                metrics.enqueued(queue, kind);
                            }
                        }
                    }),
            );
        let alerts = settings
            .alerts
            .map(|config| AlertEngine::new(store.clone(), config, maintenance.leadership()))
            .transpose()?;
        let sources = Sources::new(store.clone());
        let router = router_with_options(
            store.clone(),
            settings.config,
            RouterOptions {
                shutdown: shutdown.clone(),
                leading: Some(maintenance.leading()),
                metrics: Some(metrics.clone()),
                auth: settings.auth,
                sources: Some(sources.clone()),
                ..RouterOptions::default()
            },
        );
        Ok(Self {
            store,
            router,
            maintenance,
            alerts,
            metrics,
            limits: settings.limits,
            tls: settings.tls,
            sources,
            run_sources: settings.run_sources,
            shutdown,
        })
    }

    /// The process's metrics, for in-process workers to report to.
    pub fn metrics(&self) -> Arc<Metrics> {
        self.metrics.clone()
    }

    /// Serves on `listener` and runs the background work until shutdown, then lets requests in
    /// flight finish, waits for the background work to stop, and writes the last minute of
    /// history.
    pub async fn run(self, listener: TcpListener) -> std::io::Result<()> {
        let Self {
            store,
            router,
            maintenance,
            alerts,
            metrics,
            limits,
            tls,
            sources,
            run_sources,
            shutdown,
        } = self;
        // Every server reads every stored source: the broker's consumer group spreads the
        // messages, and the idempotency key of each message's job keeps a redelivery from
        // adding another.
        let sources = run_sources.then(|| tokio::spawn(sources.run(shutdown.clone())));
        let maintenance = tokio::spawn(maintenance.run(shutdown.clone()));
        let flusher = tokio::spawn(flush_history_every(
            metrics.clone(),
            store.clone(),
            HISTORY_FLUSH_INTERVAL,
            shutdown.clone(),
        ));
        let alerts = alerts.map(|engine| tokio::spawn(engine.run(shutdown.clone())));
        let served = match tls {
            Some(tls) => crate::serve_tls(listener, router, limits, tls, shutdown.clone()).await,
            None => crate::serve(listener, router, limits, shutdown.clone()).await,
        };
        // A listener that failed stops the rest as a shutdown would.
        shutdown.cancel();
        let _ = maintenance.await;
        let _ = flusher.await;
        // Outcomes written while the server drained (its last requests, in-process workers).
        if let Err(error) = metrics.history().flush(store.as_ref()).await {
            tracing::warn!(%error, "the last minute of history could not be written");
        }
        if let Some(alerts) = alerts {
            let _ = alerts.await;
        }
        if let Some(sources) = sources {
            let _ = sources.await;
        }
        served
    }
}
