//! `conveyor jobs list|search|bulk`: finding jobs by queue, state, kind, tag, tenant, id
//! prefix, creation time and payload, and acting on all of them at once (`POST /v1/jobs/bulk`).

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;

use crate::cli::http::{decode, stamp};
use crate::cli::ServerArg;

/// What a search matches (all given criteria at once).
#[derive(Args, Debug, Clone, Default)]
pub(crate) struct Filter {
    #[arg(long)]
    queue: Option<String>,
    /// scheduled, available, running, retryable, completed, dead, cancelled, expired or
    /// blocked.
    #[arg(long)]
    state: Option<String>,
    #[arg(long)]
    kind: Option<String>,
    /// Jobs carrying this tag.
    #[arg(long)]
    tag: Option<String>,
    #[arg(long)]
    tenant: Option<String>,
    /// The jobs of one sequence, by the key jobs carry (e.g. `payload.account=acme`).
    #[arg(long)]
    sequence: Option<String>,
    /// The start of a job id (e.g. 0193a5f2).
    #[arg(long)]
    id_prefix: Option<String>,
    /// Created at or after this (RFC 3339, e.g. 2026-12-01T09:00:00Z).
    #[arg(long)]
    created_after: Option<String>,
    /// Created before this (RFC 3339).
    #[arg(long)]
    created_before: Option<String>,
    /// A JSON object the payload must contain, e.g. '{"user": {"id": 7}}'.
    #[arg(long, value_name = "JSON")]
    payload: Option<String>,
}

impl Filter {
    /// The criteria as (name, text) pairs, in the API's names.
    fn pairs(&self) -> Vec<(&'static str, String)> {
        [
            ("queue", &self.queue),
            ("state", &self.state),
            ("kind", &self.kind),
            ("tag", &self.tag),
            ("tenant", &self.tenant),
            ("sequence", &self.sequence),
            ("id_prefix", &self.id_prefix),
            ("created_after", &self.created_after),
            ("created_before", &self.created_before),
            ("payload", &self.payload),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.clone().map(|v| (name, v)))
        .collect()
    }
}

#[derive(Args, Debug)]
pub(crate) struct SearchArgs {
    #[command(flatten)]
    filter: Filter,
    /// Jobs per page (1 to 1000).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Continue after this job id (the `next` of the previous page).
    #[arg(long)]
    cursor: Option<String>,
    /// Follow the pages to the end (up to 100,000 jobs).
    #[arg(long)]
    all: bool,
    #[command(flatten)]
    server: ServerArg,
}

/// What `jobs bulk` does to what it matches.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub(crate) enum BulkAction {
    /// Cancel unfinished jobs.
    Cancel,
    /// Run dead and expired jobs again.
    Retry,
    /// Delete dead and expired jobs.
    Discard,
}

