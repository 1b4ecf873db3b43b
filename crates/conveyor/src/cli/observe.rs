//! `conveyor workers` and `conveyor stuck`: the worker registry and stuck jobs, for on-call.

use crate::cli::http::decode;
use crate::cli::table::{ago, human_ms, Table};
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
