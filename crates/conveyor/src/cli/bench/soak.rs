//! `conveyor bench --soak DURATION`: a long mixed workload against real processes, with a worker
//! killed (SIGKILL) at a fixed interval.
//!
//! The soak starts `conveyor serve` (this same binary) on a fresh store, producer tasks in this
//! process that enqueue over HTTP at a steady rate, and `conveyor work --exec` worker processes
//! whose command succeeds, fails once and then succeeds, fails until the job dies, or fails for
//! good, depending on the job's kind. Every `--soak-kill-every` one worker is killed with SIGKILL
//! and restarted at once; the jobs it held come back through lease expiry. Every
//! `--soak-report-every` it prints the interval's throughput and the server's RSS, open file
//! descriptors, SQLite WAL size and the audit log's rows and bytes. At the end it lets the queue
//! drain and checks that every job a producer got a 2xx for is stored, in a state its kind
//! explains, and, with an audit retention, that the audit log held no more than the enqueue
//! requests of the last retention period.
//!
//! One cohesive thing, kept whole on purpose (~1,800 lines): the soak's processes, load,
//! kills, sampling and verdicts share one run's state; its unit tests are in `soak/tests.rs`.

use anyhow::Context;
use clap::Args;
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{ExitCode, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::cli::http::ApiClient;
use crate::cli::work::{EXIT_PERMANENT, EXIT_RETRY};
use crate::cli::DurabilityArg;

/// Flags of the soak (flattened into `conveyor bench`).
#[derive(Args, Debug)]
pub(crate) struct SoakArgs {
    /// Run the soak instead of the workloads, for this long (`30s`, `10m`, `1h`, or seconds): a
    /// `conveyor serve` child, producers enqueueing over HTTP, `conveyor work` children that
    /// complete, fail, retry and kill jobs, one of them killed with SIGKILL at intervals.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub soak: Option<Duration>,
    /// Soak: kill -9 one worker process (round-robin) this often, and restart it at once.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "60s")]
    soak_kill_every: Duration,
    /// Soak: print throughput and the server's resources this often.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10s")]
    soak_report_every: Duration,
    /// Soak: jobs enqueued per second, over all producers.
    #[arg(long, default_value_t = 200.0)]
    soak_rate: f64,
    /// Soak: worker processes (`conveyor work --exec`).
    #[arg(long, default_value_t = 2)]
    soak_workers: usize,
    /// Soak: jobs each worker process runs at once.
    #[arg(long, default_value_t = 8)]
    soak_worker_concurrency: usize,
    /// Soak: after the load stops, how long the queue may take to drain before the run counts
    /// as failed.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "60s")]
    soak_drain_timeout: Duration,
    /// Soak: the server deletes completed jobs this many seconds after they finished (its
    /// `--retain-completed-secs`; default: the server's, a day), so a long soak can run on a
    /// store that stops growing. Pruned jobs are told from lost ones by count: the server's
    /// completions minus the completed jobs still stored.
    #[arg(long)]
    soak_retain_completed_secs: Option<u64>,
    /// Soak: run the server with access control on, as beyond loopback: producers enqueue with
    /// a producer token, workers fetch with a worker token and the soak reads with an admin
    /// token (made on the store before the server starts), so every enqueue request is
    /// authenticated and its audit entry names its token.
    #[arg(long)]
    soak_auth: bool,
    /// Soak: the server deletes audit log entries this many seconds after they were written
    /// (its `--retain-audit-secs`; default: the server's, 90 days). Every enqueue request
    /// writes one, so with a retention the log must stop growing: the end-of-run checks hold
    /// its rows at every report to the requests of the last retention period, and its bytes
    /// to twice what they were once it had filled.
    #[arg(long)]
    soak_retain_audit_secs: Option<u64>,
}

/// A duration: a number with an optional unit `ms`, `s`, `m` or `h` (`10m`, `30s`, `1.5h`); a
/// plain number is seconds.
pub(crate) fn parse_duration(raw: &str) -> Result<Duration, String> {
    let text = raw.trim();
    let split = text
        .find(|c: char| c.is_ascii_alphabetic())
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let scale = match unit {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        _ => {
            return Err(format!(
                "{raw:?}: unknown unit {unit:?}; use ms, s, m or h (e.g. 30s, 10m, 1h)"
            ))
        }
    };
    let value: f64 = number
        .trim()
        .parse()
        .map_err(|_| format!("{raw:?} is not a duration such as 30s, 10m, 1h or 45"))?;
    if !value.is_finite() || value <= 0.0 {
        return Err(format!("{raw:?}: a duration must be positive"));
    }
    Duration::try_from_secs_f64(value * scale).map_err(|e| format!("{raw:?}: {e}"))
}

/// What a job's command does: the worker's command looks at `CONVEYOR_JOB_KIND`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    /// Succeeds at once.
    Ok,
    /// Succeeds after 300 ms, so kills find jobs in flight.
    Slow,
    /// Fails (retry) on its first attempt, succeeds on the next.
    Flaky,
    /// Fails (retry) on every attempt until it is dead.
    Doomed,
    /// Fails permanently: dead after one attempt.
    Poison,
}

const KINDS: [Kind; 5] = [
    Kind::Ok,
    Kind::Slow,
    Kind::Flaky,
    Kind::Doomed,
    Kind::Poison,
];

impl Kind {
    /// The mix: of every 100 jobs, 84 ok, 5 slow, 8 flaky, 2 doomed, 1 poison (spread over the
    /// hundred by a permutation, so consecutive jobs differ).
    fn of(n: u64) -> Kind {
        match (n * 37) % 100 {
            0..=83 => Kind::Ok,
            84..=88 => Kind::Slow,
            89..=96 => Kind::Flaky,
            97 | 98 => Kind::Doomed,
            _ => Kind::Poison,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Ok => "soak.ok",
            Kind::Slow => "soak.slow",
            Kind::Flaky => "soak.flaky",
            Kind::Doomed => "soak.doomed",
            Kind::Poison => "soak.poison",
        }
    }

    fn from_name(name: &str) -> Option<Kind> {
        KINDS.into_iter().find(|kind| kind.name() == name)
    }

    /// Doomed jobs die after three attempts (backoff 1 s, 2 s); the others have room for a kill
    /// or two on top of their own failures.
    fn max_attempts(self) -> u32 {
        match self {
            Kind::Doomed => 3,
            _ => 5,
        }
    }
}

/// The workers' command (`sh -c`); exit codes as `conveyor work` reads them.
fn exec_command() -> String {
    format!(
        r#"case "$CONVEYOR_JOB_KIND" in
  soak.slow) sleep 0.3 ;;
  soak.flaky) [ "$CONVEYOR_JOB_ATTEMPT" -ge 2 ] || exit {EXIT_RETRY} ;;
  soak.doomed) exit {EXIT_RETRY} ;;
  soak.poison) exit {EXIT_PERMANENT} ;;
esac"#
    )
}

const PRODUCERS: usize = 4;
/// Every tenth request a producer sends is a batch of this many jobs; the others are single.
const BATCH: u64 = 10;
/// Workers' lease: a killed worker's jobs are rescued this long after their last heartbeat.
const WORKER_LEASE_MS: u64 = 2000;
const MIB: f64 = 1024.0 * 1024.0;

/// Writes a line to stdout, ignoring a closed pipe (as the server's announcements do).
fn emit(line: &str) {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "{line}").and_then(|()| stdout.flush());
}

