//! `conveyor workers` and `conveyor stuck`: the worker registry and stuck jobs, for on-call.

use crate::cli::http::{decode, stamp};
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
    println!(
        "{:<36} {:<8} {:<20} {:>8} {:>9}  {:<24} LAST SEEN",
        "WORKER", "STATE", "HOST", "PID", "BUSY", "QUEUES"
    );
    let answer: WorkersResponse = decode(&answer, "GET /v1/workers")?;
    for worker in answer.workers {
        println!(
            "{:<36} {:<8} {:<20} {:>8} {:>9}  {:<24} {}",
            worker.id,
            worker.state.to_string(),
            worker.host,
            worker.pid.map_or("-".to_string(), |pid| pid.to_string()),
            format!("{}/{}", worker.busy, worker.concurrency),
            worker.queues.join(","),
            stamp(&worker.last_seen_at),
        );
    }
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
    println!(
        "{:<36} {:<14} {:<20} {:>12} {:>12}  WORKER",
        "JOB", "QUEUE", "KIND", "RUNNING_MS", "LIMIT_MS"
    );
    for job in jobs {
        println!(
            "{:<36} {:<14} {:<20} {:>12} {:>12}  {}",
            job.id,
            job.queue,
            job.kind,
            job.running_ms,
            job.threshold_ms,
            job.worker_id.as_deref().unwrap_or("-"),
        );
    }
    Ok(ExitCode::SUCCESS)
}
