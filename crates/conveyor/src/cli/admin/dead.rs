//! `conveyor dead list|replay|discard`: the dead-letter queue.

use crate::cli::http::decode;
use crate::cli::table::{ago, Table};
use anyhow::bail;
use clap::Subcommand;
use conveyor_server::api::{JobPage, ReplayResponse};
use reqwest::Method;
use serde_json::json;
use std::process::ExitCode;

use super::{check_id, print_json, query};
use crate::cli::ServerArg;

#[derive(Subcommand, Debug)]
pub(crate) enum DeadCommand {
    /// List dead jobs.
    List {
        #[arg(long)]
        queue: Option<String>,
        #[arg(long)]
        kind: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Replay dead jobs: by id, or every dead job matching --queue/--kind, or --all.
    Replay {
        ids: Vec<String>,
        #[arg(long)]
        queue: Option<String>,
        #[arg(long)]
        kind: Option<String>,
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Delete a dead job for good.
    Discard {
        id: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

pub(crate) async fn dead(command: DeadCommand) -> anyhow::Result<ExitCode> {
    match command {
        DeadCommand::List {
            queue,
            kind,
            limit,
            server,
        } => {
            let client = server.client()?;
            let page = client
                .get(&format!(
                    "/v1/dead{}",
                    query(&[
                        ("queue", queue),
                        ("kind", kind),
                        ("limit", Some(limit.to_string()))
                    ])
                ))
                .await?;
            if server.json {
                print_json(&page);
                return Ok(ExitCode::SUCCESS);
            }
            let page: JobPage = decode(&page, "GET /v1/dead")?;
            let jobs = page.jobs;
            let mut table =
                Table::new(["ID", "QUEUE", "KIND", "ATTEMPT", "DIED", "LAST ERROR"]).right([3, 4]);
            for job in &jobs {
                let last = job.errors.last();
                table.row([
                    job.id.to_string(),
                    job.queue.clone(),
                    job.kind.clone(),
                    job.attempt.to_string(),
                    job.finished_at.map_or_else(|| "-".to_string(), ago),
                    format!(
                        "[{}] {}",
                        last.map_or("-", |e| e.class.as_str()),
                        last.map_or("", |e| e.message.as_str())
                    ),
                ]);
            }
            table.print();
            println!("{} dead job(s) shown", jobs.len());
        }
        DeadCommand::Replay {
            ids,
            queue,
            kind,
            all,
            server,
        } => {
            for id in &ids {
                check_id(id)?;
            }
            let body = if !ids.is_empty() {
                json!({"ids": ids})
            } else if queue.is_some() || kind.is_some() {
                json!({"queue": queue, "kind": kind})
            } else if all {
                json!({"all": true})
            } else {
                bail!("say which dead jobs to replay: ids, --queue/--kind, or --all");
            };
            let client = server.client()?;
            let (_, answer) = client.post("/v1/dead/replay", &body).await?;
            if server.json {
                print_json(&answer);
            } else {
                let answer: ReplayResponse = decode(&answer, "POST /v1/dead/replay")?;
                println!("replayed {} job(s)", answer.replayed);
            }
        }
        DeadCommand::Discard { id, server } => {
            check_id(&id)?;
            let client = server.client()?;
            let (_, answer) = client
                .call(Method::DELETE, &format!("/v1/dead/{id}"), None)
                .await?;
            if server.json {
                print_json(&answer);
            } else {
                println!("discarded {id}");
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
