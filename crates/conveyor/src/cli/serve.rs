//! `conveyor serve`: the HTTP API on a store, with maintenance, and optionally the demo.

use anyhow::Context;
use clap::Args;
use conveyor::alerts::{AlertConfig, Thresholds};
use conveyor::{StuckParams, DEFAULT_STORE_URL};
use conveyor_server::{Server, ServerConfig, ServerSettings, TlsConfig, TlsFiles};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

use super::DurabilityArg;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Settings from a TOML file, one key per flag (`max_payload_bytes = 1048576`). A flag
    /// given here or its CONVEYOR_* variable wins over the file.
    #[arg(long, env = "CONVEYOR_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address to listen on. Port 0 picks a free port (printed at start).
    #[arg(long, default_value = "127.0.0.1:7700", env = "CONVEYOR_LISTEN")]
    listen: SocketAddr,
    /// Where jobs are stored.
    #[arg(long, default_value = DEFAULT_STORE_URL, env = "CONVEYOR_STORE")]
    store: String,
    #[arg(env = "CONVEYOR_DURABILITY", long, value_enum, default_value_t = DurabilityArg::Durable)]
    durability: DurabilityArg,
    /// Also run a demo producer and worker: jobs flow, some fail and retry, a few die.
    #[arg(env = "CONVEYOR_DEMO", long)]
    demo: bool,
    /// Largest job payload accepted, in bytes (larger gets 413).
    #[arg(env = "CONVEYOR_MAX_PAYLOAD_BYTES", long, default_value_t = 256 * 1024)]
    max_payload_bytes: usize,
    /// How often expired leases are rescued and due jobs promoted, in milliseconds.
    #[arg(env = "CONVEYOR_MAINTENANCE_INTERVAL_MS", long, default_value_t = 1000, value_parser = at_most(HOUR_MS))]
    maintenance_interval_ms: u64,
    /// How long a completed job still answers enqueues with its idempotency key, in seconds.
    /// (Unfinished jobs always do; dead and cancelled jobs never do.)
    #[arg(env = "CONVEYOR_IDEMPOTENCY_WINDOW_SECS", long, default_value_t = 24 * 3600, value_parser = at_most(TEN_YEARS_SECS))]
    idempotency_window_secs: u64,
    /// PostgreSQL: schema holding Conveyor's tables (a `?schema=` in the URL wins).
    #[arg(long, env = "CONVEYOR_SCHEMA", default_value = "conveyor")]
    schema: String,
    /// PostgreSQL: do not apply pending migrations at start (run `conveyor migrate` instead);
    /// start fails if the schema is not current.
    #[arg(env = "CONVEYOR_NO_MIGRATE", long)]
    no_migrate: bool,
    /// How long maintenance leadership lasts unrenewed: the longest a dead leader's lease
    /// rescue is missed before another server takes over, in milliseconds.
    #[arg(env = "CONVEYOR_LEADER_TTL_MS", long, default_value_t = 10_000, value_parser = at_most(HOUR_MS))]
    leader_ttl_ms: u64,
    /// Completed and cancelled jobs are deleted this many seconds after they finished (a
    /// queue's `completed_retention_secs` wins). 0 keeps them forever.
    #[arg(env = "CONVEYOR_RETAIN_COMPLETED_SECS", long, default_value_t = 24 * 3600, value_parser = at_most(conveyor::validate::MAX_RETENTION_SECS))]
    retain_completed_secs: u64,
    /// Dead jobs are deleted this many seconds after they died (a queue's
    /// `dead_retention_secs` wins). 0 keeps them forever.
    #[arg(env = "CONVEYOR_RETAIN_DEAD_SECS", long, default_value_t = 14 * 24 * 3600, value_parser = at_most(conveyor::validate::MAX_RETENTION_SECS))]
    retain_dead_secs: u64,
    /// The per-minute history (`GET /v1/stats`, the dashboard's charts and Kinds view) is
    /// kept this many seconds. 0 keeps it forever.
    #[arg(env = "CONVEYOR_RETAIN_STATS_SECS", long, default_value_t = 14 * 24 * 3600, value_parser = at_most(conveyor::validate::MAX_RETENTION_SECS))]
    retain_stats_secs: u64,
    /// Audit log entries (who enqueued, cancelled, replayed, changed settings or tokens) are
    /// deleted this many seconds after they were written, in batches by the maintenance
    /// leader. 0 keeps them forever.
    #[arg(env = "CONVEYOR_RETAIN_AUDIT_SECS", long, default_value_t = 90 * 24 * 3600, value_parser = at_most(conveyor::validate::MAX_RETENTION_SECS))]
    retain_audit_secs: u64,
    /// Keep no per-minute history: `GET /v1/stats` answers from what is stored (nothing new),
    /// and the dashboard's charts show only "Live".
    #[arg(env = "CONVEYOR_NO_HISTORY", long)]
    no_history: bool,
    /// Read the cluster's event sources (`--run-sources=false`: store and show them only, as
    /// an API-only node would).
    #[arg(long, env = "CONVEYOR_RUN_SOURCES", default_value_t = true, action = clap::ArgAction::Set,
          num_args = 0..=1, default_missing_value = "true")]
    run_sources: bool,
    /// Payload keys (at any depth, comma-separated) shown as `[redacted]` in job views and the
    /// dashboard, e.g. `password,card_number`. Workers still receive them.
    #[arg(long, value_delimiter = ',', env = "CONVEYOR_SENSITIVE_FIELDS")]
    sensitive_fields: Vec<String>,
    /// The scaling signal's target: `conveyor_queue_desired_workers` and `GET /v1/queues/{name}` give the
    /// workers that would work off each queue's backlog within this many seconds (an
    /// autoscaler may ask `/v1/queues/{name}/scale?target_s=N` for its own).
    #[arg(long, default_value_t = 60, env = "CONVEYOR_SCALE_TARGET_SECS",
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    scale_target_secs: u64,
    /// Cron schedules to create or update at start (TOML, or JSON when the name ends in
    /// `.json`). Schedules not in the file are left as they are.
    #[arg(long, env = "CONVEYOR_SCHEDULES")]
    schedules: Option<PathBuf>,
    /// Event sources to create or update at start (TOML, or JSON when the name ends in
    /// `.json`): brokers whose messages become jobs, each acknowledged once its job is
    /// durable. They are stored, so every server of the cluster reads them; sources not in
    /// the file are left as they are, and one an operator paused stays paused.
    #[arg(long, env = "CONVEYOR_SOURCES")]
    sources: Option<PathBuf>,
    /// How late a schedule tick may fire and still count as on time, in milliseconds (at least
    /// 1000). Older ticks were missed during downtime and follow the schedule's `missed` policy.
    #[arg(env = "CONVEYOR_SCHEDULE_MISFIRE_MS", long, default_value_t = 5000, value_parser = at_most(DAY_MS))]
    schedule_misfire_ms: u64,
    /// Require API tokens (`conveyor token create`): on by default when listening on a
    /// non-loopback address, off on loopback. `--auth=false` turns it off.
    #[arg(long, env = "CONVEYOR_AUTH", num_args = 0..=1, default_missing_value = "true")]
    auth: Option<bool>,
    /// Allow listening on a non-loopback address with access control off: anyone who can
    /// reach the port can then enqueue, replay, discard and change settings.
    #[arg(env = "CONVEYOR_INSECURE_NO_AUTH", long)]
    insecure_no_auth: bool,
    /// With access control: enqueue requests each token may make per second (`N` or `N/s`;
    /// a batch counts once), with bursts of one second's worth; beyond it, 429.
    #[arg(env = "CONVEYOR_ENQUEUE_RATE_PER_TOKEN", long, value_parser = parse_rate)]
    enqueue_rate_per_token: Option<f64>,
    /// How long a dashboard login (session cookie) lasts, in seconds.
    #[arg(env = "CONVEYOR_SESSION_TTL_SECS", long, default_value_t = 12 * 3600, value_parser = at_most(TEN_YEARS_SECS))]
    session_ttl_secs: u64,
    /// How long the demo worker may drain at shutdown, in seconds.
    #[arg(env = "CONVEYOR_DRAIN_TIMEOUT_SECS", long, default_value_t = 30, value_parser = at_most(DAY_MS / 1000))]
    drain_timeout_secs: u64,
    /// A registered worker not heard from for this long is marked dead by the maintenance
    /// leader, and the jobs it held are rescued at once, in seconds (fractions allowed).
    #[arg(env = "CONVEYOR_WORKER_STALE_SECS", long, default_value_t = 120.0)]
    worker_stale_secs: f64,
    /// A running job is stuck past this multiple of its kind's p95 duration (or of its
    /// timeout when its kind has no recent history).
    #[arg(env = "CONVEYOR_STUCK_FACTOR", long, default_value_t = 3.0)]
    stuck_factor: f64,
    /// A running job without history or timeout is stuck after this many seconds.
    #[arg(env = "CONVEYOR_STUCK_DEFAULT_SECS", long, default_value_t = 600, value_parser = at_most(TEN_YEARS_SECS))]
    stuck_default_secs: u64,
    /// SQLite: do not run `PRAGMA quick_check` at start (it reads the whole file). A damaged
    /// file then starts, and the damage shows in `/healthz` once an operation meets it.
    #[arg(long, env = "CONVEYOR_SKIP_INTEGRITY_CHECK")]
    skip_integrity_check: bool,
    /// Most client connections open at once; more are closed as they arrive. Default: 10,000,
    /// or fewer when the process may not open that many files (its limit minus 128).
    #[arg(long, env = "CONVEYOR_MAX_CONNECTIONS", value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_connections: Option<u64>,
    /// How long a client may take to send a request's headers, in milliseconds (slowloris).
    /// With TLS, also how long it may take to complete the handshake.
    #[arg(long, default_value_t = 10_000, env = "CONVEYOR_HEADER_READ_TIMEOUT_MS", value_parser = clap::value_parser!(u64).range(10..=HOUR_MS))]
    header_read_timeout_ms: u64,
    /// A connection idle this long between requests is closed, in seconds.
    #[arg(long, default_value_t = 60, env = "CONVEYOR_IDLE_TIMEOUT_SECS", value_parser = clap::value_parser!(u64).range(1..=86_400))]
    idle_timeout_secs: u64,
    /// The longest a fetch or a job read (`GET /v1/jobs/{id}?wait_ms=`) may long-poll (their
    /// `wait_ms` is capped to this), in milliseconds.
    /// At most 30 s, so that it stays within every request timeout; lower it when a proxy in
    /// front closes quiet requests sooner.
    #[arg(long, default_value_t = 30_000, env = "CONVEYOR_MAX_FETCH_WAIT_MS", value_parser = clap::value_parser!(u64).range(0..=30_000))]
    max_fetch_wait_ms: u64,
    /// The longest a request may take, body upload included, in seconds (408 past it). At
    /// least 31: a long-polling fetch may wait 30 s.
    #[arg(long, default_value_t = 90, env = "CONVEYOR_REQUEST_TIMEOUT_SECS", value_parser = clap::value_parser!(u64).range(31..=86_400))]
    request_timeout_secs: u64,
    /// Serve HTTPS with this certificate chain (PEM, the server's certificate first). Needs
    /// --tls-key.
    #[arg(
        long,
        env = "CONVEYOR_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM: PKCS#8, PKCS#1 or SEC1).
    #[arg(
        long,
        env = "CONVEYOR_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<PathBuf>,
    /// Require every client to present a certificate signed by a CA in this PEM file (mutual
    /// TLS); the handshake of any other client fails. Needs --tls-cert.
    #[arg(
        long,
        env = "CONVEYOR_TLS_CLIENT_CA",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_client_ca: Option<PathBuf>,
    /// Export enqueue and fetch spans (and the execute spans of workers in this process) to an
    /// OpenTelemetry collector's OTLP/HTTP endpoint, e.g. http://127.0.0.1:4318 (off without).
    #[arg(long, env = "CONVEYOR_OTLP_ENDPOINT", value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    #[arg(long, env = "CONVEYOR_OTLP_SERVICE_NAME", default_value = "conveyor")]
    otlp_service_name: String,
    #[command(flatten)]
    alerts: AlertArgs,
}