#[derive(Subcommand, Debug)]
pub(crate) enum JobsCommand {
    /// Jobs matching the criteria, newest first.
    List(SearchArgs),
    /// The same as `list` (the name operators look for).
    Search(SearchArgs),
    /// Cancel, retry or discard every job the criteria (or --ids) match.
    Bulk {
        action: BulkAction,
        #[command(flatten)]
        filter: Filter,
        /// These jobs instead of a filter (comma-separated ids).
        #[arg(long, value_delimiter = ',')]
        ids: Vec<String>,
        /// Count what would change, change nothing.
        #[arg(long)]
        dry_run: bool,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// Most jobs `--all` follows.
const MAX_ALL: usize = 100_000;

pub(crate) async fn run(command: JobsCommand) -> anyhow::Result<ExitCode> {
    match command {
        JobsCommand::List(args) | JobsCommand::Search(args) => search(args).await,
        JobsCommand::Bulk {
            action,
            filter,
            ids,
            dry_run,
            server,
        } => bulk(action, filter, ids, dry_run, server).await,
    }
}

fn query(pairs: &[(&str, String)]) -> anyhow::Result<String> {
    serde_urlencoded::to_string(pairs).context("encoding the query")
}

async fn search(args: SearchArgs) -> anyhow::Result<ExitCode> {
    if !(1..=1000).contains(&args.limit) {
        anyhow::bail!("--limit must be from 1 to 1000");
    }
    let client = args.server.client()?;
    let mut pairs = args.filter.pairs();
    pairs.push(("limit", args.limit.to_string()));
    let mut cursor = args.cursor.clone();
    let mut jobs: Vec<Value> = Vec::new();
    let next = loop {
        let mut page_query = pairs.clone();
        if let Some(cursor) = &cursor {
            page_query.push(("cursor", cursor.clone()));
        }
        let page = client
            .get(&format!("/v1/jobs?{}", query(&page_query)?))
            .await?;
        let page_jobs = page["jobs"].as_array().cloned().unwrap_or_default();
        jobs.extend(page_jobs);
        let next = page["next"].as_str().map(str::to_string);
        if !args.all || next.is_none() || jobs.len() >= MAX_ALL {
            break next;
        }
        cursor = next;
    };
    if args.server.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({"jobs": jobs, "next": next}))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if jobs.is_empty() {
        println!("no job matches");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<36}  {:<10}  {:<16}  {:<24}  {:>7}  CREATED",
        "ID", "STATE", "QUEUE", "KIND", "ATTEMPT"
    );
    for job in &jobs {
        let job: conveyor::Job = decode(job, "GET /v1/jobs")?;
        println!(
            "{:<36}  {:<10}  {:<16}  {:<24}  {:>7}  {}",
            job.id,
            job.state,
            job.queue,
            job.kind,
            job.attempt,
            stamp(&job.created_at)
        );
    }
    if let Some(next) = next {
        println!("more: --cursor {next}");
    }
    Ok(ExitCode::SUCCESS)
}

async fn bulk(
    action: BulkAction,
    filter: Filter,
    ids: Vec<String>,
    dry_run: bool,
    server: ServerArg,
) -> anyhow::Result<ExitCode> {
    let action_name = match action {
        BulkAction::Cancel => "cancel",
        BulkAction::Retry => "retry",
        BulkAction::Discard => "discard",
    };
    let mut body = json!({"action": action_name, "dry_run": dry_run});
    let pairs = filter.pairs();
    match (pairs.is_empty(), ids.is_empty()) {
        (true, true) => anyhow::bail!(
            "say which jobs: give criteria (--queue, --state, --kind, --tag, --tenant, \
             --id-prefix, --created-after, --created-before, --payload) or --ids"
        ),
        (false, false) => anyhow::bail!("give criteria or --ids, not both"),
        (false, true) => {
            let mut object = serde_json::Map::new();
            for (name, value) in pairs {
                let value = if name == "payload" {
                    serde_json::from_str(&value)
                        .with_context(|| format!("--payload is not valid JSON: {value:?}"))?
                } else {
                    Value::String(value)
                };
                object.insert(name.to_string(), value);
            }
            body["filter"] = Value::Object(object);
        }
        (true, false) => body["ids"] = json!(ids),
    }
    let client = server.client()?;
    let (_, answer) = client
        .call(Method::POST, "/v1/jobs/bulk", Some(&body))
        .await?;
    if server.json {
        println!("{}", serde_json::to_string_pretty(&answer)?);
        return Ok(ExitCode::SUCCESS);
    }
    let answer: conveyor_server::BulkResponse = decode(&answer, "POST /v1/jobs/bulk")?;
    let more = if answer.truncated {
        " (more matched than one request takes: run it again for the rest)"
    } else {
        ""
    };
    if answer.dry_run {
        println!(
            "would {action_name} {} job(s): {} matched, {} eligible{more}",
            answer.eligible, answer.matched, answer.eligible
        );
    } else {
        println!(
            "{action_name}: {} job(s) changed of {} matched ({} eligible){more}",
            answer.applied, answer.matched, answer.eligible
        );
    }
    Ok(ExitCode::SUCCESS)
}
