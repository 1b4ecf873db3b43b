//! `conveyor audit`: the server's audit log (admin only when access control is on).

use clap::Args;
use serde_json::Value;
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
    let entries = page["entries"].as_array().cloned().unwrap_or_default();
    if entries.is_empty() {
        println!("no audit entries");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:>6}  {:<24}  {:<20}  {:<16}  {:<20}  JOBS / DETAIL",
        "ID", "AT", "ACTOR", "ACTION", "TARGET"
    );
    for entry in &entries {
        println!(
            "{:>6}  {:<24}  {:<20}  {:<16}  {:<20}  {}",
            entry["id"],
            text(&entry["at"]),
            text(&entry["actor"]),
            text(&entry["action"]),
            text(&entry["target"]),
            summary(entry)
        );
    }
    if let Some(next) = page["next"].as_i64() {
        println!("(more: --before {next})");
    }
    Ok(ExitCode::SUCCESS)
}

fn text(value: &Value) -> String {
    value.as_str().unwrap_or("-").to_string()
}

/// The jobs (the first id and how many) and the detail, in one column.
fn summary(entry: &Value) -> String {
    let count = entry["job_count"].as_u64().unwrap_or(0);
    let jobs = match (entry["job_ids"].get(0).and_then(Value::as_str), count) {
        (_, 0) => String::new(),
        (Some(first), 1) => first.to_string(),
        (Some(first), n) => format!("{first} +{}", n - 1),
        (None, n) => format!("{n} jobs"),
    };
    let detail = entry["detail"].as_str().unwrap_or("");
    [jobs.as_str(), detail]
        .iter()
        .filter(|part| !part.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("  ")
}
