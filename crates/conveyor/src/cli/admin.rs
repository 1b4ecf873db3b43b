//! Client commands that talk to a running server: enqueue, job, dead, queues.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;

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
    unique: UniqueArgs,
    #[command(flatten)]
    server: ServerArg,
}

/// Unique enqueue: while a job of the same kind, queue and payload (or the chosen fields of it)
/// exists in one of the states, the server answers it instead of storing a new one. Any
/// `--unique-*` option implies `--unique`.
#[derive(Args, Debug, Default)]
pub(crate) struct UniqueArgs {
    /// Unique by kind, queue and the whole payload, while scheduled, available, running or
    /// retryable (unless --unique-states says otherwise).
    #[arg(long)]
    unique: bool,
    /// Unique by these top-level payload fields only, e.g. `customer_id,report`.
    #[arg(long, value_delimiter = ',', value_name = "FIELDS")]
    unique_args: Option<Vec<String>>,
    /// Only jobs created within this many seconds count.
    #[arg(long, value_name = "SECS")]
    unique_period_secs: Option<u64>,
    /// States in which an existing job blocks the new one, e.g. `available,running,completed`.
    #[arg(long, value_delimiter = ',', value_name = "STATES")]
    unique_states: Option<Vec<String>>,
    /// The same job in another queue counts too.
    #[arg(long)]
    unique_across_queues: bool,
}

impl UniqueArgs {
    /// The request's `unique` object, or `None` when no unique option was given. The server
    /// validates it (unknown states, empty field lists, a zero period).
    fn to_json(&self) -> Option<Value> {
        let wanted = self.unique
            || self.unique_args.is_some()
            || self.unique_period_secs.is_some()
            || self.unique_states.is_some()
            || self.unique_across_queues;
        if !wanted {
            return None;
        }
        let mut unique = json!({});
        if let Some(args) = &self.unique_args {
            unique["args"] = json!(args);
        }
        if let Some(secs) = self.unique_period_secs {
            unique["period_ms"] = json!(secs.saturating_mul(1000));
        }
        if let Some(states) = &self.unique_states {
            unique["states"] = json!(states);
        }
        if self.unique_across_queues {
            unique["by_queue"] = json!(false);
        }
        Some(unique)
    }
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
    if let Some(unique) = args.unique.to_json() {
        body["unique"] = unique;
    }
    let client = args.server.client()?;
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
    let client = server.client()?;
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
            let client = server.client()?;
            let (_, answer) = client.post("/v1/dead/replay", &body).await?;
            if server.json {
                print_json(&answer);
            } else {
                println!("replayed {} job(s)", answer["replayed"]);
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
        /// At most this many jobs of one tenant run at once.
        #[arg(long)]
        per_key_concurrency_limit: Option<Limit>,
        /// At most COUNT job starts per PERIOD: `20/1s`, `100/500ms`, `1000/1m` (or `none`).
        #[arg(long)]
        rate_limit: Option<Rate>,
        /// The same per tenant.
        #[arg(long)]
        per_key_rate_limit: Option<Rate>,
        /// This queue's share of a worker's capacity when it serves several queues.
        #[arg(long)]
        weight: Option<Limit>,
        /// Delete completed and cancelled jobs this many seconds after they finish (`none`:
        /// the server's default).
        #[arg(long)]
        completed_retention_secs: Option<Limit>,
        /// Delete dead jobs this many seconds after they die (`none`: the server's default).
        #[arg(long)]
        dead_retention_secs: Option<Limit>,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// A rate limit on the command line: `COUNT/PERIOD` with the period in ms, s, m or h, or
/// `none` to clear it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate(Option<(u64, u64)>);

impl Rate {
    /// The limit given, `None` for `none`.
    pub(crate) fn limit(self) -> Option<conveyor::RateLimit> {
        self.0
            .map(|(count, period_ms)| conveyor::RateLimit { count, period_ms })
    }
}

impl std::str::FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(Rate(None));
        }
        let bad =
            || format!("{s:?} is not COUNT/PERIOD (e.g. 20/1s, 100/500ms, 1000/1m) or `none`");
        let (count, period) = s.split_once('/').ok_or_else(bad)?;
        let count: u64 = count.trim().parse().map_err(|_| bad())?;
        let period = period.trim();
        let digits = period.trim_end_matches(|c: char| c.is_ascii_alphabetic());
        let unit_ms: u64 = match &period[digits.len()..] {
            "ms" => 1,
            "s" | "" => 1000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(bad()),
        };
        let amount: u64 = if digits.is_empty() {
            1
        } else {
            digits.parse().map_err(|_| bad())?
        };
        let period_ms = amount.checked_mul(unit_ms).ok_or_else(bad)?;
        if count == 0 || period_ms == 0 {
            return Err(format!("{s:?}: count and period must be positive"));
        }
        Ok(Rate(Some((count, period_ms))))
    }
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
            per_key_concurrency_limit,
            rate_limit,
            per_key_rate_limit,
            weight,
            completed_retention_secs,
            dead_retention_secs,
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
            if let Some(Limit(limit)) = per_key_concurrency_limit {
                change["per_key_concurrency_limit"] = json!(limit);
            }
            if let Some(Limit(weight)) = weight {
                change["weight"] = json!(weight);
            }
            if let Some(Limit(secs)) = completed_retention_secs {
                change["completed_retention_secs"] = json!(secs);
            }
            if let Some(Limit(secs)) = dead_retention_secs {
                change["dead_retention_secs"] = json!(secs);
            }
            for (field, rate) in [
                ("rate_limit", rate_limit),
                ("per_key_rate_limit", per_key_rate_limit),
            ] {
                if let Some(Rate(rate)) = rate {
                    change[field] = json!(rate
                        .map(|(count, period_ms)| json!({"count": count, "period_ms": period_ms})));
                }
            }
            if change.as_object().is_some_and(|o| o.is_empty()) {
                bail!(
                    "nothing to set: give --max-depth, --max-depth-per-tenant, \
                     --concurrency-limit, --per-key-concurrency-limit, --rate-limit, \
                     --per-key-rate-limit, --weight, --completed-retention-secs or \
                     --dead-retention-secs"
                );
            }
            (name, server, Some(change))
        }
    };
    conveyor::validate::name("queue", &name)?;
    let client = server.client()?;
    let path = format!("/v1/queues/{name}");
    let settings = match change {
        Some(body) => client.call(Method::PUT, &path, Some(&body)).await?.1,
        None => client.get(&path).await?,
    };
    if server.json {
        print_json(&settings);
    } else {
        let limit = |v: &Value| v.as_u64().map_or("none".to_string(), |n| n.to_string());
        let rate = |v: &Value| match (v["count"].as_u64(), v["period_ms"].as_u64()) {
            (Some(count), Some(period_ms)) => format!("{count} per {period_ms} ms"),
            _ => "none".to_string(),
        };
        println!(
            "{}: {}; max depth {}; max depth per tenant {}; concurrency limit {}; \
             per-tenant concurrency limit {}; rate limit {}; per-tenant rate limit {}; weight {}",
            name,
            if settings["paused"] == true {
                "paused"
            } else {
                "running"
            },
            limit(&settings["max_depth"]),
            limit(&settings["max_depth_per_tenant"]),
            limit(&settings["concurrency_limit"]),
            limit(&settings["per_key_concurrency_limit"]),
            rate(&settings["rate_limit"]),
            rate(&settings["per_key_rate_limit"]),
            settings["weight"].as_u64().unwrap_or(1)
        );
    }
    Ok(ExitCode::SUCCESS)
}