pub(crate) async fn run(
    args: &SoakArgs,
    duration: Duration,
    store: Option<&str>,
    durability: DurabilityArg,
    json_lines: bool,
) -> anyhow::Result<ExitCode> {
    if !(args.soak_rate.is_finite() && args.soak_rate > 0.0) {
        anyhow::bail!("--soak-rate must be a positive number of jobs per second");
    }
    if args.soak_workers == 0 || args.soak_worker_concurrency == 0 {
        anyhow::bail!("--soak-workers and --soak-worker-concurrency must be at least 1");
    }
    let temp = super::TempDir::create()?;
    let url = match store {
        Some(url) => url.to_string(),
        None => format!("sqlite://{}", temp.0.join("soak.db").display()),
    };
    let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let db_path = if postgres {
        None
    } else {
        conveyor::sqlite_path(&url)
    };
    let wal_path = db_path.as_ref().map(|path| {
        let mut wal = path.clone().into_os_string();
        wal.push("-wal");
        PathBuf::from(wal)
    });
    let files = StoreFiles {
        db: db_path,
        wal: wal_path,
    };
    let exe = std::env::current_exe().context("locating the conveyor binary")?;
    let queue = format!("soak-{}", Uuid::new_v4().simple());
    // A retention of 0 keeps the log forever, as the server reads it: nothing to check then.
    let audit_retention = args
        .soak_retain_audit_secs
        .filter(|&secs| secs > 0)
        .map(Duration::from_secs);

    // Before the server: on SQLite it takes the file for itself (the tokens are made through
    // a store opened without that claim, as `conveyor token create` does).
    let tokens = if args.soak_auth {
        Some(Tokens::create(&url).await?)
    } else {
        None
    };
    let mut server = Server::start(
        &exe,
        &url,
        ServerSettings {
            durability,
            retain_completed_secs: args.soak_retain_completed_secs,
            retain_audit_secs: args.soak_retain_audit_secs,
            auth: tokens.is_some(),
        },
    )
    .await?;
    let token_of = |pick: fn(&Tokens) -> &String| tokens.as_ref().map(|t| pick(t).as_str());
    let tls = crate::cli::ClientTlsArgs::default();
    let reader = Reader {
        api: ApiClient::new(&server.url, token_of(|t| &t.admin), &tls)?,
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .context("building the HTTP client")?,
        server: server.url.clone(),
        queue: queue.clone(),
        token: token_of(|t| &t.admin).map(str::to_string),
    };
    let producer_api = ApiClient::new(&server.url, token_of(|t| &t.producer), &tls)?;
    let api = &reader.api;
    api.get("/healthz")
        .await
        .context("the soak's server is not healthy")?;
    // After the server started: it made the tables (a fresh PostgreSQL schema, say).
    let audit = AuditTable::open(&url, files.db.as_deref()).await?;
    let at_start = files.resources(server.pid);
    let audit_at_start = audit.size().await;
    let shown_store = if store.is_some() {
        url.clone()
    } else {
        "sqlite://(temp file)".to_string()
    };
    let durability_name = durability_name(durability);
    let config = json!({
        "workload": "soak", "record": "start", "store": shown_store,
        "durability": durability_name, "duration_s": duration.as_secs_f64(),
        "kill_every_s": args.soak_kill_every.as_secs_f64(),
        "report_every_s": args.soak_report_every.as_secs_f64(),
        "rate": args.soak_rate, "producers": PRODUCERS, "workers": args.soak_workers,
        "worker_concurrency": args.soak_worker_concurrency, "worker_lease_ms": WORKER_LEASE_MS,
        "auth": args.soak_auth,
        "retain_audit_s": audit_retention.map(|r| r.as_secs()),
        "server_pid": server.pid, "resources": at_start.to_json(),
        "audit": audit_at_start.map(AuditSize::to_json),
    });
    if json_lines {
        emit(&config.to_string());
    } else {
        emit(&format!(
            "soak: {} s on {shown_store} ({durability_name}), {} jobs/s from {PRODUCERS} \
             producers, {} workers x {}, kill -9 of a worker every {} s, access control {}, \
             audit retention {}; server pid {}",
            duration.as_secs_f64(),
            args.soak_rate,
            args.soak_workers,
            args.soak_worker_concurrency,
            args.soak_kill_every.as_secs_f64(),
            if args.soak_auth { "on" } else { "off" },
            audit_retention.map_or("the server's".to_string(), |r| format!("{} s", r.as_secs())),
            server.pid,
        ));
        emit(&format!(
            "{:>7} {:>9} {:>9} {:>8} {:>6} {:>6} {:>5} {:>9} {:>5} {:>9} {:>8} {:>7} {:>9}",
            "t (s)",
            "enqueued",
            "completed",
            "retried",
            "dead",
            "depth",
            "kills",
            "rss (MiB)",
            "fds",
            "wal (MiB)",
            "db (MiB)",
            "audit",
            "aud (MiB)"
        ));
    }

    let worker_command = WorkerCommand {
        exe: exe.clone(),
        server: server.url.clone(),
        queue: queue.clone(),
        exec: exec_command(),
        concurrency: args.soak_worker_concurrency,
        token: token_of(|t| &t.worker).map(str::to_string),
    };
    let mut workers = Vec::with_capacity(args.soak_workers);
    for _ in 0..args.soak_workers {
        workers.push(worker_command.start()?);
    }

    let acked: Arc<Mutex<Vec<Acked>>> = Arc::default();
    let requests: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let enqueued = Arc::new(AtomicU64::new(0));
    let enqueue_errors = Arc::new(AtomicU64::new(0));
    let stop_producers = CancellationToken::new();
    let mut producers = JoinSet::new();
    let sequence = Arc::new(AtomicU64::new(0));
    for _ in 0..PRODUCERS {
        producers.spawn(produce(Producer {
            api: producer_api.clone(),
            queue: queue.clone(),
            rate: args.soak_rate / PRODUCERS as f64,
            sequence: sequence.clone(),
            acked: acked.clone(),
            requests: requests.clone(),
            enqueued: enqueued.clone(),
            errors: enqueue_errors.clone(),
            stop: stop_producers.clone(),
        }));
    }

    // The load: report every interval, kill a worker every kill interval, until the duration.
    let start = Instant::now();
    let end = start + duration;
    let interrupted = conveyor::shutdown_signal();
    tokio::pin!(interrupted);
    let mut was_interrupted = false;
    let mut previous = Sample {
        at: start,
        enqueued: 0,
        counts: Counts::default(),
        resources: at_start,
        audit: audit_at_start,
        audit_at: start,
    };
    let mut intervals: Vec<Value> = Vec::new();
    let mut samples: Vec<Sample> = Vec::new();
    let mut kills: Vec<Value> = Vec::new();
    let mut kills_in_interval = 0u64;
    let mut unexpected_exits = 0u64;
    let mut completed_at_last_kill: Option<u64> = None;
    let mut next_kill = start + args.soak_kill_every;
    let mut tick = 1u32;
    loop {
        let next_report = (start + args.soak_report_every * tick).min(end);
        tokio::select! {
            _ = tokio::time::sleep_until(next_report) => {
                tick += 1;
                for (index, worker) in workers.iter_mut().enumerate() {
                    if let Some(status) = worker.exited()? {
                        unexpected_exits += 1;
                        tracing::warn!(worker = index, pid = worker.pid, %status,
                            "soak: a worker exited without being killed; restarting it");
                        *worker = worker_command.start()?;
                    }
                }
                let counts = reader.counts().await.unwrap_or_else(|error| {
                    tracing::warn!(%error, "soak: could not read the queue's counts");
                    previous.counts.clone()
                });
                let at = Instant::now();
                let enqueued_now = enqueued.load(Ordering::Relaxed);
                let resources = files.resources(server.pid);
                let audit_size = audit.size().await;
                let sample = Sample {
                    at,
                    enqueued: enqueued_now,
                    counts,
                    resources,
                    audit: audit_size,
                    // The bound on the log's rows counts requests acknowledged up to here.
                    audit_at: Instant::now(),
                };
                let line = interval_line(&previous, &sample, start, kills_in_interval);
                if json_lines {
                    emit(&line.to_string());
                } else {
                    emit(&describe_interval(&line));
                }
                intervals.push(line);
                kills_in_interval = 0;
                previous = sample.clone();
                samples.push(sample);
                if next_report >= end {
                    break;
                }
            }
            _ = tokio::time::sleep_until(next_kill), if next_kill < end => {
                let index = kills.len() % workers.len();
                let completed_before = reader
                    .counts()
                    .await
                    .map(|c| c.completed)
                    .unwrap_or(previous.counts.completed);
                let killed = workers[index].pid;
                workers[index].kill_9().await;
                workers[index] = worker_command.start()?;
                let record = json!({
                    "workload": "soak", "record": "kill",
                    "t_s": round(start.elapsed().as_secs_f64(), 1),
                    "worker": index, "killed_pid": killed, "restarted_pid": workers[index].pid,
                    "completed_before": completed_before,
                });
                if json_lines {
                    emit(&record.to_string());
                }
                kills.push(record);
                kills_in_interval += 1;
                completed_at_last_kill = Some(completed_before);
                next_kill += args.soak_kill_every;
            }
            _ = &mut interrupted => {
                was_interrupted = true;
                tracing::warn!("soak: interrupted; stopping the load, then draining and checking");
                break;
            }
        }
    }
    let load_seconds = start.elapsed().as_secs_f64();
    stop_producers.cancel();
    while let Some(done) = producers.join_next().await {
        done.context("a producer task failed")?;
    }

    // Drain: wait for every unfinished job of the queue to finish (completed or dead).
    let drain_started = Instant::now();
    let drained = loop {
        if let Ok(counts) = reader.counts().await {
            if counts.depth == 0 {
                break true;
            }
        }
        if drain_started.elapsed() >= args.soak_drain_timeout {
            break false;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let drain_seconds = drain_started.elapsed().as_secs_f64();
    let final_counts = reader
        .counts()
        .await
        .context("reading the queue's counts after the drain")?;
    let after_drain = files.resources(server.pid);
    let audit_after_drain = audit.size().await;
    let acked = acked
        .lock()
        .map_err(|_| anyhow::anyhow!("a producer panicked while recording an acknowledgement"))?
        .clone();
    let stored = list_jobs(api, &queue, acked.len())
        .await
        .context("listing the soak's jobs")?;
    // With a retention, a completed job may have been pruned once it finished that long before
    // the listing ended; a job acknowledged later than that cannot have been.
    let prunable_before = args
        .soak_retain_completed_secs
        .map(|secs| Instant::now().checked_sub(Duration::from_secs(secs)));
    let check = verify(&acked, &stored, prunable_before.flatten());

    for worker in &mut workers {
        worker.stop().await;
    }
    let server_exit = server.stop().await;

    let first = samples.first().map(|s| s.resources);
    let middle = samples.get(samples.len() / 2).map(|s| s.resources);
    let last = samples.last().map(|s| s.resources);
    let resources = resource_report(at_start, first, middle, last, after_drain);
    // Completions the server counted (it misses one whose reporter is killed mid-request)
    // vs completed jobs still stored: without retention, more completions than completed jobs
    // would mean a job completed twice.
    let reported = final_counts.completed;
    let (completed, completed_twice) = match args.soak_retain_completed_secs {
        Some(_) => (reported, 0),
        None => (
            check.stored_completed,
            reported.saturating_sub(check.stored_completed),
        ),
    };
    let requests = requests
        .lock()
        .map_err(|_| anyhow::anyhow!("a producer panicked while recording a request"))?
        .clone();
    let audit_summary = audit_report(AuditRun {
        samples: &samples,
        at_start: audit_at_start,
        after_drain: audit_after_drain,
        retention: audit_retention,
        requests: &requests,
        start,
        // Requests still unanswered at a report, and failed ones the server may have recorded.
        unacknowledged: PRODUCERS as u64 + enqueue_errors.load(Ordering::Relaxed),
    });
    let audit_ok = audit_summary["ok"] != false;
    let invariants_ok =
        check.lost == 0 && completed_twice == 0 && check.bad.is_empty() && drained && audit_ok;
    let summary = json!({
        "workload": "soak", "record": "summary", "store": shown_store,
        "durability": durability_name, "interrupted": was_interrupted,
        "load_seconds": round(load_seconds, 1),
        "kills": kills.len(), "unexpected_worker_exits": unexpected_exits,
        "enqueued": enqueued.load(Ordering::Relaxed),
        "enqueue_errors": enqueue_errors.load(Ordering::Relaxed),
        "completed": completed, "completions_reported": reported,
        "dead": final_counts.dead, "retried": final_counts.failed,
        "rescued": check.rescued,
        "completed_jobs_per_s": round(completed as f64 / (load_seconds + drain_seconds), 1),
        "completed_after_last_kill": completed_at_last_kill.map(|at| reported.saturating_sub(at)),
        "drained": drained, "drain_seconds": round(drain_seconds, 1),
        "resources": resources,
        "audit": audit_summary,
        "server_exit": server_exit.map(|status| status.to_string()),
        "invariants": {
            "ok": invariants_ok, "acknowledged": acked.len(), "stored": check.stored,
            "missing": check.missing, "maybe_pruned": check.maybe_pruned, "lost": check.lost,
            "missing_examples": check.missing_examples,
            "stored_completed": check.stored_completed, "completed_twice": completed_twice,
            "bad_state": check.bad.len(), "bad_examples": check.bad.iter().take(10).collect::<Vec<_>>(),
            "unfinished": check.unfinished, "by_kind": check.by_kind,
            "audit_ok": audit_ok,
        },
    });
    if json_lines {
        emit(&summary.to_string());
    } else {
        emit(&describe_summary(&summary));
    }
    drop(temp);
    Ok(if invariants_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

fn durability_name(durability: DurabilityArg) -> &'static str {
    match durability {
        DurabilityArg::Durable => "durable",
        DurabilityArg::Relaxed => "relaxed",
    }
}

fn round(value: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (value * scale).round() / scale
}

/// A child process of the soak: killed (SIGKILL) if dropped, and by the kernel if the soak
/// itself dies, so none outlives it.
fn child_command(exe: &Path, log: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(exe);
    command
        .env("CONVEYOR_LOG", log)
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        // Its own process group: a Ctrl-C at the terminal reaches the soak, which then stops
        // its children in order, rather than every process at once.
        .process_group(0);
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; it asks the kernel to SIGKILL the child when the
    // soak dies, so a killed soak leaves no server or worker behind.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    command
}

/// Sends SIGTERM to a child of ours that has not been reaped yet.
fn sigterm(pid: u32) {
    // SAFETY: a plain syscall naming our own unreaped child.
    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
}

struct Server {
    child: tokio::process::Child,
    pid: u32,
    url: String,
}

/// How the soak runs its server.
struct ServerSettings {
    durability: DurabilityArg,
    retain_completed_secs: Option<u64>,
    retain_audit_secs: Option<u64>,
    auth: bool,
}

impl Server {
    async fn start(exe: &Path, store: &str, settings: ServerSettings) -> anyhow::Result<Self> {
        let mut flags: Vec<String> = Vec::new();
        for (flag, secs) in [
            ("--retain-completed-secs", settings.retain_completed_secs),
            ("--retain-audit-secs", settings.retain_audit_secs),
        ] {
            if let Some(secs) = secs {
                flags.extend([flag.to_string(), secs.to_string()]);
            }
        }
        // Lease rescues are expected here (one warning per job); other warnings are not.
        let mut child = child_command(exe, "warn,conveyor_worker::maintenance=error")
            .args([
                "serve",
                "--listen",
                "127.0.0.1:0",
                if settings.auth {
                    "--auth=true"
                } else {
                    "--auth=false"
                },
                "--store",
                store,
                "--durability",
                durability_name(settings.durability),
            ])
            .args(&flags)
            .stdout(Stdio::piped())
            .spawn()
            .context("starting `conveyor serve`")?;
        let pid = child.id().context("the server exited at once")?;
        let stdout = child.stdout.take().context("the server's stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let first = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
            .await
            .context("the server did not start listening within 60 s")?
            .context("reading the server's first line")?
            .context("the server exited before listening (see its error above)")?;
        // Keep reading so the server never writes into a closed pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let url = first
            .split_whitespace()
            .find(|word| word.starts_with("http://"))
            .with_context(|| format!("no address in the server's first line {first:?}"))?
            .to_string();
        Ok(Self { child, pid, url })
    }

    /// SIGTERM, then SIGKILL if it has not stopped within 30 s.
    async fn stop(&mut self) -> Option<ExitStatus> {
        sigterm(self.pid);
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(Ok(status)) => Some(status),
            _ => {
                tracing::warn!(pid = self.pid, "soak: the server did not stop on SIGTERM");
                let _ = self.child.kill().await;
                None
            }
        }
    }
}

/// The API tokens of a soak with access control on, one per role it plays.
struct Tokens {
    producer: String,
    worker: String,
    admin: String,
}

impl Tokens {
    /// Makes the tokens on the store directly, as `conveyor token create` does.
    async fn create(url: &str) -> anyhow::Result<Self> {
        let options = conveyor::OpenOptions {
            // The server, started next, claims the file; this store writes only tokens.
            exclusive: false,
            integrity_check: false,
            ..conveyor::OpenOptions::default()
        };
        let store = conveyor::open_store(url, options)
            .await
            .with_context(|| format!("cannot open store {url} to make the soak's tokens"))?;
        let actor = conveyor::access::Actor {
            name: "soak".to_string(),
            token_id: None,
        };
        let mut secrets = Vec::with_capacity(3);
        for role in [
            conveyor::Role::Producer,
            conveyor::Role::Worker,
            conveyor::Role::Admin,
        ] {
            let name = format!("soak-{role}-{}", Uuid::new_v4().simple());
            let created =
                conveyor::access::create_token(store.as_ref(), role, Some(name), actor.clone())
                    .await
                    .with_context(|| format!("creating the soak's {role} token"))?;
            secrets.push(created.secret.plaintext);
        }
        let mut secrets = secrets.into_iter();
        let mut next = || secrets.next().context("a token was not made");
        Ok(Self {
            producer: next()?,
            worker: next()?,
            admin: next()?,
        })
    }
}

/// How to start a worker process, the same every time (restarts included).
struct WorkerCommand {
    exe: PathBuf,
    server: String,
    queue: String,
    exec: String,
    concurrency: usize,
    token: Option<String>,
}

impl WorkerCommand {
    fn start(&self) -> anyhow::Result<Worker> {
        Worker::start(self)
    }
}

struct Worker {
    child: tokio::process::Child,
    pid: u32,
}

impl Worker {
    fn start(command: &WorkerCommand) -> anyhow::Result<Self> {
        let mut process = child_command(&command.exe, "error");
        process
            .args([
                "work",
                "--server",
                &command.server,
                "--queues",
                &command.queue,
                "--exec",
                &command.exec,
            ])
            .args(["--concurrency", &command.concurrency.to_string()]);
        if let Some(token) = &command.token {
            // Not on the command line, where `ps` would show it.
            process.env("CONVEYOR_TOKEN", token);
        }
        let child = process
            .args(["--lease-ms", &WORKER_LEASE_MS.to_string()])
            .args([
                "--registry-heartbeat-ms",
                "1000",
                "--drain-timeout-secs",
                "5",
            ])
            .stdout(Stdio::null())
            .spawn()
            .context("starting `conveyor work`")?;
        let pid = child.id().context("a worker exited at once")?;
        Ok(Self { child, pid })
    }

    /// The exit status if the worker has exited (on its own: the soak reaps the ones it kills).
    fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.child.try_wait().context("checking a worker process")
    }

    async fn kill_9(&mut self) {
        // SIGKILL, then reap it.
        if let Err(error) = self.child.start_kill() {
            tracing::warn!(pid = self.pid, %error, "soak: could not kill a worker");
        }
        let _ = self.child.wait().await;
    }

    /// SIGTERM (a graceful stop), then SIGKILL if it has not stopped within 15 s.
    async fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        sigterm(self.pid);
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            self.kill_9().await;
        }
    }
}

