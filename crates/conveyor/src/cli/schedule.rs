//! `conveyor schedule ...`: cron schedules through the server's API.

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;

use super::ServerArg;

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
    #[arg(long)]
    cron: String,
    /// IANA time zone the expression is read in (default UTC), e.g. Europe/Berlin.
    #[arg(long)]
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

fn text<'a>(value: &'a Value, or: &'a str) -> &'a str {
    value.as_str().unwrap_or(or)
}

/// `missed` as one word: `skip`, or `catch_up(N)`.
fn missed(schedule: &Value) -> String {
    match schedule["missed"].as_str() {
        Some("catch_up") => format!("catch_up({})", schedule["max_catch_up"]),
        other => other.unwrap_or("-").to_string(),
    }
}

/// A run in one line: tick, status, job and its state, and why when it did not enqueue.
fn run_line(run: &Value) -> String {
    let catch_up = if run["catch_up"] == true {
        " (catch-up)"
    } else {
        ""
    };
    format!(
        "{}  {:<16} {:<36} {:<10}{catch_up} {}",
        text(&run["tick"], "?"),
        text(&run["status"], "?"),
        text(&run["job_id"], "-"),
        text(&run["job_state"], "-"),
        text(&run["detail"], "")
    )
}

fn print_schedule(schedule: &Value) {
    let job = &schedule["job"];
    for (label, value) in [
        ("name", text(&schedule["name"], "?").to_string()),
        ("cron", text(&schedule["cron"], "?").to_string()),
        ("timezone", text(&schedule["timezone"], "?").to_string()),
        (
            "job",
            format!(
                "{} in {}",
                text(&job["kind"], "?"),
                text(&job["queue"], "?")
            ),
        ),
        ("payload", job["payload"].to_string()),
        ("overlap", text(&schedule["overlap"], "-").to_string()),
        ("missed", missed(schedule)),
        ("next run", text(&schedule["next_run_at"], "-").to_string()),
        ("last tick", text(&schedule["last_tick"], "-").to_string()),
        ("updated", text(&schedule["updated_at"], "-").to_string()),
    ] {
        println!("{label:>10}: {value}");
    }
    let runs = schedule["recent_runs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    println!("{:>10}: {}", "runs", runs.len());
    for run in &runs {
        println!("{:>10}  {}", "", run_line(run));
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
            let schedules = answer["schedules"].as_array().cloned().unwrap_or_default();
            println!(
                "{:<24} {:<16} {:<16} {:<20} {:<24} {:<16} LAST JOB",
                "NAME", "CRON", "TIMEZONE", "KIND", "NEXT RUN", "LAST RUN"
            );
            for schedule in &schedules {
                let last = &schedule["last_run"];
                println!(
                    "{:<24} {:<16} {:<16} {:<20} {:<24} {:<16} {}",
                    text(&schedule["name"], "?"),
                    text(&schedule["cron"], "?"),
                    text(&schedule["timezone"], "?"),
                    text(&schedule["job"]["kind"], "?"),
                    text(&schedule["next_run_at"], "-"),
                    text(&last["status"], "-"),
                    text(&last["job_state"], "-"),
                );
            }
            println!("{} schedule(s)", schedules.len());
        }
        ScheduleCommand::Show { name, server } => {
            let client = server.client()?;
            let schedule = client.get(&path(&name)).await?;
            if server.json {
                print_json(&schedule);
            } else {
                print_schedule(&schedule);
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
            let mut body = json!({"cron": args.cron, "job": job});
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
                println!(
                    "schedule {} set; next run {}",
                    text(&schedule["name"], "?"),
                    text(&schedule["next_run_at"], "-")
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
            let runs = answer["runs"].as_array().cloned().unwrap_or_default();
            for run in &runs {
                println!("{}", run_line(run));
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
    }
    Ok(ExitCode::SUCCESS)
}
