//! `conveyor audit`: the server's audit log (admin only when access control is on).

use crate::cli::http::{decode, stamp};
use crate::cli::table::Table;
use clap::Args;
use conveyor::AuditEntry;
use conveyor_server::api::AuditPage;
use std::process::ExitCode;

use super::ServerArg;

#[derive(Args, Debug)]
pub(crate) struct AuditArgs {
    /// Only entries of this action (job.enqueue, job.cancel, dead.replay, dead.discard,
    /// queue.settings, schedule.put, schedule.delete, token.create, token.revoke).
    #[arg(long)]
    action: Option<String>,
    /// Entries with ids below this one (the `next` of the previous page).
    #[arg(long)]
    before: Option<i64>,
    /// Most entries shown (1-1000).
    #[arg(long, default_value_t = 50)]
    limit: usize,
    #[command(flatten)]
    server: ServerArg,
}

pub(crate) async fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    let mut path = format!("/v1/audit?limit={}", args.limit);
    if let Some(action) = &args.action {
        action.parse::<conveyor::AuditAction>()?;
        path.push_str(&format!("&action={action}"));
    }
    if let Some(before) = args.before {
        path.push_str(&format!("&before={before}"));
    }
    let page = args.server.client()?.get(&path).await?;
    if args.server.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(ExitCode::SUCCESS);
    }
    let page: AuditPage = decode(&page, "GET /v1/audit")?;
    let entries = page.entries;
    if entries.is_empty() {
        println!("no audit entries");
        return Ok(ExitCode::SUCCESS);
    }
    let mut table = Table::new(["ID", "AT", "ACTOR", "ACTION", "TARGET", "JOBS / DETAIL"]);
    for entry in &entries {
        table.row([
            entry.id.to_string(),
            stamp(&entry.at),
            entry.actor.clone(),
            entry.action.to_string(),
            entry.target.clone().unwrap_or_else(|| "-".to_string()),
            summary(entry),
        ]);
    }
    table.print();
    if let Some(next) = page.next {
        println!("(more: --before {next})");
    }
    Ok(ExitCode::SUCCESS)
}

/// The jobs (the first id and how many) and the detail, in one column.
fn summary(entry: &AuditEntry) -> String {
    let count = entry.job_count;
    let jobs = match (entry.job_ids.first(), count) {
        (_, 0) => String::new(),
        (Some(first), 1) => first.to_string(),
        (Some(first), n) => format!("{first} +{}", n - 1),
        (None, n) => format!("{n} jobs"),
    };
    let detail = entry.detail.as_deref().unwrap_or("");
    [jobs.as_str(), detail]
        .iter()
        .filter(|part| !part.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("  ")
}