/// A job a producer got a 2xx for.
#[derive(Debug, Clone, Copy)]
struct Acked {
    id: Uuid,
    kind: Kind,
    at: Instant,
}

struct Producer {
    api: ApiClient,
    queue: String,
    /// Jobs per second for this producer.
    rate: f64,
    sequence: Arc<AtomicU64>,
    acked: Arc<Mutex<Vec<Acked>>>,
    /// When each acknowledged request was answered (one audit entry each).
    requests: Arc<Mutex<Vec<Instant>>>,
    enqueued: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    stop: CancellationToken,
}

/// Enqueues at a steady rate until stopped: single jobs, and every tenth request a batch.
/// Only a 2xx answer counts as an acknowledgement.
async fn produce(p: Producer) {
    let mut next = Instant::now();
    let mut request = 0u64;
    while !p.stop.is_cancelled() {
        request += 1;
        let size = if request.is_multiple_of(10) { BATCH } else { 1 };
        let first = p.sequence.fetch_add(size, Ordering::Relaxed);
        let jobs: Vec<(Kind, Value)> = (first..first + size)
            .map(|n| {
                let kind = Kind::of(n);
                let body = json!({
                    "kind": kind.name(), "queue": p.queue, "payload": {"n": n},
                    "max_attempts": kind.max_attempts(),
                });
                (kind, body)
            })
            .collect();
        let ids = if size == 1 {
            p.api
                .post("/v1/jobs", &jobs[0].1)
                .await
                .and_then(|(_, body)| Ok(vec![uuid_of(&body["id"])?]))
        } else {
            let bodies: Vec<&Value> = jobs.iter().map(|(_, body)| body).collect();
            p.api
                .post("/v1/jobs/batch", &json!({ "jobs": bodies }))
                .await
                .and_then(|(_, body)| {
                    body["ids"]
                        .as_array()
                        .context("batch answer without ids")?
                        .iter()
                        .map(uuid_of)
                        .collect()
                })
        };
        match ids {
            Ok(ids) if ids.len() == jobs.len() => {
                let at = Instant::now();
                if let Ok(mut acked) = p.acked.lock() {
                    acked.extend(ids.into_iter().zip(&jobs).map(|(id, (kind, _))| Acked {
                        id,
                        kind: *kind,
                        at,
                    }));
                }
                if let Ok(mut requests) = p.requests.lock() {
                    requests.push(at);
                }
                p.enqueued.fetch_add(size, Ordering::Relaxed);
            }
            Ok(ids) => {
                tracing::warn!(
                    sent = jobs.len(),
                    answered = ids.len(),
                    "soak: batch answered with the wrong number of ids"
                );
                p.errors.fetch_add(size, Ordering::Relaxed);
            }
            Err(error) => {
                tracing::warn!(%error, "soak: enqueue failed");
                p.errors.fetch_add(size, Ordering::Relaxed);
            }
        }
        next += Duration::from_secs_f64(size as f64 / p.rate);
        // A producer that fell behind (a slow answer) resumes the pace; it does not burst.
        let now = Instant::now();
        if next + Duration::from_secs(1) < now {
            next = now;
        }
        tokio::select! {
            _ = p.stop.cancelled() => break,
            _ = tokio::time::sleep_until(next) => {}
        }
    }
}

