//! `conveyor queue show|pause|resume|set|circuit`: one queue's settings and circuit breaker.

use anyhow::bail;
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;

use super::print_json;
use crate::cli::ServerArg;

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
    /// Change limits: a number sets one, `none` clears it; `--limits` names named limits.
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
        /// Jobs enqueued without an expiry expire this many milliseconds after they could
        /// start (`none`: never).
        #[arg(long)]
        default_ttl_ms: Option<Limit>,
        /// The queue's circuit breaker as JSON (every field optional): `{"failure_ratio": 0.5,
        /// "min_calls": 10, "window_ms": 60000, "open_ms": 30000, "half_open_calls": 1}`, or
        /// `none` to remove it.
        #[arg(long, value_name = "JSON")]
        circuit_breaker: Option<BreakerArg>,
        /// Named limits every job enqueued into the queue is subject to, comma-separated
        /// (`conveyor limit set`), or `none`.
        #[arg(long, value_name = "NAME,...")]
        limits: Option<crate::cli::limit::LimitNamesArg>,
        /// Jobs of the queue with the same key run one after another, in enqueue order: a key
        /// expression (`tenant`, `kind`, `payload.account`), `EXPR:skip` to let a dead job's
        /// successors run, or `none`.
        #[arg(long, value_name = "EXPR[:skip]")]
        sequence: Option<crate::cli::limit::SequenceArg>,
        #[command(flatten)]
        server: ServerArg,
    },
    /// Open or close the queue's circuit breaker by hand.
    Circuit {
        name: String,
        action: CircuitAction,
        #[command(flatten)]
        circuit: CircuitArgs,
        #[command(flatten)]
        server: ServerArg,
    },
}

/// `open` or `close` a circuit breaker.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub(crate) enum CircuitAction {
    Open,
    Close,
}

/// How and why a breaker is opened or closed by hand.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct CircuitArgs {
    /// Open for this many milliseconds, then probe (default: open until closed by hand).
    #[arg(long)]
    open_ms: Option<u64>,
    /// Why, for the audit log and the dashboard.
    #[arg(long)]
    reason: Option<String>,
}

/// Circuit breaker settings on the command line: a JSON object, or `none`.
#[derive(Debug, Clone)]
pub(crate) struct BreakerArg(pub(crate) Value);

impl std::str::FromStr for BreakerArg {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(BreakerArg(Value::Null));
        }
        let value: Value = serde_json::from_str(s).map_err(|e| {
            format!("{s:?} is not a JSON object ({e}); e.g. '{{\"failure_ratio\": 0.5, \"min_calls\": 10}}' or `none`")
        })?;
        conveyor::BreakerSettings::from_json("circuit_breaker", &value)
            .map_err(|e| format!("{}: {}", e.field, e.message))?;
        Ok(BreakerArg(value))
    }
}

/// Opens or closes a breaker through `path` (`/v1/queues/NAME/circuit` or the kind's) and
/// prints where it stands.
pub(crate) async fn circuit(
    server: &ServerArg,
    path: &str,
    what: &str,
    action: CircuitAction,
    args: CircuitArgs,
) -> anyhow::Result<ExitCode> {
    let mut body = json!({});
    if let Some(reason) = args.reason {
        body["reason"] = json!(reason);
    }
    let verb = match action {
        CircuitAction::Open => {
            if let Some(ms) = args.open_ms {
                body["open_ms"] = json!(ms);
            }
            "open"
        }
        CircuitAction::Close => {
            if args.open_ms.is_some() {
                bail!("--open-ms is only for `open`");
            }
            "close"
        }
    };
    let client = server.client()?;
    let (_, answer) = client
        .call(Method::POST, &format!("{path}/{verb}"), Some(&body))
        .await?;
    if server.json {
        print_json(&answer);
    } else {
        println!("circuit breaker of {what}: {}", breaker_summary(&answer));
    }
    Ok(ExitCode::SUCCESS)
}

/// One line on a breaker as the server shows it (`BreakerView`).
pub(crate) fn breaker_summary(view: &Value) -> String {
    let state = view["state"].as_str().unwrap_or("closed");
    let mut line = state.replace('_', "-");
    if state == "open" {
        match view["open_until"].as_str() {
            Some(until) => line.push_str(&format!(" until {until}")),
            None => line.push_str(" until closed by hand"),
        }
    }
    if let Some(reason) = view["reason"].as_str() {
        line.push_str(&format!(" ({reason})"));
    }
    if view["settings"].is_object() {
        line.push_str(&format!(
            "; {} of {} attempts failed in the window",
            view["failures"], view["calls"]
        ));
    }
    line
}

/// A rate limit on the command line: `COUNT/PERIOD` with the period in ms, s, m or h, or
/// `none` to clear it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate(Option<(u64, u64)>);

impl Rate {
    /// The limit given, `None` for `none` (`conveyor bench --rate-limit`, `limit set --rate`).
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
        QueueCommand::Circuit {
            name,
            action,
            circuit: args,
            server,
        } => {
            conveyor::validate::name("queue", &name)?;
            let path = format!("/v1/queues/{name}/circuit");
            return circuit(&server, &path, &format!("queue {name}"), action, args).await;
        }
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
            default_ttl_ms,
            circuit_breaker,
            limits,
            sequence,
            server,
        } => {
            let mut change = json!({});
            if let Some(limits) = limits {
                change["limits"] = limits.to_json();
            }
            if let Some(sequence) = sequence {
                change["sequence"] = sequence.to_json();
            }
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
            if let Some(Limit(ms)) = default_ttl_ms {
                change["default_ttl_ms"] = json!(ms);
            }
            if let Some(BreakerArg(breaker)) = circuit_breaker {
                change["circuit_breaker"] = breaker;
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
                     --per-key-rate-limit, --weight, --completed-retention-secs, \
                     --dead-retention-secs, --default-ttl-ms, --circuit-breaker, --limits or \
                     --sequence"
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
             per-tenant concurrency limit {}; rate limit {}; per-tenant rate limit {}; weight {}; \
             desired workers {}; circuit breaker {}; limits {}; sequence {}",
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
            settings["weight"].as_u64().unwrap_or(1),
            limit(&settings["desired_workers"]),
            breaker_summary(&settings["circuit"]),
            crate::cli::limit::names_text(&settings["limits"]),
            crate::cli::limit::sequence_text(&settings["sequence"])
        );
    }
    Ok(ExitCode::SUCCESS)
}
