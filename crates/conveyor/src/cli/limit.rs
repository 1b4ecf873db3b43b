//! `conveyor limit ...`: the cluster's named limits (how many jobs sharing a key may run at
//! once, and start per period), through the server's API.

use clap::Subcommand;
use conveyor_core::limits::KeyExpr;
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;

use super::ServerArg;
use crate::cli::kind::{print_json, segment};
use crate::cli::table::{human_ms, Table};

#[derive(Subcommand, Debug)]
pub(crate) enum LimitCommand {
    /// Create or replace a limit: at most `--concurrency` jobs of one key running at once, at
    /// most `--rate` starts per period, or both. Queues, kinds and jobs name the limits they
    /// are subject to (`"limits": ["NAME"]` in their settings or enqueue); every server applies
    /// a change within a second.
    Set {
        name: String,
        /// At most this many jobs of one key run at once, across every worker and server.
        #[arg(long, value_name = "N", required_unless_present = "rate")]
        concurrency: Option<u64>,
        /// At most COUNT jobs of one key start in any PERIOD (as `queue set --rate-limit`
        /// reads it: `100/1m`, `10/1s`, `5/500ms`, `1000/1h`; a bare number is seconds).
        #[arg(long, value_name = "COUNT/PERIOD")]
        rate: Option<crate::cli::admin::Rate>,
        /// Where a job's key is taken from: `tenant`, `kind`, `queue` or `payload.FIELD[.FIELD..]`.
        /// Without it, every job subject to the limit shares one budget.
        #[arg(long, value_name = "EXPR")]
        key: Option<KeyArg>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Every limit.
    List {
        #[command(flatten)]
        server: ServerArg,
    },
    /// One limit, with the running jobs and recent starts of each of its keys.
    Show {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Remove a limit (refused while a queue's or a kind's settings name it).
    Delete {
        name: String,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// `--key EXPR`, checked here as the server checks it, so a typo is reported before any
/// request is sent.
#[derive(Debug, Clone)]
pub(crate) struct KeyArg(String);

impl std::str::FromStr for KeyArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let expr: KeyExpr = text.parse()?;
        Ok(KeyArg(expr.to_string()))
    }
}

/// `--limits NAME[,NAME...]` of `queue set` and `kind set`: the named limits the queue's or
/// the kind's jobs are subject to, or `none`.
#[derive(Debug, Clone)]
pub(crate) struct LimitNamesArg(Vec<String>);

impl LimitNamesArg {
    /// The names as the settings' `limits` take them: `null` for none.
    pub(crate) fn to_json(&self) -> Value {
        if self.0.is_empty() {
            Value::Null
        } else {
            json!(self.0)
        }
    }
}

impl std::str::FromStr for LimitNamesArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.trim().eq_ignore_ascii_case("none") {
            return Ok(LimitNamesArg(Vec::new()));
        }
        let names: Vec<String> = text
            .split(',')
            .map(|name| name.trim().to_string())
            .collect();
        conveyor_core::limits::named::limit_names("--limits", &names)
            .map_err(|error| format!("{}: {}", error.field, error.message))?;
        Ok(LimitNamesArg(names))
    }
}

/// `--sequence EXPR[:skip]` of `queue set` and `kind set`: the key expression the queue's or
/// the kind's jobs are sequenced by (`:skip` lets a dead job's successors run, `:block` is the
/// default), or `none`.
#[derive(Debug, Clone)]
// Boxed: `queue set` holds many options, and clippy weighs the command enum's largest variant.
pub(crate) struct SequenceArg(Box<Option<conveyor_core::sequence::SequenceSpec>>);

impl SequenceArg {
    /// As the settings' `sequence` takes it: `null` for none.
    pub(crate) fn to_json(&self) -> Value {
        json!(self.0)
    }
}

impl std::str::FromStr for SequenceArg {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        use conveyor_core::sequence::{OnDead, SequenceSpec};
        let text = text.trim();
        if text.eq_ignore_ascii_case("none") {
            return Ok(SequenceArg(Box::new(None)));
        }
        let (key, on_dead) = match text.rsplit_once(':') {
            Some((key, "skip")) => (key, OnDead::Skip),
            Some((key, "block")) => (key, OnDead::Block),
            Some((_, other)) => {
                return Err(format!(
                    "--sequence: {other:?} after ':' must be block or skip"
                ))
            }
            None => (text, OnDead::Block),
        };
        let spec = SequenceSpec::key(key).on_dead(on_dead);
        conveyor_core::limits::named::sequence("--sequence", &spec)
            .map_err(|error| format!("{}: {}", error.field, error.message))?;
        Ok(SequenceArg(Box::new(Some(spec))))
    }
}

/// A sequence as settings show it (`sequence`), `none` without one.
pub(crate) fn sequence_text(sequence: &Value) -> String {
    match (sequence["key"].as_str(), sequence["on_dead"].as_str()) {
        (Some(key), Some("skip")) => format!("{key} (dead jobs skipped)"),
        (Some(key), _) => key.to_string(),
        _ => "none".to_string(),
    }
}