const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 24 * HOUR_MS;
const TEN_YEARS_SECS: u64 = 10 * 365 * 24 * 3600;

/// A whole number no larger than `max`. Durations from flags end up added to timestamps; an
/// absurd one is refused here, naming the flag, rather than overflowing later.
fn at_most(max: u64) -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(..=max)
}

/// `N` or `N/s`: a positive number of requests per second.
fn parse_rate(raw: &str) -> Result<f64, String> {
    let number = raw.strip_suffix("/s").unwrap_or(raw).trim();
    match number.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err(format!(
            "{raw:?} is not a rate; expected a positive number per second, e.g. 100 or 100/s"
        )),
    }
}

/// Whether access control is on, or why the server must not start: listening beyond this
/// machine without it needs `--insecure-no-auth`.
fn auth_enabled(args: &ServeArgs) -> anyhow::Result<bool> {
    let loopback = args.listen.ip().is_loopback();
    let enabled = match (args.auth, args.insecure_no_auth) {
        (Some(true), true) => anyhow::bail!("--auth and --insecure-no-auth contradict each other"),
        (Some(enabled), false) => enabled,
        (None, insecure) => !loopback && !insecure,
        (Some(false), true) => false,
    };
    if !enabled && !loopback && !args.insecure_no_auth {
        anyhow::bail!(
            "refusing to listen on {} without access control: anyone who can reach it could \
             enqueue, replay, discard and change settings. Drop --auth=false (and create a token \
             with `conveyor token create --role admin`), listen on 127.0.0.1, or pass \
             --insecure-no-auth if something in front of it controls access",
            args.listen
        );
    }
    Ok(enabled)
}