fn uuid_of(value: &Value) -> anyhow::Result<Uuid> {
    value
        .as_str()
        .and_then(|text| Uuid::parse_str(text).ok())
        .with_context(|| format!("{value} is not a job id"))
}

/// The queue's figures at one moment.
#[derive(Debug, Clone, Default)]
struct Counts {
    /// Completions the workers reported (the server's
    /// `jobs_processed_total{status="completed"}`): unlike the stored count, pruning does not
    /// lower it.
    completed: u64,
    /// Jobs dead (store-wide count).
    dead: u64,
    /// Unfinished jobs: available, scheduled, running, retryable.
    depth: u64,
    /// Failed attempts that were retried, as reported by the workers (the server's
    /// `jobs_processed_total{status="failed"}`; lease rescues are not in it).
    failed: u64,
}

/// How the soak reads the server's figures (with the admin token when access control is on).
struct Reader {
    api: ApiClient,
    /// For `/metrics`, which answers text.
    http: reqwest::Client,
    server: String,
    queue: String,
    token: Option<String>,
}

impl Reader {
    async fn counts(&self) -> anyhow::Result<Counts> {
        let queue = self.queue.as_str();
        let queues = self.api.get("/v1/queues").await?;
        let stats = queues["queues"]
            .as_array()
            .and_then(|all| all.iter().find(|q| q["name"] == queue))
            .cloned()
            .unwrap_or(Value::Null);
        let number = |field: &str| stats[field].as_u64().unwrap_or(0);
        let mut request = self.http.get(format!("{}/metrics", self.server));
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        let metrics = request
            .send()
            .await
            .context("GET /metrics")?
            .error_for_status()
            .context("GET /metrics")?
            .text()
            .await
            .context("reading /metrics")?;
        Ok(Counts {
            completed: processed(&metrics, queue, "completed"),
            dead: number("dead"),
            depth: number("available")
                + number("scheduled")
                + number("running")
                + number("retryable"),
            failed: processed(&metrics, queue, "failed"),
        })
    }
}

