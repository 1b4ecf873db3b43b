//! `conveyor queues`: every queue at a glance, once or every second.

use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

use crate::cli::ServerArg;

#[derive(Args, Debug)]
pub(crate) struct QueuesArgs {
    /// Refresh every second until interrupted.
    #[arg(long)]
    watch: bool,
    #[command(flatten)]
    server: ServerArg,
}

pub(crate) async fn queues(args: QueuesArgs) -> anyhow::Result<ExitCode> {
    let client = args.server.client()?;
    loop {
        let answer = client.get("/v1/queues").await?;
        if args.server.json {
            println!("{answer}");
        } else {
            if args.watch {
                print!("\x1b[2J\x1b[H");
            }
            println!(
                "{:<16} {:>9} {:>9} {:>8} {:>9} {:>6} {:>10} {:>9} {:>10}  STATE",
                "QUEUE",
                "AVAILABLE",
                "SCHEDULED",
                "RUNNING",
                "RETRYABLE",
                "DEAD",
                "COMPLETED",
                "CANCELLED",
                "OLDEST_MS",
            );
            for q in answer["queues"].as_array().cloned().unwrap_or_default() {
                println!(
                    "{:<16} {:>9} {:>9} {:>8} {:>9} {:>6} {:>10} {:>9} {:>10}  {}",
                    q["name"].as_str().unwrap_or("?"),
                    q["available"].to_string(),
                    q["scheduled"].to_string(),
                    q["running"].to_string(),
                    q["retryable"].to_string(),
                    q["dead"].to_string(),
                    q["completed"].to_string(),
                    q["cancelled"].to_string(),
                    q["oldest_available_age_ms"].to_string(),
                    if q["paused"] == true { "paused" } else { "" }
                );
            }
        }
        if !args.watch {
            return Ok(ExitCode::SUCCESS);
        }
        tokio::select! {
            _ = conveyor::shutdown_signal() => return Ok(ExitCode::SUCCESS),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
}