/// The TLS configuration from `--tls-cert`, `--tls-key` and `--tls-client-ca` (clap makes sure
/// they come together), or `None` for plain HTTP.
fn tls_config(args: &ServeArgs) -> anyhow::Result<Option<TlsConfig>> {
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    let files = TlsFiles {
        cert: cert.clone(),
        key: key.clone(),
        client_ca: args.tls_client_ca.clone(),
    };
    let config = TlsConfig::from_files(&files).context("cannot set up TLS")?;
    Ok(Some(config))
}

/// Webhook alerts (see `conveyor::alerts`); off unless `--alert-webhook` is given.
#[derive(Args, Debug)]
pub(crate) struct AlertArgs {
    /// POST signed alerts to this http:// or https:// URL: jobs entering the dead-letter queue,
    /// queues past their thresholds, workers going stale. Only the maintenance leader alerts.
    #[arg(long, env = "CONVEYOR_ALERT_WEBHOOK")]
    alert_webhook: Option<String>,
    /// Also trust the CA certificates in this PEM file for an https:// webhook (besides the
    /// public roots), e.g. a private CA's.
    #[arg(
        long,
        env = "CONVEYOR_ALERT_CA",
        value_name = "FILE",
        requires = "alert_webhook"
    )]
    alert_ca: Option<PathBuf>,
    /// The environment variable holding the webhook's HMAC secret.
    #[arg(
        env = "CONVEYOR_ALERT_SECRET_ENV",
        long,
        default_value = "CONVEYOR_ALERT_SECRET"
    )]
    alert_secret_env: String,
    /// Alert when a queue holds more unfinished jobs than this: `N` for every queue or
    /// `QUEUE=N` for one (repeat the flag for several).
    #[arg(
        env = "CONVEYOR_ALERT_MAX_DEPTH",
        value_delimiter = ',',
        long,
        value_name = "[QUEUE=]N"
    )]
    alert_max_depth: Vec<String>,
    /// Alert when a queue's oldest available job has waited longer than this many seconds:
    /// `SECS` for every queue or `QUEUE=SECS` (repeatable).
    #[arg(
        env = "CONVEYOR_ALERT_MAX_AGE_SECS",
        value_delimiter = ',',
        long,
        value_name = "[QUEUE=]SECS"
    )]
    alert_max_age_secs: Vec<String>,
    /// How long a threshold must stay crossed before it alerts, in seconds.
    #[arg(env = "CONVEYOR_ALERT_SUSTAIN_SECS", long, default_value_t = 60.0)]
    alert_sustain_secs: f64,
    /// How long the same alert for the same queue or worker stays quiet after firing, in
    /// seconds.
    #[arg(env = "CONVEYOR_ALERT_COOLDOWN_SECS", long, default_value_t = 900.0)]
    alert_cooldown_secs: f64,
    /// How often the alert rules look at the store, in milliseconds.
    #[arg(env = "CONVEYOR_ALERT_CHECK_MS", long, default_value_t = 1000, value_parser = at_most(HOUR_MS))]
    alert_check_ms: u64,
}