/// Sums `jobs_processed_total{..., status="STATUS"}` over the kinds of `queue`.
fn processed(metrics: &str, queue: &str, status: &str) -> u64 {
    let label = format!("queue=\"{queue}\"");
    let status = format!("status=\"{status}\"");
    metrics
        .lines()
        .filter(|line| {
            line.starts_with("conveyor_jobs_processed_total{")
                && line.contains(&label)
                && line.contains(&status)
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

/// Where the SQLite store keeps its files (none for PostgreSQL).
struct StoreFiles {
    db: Option<PathBuf>,
    wal: Option<PathBuf>,
}

impl StoreFiles {
    fn resources(&self, pid: u32) -> Resources {
        let size = |path: &Option<PathBuf>| {
            path.as_ref()
                .map(|path| std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
        };
        // What each open descriptor points at (`socket:[...]` for connections).
        let fds: Option<Vec<String>> =
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .ok()
                .map(|entries| {
                    entries
                        .filter_map(|entry| entry.ok())
                        .map(|entry| {
                            std::fs::read_link(entry.path())
                                .map(|target| target.to_string_lossy().into_owned())
                                .unwrap_or_default()
                        })
                        .collect()
                });
        Resources {
            rss_bytes: rss_bytes(pid),
            fds: fds.as_ref().map(|fds| fds.len() as u64),
            sockets: fds.as_ref().map(|fds| {
                fds.iter()
                    .filter(|target| target.starts_with("socket:"))
                    .count() as u64
            }),
            wal_bytes: size(&self.wal),
            db_bytes: size(&self.db),
        }
    }
}

/// The audit log's size: its entries, and the bytes of its table with the table's indexes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct AuditSize {
    rows: u64,
    bytes: u64,
}

impl AuditSize {
    fn to_json(self) -> Value {
        json!({"rows": self.rows, "bytes": self.bytes})
    }
}

/// Where the soak reads the audit log's size: the store's database itself, beside the server
/// (as it reads the WAL and database files from the disk), since no API counts the log.
enum AuditTable {
    /// Read through a read-only connection of its own (WAL mode lets it read beside the
    /// server's writer), bytes from SQLite's `dbstat` (pages of the table and its indexes).
    Sqlite(PathBuf),
    /// `pg_total_relation_size`: heap, indexes and TOAST, dead rows included until vacuumed.
    Postgres {
        pool: sqlx::PgPool,
        /// The table, schema-qualified and quoted.
        table: String,
    },
    /// A store the soak cannot read directly (none today).
    Unknown,
}

impl AuditTable {
    async fn open(url: &str, sqlite_file: Option<&Path>) -> anyhow::Result<Self> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let schema = conveyor::postgres_schema(url).replace('"', "\"\"");
            return Ok(Self::Postgres {
                pool: super::nodes::sqlx_pool(url).await?,
                table: format!("\"{schema}\".audit_log"),
            });
        }
        Ok(sqlite_file.map_or(Self::Unknown, |path| Self::Sqlite(path.to_path_buf())))
    }

    /// The log's size now; `None` (with a warning) when it cannot be read.
    async fn size(&self) -> Option<AuditSize> {
        let read = match self {
            Self::Sqlite(path) => {
                let path = path.clone();
                tokio::task::spawn_blocking(move || sqlite_audit_size(&path))
                    .await
                    .context("reading the audit log's size")
                    .and_then(|size| size)
            }
            Self::Postgres { pool, table } => {
                // The table name is the schema from the soak's own URL, quoted above.
                let statement = sqlx::AssertSqlSafe(format!(
                    "SELECT count(*), pg_total_relation_size($1::regclass) FROM {table}"
                ));
                sqlx::query_as::<_, (i64, i64)>(statement)
                    .bind(table)
                    .fetch_one(pool)
                    .await
                    .context("reading the audit log's size")
                    .map(|(rows, bytes)| AuditSize {
                        rows: u64::try_from(rows).unwrap_or(0),
                        bytes: u64::try_from(bytes).unwrap_or(0),
                    })
            }
            Self::Unknown => return None,
        };
        read.map_err(|error| {
            tracing::warn!(error = format!("{error:#}"), "soak: audit log not read")
        })
        .ok()
    }
}

fn sqlite_audit_size(path: &Path) -> anyhow::Result<AuditSize> {
    use rusqlite::OpenFlags;
    let conn = rusqlite::Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening {}", path.display()))?;
    conn.busy_timeout(Duration::from_secs(5))
        .context("setting a busy timeout")?;
    // `dbstat('main', 1)`: one row per b-tree with its pages' total size.
    let (rows, bytes) = conn
        .query_row(
            "SELECT (SELECT count(*) FROM audit_log), \
                    (SELECT coalesce(sum(pgsize), 0) FROM dbstat('main', 1) \
                     WHERE name IN (SELECT name FROM sqlite_schema WHERE tbl_name = 'audit_log'))",
            [],
            |row| Ok((row.get::<_, i64>(0)?, row.get::<_, i64>(1)?)),
        )
        .context("counting the audit log")?;
    Ok(AuditSize {
        rows: u64::try_from(rows).unwrap_or(0),
        bytes: u64::try_from(bytes).unwrap_or(0),
    })
}

/// The server's resident set size, from `/proc/PID/status` (Linux).
fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[derive(Debug, Clone, Copy, Default)]
struct Resources {
    rss_bytes: Option<u64>,
    fds: Option<u64>,
    /// Of `fds`, the sockets (the listener and HTTP connections).
    sockets: Option<u64>,
    wal_bytes: Option<u64>,
    db_bytes: Option<u64>,
}

impl Resources {
    fn to_json(self) -> Value {
        json!({
            "rss_bytes": self.rss_bytes, "fds": self.fds, "sockets": self.sockets,
            "wal_bytes": self.wal_bytes, "db_bytes": self.db_bytes,
        })
    }
}

#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    enqueued: u64,
    counts: Counts,
    resources: Resources,
    /// `None` when it could not be read.
    audit: Option<AuditSize>,
    /// Just after `audit` was read.
    audit_at: Instant,
}

