//! `conveyor queues`: every queue at a glance, once or every second.

use clap::Args;
use std::process::ExitCode;
use std::time::Duration;

use crate::cli::http::decode;
use crate::cli::ServerArg;
use conveyor_server::api::QueuesResponse;

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
            let answer: QueuesResponse = decode(&answer, "GET /v1/queues")?;
            for q in answer.queues {
                println!(
                    "{:<16} {:>9} {:>9} {:>8} {:>9} {:>6} {:>10} {:>9} {:>10}  {}",
                    q.name,
                    q.available,
                    q.scheduled,
                    q.running,
                    q.retryable,
                    q.dead,
                    q.completed,
                    q.cancelled,
                    q.oldest_available_age_ms,
                    if q.paused { "paused" } else { "" }
                );
            }
            for breaker in answer
                .breakers
                .iter()
                .filter(|b| b.state != conveyor::BreakerState::Closed)
            {
                let view = serde_json::to_value(breaker).unwrap_or_default();
                println!(
                    "circuit breaker of {} {}: {}",
                    breaker.scope.as_str(),
                    breaker.name,
                    super::queue::breaker_summary(&view)
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
