//! `conveyor source ...`: the cluster's event sources, through the server's API.

use anyhow::Context;
use clap::Subcommand;
use reqwest::Method;
use serde_json::Value;
use std::process::ExitCode;

use super::ServerArg;
use crate::cli::kind::{print_json, segment};
use crate::cli::table::Table;

#[derive(Subcommand, Debug)]
pub(crate) enum SourceCommand {
    /// Create or replace a source: a broker whose messages become jobs, from a JSON or TOML
    /// document (`--file`, `-` for standard input) or inline JSON (`--spec`), e.g.
    /// `{"type": "redis_stream", "url": "redis://127.0.0.1:6379", "stream": "orders",
    /// "group": "conveyor", "job": {"kind": "order.placed", "queue": "orders"}}`. Types:
    /// redis_stream, amqp, nats, mqtt, sqs, kafka (see the guide's Event sources page). Every
    /// server of the cluster starts reading it within a second.
    Set {
        name: String,
        #[arg(
            long,
            value_name = "FILE",
            conflicts_with = "spec",
            required_unless_present = "spec"
        )]
        file: Option<String>,
        /// The source as JSON, instead of a file.
        #[arg(long, value_name = "JSON")]
        spec: Option<String>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Every source, with its state and counts on the server asked.
    List {
        #[command(flatten)]
        server: ServerArg,
    },
    /// One source: its configuration (passwords hidden), state, last error, counts and lag.
    Show {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Stop reading a source on every server (what the broker holds waits there).
    Pause {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Read a paused source again.
    Resume {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Remove a source (its jobs stay; the broker keeps its consumer group).
    Delete {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// A source document from a file (TOML when the name ends in `.toml`, else JSON; `-` reads
/// JSON from standard input) or inline JSON.
pub(crate) fn document(file: Option<&str>, spec: Option<&str>) -> anyhow::Result<Value> {
    if let Some(spec) = spec {
        return serde_json::from_str(spec).context("--spec is not valid JSON");
    }
    let Some(file) = file else {
        anyhow::bail!("give --file FILE or --spec JSON");
    };
    let text = if file == "-" {
        std::io::read_to_string(std::io::stdin()).context("reading the source from stdin")?
    } else {
        std::fs::read_to_string(file).with_context(|| format!("reading {file:?}"))?
    };
    if file.ends_with(".toml") {
        let value: toml::Value =
            toml::from_str(&text).with_context(|| format!("{file:?} is not valid TOML"))?;
        return serde_json::to_value(value).context("converting the TOML to JSON");
    }
    serde_json::from_str(&text).with_context(|| format!("{file:?} is not valid JSON"))
}

/// Where a source's messages go: a queue (with the job's kind) or an event's name; either may
/// be fixed or taken from each message (`{"from": ...}`).
fn target(source: &Value) -> String {
    let part = |value: &Value| match value {
        Value::String(text) => text.clone(),
        Value::Object(from) => from
            .get("from")
            .and_then(Value::as_str)
            .map_or_else(|| "?".to_string(), |from| format!("<{from}>")),
        _ => "?".to_string(),
    };
    if let Some(event) = source.get("event").filter(|event| !event.is_null()) {
        return format!("event {}", part(&event["name"]));
    }
    let job = &source["job"];
    let queue = match &job["queue"] {
        Value::Null => conveyor_core::DEFAULT_QUEUE.to_string(),
        queue => part(queue),
    };
    format!("{queue} ({})", part(&job["kind"]))
}

/// A source's one-line summary: name, type, target, state, counts.
fn row(source: &Value) -> [String; 8] {
    let text = |key: &str| match &source[key] {
        Value::String(text) => text.clone(),
        Value::Null => "-".to_string(),
        other => other.to_string(),
    };
    [
        text("name"),
        text("type"),
        target(source),
        text("state"),
        text("received"),
        text("enqueued"),
        text("invalid"),
        text("lag"),
    ]
}

fn describe(source: &Value) {
    let [name, kind, target, state, received, enqueued, invalid, lag] = row(source);
    println!("source {name} ({kind}, into {target}): {state}");
    println!("  received {received}, enqueued {enqueued}, invalid {invalid}, lag {lag}");
    if let Some(error) = source["last_error"].as_str() {
        println!("  last error: {error}");
    }
}

pub(crate) async fn run(command: SourceCommand) -> anyhow::Result<ExitCode> {
    match command {
        SourceCommand::Set {
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
                    &format!("/v1/sources/{}", segment(&name)),
                    Some(&body),
                )
                .await?;
            if server.json {
                print_json(&answer);
            } else {
                println!("source {name} set");
                describe(&answer);
            }
        }
        SourceCommand::List { server } => {
            let answer = server.client()?.get("/v1/sources").await?;
            if server.json {
                print_json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            let sources = answer["sources"].as_array().cloned().unwrap_or_default();
            if sources.is_empty() {
                println!("no sources (conveyor source set NAME --file FILE)");
            } else {
                let mut table = Table::new([
                    "NAME", "TYPE", "INTO", "STATE", "RECEIVED", "ENQUEUED", "INVALID", "LAG",
                ]);
                for source in &sources {
                    table.row(row(source));
                }
                table.print();
            }
        }
        SourceCommand::Show { name, server } => {
            let answer = server
                .client()?
                .get(&format!("/v1/sources/{}", segment(&name)))
                .await?;
            if server.json {
                print_json(&answer);
            } else {
                describe(&answer);
                print_json(&answer);
            }
        }
        SourceCommand::Pause { name, server } => switch(&name, &server, "pause").await?,
        SourceCommand::Resume { name, server } => switch(&name, &server, "resume").await?,
        SourceCommand::Delete { name, server } => {
            server
                .client()?
                .call(
                    Method::DELETE,
                    &format!("/v1/sources/{}", segment(&name)),
                    None,
                )
                .await?;
            println!("source {name} deleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Pauses or resumes a source (`action`: the route's last segment).
async fn switch(name: &str, server: &ServerArg, action: &str) -> anyhow::Result<()> {
    let (_, answer) = server
        .client()?
        .call(
            Method::POST,
            &format!("/v1/sources/{}/{action}", segment(name)),
            None,
        )
        .await?;
    if server.json {
        print_json(&answer);
    } else {
        describe(&answer);
    }
    Ok(())
}