/// Named limits as settings show them (`limits`), `none` without any.
pub(crate) fn names_text(limits: &Value) -> String {
    let names: Vec<&str> = limits
        .as_array()
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}

/// A limit's fields in a few words: `concurrency 10, 100 per 1m, key tenant`.
fn describe(limit: &Value) -> String {
    let mut parts = Vec::new();
    if let Some(concurrency) = limit["concurrency"].as_u64() {
        parts.push(format!("concurrency {concurrency}"));
    }
    if let Some(rate) = rate_text(&limit["rate"]) {
        parts.push(rate);
    }
    parts.push(match limit["key"].as_str() {
        Some(key) => format!("key {key}"),
        None => "one key".to_string(),
    });
    parts.join(", ")
}

/// A rate as `COUNT per PERIOD`, `None` without one.
fn rate_text(rate: &Value) -> Option<String> {
    let count = rate["count"].as_u64()?;
    let period_ms = rate["period_ms"].as_u64()?;
    Some(format!("{count} per {}", human_ms(period_ms)))
}

pub(crate) async fn run(command: LimitCommand) -> anyhow::Result<ExitCode> {
    match command {
        LimitCommand::Set {
            name,
            concurrency,
            rate,
            key,
            server,
        } => {
            let mut body = json!({});
            if let Some(concurrency) = concurrency {
                body["concurrency"] = json!(concurrency);
            }
            if let Some(rate) = rate.and_then(|rate| rate.limit()) {
                body["rate"] = json!(rate);
            }
            if let Some(KeyArg(key)) = key {
                body["key"] = json!(key);
            }
            let (_, answer) = server
                .client()?
                .call(
                    Method::PUT,
                    &format!("/v1/limits/{}", segment(&name)),
                    Some(&body),
                )
                .await?;
            if server.json {
                print_json(&answer);
            } else {
                println!("limit {name} set: {}", describe(&answer));
            }
        }
        LimitCommand::List { server } => {
            let answer = server.client()?.get("/v1/limits").await?;
            if server.json {
                print_json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            let limits = answer["limits"].as_array().cloned().unwrap_or_default();
            if limits.is_empty() {
                println!("no limits (conveyor limit set NAME --concurrency N)");
            } else {
                let mut table = Table::new(["NAME", "CONCURRENCY", "RATE", "KEY"]);
                for limit in &limits {
                    table.row([
                        limit["name"].as_str().unwrap_or("").to_string(),
                        limit["concurrency"]
                            .as_u64()
                            .map_or_else(|| "-".to_string(), |n| n.to_string()),
                        rate_text(&limit["rate"]).unwrap_or_else(|| "-".to_string()),
                        limit["key"].as_str().unwrap_or("-").to_string(),
                    ]);
                }
                table.print();
            }
        }
        LimitCommand::Show { name, server } => {
            let answer = server
                .client()?
                .get(&format!("/v1/limits/{}", segment(&name)))
                .await?;
            if server.json {
                print_json(&answer);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "limit {} ({}): {} running",
                answer["name"].as_str().unwrap_or(&name),
                describe(&answer),
                answer["in_use"].as_u64().unwrap_or(0)
            );
            let usage = answer["usage"].as_array().cloned().unwrap_or_default();
            if usage.is_empty() {
                println!("  no key in use");
            } else {
                let mut table = Table::new(["KEY", "RUNNING", "RECENT STARTS"]).right([1, 2]);
                for key in &usage {
                    let value = key["key"].as_str().unwrap_or("");
                    table.row([
                        if value.is_empty() { "-" } else { value }.to_string(),
                        key["running"].as_u64().unwrap_or(0).to_string(),
                        key["recent_starts"].as_u64().unwrap_or(0).to_string(),
                    ]);
                }
                table.print_indented("  ");
            }
        }
        LimitCommand::Delete { name, server } => {
            server
                .client()?
                .call(
                    Method::DELETE,
                    &format!("/v1/limits/{}", segment(&name)),
                    None,
                )
                .await?;
            println!("limit {name} deleted");
        }
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_names_are_a_list_or_none() {
        let names = |text: &str| text.parse::<LimitNamesArg>().map(|names| names.to_json());
        assert_eq!(names("a, b"), Ok(json!(["a", "b"])));
        assert_eq!(names("none"), Ok(Value::Null));
        assert!(names("a,a").is_err());
        assert!(names("a:b").is_err());
        assert!(names("a,,b").is_err());
    }

    #[test]
    fn keys_are_checked_before_sending() {
        assert!("tenant".parse::<KeyArg>().is_ok());
        assert!("payload.customer.id".parse::<KeyArg>().is_ok());
        assert!("customer".parse::<KeyArg>().is_err());
        assert!("payload.".parse::<KeyArg>().is_err());
    }
}