impl AlertArgs {
    /// The alert configuration, or `None` when no webhook is set.
    fn config(&self) -> anyhow::Result<Option<AlertConfig>> {
        let Some(webhook) = &self.alert_webhook else {
            return Ok(None);
        };
        let secret = std::env::var(&self.alert_secret_env).map_err(|_| {
            anyhow::anyhow!(
                "--alert-webhook needs a secret: set the environment variable {} (or name \
                 another with --alert-secret-env)",
                self.alert_secret_env
            )
        })?;
        let mut config = AlertConfig::new(webhook.clone(), secret.into_bytes());
        if let Some(path) = &self.alert_ca {
            let pem = std::fs::read(path)
                .with_context(|| format!("cannot read --alert-ca {}", path.display()))?;
            // Checked here, where the file can be named.
            super::http::parse_ca_pem(&pem, path, "--alert-ca")?;
            config.extra_ca_pem = Some(pem);
        }
        config.sustain = seconds("--alert-sustain-secs", self.alert_sustain_secs)?;
        config.cooldown = seconds("--alert-cooldown-secs", self.alert_cooldown_secs)?;
        config.check_interval = Duration::from_millis(self.alert_check_ms.max(10));
        config.max_depth = thresholds(&self.alert_max_depth, "--alert-max-depth")?;
        config.max_age_secs = thresholds(&self.alert_max_age_secs, "--alert-max-age-secs")?;
        Ok(Some(config))
    }
}

