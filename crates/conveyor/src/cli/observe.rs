//! `conveyor workers` and `conveyor stuck`: the worker registry and stuck jobs, for on-call.

use crate::cli::http::decode;
use crate::cli::table::{ago, human_duration, human_ms, Table};
use clap::Args;
use conveyor_server::api::{StuckResponse, WorkersResponse};
use std::process::ExitCode;

use super::ServerArg;

#[derive(Args, Debug)]
pub(crate) struct WorkersArgs {
    /// Only workers in this state: alive, stopped or dead.
    #[arg(long)]
    state: Option<String>,
    #[command(flatten)]
    server: ServerArg,
}

#[derive(Args, Debug)]
pub(crate) struct StuckArgs {
    /// Only jobs of this queue.
    #[arg(long)]
    queue: Option<String>,
    #[command(flatten)]
    server: ServerArg,
}

pub(crate) async fn workers(args: WorkersArgs) -> anyhow::Result<ExitCode> {
    let path = match &args.state {
        Some(state) => {
            if !matches!(state.as_str(), "alive" | "stopped" | "dead") {
                anyhow::bail!("--state must be alive, stopped or dead (got {state:?})");
            }
            format!("/v1/workers?state={state}")
        }
        None => "/v1/workers".to_string(),
    };
    let answer = args.server.client()?.get(&path).await?;
    if args.server.json {
        println!("{answer}");
        return Ok(ExitCode::SUCCESS);
    }
    let answer: WorkersResponse = decode(&answer, "GET /v1/workers")?;
    let mut table = Table::new([
        "WORKER",
        "STATE",
        "HOST",
        "PID",
        "BUSY",
        "QUEUES",
        "LAST SEEN",
    ])
    .right([3, 4]);
    for worker in answer.workers {
        table.row([
            worker.id,
            worker.state.to_string(),
            if worker.host.is_empty() {
                "-".to_string()
            } else {
                worker.host
            },
            worker.pid.map_or("-".to_string(), |pid| pid.to_string()),
            format!("{}/{}", worker.busy, worker.concurrency),
            worker.queues.join(","),
            ago(worker.last_seen_at),
        ]);
    }
    table.print();
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn stuck(args: StuckArgs) -> anyhow::Result<ExitCode> {
    let path = match &args.queue {
        Some(queue) => {
            conveyor::validate::name("queue", queue)?;
            format!("/v1/jobs/stuck?queue={queue}")
        }
        None => "/v1/jobs/stuck".to_string(),
    };
    let answer = args.server.client()?.get(&path).await?;
    if args.server.json {
        println!("{answer}");
        return Ok(ExitCode::SUCCESS);
    }
    let jobs = decode::<StuckResponse>(&answer, "GET /v1/jobs/stuck")?.jobs;
    if jobs.is_empty() {
        println!("no stuck jobs");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table =
        Table::new(["JOB", "QUEUE", "KIND", "RUNNING", "LIMIT", "WORKER"]).right([3, 4]);
    for job in jobs {
        table.row([
            job.id.to_string(),
            job.queue,
            job.kind,
            human_ms(job.running_ms),
            human_ms(job.threshold_ms),
            job.worker_id.unwrap_or_else(|| "-".to_string()),
        ]);
    }
    table.print();
    Ok(ExitCode::SUCCESS)
}

#[derive(Args, Debug)]
pub(crate) struct StatsArgs {
    /// How far back to look (seconds, or a number with s, m, h or d), unless --from is given.
    #[arg(long, default_value = "1h")]
    since: String,
    /// Start of the span (RFC 3339); wins over --since.
    #[arg(long)]
    from: Option<String>,
    /// End of the span (RFC 3339; default: now).
    #[arg(long)]
    to: Option<String>,
    /// Width of each point of the series (whole minutes: 60, 5m, 1h); default: about 120
    /// points. The table sums the span either way; the series is in --json.
    #[arg(long)]
    step: Option<String>,
    /// Only this queue.
    #[arg(long)]
    queue: Option<String>,
    /// Only this job kind.
    #[arg(long)]
    kind: Option<String>,
    #[command(flatten)]
    server: ServerArg,
}

/// `conveyor stats`: the history per queue and kind over a span (`GET /v1/stats`).
pub(crate) async fn stats(args: StatsArgs) -> anyhow::Result<ExitCode> {
    use conveyor::stats::{parse_duration, StatsPoint, StatsReport};
    let rfc3339 = |flag: &str, text: &str| {
        chrono::DateTime::parse_from_rfc3339(text)
            .map(|at| at.with_timezone(&chrono::Utc))
            .map_err(|e| {
                anyhow::anyhow!(
                    "{flag} {text:?} is not an RFC 3339 time ({e}), e.g. 2026-12-01T09:00:00Z"
                )
            })
    };
    let to = args.to.as_deref().map(|t| rfc3339("--to", t)).transpose()?;
    let from = match &args.from {
        Some(from) => rfc3339("--from", from)?,
        None => {
            let since = parse_duration("since", &args.since)
                .map_err(|e| anyhow::anyhow!("--since {}", e.message))?;
            let end = to.unwrap_or_else(chrono::Utc::now);
            chrono::Duration::from_std(since)
                .ok()
                .and_then(|since| end.checked_sub_signed(since))
                .ok_or_else(|| anyhow::anyhow!("--since {:?} is too long", args.since))?
        }
    };
    let mut pairs = vec![(
        "from",
        from.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
    )];
    if let Some(to) = to {
        pairs.push(("to", to.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)));
    }
    for (key, value) in [
        ("step", &args.step),
        ("queue", &args.queue),
        ("kind", &args.kind),
    ] {
        if let Some(value) = value {
            pairs.push((key, value.clone()));
        }
    }
    let query = serde_urlencoded::to_string(&pairs)?;
    let answer = args
        .server
        .client()?
        .get(&format!("/v1/stats?{query}"))
        .await?;
    if args.server.json {
        println!("{answer}");
        return Ok(ExitCode::SUCCESS);
    }
    let report: StatsReport = decode(&answer, "GET /v1/stats")?;
    let ms = |ms: f64| human_duration(std::time::Duration::from_secs_f64(ms.max(0.0) / 1000.0));
    let latency = |point: &StatsPoint| {
        let run = point.run_time.map(|l| (ms(l.p50_ms), ms(l.p95_ms)));
        let wait = point.queue_wait.map(|l| (ms(l.p50_ms), ms(l.p95_ms)));
        let (run50, run95) = run.unwrap_or(("-".into(), "-".into()));
        let (wait50, wait95) = wait.unwrap_or(("-".into(), "-".into()));
        [run50, run95, wait50, wait95]
    };
    let rate = |point: &StatsPoint| {
        point
            .failure_rate
            .map_or("-".to_string(), |r| format!("{:.1}%", r * 100.0))
    };
    println!(
        "{} to {} ({} per point)",
        report.from.format("%Y-%m-%d %H:%M UTC"),
        report.to.format("%Y-%m-%d %H:%M UTC"),
        human_duration(std::time::Duration::from_secs(report.step_s))
    );
    if report.kinds.is_empty() {
        println!("nothing was enqueued, started or finished in this span");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new([
        "QUEUE", "KIND", "ENQUEUED", "DONE", "FAILED", "DEAD", "FAIL %", "PER MIN", "RUN P50",
        "RUN P95", "WAIT P50", "WAIT P95",
    ])
    .right(2..12);
    let row = |queue: String, kind: String, per_min: f64, point: &StatsPoint| {
        let [run50, run95, wait50, wait95] = latency(point);
        [
            queue,
            kind,
            point.enqueued.to_string(),
            point.completed.to_string(),
            point.failed.to_string(),
            point.dead.to_string(),
            rate(point),
            format!("{per_min:.1}"),
            run50,
            run95,
            wait50,
            wait95,
        ]
    };
    for kind in &report.kinds {
        table.row(row(
            kind.queue.clone(),
            kind.kind.clone(),
            kind.throughput_per_min,
            &kind.totals,
        ));
    }
    let minutes = ((report.to - report.from).num_seconds() as f64 / 60.0).max(1.0);
    table.row(row(
        "all".into(),
        "".into(),
        report.totals.completed as f64 / minutes,
        &report.totals,
    ));
    table.print();
    Ok(ExitCode::SUCCESS)
}

#[derive(clap::Subcommand, Debug)]
pub(crate) enum WorkerCommandArgs {
    /// Stop it fetching: it finishes the jobs it holds and keeps running.
    Quiet {
        /// The worker's id, as `conveyor workers` lists it.
        id: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Stop it fetching and have it exit once its jobs are done (the Rust worker and `conveyor
    /// work` exit; other HTTP workers stay quiet).
    Stop {
        id: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Clear a quiet (or a stop not yet obeyed): it gets jobs again.
    Resume {
        id: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// `conveyor worker quiet|stop|resume ID` (`POST /v1/workers/{id}/...`).
pub(crate) async fn worker(command: WorkerCommandArgs) -> anyhow::Result<ExitCode> {
    let (action, id, server) = match &command {
        WorkerCommandArgs::Quiet { id, server } => ("quiet", id, server),
        WorkerCommandArgs::Stop { id, server } => ("stop", id, server),
        WorkerCommandArgs::Resume { id, server } => ("resume", id, server),
    };
    conveyor::workers::text("id", id, true)?;
    // A path segment: everything but unreserved characters percent-encoded.
    let segment: String = id
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect();
    let path = format!("/v1/workers/{segment}/{action}");
    let (_, answer) = server
        .client()?
        .call(reqwest::Method::POST, &path, Some(&serde_json::json!({})))
        .await?;
    if server.json {
        println!("{answer}");
        return Ok(ExitCode::SUCCESS);
    }
    match action {
        "quiet" => {
            println!("worker {id} told to quiet: it gets no more jobs and finishes those it holds")
        }
        "stop" => println!(
            "worker {id} told to stop: it gets no more jobs and exits once its jobs are done"
        ),
        _ => println!(
            "worker {id} resumed: it gets jobs again (an embedded Rust worker that already \
             stopped fetching stays quiet until restarted)"
        ),
    }
    Ok(ExitCode::SUCCESS)
}
