//! `conveyor enqueue`: one job, from the command line or stdin.

use crate::cli::http::decode;
use anyhow::Context;
use clap::Args;
use conveyor_server::api::EnqueuedJob;
use serde_json::{json, Value};
use std::process::ExitCode;

use super::print_json;
use crate::cli::ServerArg;

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
    /// Not started within this many milliseconds, the job expires instead of running.
    #[arg(long, conflicts_with = "expires_at")]
    ttl_ms: Option<u64>,
    /// Not started by this RFC 3339 time, the job expires instead of running.
    #[arg(long)]
    expires_at: Option<String>,
    /// W3C trace context of the span enqueueing the job (00-<trace id>-<span id>-<flags>).
    #[arg(long)]
    traceparent: Option<String>,
    #[arg(long, requires = "traceparent")]
    tracestate: Option<String>,
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
        ("ttl_ms", args.ttl_ms.map(Value::from)),
        ("expires_at", args.expires_at.map(Value::from)),
        ("traceparent", args.traceparent.map(Value::from)),
        ("tracestate", args.tracestate.map(Value::from)),
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
    let queue = body["queue"].as_str().unwrap_or(conveyor::DEFAULT_QUEUE);
    warn_if_unserved(&client, queue).await;
    if args.server.json {
        print_json(&job);
    } else {
        let job: EnqueuedJob = decode(&job, "POST /v1/jobs")?;
        let duplicate = if job.duplicate() {
            " (duplicate: existing job returned)"
        } else {
            ""
        };
        let state = match &job {
            EnqueuedJob::Readable { job, .. } => job.state.to_string(),
            // Another producer's job, found through a shared key: only its id is shown.
            EnqueuedJob::Foreign { .. } => "?".to_string(),
        };
        println!("{} {state}{duplicate}", job.id());
    }
    Ok(ExitCode::SUCCESS)
}

/// Warns (on stderr) when no live worker serves `queue`: the job is stored but will wait. Only
/// a hint: a token that may not list workers (a producer's) or a server that cannot answer
/// just skips it.
async fn warn_if_unserved(client: &crate::cli::http::ApiClient, queue: &str) {
    let Ok(answer) = client.get("/v1/workers").await else {
        return;
    };
    let Ok(listed) = decode::<conveyor_server::api::WorkersResponse>(&answer, "GET /v1/workers")
    else {
        return;
    };
    let served = listed.workers.iter().any(|worker| {
        worker.state == conveyor::WorkerState::Alive && worker.queues.iter().any(|q| q == queue)
    });
    if !served {
        eprintln!(
            "warning: no live worker serves queue {queue:?} (see `conveyor workers`); the job \
             waits until one does"
        );
    }
}