fn thresholds(settings: &[String], flag: &'static str) -> anyhow::Result<Thresholds> {
    let mut thresholds = Thresholds::default();
    for setting in settings {
        thresholds.add(setting, flag)?;
    }
    Ok(thresholds)
}

/// A duration given in (possibly fractional) seconds.
fn seconds(flag: &str, value: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(value)
        .map_err(|_| anyhow::anyhow!("{flag} must be a non-negative number of seconds"))
}

pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<ExitCode> {
    // Checked before anything is opened or bound, so a refusal leaves nothing behind.
    let auth = auth_enabled(&args)?;
    let tls = tls_config(&args)?;
    let otlp = match &args.otlp_endpoint {
        Some(endpoint) => {
            let mut config = conveyor::otlp::OtlpConfig::new(endpoint.clone());
            config.service_name = args.otlp_service_name.clone();
            Some(conveyor::otlp::OtlpExporter::install(&config)?)
        }
        None => None,
    };
    let mut open_options = args.durability.open_options();
    open_options.store.completed_idempotency_window =
        Duration::from_secs(args.idempotency_window_secs);
    open_options.schema = args.schema.clone();
    open_options.run_migrations = !args.no_migrate;
    open_options.integrity_check = !args.skip_integrity_check;
    // Read before the store opens: a bad sources file stops the start with a message naming it.
    let sources = match &args.sources {
        Some(path) => conveyor::load_sources(path)?,
        None => Vec::new(),
    };
    let store = conveyor::open_store(&args.store, open_options)
        .await
        .with_context(|| format!("cannot open store {}", args.store))?;
    if let Some(path) = &args.schedules {
        let schedules = conveyor::load_schedules(path)?;
        for schedule in schedules {
            let name = schedule.name().to_string();
            // A schedule an operator paused stays paused across restarts: the file says what
            // runs, not whether someone stopped it for now (the file may pause it too).
            let schedule = match store.schedule_get(&name).await {
                Ok(Some(stored)) if stored.schedule.spec().paused && !schedule.spec().paused => {
                    tracing::info!(schedule = %name, "kept paused (resume it to run it again)");
                    conveyor::Schedule::from_spec(
                        name.clone(),
                        schedule.spec().clone().paused(true),
                    )?
                }
                _ => schedule,
            };
            store.schedule_put(schedule).await.with_context(|| {
                format!("cannot store schedule {name:?} from {}", path.display())
            })?;
        }
        tracing::info!(file = %path.display(), "schedules applied");
    }
    if let Some(path) = &args.sources {
        conveyor_server::sources::apply(store.as_ref(), sources)
            .await
            .with_context(|| format!("cannot store the sources of {}", path.display()))?;
        tracing::info!(file = %path.display(), "sources applied");
    }
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("cannot listen on {}", args.listen))?;
    let local = listener.local_addr().context("reading the bound address")?;

    let shutdown = CancellationToken::new();
    if !(args.stuck_factor.is_finite() && args.stuck_factor >= 1.0) {
        anyhow::bail!("--stuck-factor must be at least 1");
    }
    let worker_stale = seconds("--worker-stale-secs", args.worker_stale_secs)?;
    if worker_stale < Duration::from_millis(100) {
        anyhow::bail!("--worker-stale-secs must be at least 0.1");
    }
    let settings = ServerSettings {
        config: ServerConfig {
            max_payload_bytes: args.max_payload_bytes,
            stuck: {
                let mut params = StuckParams::default();
                params.factor = args.stuck_factor;
                params.default_threshold = Duration::from_secs(args.stuck_default_secs.max(1));
                params
            },
            sensitive_fields: args.sensitive_fields.clone(),
            max_fetch_wait: Duration::from_millis(args.max_fetch_wait_ms),
            scale_target: Duration::from_secs(args.scale_target_secs),
            ..ServerConfig::default()
        },
        auth: conveyor_server::AuthOptions {
            enabled: auth,
            enqueue_rate_per_token: args.enqueue_rate_per_token,
            session_ttl: Duration::from_secs(args.session_ttl_secs.max(60)),
        },
        maintenance_interval: Duration::from_millis(args.maintenance_interval_ms.max(10)),
        leader_ttl: Duration::from_millis(args.leader_ttl_ms.max(100)),
        worker_stale_after: worker_stale,
        retention: retention(&args),
        stats_retention: (args.retain_stats_secs > 0)
            .then(|| Duration::from_secs(args.retain_stats_secs)),
        audit_retention: (args.retain_audit_secs > 0)
            .then(|| Duration::from_secs(args.retain_audit_secs)),
        schedule_misfire: Duration::from_millis(args.schedule_misfire_ms),
        alerts: args.alerts.config()?,
        history: !args.no_history,
        run_sources: args.run_sources,
        limits: conveyor_server::ConnectionLimits {
            max_connections: connection_cap(args.max_connections),
            header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
            idle_timeout: Duration::from_secs(args.idle_timeout_secs),
            request_timeout: Duration::from_secs(args.request_timeout_secs),
            tls_handshake_timeout: Duration::from_millis(args.header_read_timeout_ms),
        },
        tls: tls.clone(),
    };
    let server = Server::new(store.clone(), settings, shutdown.clone())?;
    let metrics = server.metrics();
    let demo = args.demo.then(|| {
        tokio::spawn(super::demo::run(
            store.clone(),
            shutdown.clone(),
            Duration::from_secs(args.drain_timeout_secs),
            metrics.clone(),
        ))
    });

    // The first stdout line tells scripts and tests where we listen. Written without println!,
    // which panics when whoever started us has closed our stdout.
    let scheme = if tls.is_some() { "https" } else { "http" };
    let client_certificates = tls
        .as_ref()
        .is_some_and(TlsConfig::requires_client_certificate);
    announce(&format!(
        "conveyor listening on {scheme}://{local} (store: {}, durability: {:?}, auth: {}, tls: {})",
        args.store,
        args.durability,
        if auth { "on" } else { "off" },
        match (&tls, client_certificates) {
            (None, _) => "off",
            (Some(_), false) => "on",
            (Some(_), true) => "on, client certificates required",
        }
    ));
    if args.demo {
        announce(&format!(
            "demo running: watch it with `conveyor queues --watch --server {scheme}://{local}`"
        ));
    }
    tracing::info!(url = %format!("{scheme}://{local}"), store = %args.store, auth,
        tls = tls.is_some(), client_certificates, "server started");
    if auth && !store.tokens_list().await?.iter().any(|t| t.is_active()) {
        tracing::warn!(
            "access control is on but the store has no active token: every request but \
             /healthz gets 401; create one with `conveyor token create --role admin`"
        );
    }

    let signal = shutdown.clone();
    tokio::spawn(async move {
        conveyor::shutdown_signal().await;
        // Cancel first: nothing may stand between the signal and the shutdown.
        signal.cancel();
        tracing::info!("shutdown signal received");
    });
    server.run(listener).await.context("HTTP server failed")?;
    if let Some(demo) = demo {
        let _ = demo.await;
        // The demo's last outcomes, counted after the server's last flush.
        if let Err(error) = metrics.history().flush(store.as_ref()).await {
            tracing::warn!(%error, "the last minute of history could not be written");
        }
    }
    if let Some(otlp) = otlp {
        otlp.flush().await;
    }
    tracing::info!("server stopped");
    Ok(ExitCode::SUCCESS)
}

