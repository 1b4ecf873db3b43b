//! Client commands that talk to a running server, one file each: `enqueue`, `job`, `dead`,
//! `queues` (the overview) and `queue` (one queue's settings).

mod dead;
mod enqueue;
mod job;
mod queue;
mod queues;

pub(crate) use dead::{dead, DeadCommand};
pub(crate) use enqueue::{enqueue, EnqueueArgs};
pub(crate) use job::{job, JobCommand};
pub(crate) use queue::{queue, QueueCommand, Rate};
pub(crate) use queues::{queues, QueuesArgs};

use anyhow::bail;
use serde_json::Value;

pub(super) fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

pub(super) fn check_id(id: &str) -> anyhow::Result<()> {
    if uuid::Uuid::parse_str(id).is_err() {
        bail!("{id:?} is not a job id (a UUID like 01937f6e-3c2a-7b1e-9f00-5a1b2c3d4e5f)");
    }
    Ok(())
}

pub(super) fn print_job(job: &Value) {
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

/// A query string (`?a=1&b=x%20y`) of the pairs that have a value; empty when none has.
pub(super) fn query(pairs: &[(&str, Option<String>)]) -> String {
    let present: Vec<(&str, &str)> = pairs
        .iter()
        .filter_map(|(key, value)| value.as_deref().map(|value| (*key, value)))
        .collect();
    match serde_urlencoded::to_string(&present) {
        Ok(encoded) if !encoded.is_empty() => format!("?{encoded}"),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::query;

    #[test]
    fn queries_encode_values_and_skip_absent_ones() {
        assert_eq!(query(&[("queue", None)]), "");
        assert_eq!(
            query(&[
                ("queue", Some("a b&c".into())),
                ("kind", None),
                ("limit", Some("5".into()))
            ]),
            "?queue=a+b%26c&limit=5"
        );
    }
}