fn interval_line(before: &Sample, now: &Sample, start: Instant, kills: u64) -> Value {
    let seconds = now.at.duration_since(before.at).as_secs_f64().max(1e-9);
    let completed = now.counts.completed.saturating_sub(before.counts.completed);
    json!({
        "workload": "soak", "record": "interval",
        "t_s": round(now.at.duration_since(start).as_secs_f64(), 1),
        "enqueued": now.enqueued.saturating_sub(before.enqueued),
        "completed": completed,
        "completed_per_s": round(completed as f64 / seconds, 1),
        "retried": now.counts.failed.saturating_sub(before.counts.failed),
        "dead": now.counts.dead.saturating_sub(before.counts.dead),
        "depth": now.counts.depth,
        "kills": kills,
        "rss_bytes": now.resources.rss_bytes, "fds": now.resources.fds,
        "sockets": now.resources.sockets,
        "wal_bytes": now.resources.wal_bytes, "db_bytes": now.resources.db_bytes,
        "audit_rows": now.audit.map(|a| a.rows), "audit_bytes": now.audit.map(|a| a.bytes),
    })
}

fn mib(value: &Value) -> String {
    value.as_u64().map_or("-".to_string(), |bytes| {
        format!("{:.1}", bytes as f64 / MIB)
    })
}

fn describe_interval(line: &Value) -> String {
    let count = |value: &Value| {
        if value.is_null() {
            "-".to_string()
        } else {
            value.to_string()
        }
    };
    format!(
        "{:>7} {:>9} {:>9} {:>8} {:>6} {:>6} {:>5} {:>9} {:>5} {:>9} {:>8} {:>7} {:>9}",
        count(&line["t_s"]),
        count(&line["enqueued"]),
        count(&line["completed"]),
        count(&line["retried"]),
        count(&line["dead"]),
        count(&line["depth"]),
        count(&line["kills"]),
        mib(&line["rss_bytes"]),
        count(&line["fds"]),
        mib(&line["wal_bytes"]),
        mib(&line["db_bytes"]),
        count(&line["audit_rows"]),
        mib(&line["audit_bytes"]),
    )
}

/// One resource at start, after the first interval, mid-run, after the last interval and
/// after the drain, and whether it stayed flat from the first interval to the last: grew by
/// no more than a tenth, or by less than `slack` (noise: a few connections, a few pages).
///
/// The growth over the second half (middle to last) tells a resource that grew once and then
/// held (a cache filling, a high-water mark) from one that keeps growing.
fn trend(values: [Option<u64>; 5], slack: u64, judged: bool) -> Value {
    let [start, first, middle, last, drained] = values;
    let growth = |from: Option<u64>, to: Option<u64>| match (from, to) {
        (Some(from), Some(to)) if from > 0 => {
            Some(round((to as f64 - from as f64) * 100.0 / from as f64, 1))
        }
        _ => None,
    };
    let flat = match (first, last) {
        (Some(first), Some(last)) if judged => Some(last <= first + (first / 10).max(slack)),
        _ => None,
    };
    json!({
        "start": start, "first_interval": first, "middle": middle, "last_interval": last,
        "after_drain": drained, "growth_pct": growth(first, last),
        "second_half_growth_pct": growth(middle, last), "flat": flat,
    })
}

fn resource_report(
    start: Resources,
    first: Option<Resources>,
    middle: Option<Resources>,
    last: Option<Resources>,
    drained: Resources,
) -> Value {
    let pick = |f: fn(&Resources) -> Option<u64>| {
        [
            f(&start),
            first.as_ref().and_then(f),
            middle.as_ref().and_then(f),
            last.as_ref().and_then(f),
            f(&drained),
        ]
    };
    json!({
        "rss_bytes": trend(pick(|r| r.rss_bytes), 4 << 20, true),
        // Connections come and go with the load (workers restart, requests overlap).
        "fds": trend(pick(|r| r.fds), 10, true),
        "sockets": trend(pick(|r| r.sockets), 10, true),
        "wal_bytes": trend(pick(|r| r.wal_bytes), 1 << 20, true),
        // The database file grows with the jobs kept (completed ones for a day by default).
        "db_bytes": trend(pick(|r| r.db_bytes), 0, false),
    })
}

/// How long after a retention period the log counts as filled, and how far back of a report
/// its entries may reach: maintenance prunes once a second, so an entry outlives the retention
/// by up to a pass, plus the pass itself.
const AUDIT_PRUNE_SLACK: Duration = Duration::from_secs(5);
/// Bytes the audit table may vary by and still count as flat (a few pages).
const AUDIT_FLAT_SLACK: u64 = 64 << 10;

/// What the audit checks look at.
struct AuditRun<'a> {
    samples: &'a [Sample],
    at_start: Option<AuditSize>,
    after_drain: Option<AuditSize>,
    /// The server's audit retention, when the soak set one.
    retention: Option<Duration>,
    /// When each acknowledged enqueue request was answered.
    requests: &'a [Instant],
    start: Instant,
    /// Requests whose entry may be stored though the soak counted no answer (in flight at a
    /// report, or failed after the server recorded them).
    unacknowledged: u64,
}

