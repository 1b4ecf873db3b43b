//! `conveyor serve`: the HTTP API on a store, with maintenance, and optionally the demo.

use anyhow::Context;
use clap::Args;
use conveyor::{Maintenance, Scheduler, DEFAULT_STORE_URL};
use conveyor_server::{RouterOptions, ServerConfig};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::DurabilityArg;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Address to listen on. Port 0 picks a free port (printed at start).
    #[arg(long, default_value = "127.0.0.1:7700", env = "CONVEYOR_LISTEN")]
    listen: SocketAddr,
    /// Where jobs are stored.
    #[arg(long, default_value = DEFAULT_STORE_URL, env = "CONVEYOR_STORE")]
    store: String,
    #[arg(long, value_enum, default_value_t = DurabilityArg::Durable)]
    durability: DurabilityArg,
    /// Also run a demo producer and worker: jobs flow, some fail and retry, a few die.
    #[arg(long)]
    demo: bool,
    /// Largest job payload accepted, in bytes (larger gets 413).
    #[arg(long, default_value_t = 256 * 1024)]
    max_payload_bytes: usize,
    /// How often expired leases are rescued and due jobs promoted, in milliseconds.
    #[arg(long, default_value_t = 1000)]
    maintenance_interval_ms: u64,
    /// How long a completed job still answers enqueues with its idempotency key, in seconds.
    /// (Unfinished jobs always do; dead and cancelled jobs never do.)
    #[arg(long, default_value_t = 24 * 3600)]
    idempotency_window_secs: u64,
    /// PostgreSQL: schema holding Conveyor's tables (a `?schema=` in the URL wins).
    #[arg(long, env = "CONVEYOR_SCHEMA", default_value = "conveyor")]
    schema: String,
    /// PostgreSQL: do not apply pending migrations at start (run `conveyor migrate` instead);
    /// start fails if the schema is not current.
    #[arg(long)]
    no_migrate: bool,
    /// How long maintenance leadership lasts unrenewed: the longest a dead leader's lease
    /// rescue is missed before another server takes over, in milliseconds.
    #[arg(long, default_value_t = 10_000)]
    leader_ttl_ms: u64,
    /// Cron schedules to create or update at start (TOML, or JSON when the name ends in
    /// `.json`). Schedules not in the file are left as they are.
    #[arg(long, env = "CONVEYOR_SCHEDULES")]
    schedules: Option<PathBuf>,
    /// How late a schedule tick may fire and still count as on time, in milliseconds (at least
    /// 1000). Older ticks were missed during downtime and follow the schedule's `missed` policy.
    #[arg(long, default_value_t = 5000)]
    schedule_misfire_ms: u64,
    /// How long the demo worker may drain at shutdown, in seconds.
    #[arg(long, default_value_t = 30)]
    drain_timeout_secs: u64,
}

pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    let mut open_options = args.durability.open_options();
    open_options.store.completed_idempotency_window =
        Duration::from_secs(args.idempotency_window_secs);
    open_options.schema = args.schema.clone();
    open_options.run_migrations = !args.no_migrate;
    let store = conveyor::open_store(&args.store, open_options)
        .await
        .with_context(|| format!("cannot open store {}", args.store))?;
    if let Some(path) = &args.schedules {
        let schedules = conveyor::load_schedules(path)?;
        for schedule in schedules {
            let name = schedule.name().to_string();
            store.schedule_put(schedule).await.with_context(|| {
                format!("cannot store schedule {name:?} from {}", path.display())
            })?;
        }
        tracing::info!(file = %path.display(), "schedules applied");
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let local = listener.local_addr().context("reading the bound address")?;

    let shutdown = CancellationToken::new();
    let config = ServerConfig {
        max_payload_bytes: args.max_payload_bytes,
        ..ServerConfig::default()
    };
    let maintenance = Maintenance::new(store.clone())
        .interval(Duration::from_millis(args.maintenance_interval_ms.max(10)))
        .leader_ttl(Duration::from_millis(args.leader_ttl_ms.max(100)))
        .scheduler(
            Scheduler::new(store.clone())
                .misfire_threshold(Duration::from_millis(args.schedule_misfire_ms)),
        );
    let leading = maintenance.leading();
    let app = conveyor_server::router_with_options(
        store.clone(),
        config,
        RouterOptions {
            shutdown: shutdown.clone(),
            leading: Some(leading),
            ..RouterOptions::default()
        },
    );

    let maintenance = tokio::spawn(maintenance.run(shutdown.clone()));
    let demo = args.demo.then(|| {
        tokio::spawn(super::demo::run(
            store.clone(),
            shutdown.clone(),
            Duration::from_secs(args.drain_timeout_secs),
        ))
    });

    // The first stdout line tells scripts and tests where we listen. Written without println!,
    // which panics when whoever started us has closed our stdout.
    announce(&format!(
        "conveyor listening on http://{local} (store: {}, durability: {:?})",
        args.store, args.durability
    ));
    if args.demo {
        announce(&format!(
            "demo running: watch it with `conveyor queues --watch --server http://{local}`"
        ));
    }
    tracing::info!(%local, store = %args.store, "server started");

    let signal = shutdown.clone();
    tokio::spawn(async move {
        conveyor::shutdown_signal().await;
        tracing::info!("shutdown signal received");
        signal.cancel();
    });
    let graceful = shutdown.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move { graceful.cancelled().await })
        .await
        .context("HTTP server failed")?;
    if let Some(demo) = demo {
        let _ = demo.await;
    }
    let _ = maintenance.await;
    tracing::info!("server stopped");
    Ok(ExitCode::SUCCESS)
}

fn announce(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
}
