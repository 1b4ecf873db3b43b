//! Client commands that talk to a running server: enqueue, job, dead, queues.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;

use super::http::ApiClient;
use super::ServerArg;

#[derive(Args, Debug)]
pub(crate) struct EnqueueArgs {
    /// The job's kind (which handler runs it).
    kind: String,
    /// JSON payload, e.g. '{"user_id": 7}'. Use '-' to read it from stdin.
    #[arg(long, default_value = "{}")]
    payload: String,
    #[arg(long)]
    queue: Option<String>,
    /// Higher runs first.
    #[arg(long, allow_hyphen_values = true)]
    priority: Option<i32>,
    /// Run no sooner than this many milliseconds from now.
    #[arg(long)]
    delay_ms: Option<u64>,
    /// Run no sooner than this RFC 3339 time.
    #[arg(long)]
    run_at: Option<String>,
    #[arg(long)]
    max_attempts: Option<u32>,
    #[arg(long)]
    timeout_ms: Option<u64>,
    #[arg(long)]
    idempotency_key: Option<String>,
    /// Repeat for several tags.
    #[arg(long = "tag")]
    tags: Vec<String>,
    #[arg(long)]
    tenant: Option<String>,
    #[command(flatten)]
    server: ServerArg,
}

#[derive(Subcommand, Debug)]
pub(crate) enum JobCommand {
    /// Show a job with its error history.
    Show {
        id: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Cancel a job that has not finished.
    Cancel {
        id: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

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

#[derive(Args, Debug)]
pub(crate) struct QueuesArgs {
    /// Refresh every second until interrupted.
    #[arg(long)]
    watch: bool,
    #[command(flatten)]
    server: ServerArg,
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

pub(crate) async fn enqueue(args: EnqueueArgs) -> anyhow::Result<ExitCode> {
    let payload_text = if args.payload == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading payload from stdin")?
    } else {
        args.payload.clone()
    };
    let payload: Value = serde_json::from_str(&payload_text)
        .with_context(|| format!("--payload is not valid JSON: {payload_text:?}"))?;
    let mut body = json!({"kind": args.kind, "payload": payload});
    let fields = [
        ("queue", args.queue.map(Value::from)),
        ("priority", args.priority.map(Value::from)),
        ("delay_ms", args.delay_ms.map(Value::from)),
        ("run_at", args.run_at.map(Value::from)),
        ("max_attempts", args.max_attempts.map(Value::from)),
        ("timeout_ms", args.timeout_ms.map(Value::from)),
        ("idempotency_key", args.idempotency_key.map(Value::from)),
        ("tenant", args.tenant.map(Value::from)),
    ];
    for (name, value) in fields {
        if let Some(value) = value {
            body[name] = value;
        }
    }
    if !args.tags.is_empty() {
        body["tags"] = json!(args.tags);
    }
    let client = ApiClient::new(&args.server.server)?;
    let (_, job) = client.post("/v1/jobs", &body).await?;
    if args.server.json {
        print_json(&job);
    } else {
        let duplicate = if job["duplicate"].as_bool() == Some(true) {
            " (duplicate: existing job returned)"
        } else {
            ""
        };
        println!(
            "{} {}{duplicate}",
            job["id"].as_str().unwrap_or("?"),
            job["state"].as_str().unwrap_or("?")
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn check_id(id: &str) -> anyhow::Result<()> {
    if uuid::Uuid::parse_str(id).is_err() {
        bail!("{id:?} is not a job id (a UUID like 01937f6e-3c2a-7b1e-9f00-5a1b2c3d4e5f)");
    }
    Ok(())
}

fn print_job(job: &Value) {
    let field = |name: &str| match &job[name] {
        Value::Null => "-".to_string(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    for name in [
        "id",
        "kind",
        "queue",
        "state",
        "priority",
        "attempt",
        "max_attempts",
        "run_at",
        "created_at",
        "started_at",
        "finished_at",
        "tenant",
        "idempotency_key",
    ] {
        println!("{name:>16}: {}", field(name));
    }
    println!("{:>16}: {}", "payload", job["payload"]);
    if !job["result"].is_null() {
        println!("{:>16}: {}", "result", job["result"]);
    }
    let errors = job["errors"].as_array().cloned().unwrap_or_default();
    println!("{:>16}: {}", "errors", errors.len());
    for error in errors {
        println!(
            "{:>16}  attempt {} at {} [{}] {}",
            "",
            error["attempt"],
            error["at"].as_str().unwrap_or("?"),
            error["class"].as_str().unwrap_or("?"),
            error["message"].as_str().unwrap_or("")
        );
    }
}

pub(crate) async fn job(command: JobCommand) -> anyhow::Result<ExitCode> {
    let (id, server, cancel) = match command {
        JobCommand::Show { id, server } => (id, server, false),
        JobCommand::Cancel { id, server } => (id, server, true),
    };
    check_id(&id)?;
    let client = ApiClient::new(&server.server)?;
    let job = if cancel {
        client
            .post(&format!("/v1/jobs/{id}/cancel"), &json!({}))
            .await?
            .1
    } else {
        client.get(&format!("/v1/jobs/{id}")).await?
    };
    if server.json {
        print_json(&job);
    } else {
        print_job(&job);
    }
    Ok(ExitCode::SUCCESS)
}

fn query(pairs: &[(&str, Option<String>)]) -> String {
    let parts: Vec<String> = pairs
        .iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", urlencode(v))))
        .collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!("?{}", parts.join("&"))
    }
}

fn urlencode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) async fn dead(command: DeadCommand) -> anyhow::Result<ExitCode> {
    match command {
        DeadCommand::List {
            queue,
            kind,
            limit,
            server,
        } => {
            let client = ApiClient::new(&server.server)?;
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
            let jobs = page["jobs"].as_array().cloned().unwrap_or_default();
            println!(
                "{:<36}  {:<12} {:<20} {:>7}  LAST ERROR",
                "ID", "QUEUE", "KIND", "ATTEMPT"
            );
            for job in &jobs {
                let last = job["errors"]
                    .as_array()
                    .and_then(|e| e.last())
                    .cloned()
                    .unwrap_or(Value::Null);
                println!(
                    "{:<36}  {:<12} {:<20} {:>7}  [{}] {}",
                    job["id"].as_str().unwrap_or("?"),
                    job["queue"].as_str().unwrap_or("?"),
                    job["kind"].as_str().unwrap_or("?"),
                    job["attempt"].to_string(),
                    last["class"].as_str().unwrap_or("-"),
                    last["message"].as_str().unwrap_or("")
                );
            }
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
            let client = ApiClient::new(&server.server)?;
            let (_, answer) = client.post("/v1/dead/replay", &body).await?;
            if server.json {
                print_json(&answer);
            } else {
                println!("replayed {} job(s)", answer["replayed"]);
            }
        }
        DeadCommand::Discard { id, server } => {
            check_id(&id)?;
            let client = ApiClient::new(&server.server)?;
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

pub(crate) async fn queues(args: QueuesArgs) -> anyhow::Result<ExitCode> {
    let client = ApiClient::new(&args.server.server)?;
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

#[derive(Subcommand, Debug)]
pub(crate) enum QueueCommand {
    /// Show a queue's settings.
    Show {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Stop handing out the queue's jobs (enqueuing continues).
    Pause {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Hand out the queue's jobs again.
    Resume {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Change limits: a number sets one, `none` clears it.
    Set {
        name: String,
        /// Refuse enqueues (HTTP 429) while this many jobs are unfinished.
        #[arg(long)]
        max_depth: Option<Limit>,
        /// The same per tenant.
        #[arg(long)]
        max_depth_per_tenant: Option<Limit>,
        /// At most this many of the queue's jobs run at once, across all workers and servers.
        #[arg(long)]
        concurrency_limit: Option<Limit>,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// A limit on the command line: a positive number, or `none` to clear it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limit(Option<u64>);

impl std::str::FromStr for Limit {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(Limit(None));
        }
        match s.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Limit(Some(n))),
            _ => Err(format!("{s:?} is not a positive number or `none`")),
        }
    }
}

pub(crate) async fn queue(command: QueueCommand) -> anyhow::Result<ExitCode> {
    let (name, server, change) = match command {
        QueueCommand::Show { name, server } => (name, server, None),
        QueueCommand::Pause { name, server } => (name, server, Some(json!({"paused": true}))),
        QueueCommand::Resume { name, server } => (name, server, Some(json!({"paused": false}))),
        QueueCommand::Set {
            name,
            max_depth,
            max_depth_per_tenant,
            concurrency_limit,
            server,
        } => {
            let mut change = json!({});
            if let Some(Limit(limit)) = max_depth {
                change["max_depth"] = json!(limit);
            }
            if let Some(Limit(limit)) = max_depth_per_tenant {
                change["max_depth_per_tenant"] = json!(limit);
            }
            if let Some(Limit(limit)) = concurrency_limit {
                change["concurrency_limit"] = json!(limit);
            }
            if change.as_object().is_some_and(|o| o.is_empty()) {
                bail!("nothing to set: give --max-depth, --max-depth-per-tenant or --concurrency-limit");
            }
            (name, server, Some(change))
        }
    };
    conveyor::validate::name("queue", &name)?;
    let client = ApiClient::new(&server.server)?;
    let path = format!("/v1/queues/{name}");
    let settings = match change {
        Some(body) => client.call(Method::PUT, &path, Some(&body)).await?.1,
        None => client.get(&path).await?,
    };
    if server.json {
        print_json(&settings);
    } else {
        let limit = |v: &Value| v.as_u64().map_or("none".to_string(), |n| n.to_string());
        println!(
            "{}: {}; max depth {}; max depth per tenant {}; concurrency limit {}",
            name,
            if settings["paused"] == true {
                "paused"
            } else {
                "running"
            },
            limit(&settings["max_depth"]),
            limit(&settings["max_depth_per_tenant"]),
            limit(&settings["concurrency_limit"])
        );
    }
    Ok(ExitCode::SUCCESS)
}