/// The audit log over the run, and with a retention whether it stayed bounded.
///
/// Rows: each enqueue request appends one entry and maintenance deletes those older than the
/// retention, so at a report the log holds at most the entries of the requests answered within
/// the retention (and `AUDIT_PRUNE_SLACK`) before it, those not answered yet, and what it held
/// before the load (the tokens' creation). Checked at every report.
///
/// Bytes: once the log has filled (the first report a retention and the slack after the
/// start), its table and indexes must stay within twice their size then; a store that deletes
/// entries but never reuses their space fails this.
fn audit_report(run: AuditRun<'_>) -> Value {
    let size = |sample: &Sample| sample.audit;
    let t_s = |sample: &Sample| round(sample.audit_at.duration_since(run.start).as_secs_f64(), 1);
    let filled = run.retention.and_then(|retention| {
        run.samples
            .iter()
            .find(|s| s.audit_at.duration_since(run.start) >= retention + AUDIT_PRUNE_SLACK)
    });
    let points = [
        ("start", run.at_start),
        ("first_interval", run.samples.first().and_then(size)),
        ("filled", filled.and_then(size)),
        (
            "middle",
            run.samples.get(run.samples.len() / 2).and_then(size),
        ),
        ("last_interval", run.samples.last().and_then(size)),
        ("after_drain", run.after_drain),
    ];
    let rows: serde_json::Map<String, Value> = points
        .iter()
        .map(|(name, size)| (name.to_string(), json!(size.map(|s| s.rows))))
        .collect();
    let mut bytes: serde_json::Map<String, Value> = points
        .iter()
        .map(|(name, size)| (name.to_string(), json!(size.map(|s| s.bytes))))
        .collect();
    let filled_bytes = filled.and_then(size).map(|s| s.bytes);
    let last_bytes = run.samples.last().and_then(size).map(|s| s.bytes);
    let growth = |from: u64, to: u64| round((to as f64 - from as f64) * 100.0 / from as f64, 1);
    // A store that reuses deleted entries' space only after a vacuum rises to a high-water mark
    // (the live entries and those dead since the last pass) and then holds: the second half
    // tells that from steady growth.
    let middle_bytes = run
        .samples
        .get(run.samples.len() / 2)
        .and_then(size)
        .map(|s| s.bytes);
    if let (Some(from), Some(to)) = (middle_bytes, last_bytes) {
        if from > 0 {
            bytes.insert(
                "second_half_growth_pct".to_string(),
                json!(growth(from, to)),
            );
        }
    }
    if let (Some(from), Some(to)) = (filled_bytes, last_bytes) {
        if from > 0 {
            bytes.insert("growth_pct".to_string(), json!(growth(from, to)));
        }
        bytes.insert(
            "flat".to_string(),
            json!(to <= from + (from / 10).max(AUDIT_FLAT_SLACK)),
        );
    }
    let Some(retention) = run.retention else {
        return json!({
            "retention_s": null, "checked": false, "ok": null, "rows": rows, "bytes": bytes,
        });
    };

    let window = retention + AUDIT_PRUNE_SLACK;
    let held_before = run.at_start.map_or(0, |s| s.rows);
    let mut checked = 0u64;
    let mut over = 0u64;
    // The report closest to its bound (or furthest over it): its share, rows, bound, time.
    let mut worst: Option<(f64, u64, u64, f64)> = None;
    for sample in run.samples {
        let Some(audit) = sample.audit else {
            continue;
        };
        let since = sample.audit_at.checked_sub(window);
        let answered = run
            .requests
            .iter()
            .filter(|&&at| at <= sample.audit_at && since.is_none_or(|since| at >= since))
            .count() as u64;
        let bound = answered + run.unacknowledged + held_before;
        checked += 1;
        if audit.rows > bound {
            over += 1;
        }
        let share = audit.rows as f64 / bound.max(1) as f64;
        if worst.is_none_or(|(most, ..)| share > most) {
            worst = Some((share, audit.rows, bound, t_s(sample)));
        }
    }
    // Nothing read is nothing shown to be bounded.
    let rows_ok = checked > 0 && over == 0;
    let bytes_ok = match (filled_bytes, last_bytes) {
        (Some(from), Some(to)) => Some(to <= (2 * from).max(from + AUDIT_FLAT_SLACK)),
        _ => None,
    };
    json!({
        "retention_s": retention.as_secs(),
        "checked": true,
        "filled_at_s": filled.map(t_s),
        "rows": rows,
        "bytes": bytes,
        "reports_checked": checked,
        "reports_over_bound": over,
        "closest": worst.map(|(_, rows, bound, t)| json!({"t_s": t, "rows": rows, "bound": bound})),
        "rows_ok": rows_ok,
        "bytes_ok": bytes_ok,
        "ok": rows_ok && bytes_ok != Some(false),
    })
}

fn describe_audit(audit: &Value) -> String {
    let rows = &audit["rows"];
    let bytes = &audit["bytes"];
    let count = |v: &Value| v.as_u64().map_or("-".to_string(), |n| n.to_string());
    let mut text = format!(
        "audit log: rows {} at start, {} after the 1st interval, {} at the last, {} after the \
         drain; {} MiB at the last",
        count(&rows["start"]),
        count(&rows["first_interval"]),
        count(&rows["last_interval"]),
        count(&rows["after_drain"]),
        mib(&bytes["last_interval"]),
    );
    if audit["checked"] != true {
        text.push_str(" (no retention given: not checked)");
        return text;
    }
    text.push_str(&format!(
        "\naudit retention {} s: filled at {} s with {} rows, {} MiB; bytes since then {} ({}), \
         over the 2nd half {}, within twice: {}; rows within the requests of the last retention \
         at {} of {} reports (closest: {} of {}) -> {}",
        audit["retention_s"],
        audit["filled_at_s"],
        count(&rows["filled"]),
        mib(&bytes["filled"]),
        bytes["growth_pct"]
            .as_f64()
            .map_or("-".to_string(), |g| format!("{g:+.1}%")),
        match bytes["flat"].as_bool() {
            Some(true) => "flat",
            Some(false) => "GROWING",
            None => "-",
        },
        bytes["second_half_growth_pct"]
            .as_f64()
            .map_or("-".to_string(), |g| format!("{g:+.1}%")),
        match audit["bytes_ok"].as_bool() {
            Some(true) => "yes",
            Some(false) => "NO",
            None => "-",
        },
        audit["reports_checked"].as_u64().unwrap_or(0)
            - audit["reports_over_bound"].as_u64().unwrap_or(0),
        audit["reports_checked"],
        count(&audit["closest"]["rows"]),
        count(&audit["closest"]["bound"]),
        if audit["ok"] == true { "ok" } else { "FAILED" },
    ));
    text
}

fn describe_summary(summary: &Value) -> String {
    let invariants = &summary["invariants"];
    let mut text = format!(
        "\nsoak {}: {} s of load, {} kills ({} unexpected worker exits), drained {} in {} s\n\
         jobs: {} enqueued ({} enqueue errors), {} completed ({} jobs/s), {} failed attempts \
         retried, {} dead, {} rescued after a kill; {} completed after the last kill\n",
        if invariants["ok"] == true {
            "OK"
        } else {
            "FAILED"
        },
        summary["load_seconds"],
        summary["kills"],
        summary["unexpected_worker_exits"],
        if summary["drained"] == true {
            "yes"
        } else {
            "NO"
        },
        summary["drain_seconds"],
        summary["enqueued"],
        summary["enqueue_errors"],
        summary["completed"],
        summary["completed_jobs_per_s"],
        summary["retried"],
        summary["dead"],
        summary["rescued"],
        summary["completed_after_last_kill"],
    );
    text.push_str(
        "server         start  1st intvl     middle  last intvl  after drain   growth  \
         2nd half  verdict\n",
    );
    let resources = &summary["resources"];
    for (name, key, bytes) in [
        ("rss (MiB)", "rss_bytes", true),
        ("fds", "fds", false),
        ("  sockets", "sockets", false),
        ("wal (MiB)", "wal_bytes", true),
        ("db (MiB)", "db_bytes", true),
    ] {
        let r = &resources[key];
        let show = |v: &Value| {
            if bytes {
                mib(v)
            } else {
                v.as_u64().map_or("-".to_string(), |n| n.to_string())
            }
        };
        let percent = |v: &Value| v.as_f64().map_or("-".to_string(), |g| format!("{g:+.1}%"));
        let verdict = match r["flat"].as_bool() {
            Some(true) => "flat",
            Some(false) => "GROWING",
            None => "-",
        };
        text.push_str(&format!(
            "{name:<10} {:>9} {:>10} {:>10} {:>11} {:>12} {:>8} {:>9}  {verdict}\n",
            show(&r["start"]),
            show(&r["first_interval"]),
            show(&r["middle"]),
            show(&r["last_interval"]),
            show(&r["after_drain"]),
            percent(&r["growth_pct"]),
            percent(&r["second_half_growth_pct"]),
        ));
    }
    text.push_str(&describe_audit(&summary["audit"]));
    text.push('\n');
    text.push_str(&format!(
        "invariants: {} acknowledged, {} stored in the queue, {} missing ({} maybe pruned, {} lost), \
         {} completed twice, {} in an unexpected state, {} unfinished",
        invariants["acknowledged"],
        invariants["stored"],
        invariants["missing"],
        invariants["maybe_pruned"],
        invariants["lost"],
        invariants["completed_twice"],
        invariants["bad_state"],
        invariants["unfinished"],
    ));
    if let Some(examples) = invariants["bad_examples"].as_array() {
        for example in examples {
            text.push_str(&format!("\n  {}", example.as_str().unwrap_or_default()));
        }
    }
    let lost = invariants["lost"].as_u64().unwrap_or(0) > 0;
    if let Some(examples) = invariants["missing_examples"].as_array().filter(|_| lost) {
        for example in examples {
            text.push_str(&format!(
                "\n  missing: {}",
                example.as_str().unwrap_or_default()
            ));
        }
    }
    text
}

