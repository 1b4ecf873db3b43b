//! `conveyor work --exec CMD`: a worker over the HTTP API that runs a shell command per job.
//!
//! The command gets the job's payload (JSON) on stdin and its metadata in `CONVEYOR_*`
//! environment variables (a workflow's step also `CONVEYOR_FLOW_ID`, `CONVEYOR_STEP` and
//! `CONVEYOR_PARENTS`, its parents' results as a JSON object). Its exit status decides the outcome:
//! - `0`: completed (stdout, if it is JSON, becomes the job's result);
//! - `75` (EX_TEMPFAIL): retry with backoff (class `error`);
//! - `65` (EX_DATAERR): permanent failure, straight to the dead-letter queue (class `permanent`);
//! - anything else, or killed by a signal: retry with backoff (class `exit_status`).

use crate::cli::http::decode;
use anyhow::Context;
use clap::Args;
use conveyor_server::api::{FetchResponse, FetchedJob};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::process::{ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::http::{ApiClient, ApiFailure};

pub(crate) const EXIT_RETRY: i32 = 75;
pub(crate) const EXIT_PERMANENT: i32 = 65;
/// Long-poll length: bounds how long a SIGTERM waits for an in-flight fetch to return.
const LONG_POLL_MS: u64 = 1000;
/// Most bytes of stdout/stderr kept for results and error messages.
const OUTPUT_LIMIT: usize = 64 * 1024;

#[derive(Args, Debug)]
pub(crate) struct WorkArgs {
    /// Shell command run (with `sh -c`) for each job; payload on stdin.
    #[arg(long)]
    exec: String,
    /// Queues to serve, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "default")]
    queues: Vec<String>,
    /// Jobs run at once.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Lease per job in milliseconds; renewed every third of it while the command runs.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: u64,
    /// At shutdown, how long running commands may finish before they are killed and their jobs
    /// released for another worker, in seconds.
    #[arg(long, default_value_t = 30.0)]
    drain_timeout_secs: f64,
    #[arg(long)]
    worker_id: Option<String>,
    /// Base URL of a running `conveyor serve`.
    #[arg(long, env = "CONVEYOR_SERVER", default_value = "http://127.0.0.1:7700")]
    server: String,
    /// API token (role worker or admin), for a server with access control on.
    #[arg(long, env = "CONVEYOR_TOKEN", hide_env_values = true)]
    token: Option<String>,
    #[command(flatten)]
    tls: super::ClientTlsArgs,
    /// How often the worker reports itself to the server's worker registry, in milliseconds
    /// (keep it well under the server's `--worker-stale-secs`).
    #[arg(long, default_value_t = 10_000)]
    registry_heartbeat_ms: u64,
}

#[derive(Clone)]
struct Ctx {
    api: ApiClient,
    exec: String,
    server: String,
    lease_ms: u64,
    /// Cancelled at the drain timeout: running commands are killed and their jobs released.
    abort: CancellationToken,
    running: Arc<Mutex<HashMap<String, String>>>,
}

pub(crate) async fn run(args: WorkArgs) -> anyhow::Result<ExitCode> {
    if args.concurrency == 0 {
        anyhow::bail!("--concurrency must be at least 1");
    }
    if args.lease_ms < 300 {
        anyhow::bail!("--lease-ms must be at least 300");
    }
    for queue in &args.queues {
        conveyor::validate::name("queues", queue)?;
    }
    let api = ApiClient::new(&args.server, args.token.as_deref(), &args.tls)?;
    api.get("/healthz")
        .await
        .context("checking the server before starting")?;
    let worker_id = args
        .worker_id
        .clone()
        .unwrap_or_else(conveyor::default_worker_id);
    let ctx = Ctx {
        api,
        exec: args.exec.clone(),
        server: args.server.clone(),
        lease_ms: args.lease_ms,
        abort: CancellationToken::new(),
        running: Arc::new(Mutex::new(HashMap::new())),
    };
    let stop = CancellationToken::new();
    let signal = stop.clone();
    tokio::spawn(async move {
        conveyor::shutdown_signal().await;
        signal.cancel();
    });
    // Not println!: a worker whose stdout was closed must keep working, not panic.
    {
        use std::io::Write;
        let _ = writeln!(
            std::io::stdout(),
            "conveyor worker {worker_id} serving {:?} on {}",
            args.queues,
            args.server
        );
    }
    tracing::info!(%worker_id, queues = ?args.queues, "exec worker started");
    let stop_registry = CancellationToken::new();
    let registry = tokio::spawn(run_registry(
        ctx.clone(),
        Registration {
            worker_id: worker_id.clone(),
            queues: args.queues.clone(),
            concurrency: args.concurrency,
            started_at: chrono::Utc::now(),
        },
        Duration::from_millis(args.registry_heartbeat_ms.max(10)),
        stop_registry.clone(),
        stop.clone(),
    ));

    let slots = Arc::new(Semaphore::new(args.concurrency));
    let mut jobs = JoinSet::new();
    let mut backoff = Duration::from_millis(200);
    loop {
        let first = tokio::select! {
            _ = stop.cancelled() => break,
            permit = slots.clone().acquire_owned() => permit?,
        };
        let mut permits = vec![first];
        while let Ok(permit) = slots.clone().try_acquire_owned() {
            permits.push(permit);
        }
        let request = json!({
            "worker_id": worker_id, "queues": args.queues, "max": permits.len(),
            "lease_ms": args.lease_ms, "wait_ms": LONG_POLL_MS,
        });
        // A fetch in flight is not interrupted: jobs it claims are run (or released at drain).
        let fetched = ctx.api.post("/v1/fetch", &request).await;
        let batch = match fetched {
            Ok((_, body)) => match decode::<FetchResponse>(&body, "POST /v1/fetch") {
                Ok(answer) => {
                    backoff = Duration::from_millis(200);
                    if answer.command == Some(conveyor::WorkerCommand::Stop) {
                        tracing::info!(%worker_id, "told to stop: draining, then exiting");
                        stop.cancel();
                    }
                    answer.jobs
                }
                Err(error) => {
                    // Jobs it may have claimed are rescued when their leases expire.
                    tracing::error!(error = %format!("{error:#}"), "fetch answer unreadable");
                    tokio::select! {
                        _ = stop.cancelled() => break,
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                    continue;
                }
            },
            Err(error) => {
                tracing::error!(error = %error, retry_in = ?backoff, "fetch failed");
                tokio::select! {
                    _ = stop.cancelled() => break,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        if stop.is_cancelled() {
            // Claimed by a long-poll that was in flight when the signal came: give them back.
            for job in batch {
                let id = job.id;
                let body = json!({"lease_token": job.lease_token});
                if let Err(error) = ctx.api.post(&format!("/v1/jobs/{id}/release"), &body).await {
                    tracing::warn!(job_id = %id, %error, "could not release a job fetched during shutdown; it will be rescued");
                }
            }
            break;
        }
        for job in batch {
            let permit = permits.pop();
            let ctx = ctx.clone();
            jobs.spawn(async move {
                run_job(&ctx, job).await;
                drop(permit);
            });
        }
        while jobs.try_join_next().is_some() {}
        if stop.is_cancelled() {
            break;
        }
    }

    tracing::info!(running = jobs.len(), "shutdown: no more fetching; draining");
    let drain = Duration::from_secs_f64(args.drain_timeout_secs.max(0.0));
    let drained =
        tokio::time::timeout(drain, async { while jobs.join_next().await.is_some() {} }).await;
    if drained.is_err() {
        let left = ctx.running.lock().map(|r| r.len()).unwrap_or(0);
        tracing::warn!(
            jobs = left,
            "drain timeout reached: killing commands and releasing their jobs"
        );
        ctx.abort.cancel();
        while jobs.join_next().await.is_some() {}
    }
    stop_registry.cancel();
    let _ = registry.await;
    tracing::info!("exec worker stopped");
    Ok(ExitCode::SUCCESS)
}

enum CommandEnd {
    Exited {
        code: Option<i32>,
        stdout: Vec<u8>,
        stderr: Vec<u8>,
    },
    TimedOut,
    LeaseLost,
    Aborted,
    SpawnFailed(String),
}

/// Who this worker is, for the registry.
struct Registration {
    worker_id: String,
    queues: Vec<String>,
    concurrency: usize,
    started_at: chrono::DateTime<chrono::Utc>,
}

/// Reports the worker to `POST /v1/workers/heartbeat` every `interval` (with its busy slots),
/// and once more as `stopping` at a graceful shutdown, so the server can tell a stop from a
/// crash. Failures are logged and retried at the next beat; jobs never wait on it. An
/// operator's `stop` in the answer starts the graceful shutdown (`shutdown`); a `quiet` needs
/// nothing here, as the server hands a quiet worker no jobs.
async fn run_registry(
    ctx: Ctx,
    me: Registration,
    interval: Duration,
    stop: CancellationToken,
    shutdown: CancellationToken,
) {
    let beat = |busy: usize, stopping: bool| {
        json!({
            "worker_id": me.worker_id, "host": conveyor::hostname(), "pid": std::process::id(),
            "queues": me.queues, "concurrency": me.concurrency, "busy": busy,
            "version": env!("CARGO_PKG_VERSION"), "started_at": me.started_at,
            "stopping": stopping,
        })
    };
    loop {
        let busy = ctx.running.lock().map(|r| r.len()).unwrap_or(0);
        match ctx
            .api
            .post("/v1/workers/heartbeat", &beat(busy, false))
            .await
        {
            Ok((_, answer)) => {
                if answer["command"] == "stop" && !shutdown.is_cancelled() {
                    tracing::info!(worker_id = %me.worker_id, "told to stop: draining, then exiting");
                    shutdown.cancel();
                }
            }
            Err(error) => tracing::warn!(%error, "worker registry heartbeat failed; will retry"),
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(interval) => {}
        }
    }
    if let Err(error) = ctx.api.post("/v1/workers/heartbeat", &beat(0, true)).await {
        tracing::warn!(%error, "could not record the worker's stop in the registry");
    }
}

async fn run_job(ctx: &Ctx, job: FetchedJob) {
    let id = job.id.to_string();
    let token = job.lease_token.to_string();
    let queue = job.queue.clone();
    let kind = job.kind.clone();
    let attempt = job.attempt;
    if let Ok(mut running) = ctx.running.lock() {
        running.insert(id.clone(), token.clone());
    }
    // Lifecycle events name the job, never its payload (which may hold personal data).
    let trace = job.traceparent.as_deref().and_then(|parent| {
        conveyor::trace::TraceContext::parse(parent, job.tracestate.as_deref(), "").ok()
    });
    let trace_id = trace
        .as_ref()
        .map(|t| t.trace_id().to_string())
        .unwrap_or_default();
    tracing::info!(target: conveyor::JOB_LOG_TARGET, job_id = %id, %trace_id, %queue, %kind,
        attempt, "job started");
    let started = std::time::Instant::now();
    let end = execute(ctx, &job, &id, &token).await;
    let duration_ms = started.elapsed().as_millis() as u64;
    if let Ok(mut running) = ctx.running.lock() {
        running.remove(&id);
    }
    let tail = |bytes: &[u8]| {
        let text = String::from_utf8_lossy(bytes);
        let text = text.trim();
        let start = text.len().saturating_sub(2000);
        let start = (start..text.len())
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(text.len());
        text[start..].to_string()
    };
    let (path, body) = match end {
        CommandEnd::Exited {
            code: Some(0),
            stdout,
            ..
        } => {
            let result: Value = serde_json::from_slice(&stdout).unwrap_or(Value::Null);
            ("complete", json!({"lease_token": token, "result": result}))
        }
        CommandEnd::Exited {
            code: Some(EXIT_PERMANENT),
            stderr,
            ..
        } => (
            "fail",
            json!({"lease_token": token, "retry": "never",
                   "error": {"class": "permanent", "message": format!("command exited {EXIT_PERMANENT} (permanent): {}", tail(&stderr))}}),
        ),
        CommandEnd::Exited {
            code: Some(EXIT_RETRY),
            stderr,
            ..
        } => (
            "fail",
            json!({"lease_token": token, "retry": "auto",
                   "error": {"class": "error", "message": format!("command exited {EXIT_RETRY} (retry): {}", tail(&stderr))}}),
        ),
        CommandEnd::Exited { code, stderr, .. } => (
            "fail",
            json!({"lease_token": token, "retry": "auto",
                   "error": {"class": "exit_status", "message": format!("command {}: {}",
                        code.map_or("was killed by a signal".to_string(), |c| format!("exited {c}")), tail(&stderr))}}),
        ),
        CommandEnd::TimedOut => (
            "fail",
            json!({"lease_token": token, "retry": "auto",
                   "error": {"class": "timeout", "message": format!("command exceeded the job's timeout of {} ms", job.timeout_ms.unwrap_or_default())}}),
        ),
        CommandEnd::SpawnFailed(message) => (
            "fail",
            json!({"lease_token": token, "retry": "auto", "error": {"class": "spawn_failed", "message": message}}),
        ),
        CommandEnd::Aborted => ("release", json!({"lease_token": token})),
        CommandEnd::LeaseLost => {
            tracing::warn!(target: conveyor::JOB_LOG_TARGET, job_id = %id, %trace_id, %queue, %kind,
                attempt, duration_ms, outcome = "lease_lost",
                "lease lost (cancelled or rescued); command killed");
            return;
        }
    };
    match ctx.api.post(&format!("/v1/jobs/{id}/{path}"), &body).await {
        Ok((_, answer)) => match path {
            "complete" => tracing::info!(target: conveyor::JOB_LOG_TARGET, job_id = %id, %trace_id,
                %queue, %kind, attempt, duration_ms, outcome = "completed", "job completed"),
            "fail" => {
                // The server answers with the job: `dead` when this was the last attempt.
                let dead = decode::<conveyor::Job>(&answer, "a failure report")
                    .is_ok_and(|job| job.state == conveyor::JobState::Dead);
                let outcome = if dead { "dead" } else { "failed" };
                tracing::warn!(target: conveyor::JOB_LOG_TARGET, job_id = %id, %trace_id, %queue, %kind,
                    attempt, duration_ms, outcome,
                    error_class = body["error"]["class"].as_str().unwrap_or_default(),
                    error = body["error"]["message"].as_str().unwrap_or_default(),
                    "job failed")
            }
            _ => {
                tracing::info!(target: conveyor::JOB_LOG_TARGET, job_id = %id, %trace_id, %queue, %kind,
                attempt, duration_ms, outcome = "released", "job released at shutdown")
            }
        },
        Err(error) => match error.downcast_ref::<ApiFailure>() {
            Some(failure) if failure.status.as_u16() == 409 => {
                tracing::warn!(target: conveyor::JOB_LOG_TARGET, job_id = %id, %trace_id, %queue, %kind,
                    attempt, duration_ms, outcome = "lease_lost", "report rejected: lease was lost")
            }
            _ => {
                tracing::error!(job_id = %id, %error, "could not report the outcome; the lease will expire and the job rerun")
            }
        },
    }
}

async fn execute(ctx: &Ctx, job: &FetchedJob, id: &str, token: &str) -> CommandEnd {
    let mut command = tokio::process::Command::new("sh");
    command
        .arg("-c")
        .arg(&ctx.exec)
        .env("CONVEYOR_JOB_ID", id)
        .env("CONVEYOR_JOB_KIND", &job.kind)
        .env("CONVEYOR_JOB_QUEUE", &job.queue)
        .env("CONVEYOR_JOB_ATTEMPT", job.attempt.to_string())
        .env("CONVEYOR_LEASE_TOKEN", token)
        .env("CONVEYOR_SERVER", &ctx.server)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // Its own process group, so a timeout or drain kills what the shell started too.
        .process_group(0);
    // The command runs as a child span of the producer's: TRACEPARENT/TRACESTATE, the
    // environment carrier OpenTelemetry's SDKs read.
    if let Some(trace) = job.traceparent.as_deref().and_then(|parent| {
        conveyor::trace::TraceContext::parse(parent, job.tracestate.as_deref(), "").ok()
    }) {
        let child = trace.child(&conveyor::trace::TraceContext::new_span_id());
        command.env("TRACEPARENT", &child.traceparent);
        if let Some(state) = &child.tracestate {
            command.env("TRACESTATE", state);
        }
    }
    // A workflow's step learns its flow, its name and its parents' results (JSON).
    if let (Some(flow_id), Some(step)) = (&job.flow_id, &job.step) {
        let parents = job.parents.as_ref().map_or_else(
            || "{}".to_string(),
            |parents| serde_json::to_string(parents).unwrap_or_else(|_| "{}".to_string()),
        );
        command
            .env("CONVEYOR_FLOW_ID", flow_id.to_string())
            .env("CONVEYOR_STEP", step)
            .env("CONVEYOR_PARENTS", parents);
    }
    #[cfg(target_os = "linux")]
    // SAFETY: prctl is async-signal-safe; it only asks the kernel to SIGKILL the child when this
    // worker dies, so a `kill -9`'d worker leaves no orphaned commands behind.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            return CommandEnd::SpawnFailed(format!("cannot start `sh -c {}`: {e}", ctx.exec))
        }
    };
    let group = child.id().map(|pid| pid as i32);
    if let Some(mut stdin) = child.stdin.take() {
        let payload = serde_json::to_vec(&job.payload).unwrap_or_default();
        // A command that does not read stdin is fine: ignore a broken pipe.
        let _ = stdin.write_all(&payload).await;
    }
    let output = child.wait_with_output();
    tokio::pin!(output);
    let timeout = async {
        match job.timeout_ms {
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(timeout);
    let period = Duration::from_millis(ctx.lease_ms / 3);
    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    let kill_group = |end: CommandEnd| {
        if let Some(pgid) = group {
            // SAFETY: plain syscall on a process group this worker created.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
        end
    };
    loop {
        tokio::select! {
            done = &mut output => return match done {
                Ok(out) => CommandEnd::Exited {
                    code: out.status.code(),
                    stdout: out.stdout.into_iter().take(OUTPUT_LIMIT).collect(),
                    stderr: out.stderr.into_iter().take(OUTPUT_LIMIT).collect(),
                },
                Err(e) => CommandEnd::SpawnFailed(format!("waiting for the command failed: {e}")),
            },
            // Dropping `output` kills the child (kill_on_drop).
            _ = &mut timeout => return kill_group(CommandEnd::TimedOut),
            _ = ctx.abort.cancelled() => return kill_group(CommandEnd::Aborted),
            _ = heartbeat.tick() => {
                let beat = ctx.api.post(&format!("/v1/jobs/{id}/heartbeat"), &json!({"lease_token": token, "lease_ms": ctx.lease_ms})).await;
                if let Err(error) = beat {
                    if error.downcast_ref::<ApiFailure>().is_some_and(|f| f.status.as_u16() == 409) {
                        return kill_group(CommandEnd::LeaseLost);
                    }
                    tracing::warn!(job_id = %id, %error, "heartbeat failed; will retry");
                }
            }
        }
    }
}
