//! Client commands that talk to a running server, one file each: `enqueue`, `job`, `dead`,
//! `queues` (the overview) and `queue` (one queue's settings).

mod dead;
mod enqueue;
mod job;
pub(crate) mod queue;
mod queues;

pub(crate) use dead::{dead, DeadCommand};
pub(crate) use enqueue::{enqueue, EnqueueArgs};
pub(crate) use job::{job, JobCommand};
pub(crate) use queue::Rate;
pub(crate) use queue::{queue, QueueCommand};
pub(crate) use queues::{queues, QueuesArgs};

use crate::cli::http::stamp;
use anyhow::bail;
use conveyor::Job;
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

pub(super) fn print_job(job: &Job) {
    let optional = |value: Option<String>| value.unwrap_or_else(|| "-".to_string());
    for (name, value) in [
        ("id", job.id.to_string()),
        ("kind", job.kind.clone()),
        ("queue", job.queue.clone()),
        ("state", job.state.to_string()),
        ("priority", job.priority.to_string()),
        ("attempt", job.attempt.to_string()),
        ("max_attempts", job.max_attempts.to_string()),
        ("run_at", stamp(&job.run_at)),
        ("created_at", stamp(&job.created_at)),
        ("started_at", optional(job.started_at.as_ref().map(stamp))),
        ("finished_at", optional(job.finished_at.as_ref().map(stamp))),
        ("tenant", optional(job.tenant.clone())),
        ("idempotency_key", optional(job.idempotency_key.clone())),
    ] {
        println!("{name:>16}: {value}");
    }
    println!("{:>16}: {}", "payload", job.payload);
    if let Some(result) = &job.result {
        println!("{:>16}: {result}", "result");
    }
    println!("{:>16}: {}", "errors", job.errors.len());
    for error in &job.errors {
        println!(
            "{:>16}  attempt {} at {} [{}] {}",
            "",
            error.attempt,
            stamp(&error.at),
            error.class,
            error.message
        );
        if let Some(replayed) = &error.replayed_at {
            println!(
                "{:>16}  -- replayed at {}: the attempts below are a new run --",
                "",
                stamp(replayed)
            );
        }
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
