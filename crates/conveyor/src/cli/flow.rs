//! `conveyor flow ...`: workflows through the server's API.

use anyhow::Context;
use clap::Subcommand;
use serde_json::{json, Value};
use std::process::ExitCode;

use super::ServerArg;
use crate::cli::http::{decode, stamp};
use crate::cli::table::Table;
use conveyor::workflow::{FlowView, StepView};
use conveyor_server::api::{CreatedFlow, FlowPage, SignalResponse};

#[derive(Subcommand, Debug)]
pub(crate) enum FlowCommand {
    /// Create a flow from a JSON file (`-` for standard input) holding the body of
    /// `POST /v1/flows`: {"name", "steps": [{"name", "job": {...}, "after": [...]}, ...]}.
    Create {
        file: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// One flow: its state and every step (state, parents, attempts, result or error).
    Show {
        id: String,
        /// Wait up to this many seconds for the flow to finish before showing it.
        #[arg(long)]
        wait: Option<u64>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Flows newest first, with how many steps are in each state.
    List {
        /// running, completed, failed, compensating, compensated or cancelled.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        name: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Cancel every unfinished step of a flow (running ones lose their lease).
    Cancel {
        id: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Deliver a signal to the flow's step waiting for it; its payload becomes the step's result.
    Signal {
        id: String,
        signal: String,
        /// JSON payload.
        #[arg(long)]
        payload: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
}

fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// A path segment as typed; anything but an id's characters is escaped so the server, not the
/// URL, refuses it.
fn segment(raw: &str) -> String {
    raw.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn wire_name(value: impl serde::Serialize) -> String {
    match serde_json::to_value(value) {
        Ok(Value::String(name)) => name,
        _ => "?".to_string(),
    }
}

/// A value shortened for one line.
fn brief(value: &Value) -> String {
    let text = value.to_string();
    if text.chars().count() > 60 {
        text.chars().take(57).collect::<String>() + "..."
    } else {
        text
    }
}

/// A step's row: name, state, what it does, its parents, attempts, and result or error.
fn step_row(step: &StepView) -> [String; 6] {
    let what = match (&step.kind, &step.wait) {
        (Some(kind), _) => format!("job {kind}"),
        (None, Some(wait)) => format!("wait {}", wait.signal),
        _ => "-".to_string(),
    };
    let after = if step.after.is_empty() {
        "-".to_string()
    } else {
        step.after.join(",")
    };
    let outcome = match (&step.result, &step.error, &step.progress) {
        (_, Some(error), _) => format!("{}: {}", error.class, error.message),
        (Some(result), _, _) => brief(result),
        (None, None, Some(progress)) => format!("{}%", progress.percent),
        _ => String::new(),
    };
    let compensation = step
        .compensation
        .map(|c| format!(" [compensation {}]", wire_name(c)))
        .unwrap_or_default();
    [
        step.name.clone(),
        step.state.as_str().to_string(),
        what,
        after,
        step.attempts.to_string(),
        format!("{outcome}{compensation}").trim_start().to_string(),
    ]
}

fn print_flow(flow: &FlowView) {
    println!(
        "flow {} ({})",
        flow.id,
        flow.name.as_deref().unwrap_or("unnamed")
    );
    println!("  state: {}", flow.state);
    if let Some(step) = &flow.failed_step {
        println!("  failed at: {step}");
    }
    println!("  on failure: {}", wire_name(flow.on_failure));
    println!("  created: {}", stamp(&flow.created_at));
    if let Some(at) = &flow.finished_at {
        println!("  finished: {}", stamp(at));
    }
    let mut table =
        Table::new(["STEP", "STATE", "DOES", "AFTER", "TRY", "RESULT / ERROR"]).right([4]);
    for step in &flow.steps {
        table.row(step_row(step));
    }
    table.print_indented("  ");
}

pub(crate) async fn run(command: FlowCommand) -> anyhow::Result<ExitCode> {
    match command {
        FlowCommand::Create { file, server } => {
            let text = if file == "-" {
                std::io::read_to_string(std::io::stdin()).context("reading the flow from stdin")?
            } else {
                std::fs::read_to_string(&file)
                    .with_context(|| format!("reading the flow from {file:?}"))?
            };
            let body: Value = serde_json::from_str(&text)
                .with_context(|| format!("{file:?} is not valid JSON"))?;
            let client = server.client()?;
            let (_, answer) = client.post("/v1/flows", &body).await?;
            if server.json {
                print_json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            let created: CreatedFlow = decode(&answer, "POST /v1/flows")?;
            let verb = if created.duplicate {
                "exists"
            } else {
                "created"
            };
            println!("flow {} {verb}", created.id);
            for (step, job) in &created.steps {
                println!("  {step:<20} job {job}");
            }
        }
        FlowCommand::Show { id, wait, server } => {
            let client = server.client()?;
            let mut path = format!("/v1/flows/{}", segment(&id));
            if let Some(secs) = wait {
                path.push_str(&format!("?wait_ms={}", secs.saturating_mul(1000)));
            }
            let answer = client.get(&path).await?;
            if server.json {
                print_json(&answer);
            } else {
                print_flow(&decode(&answer, "GET /v1/flows/{id}")?);
            }
        }
        FlowCommand::List {
            state,
            name,
            limit,
            server,
        } => {
            let mut query = vec![format!("limit={limit}")];
            if let Some(state) = state {
                query.push(format!("state={}", segment(&state)));
            }
            if let Some(name) = name {
                query.push(format!("name={}", segment(&name)));
            }
            let client = server.client()?;
            let answer = client
                .get(&format!("/v1/flows?{}", query.join("&")))
                .await?;
            if server.json {
                print_json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            let page: FlowPage = decode(&answer, "GET /v1/flows")?;
            let mut table = Table::new(["ID", "NAME", "STATE", "CREATED", "STEPS"]);
            for flow in &page.flows {
                let counts: Vec<String> = flow
                    .step_counts
                    .iter()
                    .map(|(state, n)| format!("{state}={n}"))
                    .collect();
                table.row([
                    flow.id.to_string(),
                    flow.name.clone().unwrap_or_else(|| "-".to_string()),
                    flow.state.as_str().to_string(),
                    stamp(&flow.created_at),
                    counts.join(" "),
                ]);
            }
            table.print();
            println!("{} flow(s)", page.flows.len());
        }
        FlowCommand::Cancel { id, server } => {
            let client = server.client()?;
            let (_, answer) = client
                .post(&format!("/v1/flows/{}/cancel", segment(&id)), &json!({}))
                .await?;
            if server.json {
                print_json(&answer);
            } else {
                let flow: FlowView = decode(&answer, "POST /v1/flows/{id}/cancel")?;
                println!("flow {} {}", flow.id, flow.state);
            }
        }
        FlowCommand::Signal {
            id,
            signal,
            payload,
            server,
        } => {
            let mut body = json!({ "signal": signal });
            if let Some(payload) = &payload {
                body["payload"] = serde_json::from_str(payload)
                    .with_context(|| format!("--payload is not valid JSON: {payload:?}"))?;
            }
            let client = server.client()?;
            let (_, answer) = client
                .post(&format!("/v1/flows/{}/signal", segment(&id)), &body)
                .await?;
            if server.json {
                print_json(&answer);
            } else {
                let response: SignalResponse = decode(&answer, "POST /v1/flows/{id}/signal")?;
                println!("signal {signal}: {}", wire_name(response.outcome));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