/// The connection cap: the one asked for, else 10,000 or what the file limit leaves. The soft
/// file limit is first raised to the hard one (commonly 1,024 soft and far more hard), since
/// every connection is a file.
fn connection_cap(asked: Option<u64>) -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit on this process with a properly initialised struct.
    let files = unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            if limit.rlim_cur < limit.rlim_max {
                let raised = libc::rlimit {
                    rlim_cur: limit.rlim_max,
                    rlim_max: limit.rlim_max,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                    limit.rlim_cur = limit.rlim_max;
                }
            }
            Some(limit.rlim_cur)
        } else {
            None
        }
    };
    // Room for the store's files, its connections and the listener.
    let available =
        files.map(|files| usize::try_from(files.saturating_sub(128).max(16)).unwrap_or(usize::MAX));
    match asked {
        Some(asked) => {
            let asked = usize::try_from(asked).unwrap_or(usize::MAX);
            if let Some(available) = available.filter(|available| asked > *available) {
                tracing::warn!(
                    asked,
                    available,
                    "--max-connections is above what the file limit allows"
                );
            }
            asked
        }
        None => available.map_or(10_000, |available| available.min(10_000)),
    }
}

fn announce(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
}

/// The default retention from the flags; 0 for either keeps those jobs forever (a queue may
/// still set its own).
fn retention(args: &ServeArgs) -> Option<conveyor::RetentionPolicy> {
    let forever = Duration::from_secs(conveyor::validate::MAX_RETENTION_SECS);
    let or_forever = |secs: u64| match secs {
        0 => forever,
        secs => Duration::from_secs(secs.min(conveyor::validate::MAX_RETENTION_SECS)),
    };
    Some(conveyor::RetentionPolicy {
        completed: or_forever(args.retain_completed_secs),
        dead: or_forever(args.retain_dead_secs),
    })
}
