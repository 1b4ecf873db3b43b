//! `conveyor audit`: the server's audit log (admin only when access control is on).

use crate::cli::http::{decode, stamp};
use crate::cli::table::Table;
use clap::Args;
use conveyor::AuditEntry;
use conveyor_server::api::AuditPage;
use std::process::ExitCode;

use super::ServerArg;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub(crate) struct AuditArgs {
    #[command(subcommand)]
    command: Option<AuditCommand>,
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

#[derive(clap::Subcommand, Debug)]
pub(crate) enum AuditCommand {
    /// Delete the entries written before a moment, on the store itself (a one-off; the
    /// maintenance leader prunes by `serve --retain-audit-secs` on its own). Not offered over
    /// HTTP: whoever may erase the trail must be able to open the store.
    Prune {
        /// RFC 3339: entries written before it are deleted, e.g. 2026-01-01T00:00:00Z.
        #[arg(long, value_parser = rfc3339)]
        before: chrono::DateTime<chrono::Utc>,
        #[command(flatten)]
        store: super::token::StoreArg,
    },
}

fn rfc3339(text: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|at| at.with_timezone(&chrono::Utc))
        .map_err(|e| format!("not an RFC 3339 time ({e}), e.g. 2026-01-01T00:00:00Z"))
}

/// Entries deleted per statement by `conveyor audit prune`.
const PRUNE_BATCH: usize = 1000;

async fn prune(
    before: chrono::DateTime<chrono::Utc>,
    store: &super::token::StoreArg,
) -> anyhow::Result<ExitCode> {
    let store = store.open().await?;
    let mut pruned = 0u64;
    loop {
        let deleted = store
            .audit_prune(conveyor::AuditCutoff::Before(before), PRUNE_BATCH)
            .await?;
        pruned += deleted;
        if deleted < PRUNE_BATCH as u64 {
            break;
        }
    }
    println!(
        "deleted {pruned} audit entr{} written before {}",
        if pruned == 1 { "y" } else { "ies" },
        before.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
    );
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn run(args: AuditArgs) -> anyhow::Result<ExitCode> {
    if let Some(AuditCommand::Prune { before, store }) = &args.command {
        return prune(*before, store).await;
    }
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
