//! `conveyor queues`: every queue at a glance, once or every second.

use clap::Args;
use std::io::IsTerminal;
use std::process::ExitCode;
use std::time::Duration;

use crate::cli::http::decode;
use crate::cli::table::{human_ms, Table};
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
    let mut refreshes = 0u64;
    loop {
        let answer = client.get("/v1/queues").await?;
        if args.server.json {
            println!("{answer}");
        } else {
            if args.watch {
                // Clear the screen on a terminal only; into a pipe or a file, each refresh
                // follows the previous one after a blank line, with no escape codes.
                if std::io::stdout().is_terminal() {
                    print!("\x1b[2J\x1b[H");
                } else if refreshes > 0 {
                    println!();
                }
                refreshes += 1;
            }
            let answer: QueuesResponse = decode(&answer, "GET /v1/queues")?;
            let mut table = Table::new([
                "QUEUE",
                "AVAILABLE",
                "SCHEDULED",
                "RUNNING",
                "RETRYABLE",
                "DEAD",
                "COMPLETED",
                "CANCELLED",
                "OLDEST",
                "STATE",
            ])
            .right(1..=8);
            for q in &answer.queues {
                table.row([
                    q.name.clone(),
                    q.available.to_string(),
                    q.scheduled.to_string(),
                    q.running.to_string(),
                    q.retryable.to_string(),
                    q.dead.to_string(),
                    q.completed.to_string(),
                    q.cancelled.to_string(),
                    // How long the oldest available job has waited; nothing waits in an
                    // empty queue.
                    if q.available == 0 {
                        "-".to_string()
                    } else {
                        human_ms(q.oldest_available_age_ms)
                    },
                    if q.paused { "paused" } else { "" }.to_string(),
                ]);
            }
            table.print();
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