/// What the final listing found.
struct Check {
    stored: usize,
    /// Completed jobs in the queue (acknowledged or not).
    stored_completed: u64,
    missing: usize,
    /// Missing jobs that may have been pruned: of a kind that completes, acknowledged before
    /// `prunable_before`.
    maybe_pruned: usize,
    /// Missing jobs that cannot have been pruned.
    lost: usize,
    /// Some of the lost jobs.
    missing_examples: Vec<String>,
    /// Jobs in a state their kind does not explain, described.
    bad: Vec<String>,
    unfinished: usize,
    /// Jobs whose history holds a lease expiry (a worker died or was marked dead while holding it).
    rescued: usize,
    /// Per kind, how many jobs ended in each state.
    by_kind: BTreeMap<&'static str, BTreeMap<String, u64>>,
}

/// A stored job, as far as the checks need it.
struct Stored {
    kind: String,
    state: String,
    attempt: u64,
    max_attempts: u64,
    error_classes: Vec<String>,
}

/// Lists the queue's jobs (pages of 500).
async fn list_jobs(
    api: &ApiClient,
    queue: &str,
    expected: usize,
) -> anyhow::Result<HashMap<Uuid, Stored>> {
    let mut stored: HashMap<Uuid, Stored> = HashMap::with_capacity(expected);
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("/v1/jobs?queue={queue}&limit=500");
        if let Some(after) = &after {
            path.push_str(&format!("&after={after}"));
        }
        let page = api.get(&path).await?;
        for job in page["jobs"].as_array().context("a job page without jobs")? {
            let id = uuid_of(&job["id"])?;
            let text = |field: &str| job[field].as_str().unwrap_or_default().to_string();
            stored.insert(
                id,
                Stored {
                    kind: text("kind"),
                    state: text("state"),
                    attempt: job["attempt"].as_u64().unwrap_or(0),
                    max_attempts: job["max_attempts"].as_u64().unwrap_or(0),
                    error_classes: job["errors"]
                        .as_array()
                        .map(|errors| {
                            errors
                                .iter()
                                .map(|e| e["class"].as_str().unwrap_or_default().to_string())
                                .collect()
                        })
                        .unwrap_or_default(),
                },
            );
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => break,
        }
    }
    Ok(stored)
}

/// Checks every acknowledged job against the stored ones.
fn verify(
    acked: &[Acked],
    stored: &HashMap<Uuid, Stored>,
    prunable_before: Option<Instant>,
) -> Check {
    let mut check = Check {
        stored: stored.len(),
        stored_completed: stored.values().filter(|j| j.state == "completed").count() as u64,
        missing: 0,
        maybe_pruned: 0,
        lost: 0,
        missing_examples: Vec::new(),
        bad: Vec::new(),
        unfinished: 0,
        rescued: 0,
        by_kind: BTreeMap::new(),
    };
    for &Acked { id, kind, at } in acked {
        let Some(job) = stored.get(&id) else {
            check.missing += 1;
            let completes = matches!(kind, Kind::Ok | Kind::Slow | Kind::Flaky);
            if completes && prunable_before.is_some_and(|before| at < before) {
                check.maybe_pruned += 1;
            } else {
                check.lost += 1;
                if check.missing_examples.len() < 10 {
                    check.missing_examples.push(id.to_string());
                }
            }
            continue;
        };
        *check
            .by_kind
            .entry(kind.name())
            .or_default()
            .entry(job.state.clone())
            .or_default() += 1;
        if job
            .error_classes
            .iter()
            .any(|class| class == conveyor::error_class::LEASE_EXPIRED)
        {
            check.rescued += 1;
        }
        match judge(kind, job) {
            Ok(Fate::Finished) => {}
            Ok(Fate::Unfinished) => check.unfinished += 1,
            Err(why) => check.bad.push(format!("job {id} ({}): {why}", kind.name())),
        }
    }
    check
}

enum Fate {
    Finished,
    Unfinished,
}

/// Whether a job's state is one its kind and history explain.
fn judge(kind: Kind, job: &Stored) -> Result<Fate, String> {
    if Kind::from_name(&job.kind) != Some(kind) {
        return Err(format!("stored with kind {:?}", job.kind));
    }
    if job.max_attempts != u64::from(kind.max_attempts()) {
        return Err(format!("stored with max_attempts {}", job.max_attempts));
    }
    if job.attempt > job.max_attempts {
        return Err(format!("attempt {} of {}", job.attempt, job.max_attempts));
    }
    let errors = job.error_classes.len() as u64;
    let only_rescues = job
        .error_classes
        .iter()
        .all(|class| class == conveyor::error_class::LEASE_EXPIRED);
    match job.state.as_str() {
        "completed" => {
            if errors + 1 != job.attempt {
                return Err(format!(
                    "completed at attempt {} with {errors} errors recorded",
                    job.attempt
                ));
            }
            match kind {
                Kind::Ok | Kind::Slow if !only_rescues => Err(format!(
                    "its command always succeeds, yet it failed: {:?}",
                    job.error_classes
                )),
                Kind::Flaky if job.attempt < 2 => {
                    Err("completed on the attempt its command fails".to_string())
                }
                Kind::Doomed | Kind::Poison => {
                    Err("completed, though its command always fails".to_string())
                }
                _ => Ok(Fate::Finished),
            }
        }
        "dead" => {
            if errors != job.attempt {
                return Err(format!(
                    "dead at attempt {} with {errors} errors recorded",
                    job.attempt
                ));
            }
            let permanent = job.error_classes.last().map(String::as_str)
                == Some(conveyor::error_class::PERMANENT);
            if job.attempt == job.max_attempts || permanent {
                if permanent && kind != Kind::Poison {
                    return Err("failed permanently, though its command never does".to_string());
                }
                Ok(Fate::Finished)
            } else {
                Err(format!(
                    "dead after {} of {} attempts without a permanent failure",
                    job.attempt, job.max_attempts
                ))
            }
        }
        "available" | "scheduled" | "retryable" | "running" => Ok(Fate::Unfinished),
        other => Err(format!(
            "in state {other:?}, which nothing in the soak causes"
        )),
    }
}

#[cfg(test)]
mod tests;
