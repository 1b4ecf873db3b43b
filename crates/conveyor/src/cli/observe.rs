//! `conveyor workers` and `conveyor stuck`: the worker registry and stuck jobs, for on-call.

use clap::Args;
use serde_json::Value;
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

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    }
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
    for worker in answer["workers"].as_array().cloned().unwrap_or_default() {
        let queues: Vec<String> = worker["queues"]
            .as_array()
            .map(|qs| qs.iter().map(text).collect())
            .unwrap_or_default();
        println!(
            "{:<36} {:<8} {:<20} {:>8} {:>9}  {:<24} {}",
            text(&worker["id"]),
            text(&worker["state"]),
            text(&worker["host"]),
            text(&worker["pid"]),
            format!("{}/{}", text(&worker["busy"]), text(&worker["concurrency"])),
            queues.join(","),
            text(&worker["last_seen_at"]),
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
    let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
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
            text(&job["id"]),
            text(&job["queue"]),
            text(&job["kind"]),
            text(&job["running_ms"]),
            text(&job["threshold_ms"]),
            text(&job["worker_id"]),
        );
    }
    Ok(ExitCode::SUCCESS)
}
