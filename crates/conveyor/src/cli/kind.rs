//! `conveyor kind ...`: payload schemas per job kind, through the server's API.

use anyhow::Context;
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;

use super::ServerArg;
use crate::cli::http::{decode, stamp};
use crate::cli::table::{ago, Table};
use conveyor::kinds::KindSettings;

#[derive(Subcommand, Debug)]
pub(crate) enum KindCommand {
    /// Set a kind's payload schema (JSON Schema 2020-12) from a file (`-` for standard input).
    /// Every enqueue of the kind is checked against it from then on. Refused, naming how many,
    /// when queued jobs of the kind would not pass, unless --force.
    Set {
        kind: String,
        #[arg(long, value_name = "FILE")]
        schema: Option<String>,
        /// The kind's circuit breaker as JSON (every field optional): `{"failure_ratio": 0.5,
        /// "min_calls": 10, "window_ms": 60000, "open_ms": 30000, "half_open_calls": 1,
        /// "pause_on_retry_after": true}`, or `none` to remove it.
        #[arg(long, value_name = "JSON")]
        circuit_breaker: Option<crate::cli::admin::queue::BreakerArg>,
        /// Your own version number of the schema, shown with it.
        #[arg(long)]
        version: Option<u32>,
        /// Named limits every job of the kind is subject to, comma-separated (`conveyor limit
        /// set`), or `none`.
        #[arg(long, value_name = "NAME,...")]
        limits: Option<crate::cli::limit::LimitNamesArg>,
        /// Jobs of the kind with the same key run one after another, in enqueue order: a key
        /// expression (`tenant`, `payload.account`), `EXPR:skip` to let a dead job's successors
        /// run, or `none`.
        #[arg(long, value_name = "EXPR[:skip]")]
        sequence: Option<crate::cli::limit::SequenceArg>,
        /// The kind's jobs go out in batches, to handlers that take them so (`handle_batch`):
        /// `{"max_size": 100, "max_wait_ms": 2000, "key": "payload.account"}` (`max_wait_ms`
        /// and `key` optional), or `none`.
        #[arg(long, value_name = "JSON")]
        batch: Option<BatchArg>,
        /// Set it even if queued jobs of the kind would not pass it.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Open or close the kind's circuit breaker by hand (holds the kind in every queue).
    Circuit {
        kind: String,
        action: crate::cli::admin::queue::CircuitAction,
        #[command(flatten)]
        circuit: crate::cli::admin::queue::CircuitArgs,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Every kind with a schema.
    List {
        #[command(flatten)]
        server: ServerArg,
    },
    /// One kind's schema.
    Show {
        kind: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Remove a kind's schema (its jobs stay).
    Delete {
        kind: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// A kind as a path segment: anything outside a name's characters is escaped, so the server
/// (not the URL) refuses it with a message naming `kind`.
pub(crate) fn segment(raw: &str) -> String {
    raw.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub(crate) fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// `--batch`: a kind's batch setting as JSON, checked here as the server would, or `none`.
#[derive(Debug, Clone)]
pub(crate) struct BatchArg(Value);

impl std::str::FromStr for BatchArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(BatchArg(Value::Null));
        }
        let spec: conveyor::batch::BatchSpec = serde_json::from_str(s).map_err(|e| {
            format!("{s:?} is not a batch ({e}); e.g. '{{\"max_size\": 100, \"max_wait_ms\": 2000}}' or `none`")
        })?;
        spec.validate("batch")
            .map_err(|e| format!("{}: {}", e.field, e.message))?;
        Ok(BatchArg(json!(spec)))
    }
}

/// A batch setting in a line: `100 jobs, up to 2000 ms, by payload.account`.
fn batch_text(batch: Option<&conveyor::batch::BatchSpec>) -> String {
    match batch {
        None => "none".to_string(),
        Some(spec) => {
            let mut text = format!("{} jobs, up to {} ms", spec.max_size, spec.max_wait_ms);
            if let Some(key) = &spec.key {
                text.push_str(&format!(", by {key}"));
            }
            text
        }
    }
}

/// A kind's row: name, schema version and size, and when it last changed.
fn summary(kind: &KindSettings) -> [String; 4] {
    let version = kind
        .version
        .map(|v| format!("v{v}"))
        .unwrap_or_else(|| "-".to_string());
    let schema = match &kind.schema {
        Some(schema) => format!("{} bytes", schema.to_string().len()),
        None => "none".to_string(),
    };
    [kind.kind.clone(), version, schema, ago(kind.updated_at)]
}

pub(crate) async fn run(command: KindCommand) -> anyhow::Result<ExitCode> {
    match command {
        KindCommand::Circuit {
            kind,
            action,
            circuit,
            server,
        } => {
            let path = format!("/v1/kinds/{}/circuit", segment(&kind));
            return crate::cli::admin::queue::circuit(
                &server,
                &path,
                &format!("kind {kind}"),
                action,
                circuit,
            )
            .await;
        }
        KindCommand::Set {
            kind,
            schema,
            circuit_breaker,
            version,
            limits,
            sequence,
            batch,
            force,
            server,
        } => {
            let mut body = json!({"force": force});
            if let Some(schema) = &schema {
                let text = if schema == "-" {
                    std::io::read_to_string(std::io::stdin())
                        .context("reading the schema from stdin")?
                } else {
                    std::fs::read_to_string(schema)
                        .with_context(|| format!("reading the schema from {schema:?}"))?
                };
                let schema_value: Value = serde_json::from_str(&text)
                    .with_context(|| format!("{schema:?} is not valid JSON"))?;
                body["schema"] = schema_value;
                body["version"] = json!(version);
            } else if let Some(version) = version {
                body["version"] = json!(version);
            }
            if let Some(breaker) = circuit_breaker {
                body["circuit_breaker"] = breaker.0;
            }
            if let Some(limits) = &limits {
                body["limits"] = limits.to_json();
            }
            if let Some(sequence) = &sequence {
                body["sequence"] = sequence.to_json();
            }
            if let Some(batch) = batch {
                body["batch"] = batch.0;
            }
            if schema.is_none()
                && body.get("circuit_breaker").is_none()
                && limits.is_none()
                && sequence.is_none()
                && body.get("batch").is_none()
            {
                anyhow::bail!(
                    "nothing to set: give --schema FILE, --circuit-breaker JSON, --limits NAMES, \
                     --sequence EXPR and/or --batch JSON"
                );
            }
            let client = server.client()?;
            let (_, answer) = client
                .call(
                    Method::PUT,
                    &format!("/v1/kinds/{}", segment(&kind)),
                    Some(&body),
                )
                .await?;
            if server.json {
                print_json(&answer);
            } else {
                let stored: KindSettings = decode(&answer, "PUT /v1/kinds/{kind}")?;
                println!(
                    "kind {} set: schema {}, circuit breaker {}, limits {}, sequence {}, batch {}",
                    stored.kind,
                    if stored.schema.is_some() {
                        "set"
                    } else {
                        "none"
                    },
                    if stored.circuit_breaker.is_some() {
                        "set"
                    } else {
                        "none"
                    },
                    crate::cli::limit::names_text(&json!(stored.limits)),
                    crate::cli::limit::sequence_text(&json!(stored.sequence)),
                    batch_text(stored.batch.as_ref())
                );
            }
        }
        KindCommand::List { server } => {
            let answer = server.client()?.get("/v1/kinds").await?;
            if server.json {
                print_json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            let kinds: Vec<KindSettings> = decode(&answer["kinds"], "GET /v1/kinds")?;
            if kinds.is_empty() {
                println!("no kind has a schema (conveyor kind set KIND --schema FILE)");
            } else {
                let mut table = Table::new(["KIND", "VERSION", "SCHEMA", "UPDATED"]);
                for kind in &kinds {
                    table.row(summary(kind));
                }
                table.print();
            }
        }
        KindCommand::Show { kind, server } => {
            let answer = server
                .client()?
                .get(&format!("/v1/kinds/{}", segment(&kind)))
                .await?;
            if server.json {
                print_json(&answer);
            } else {
                let stored: KindSettings = decode(&answer, "GET /v1/kinds/{kind}")?;
                println!("kind {}", stored.kind);
                if let Some(version) = stored.version {
                    println!("  version: {version}");
                }
                println!("  updated: {}", stamp(&stored.updated_at));
                if !stored.limits.is_empty() {
                    println!("  limits: {}", stored.limits.join(", "));
                }
                if stored.sequence.is_some() {
                    let sequence = crate::cli::limit::sequence_text(&json!(stored.sequence));
                    println!("  sequence: {sequence}");
                }
                if stored.batch.is_some() {
                    println!("  batch: {}", batch_text(stored.batch.as_ref()));
                }
                match &stored.schema {
                    Some(schema) => print_json(schema),
                    None => println!("  no schema"),
                }
            }
        }
        KindCommand::Delete { kind, server } => {
            server
                .client()?
                .call(
                    Method::DELETE,
                    &format!("/v1/kinds/{}", segment(&kind)),
                    None,
                )
                .await?;
            println!("schema of kind {kind} removed");
        }
    }
    Ok(ExitCode::SUCCESS)
}
