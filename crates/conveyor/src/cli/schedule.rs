//! `conveyor schedule ...`: cron and interval schedules through the server's API.

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;

use super::ServerArg;
use crate::cli::http::{decode, stamp};
use crate::cli::table::Table;
use conveyor::schedule::ScheduleRun;
use conveyor_server::api::{RunList, ScheduleAnswer, ScheduleList};

#[derive(Subcommand, Debug)]
pub(crate) enum ScheduleCommand {
    /// Every schedule with its next and last run.
    List {
        #[command(flatten)]
        server: ServerArg,
    },
    /// One schedule: its definition, next run and recent runs (with their jobs' states).
    Show {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Create or replace a schedule.
    Set(Box<SetArgs>),
    /// A schedule's latest runs, newest first.
    Runs {
        name: String,
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Delete a schedule (its jobs stay).
    Delete {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Stop a schedule firing: its ticks pass as skipped until it is resumed.
    Pause {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Fire a paused schedule again, from its next tick.
    Resume {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Enqueue a schedule's job now, outside its ticks (tagged `manual`).
    Trigger {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum OverlapArg {
    Skip,
    Allow,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum MissedArg {
    Skip,
    #[value(name = "catch_up", alias = "catch-up")]
    CatchUp,
}

#[derive(Args, Debug)]
pub(crate) struct SetArgs {
    name: String,
    /// Cron expression: 5 fields (minute hour day-of-month month day-of-week), or 6 with
    /// seconds first. Quote it: '*/5 * * * *'.
    #[arg(long, required_unless_present = "every", conflicts_with = "every")]
    cron: Option<String>,
    /// A fixed interval instead of --cron: 30s, 5m, 1h30m, 2d (units s, m, h, d, w; from 1s
    /// to 366d), counted from when the schedule is set.
    #[arg(long, value_parser = every_arg)]
    every: Option<String>,
    /// IANA time zone the cron expression is read in (default UTC), e.g. Europe/Berlin.
    #[arg(long, conflicts_with = "every")]
    timezone: Option<String>,
    /// The kind of job each run enqueues.
    #[arg(long)]
    kind: String,
    /// The job's JSON payload.
    #[arg(long)]
    payload: Option<String>,
    #[arg(long)]
    queue: Option<String>,
    #[arg(long, allow_hyphen_values = true)]
    priority: Option<i32>,
    #[arg(long)]
    max_attempts: Option<u32>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// Repeat for several tags.
    #[arg(long = "tag")]
    tags: Vec<String>,
    #[arg(long)]
    tenant: Option<String>,
    /// While the previous run's job is unfinished: skip the tick (default) or run anyway.
    #[arg(long, value_enum)]
    overlap: Option<OverlapArg>,
    /// Ticks missed during downtime: skip them (default), or catch up on the latest ones.
    #[arg(long, value_enum)]
    missed: Option<MissedArg>,
    /// With --missed catch_up: most missed ticks run (default 10).
    #[arg(long)]
    max_catch_up: Option<u32>,
    #[command(flatten)]
    server: ServerArg,
}

/// Checks `--every` before anything is sent: the server would refuse it the same way.
fn every_arg(text: &str) -> Result<String, String> {
    conveyor::schedule::parse_every(text)
        .map(|_| text.trim().to_string())
        .map_err(|e| e.message)
}

/// The schedule's path; names are `[A-Za-z0-9_.:-]`, anything else is escaped so that the
/// server, not the URL, refuses it.
fn path(name: &str) -> String {
    let escaped: String = name
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b':' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    format!("/v1/schedules/{escaped}")
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// A policy or status as the API spells it (`skip`, `catch_up`, `enqueued`, ...).
fn wire_name(value: impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        _ => "?".to_string(),
    }
}

fn optional_stamp(at: Option<&chrono::DateTime<chrono::Utc>>) -> String {
    at.map_or_else(|| "-".to_string(), stamp)
}

/// When a schedule runs: `cron EXPR in ZONE`, or `every INTERVAL`.
fn when(schedule: &ScheduleAnswer) -> String {
    match &schedule.every {
        Some(every) => format!("every {every}"),
        None => format!("cron {} in {}", schedule.cron, schedule.timezone),
    }
}

/// `missed` as one word: `skip`, or `catch_up(N)`.
fn missed(schedule: &ScheduleAnswer) -> String {
    match (wire_name(schedule.missed), schedule.max_catch_up) {
        (name, Some(max)) if name == "catch_up" => format!("catch_up({max})"),
        (name, _) => name,
    }
}

/// Runs as a table: tick, status, job and its state, and why when it did not enqueue.
fn runs_table(runs: &[ScheduleRun]) -> Table {
    let mut table = Table::new(["TICK", "STATUS", "JOB", "STATE", "DETAIL"]);
    for run in runs {
        let detail = [
            if run.catch_up { "(catch-up)" } else { "" },
            run.detail.as_deref().unwrap_or(""),
        ]
        .iter()
        .filter(|part| !part.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join(" ");
        table.row([
            stamp(&run.tick),
            wire_name(run.status),
            run.job_id
                .map_or_else(|| "-".to_string(), |id| id.to_string()),
            run.job_state
                .map_or_else(|| "-".to_string(), |state| state.to_string()),
            detail,
        ]);
    }
    table
}

fn print_schedule(schedule: &ScheduleAnswer) {
    let job = &schedule.job;
    for (label, value) in [
        ("name", schedule.name.clone()),
        ("when", when(schedule)),
        ("job", format!("{} in {}", job.kind, job.queue)),
        ("payload", job.payload.to_string()),
        ("overlap", wire_name(schedule.overlap)),
        ("missed", missed(schedule)),
        ("next run", optional_stamp(schedule.next_run_at.as_ref())),
        ("last tick", optional_stamp(schedule.last_tick.as_ref())),
        ("updated", stamp(&schedule.updated_at)),
    ] {
        println!("{label:>10}: {value}");
    }
    println!("{:>10}: {}", "runs", schedule.recent_runs.len());
    if !schedule.recent_runs.is_empty() {
        runs_table(&schedule.recent_runs).print_indented(&" ".repeat(12));
    }
}

pub(crate) async fn run(command: ScheduleCommand) -> anyhow::Result<ExitCode> {
    match command {
        ScheduleCommand::List { server } => {
            let client = server.client()?;
            let answer = client.get("/v1/schedules").await?;
            if server.json {
                print_json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            let schedules = decode::<ScheduleList>(&answer, "GET /v1/schedules")?.schedules;
            let mut table = Table::new([
                "NAME",
                "CRON/EVERY",
                "TIMEZONE",
                "KIND",
                "NEXT RUN",
                "LAST RUN",
                "LAST JOB",
            ]);
            for schedule in &schedules {
                let last = schedule.last_run.as_ref();
                table.row([
                    schedule.name.clone(),
                    match &schedule.every {
                        Some(every) => format!("every {every}"),
                        None => schedule.cron.clone(),
                    },
                    if schedule.every.is_some() {
                        "-".to_string()
                    } else {
                        schedule.timezone.clone()
                    },
                    schedule.job.kind.clone(),
                    optional_stamp(schedule.next_run_at.as_ref()),
                    last.map_or_else(|| "-".to_string(), |run| wire_name(run.status)),
                    last.and_then(|run| run.job_state)
                        .map_or_else(|| "-".to_string(), |state| state.to_string()),
                ]);
            }
            table.print();
            println!("{} schedule(s)", schedules.len());
        }
        ScheduleCommand::Show { name, server } => {
            let client = server.client()?;
            let schedule = client.get(&path(&name)).await?;
            if server.json {
                print_json(&schedule);
            } else {
                print_schedule(&decode(&schedule, "GET /v1/schedules/{name}")?);
            }
        }
        ScheduleCommand::Set(args) => {
            let mut job = json!({"kind": args.kind});
            if let Some(payload) = &args.payload {
                job["payload"] = serde_json::from_str(payload)
                    .with_context(|| format!("--payload is not valid JSON: {payload:?}"))?;
            }
            let fields = [
                ("queue", args.queue.map(Value::from)),
                ("priority", args.priority.map(Value::from)),
                ("max_attempts", args.max_attempts.map(Value::from)),
                ("timeout_ms", args.timeout_ms.map(Value::from)),
                ("tenant", args.tenant.map(Value::from)),
            ];
            for (field, value) in fields {
                if let Some(value) = value {
                    job[field] = value;
                }
            }
            if !args.tags.is_empty() {
                job["tags"] = json!(args.tags);
            }
            let mut body = json!({"job": job});
            if let Some(cron) = args.cron {
                body["cron"] = json!(cron);
            }
            if let Some(every) = args.every {
                body["every"] = json!(every);
            }
            if let Some(timezone) = args.timezone {
                body["timezone"] = json!(timezone);
            }
            if let Some(overlap) = args.overlap {
                body["overlap"] = json!(match overlap {
                    OverlapArg::Skip => "skip",
                    OverlapArg::Allow => "allow",
                });
            }
            if let Some(missed) = args.missed {
                body["missed"] = json!(match missed {
                    MissedArg::Skip => "skip",
                    MissedArg::CatchUp => "catch_up",
                });
            }
            if let Some(max) = args.max_catch_up {
                body["max_catch_up"] = json!(max);
            }
            let client = args.server.client()?;
            let (_, schedule) = client
                .call(Method::PUT, &path(&args.name), Some(&body))
                .await?;
            if args.server.json {
                print_json(&schedule);
            } else {
                let schedule: ScheduleAnswer = decode(&schedule, "PUT /v1/schedules/{name}")?;
                println!(
                    "schedule {} set; next run {}",
                    schedule.name,
                    optional_stamp(schedule.next_run_at.as_ref())
                );
            }
        }
        ScheduleCommand::Runs {
            name,
            limit,
            server,
        } => {
            let client = server.client()?;
            let answer = client
                .get(&format!("{}/runs?limit={limit}", path(&name)))
                .await?;
            if server.json {
                print_json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            let runs = decode::<RunList>(&answer, "GET /v1/schedules/{name}/runs")?.runs;
            if !runs.is_empty() {
                runs_table(&runs).print();
            }
            println!("{} run(s) shown", runs.len());
        }
        ScheduleCommand::Delete { name, server } => {
            let client = server.client()?;
            client.call(Method::DELETE, &path(&name), None).await?;
            if server.json {
                print_json(&json!({"deleted": name}));
            } else {
                println!("schedule {name} deleted");
            }
        }
        ScheduleCommand::Pause { name, server } => set_paused(&name, &server, true).await?,
        ScheduleCommand::Resume { name, server } => set_paused(&name, &server, false).await?,
        ScheduleCommand::Trigger { name, server } => {
            let client = server.client()?;
            let (_, run) = client
                .call(
                    Method::POST,
                    &format!("{}/trigger", path(&name)),
                    Some(&json!({})),
                )
                .await?;
            if server.json {
                print_json(&run);
            } else {
                println!(
                    "schedule {name} triggered: job {} ({}) enqueued into {}",
                    run["id"].as_str().unwrap_or("?"),
                    run["job"].as_str().unwrap_or("?"),
                    run["queue"].as_str().unwrap_or("?")
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `conveyor schedule pause|resume NAME`.
async fn set_paused(name: &str, server: &ServerArg, pausing: bool) -> anyhow::Result<()> {
    let action = if pausing { "pause" } else { "resume" };
    let (_, view) = server
        .client()?
        .call(
            Method::POST,
            &format!("{}/{action}", path(name)),
            Some(&json!({})),
        )
        .await?;
    if server.json {
        print_json(&view);
    } else if pausing {
        println!(
            "schedule {name} paused: it fires nothing until `conveyor schedule resume {name}`"
        );
    } else {
        let next = view["next_run_at"].as_str().unwrap_or("none");
        println!("schedule {name} resumed; next run {next}");
    }
    Ok(())
}
