//! `conveyor event send` and `conveyor subscription ...`: one event, many jobs and flows,
//! through the server's API.

use anyhow::Context;
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;

use super::ServerArg;
use crate::cli::kind::{print_json, segment};
use crate::cli::source::document;
use crate::cli::table::Table;

#[derive(Subcommand, Debug)]
pub(crate) enum EventCommand {
    /// Send an event: every subscription to its name makes a job or a flow of it, all in one
    /// transaction. Prints each job and flow made.
    Send {
        name: String,
        /// The payload, as JSON (default `{}`).
        #[arg(long, value_name = "JSON")]
        payload: Option<String>,
        /// Your id for the event: sent again with the same id, it makes no new jobs or flows.
        #[arg(long)]
        id: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
}

#[derive(Subcommand, Debug)]
pub(crate) enum SubscriptionCommand {
    /// Create or replace a subscription, from a JSON or TOML file (`--file`, `-` for standard
    /// input) or inline JSON (`--spec`): `{"event": "user.signed_up", "job": {"kind":
    /// "email.welcome", "queue": "mail"}, "filter": {"plan": "pro"}}`. In place of `job`,
    /// `flow` makes a flow: the body `POST /v1/flows` takes (`name`, `steps`, `on_failure`,
    /// `tags`), each step's job taking the event's payload unless it gives its own.
    Set {
        name: String,
        #[arg(
            long,
            value_name = "FILE",
            conflicts_with = "spec",
            required_unless_present = "spec"
        )]
        file: Option<String>,
        /// The subscription as JSON, instead of a file.
        #[arg(long, value_name = "JSON")]
        spec: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Every subscription.
    List {
        #[command(flatten)]
        server: ServerArg,
    },
    /// One subscription.
    Show {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Remove a subscription (the jobs it made stay).
    Delete {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

pub(crate) async fn run_event(command: EventCommand) -> anyhow::Result<ExitCode> {
    let EventCommand::Send {
        name,
        payload,
        id,
        server,
    } = command;
    let payload: Value = match payload {
        Some(text) => serde_json::from_str(&text).context("--payload is not valid JSON")?,
        None => json!({}),
    };
    let mut body = json!({"name": name, "payload": payload});
    if let Some(id) = id {
        body["id"] = json!(id);
    }
    let (_, answer) = server
        .client()?
        .call(Method::POST, "/v1/events", Some(&body))
        .await?;
    if server.json {
        print_json(&answer);
        return Ok(ExitCode::SUCCESS);
    }
    let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
    let flows = answer["flows"].as_array().cloned().unwrap_or_default();
    println!(
        "event {} ({}): {} job(s), {} flow(s)",
        answer["name"].as_str().unwrap_or(""),
        answer["id"].as_str().unwrap_or(""),
        jobs.len(),
        flows.len()
    );
    let made = jobs
        .iter()
        .map(|job| (job, "job_id", "job"))
        .chain(flows.iter().map(|flow| (flow, "flow_id", "flow")));
    for (made, id, what) in made {
        println!(
            "  {}  {what} {}{}",
            made["subscription"].as_str().unwrap_or(""),
            made[id].as_str().unwrap_or(""),
            if made["duplicate"] == true {
                "  (already made)"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::SUCCESS)
}

pub(crate) async fn run_subscription(command: SubscriptionCommand) -> anyhow::Result<ExitCode> {
    match command {
        SubscriptionCommand::Set {
            name,
            file,
            spec,
            server,
        } => {
            let body = document(file.as_deref(), spec.as_deref())?;
            let (_, answer) = server
                .client()?
                .call(
                    Method::PUT,
                    &format!("/v1/subscriptions/{}", segment(&name)),
                    Some(&body),
                )
                .await?;
            if server.json {
                print_json(&answer);
            } else {
                println!(
                    "subscription {name} set: {} -> {}",
                    answer["event"].as_str().unwrap_or(""),
                    makes(&answer)
                );
            }
        }
        SubscriptionCommand::List { server } => {
            let answer = server.client()?.get("/v1/subscriptions").await?;
            if server.json {
                print_json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            let subscriptions = answer["subscriptions"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            if subscriptions.is_empty() {
                println!("no subscriptions (conveyor subscription set NAME --spec JSON)");
            } else {
                let mut table = Table::new(["NAME", "EVENT", "MAKES", "QUEUE", "FILTER"]);
                for s in &subscriptions {
                    let queue = match s.get("flow") {
                        Some(_) => "-",
                        None => s["job"]["queue"].as_str().unwrap_or("default"),
                    };
                    table.row([
                        s["name"].as_str().unwrap_or("").to_string(),
                        s["event"].as_str().unwrap_or("").to_string(),
                        makes(s),
                        queue.to_string(),
                        s.get("filter").map_or("-".to_string(), Value::to_string),
                    ]);
                }
                table.print();
            }
        }
        SubscriptionCommand::Show { name, server } => {
            let answer = server
                .client()?
                .get(&format!("/v1/subscriptions/{}", segment(&name)))
                .await?;
            print_json(&answer);
        }
        SubscriptionCommand::Delete { name, server } => {
            server
                .client()?
                .call(
                    Method::DELETE,
                    &format!("/v1/subscriptions/{}", segment(&name)),
                    None,
                )
                .await?;
            println!("subscription {name} deleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What a subscription makes, in a word or two: its job's kind, or `flow NAME`.
fn makes(subscription: &Value) -> String {
    match subscription.get("flow") {
        Some(flow) => format!(
            "flow {}",
            flow["name"]
                .as_str()
                .or(subscription["name"].as_str())
                .unwrap_or("")
        ),
        None => subscription["job"]["kind"]
            .as_str()
            .unwrap_or("")
            .to_string(),
    }
}
