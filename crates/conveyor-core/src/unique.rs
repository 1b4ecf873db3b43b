//! Unique jobs: at most one job per identity (kind, queue, and the payload or a chosen subset of
//! it) in a chosen set of states, optionally only counting jobs created within a window.
//!
//! Unlike an idempotency key, which the producer invents, a unique job's identity comes from the
//! job itself, so two producers that never coordinate (a cron tick on two nodes, a retrying web
//! handler) enqueue the same work once. Every store computes the key with [`unique_key`] at
//! insert and stores it with the job; the duplicate check runs in the insert's transaction under
//! the same serialization as idempotency keys (see the stores).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::time::Duration;

use crate::error::ValidationError;
use crate::state::JobState;

/// Most payload fields a unique spec may name, and the longest name: bounds on the key's input,
/// which is computed on the insert path.
pub const MAX_UNIQUE_ARGS: usize = 32;
pub const MAX_UNIQUE_ARG_LEN: usize = 128;

/// Makes an enqueue unique: while a job with the same identity exists in one of `states` (and,
/// with a period, was created within it), inserting another returns that job with
/// `duplicate: true` instead, as an idempotency key does.
///
/// ```
/// use conveyor_core::{JobState, UniqueSpec};
/// use std::time::Duration;
/// // One refresh per customer at a time, whatever else the payload says.
/// let spec = UniqueSpec::by_args(["customer_id"]);
/// // At most one report per hour, even after the previous one completed.
/// let hourly = UniqueSpec::whole_payload()
///     .period(Duration::from_secs(3600))
///     .states([JobState::Scheduled, JobState::Available, JobState::Running,
///              JobState::Retryable, JobState::Completed]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UniqueSpec {
    /// Top-level payload fields that make up the identity; `None` uses the whole payload. A
    /// field the payload lacks counts as `null`. Object keys are compared regardless of order.
    #[serde(default)]
    pub args: Option<Vec<String>>,
    /// Whether the queue is part of the identity (default): with `false`, the same job in
    /// another queue is a duplicate too.
    #[serde(default = "by_queue_default")]
    pub by_queue: bool,
    /// Only jobs created less than this long ago count; `None` counts every job.
    #[serde(default)]
    pub period_ms: Option<u64>,
    /// States in which an existing job blocks a new one. Default: the unfinished states
    /// (scheduled, available, running, retryable), i.e. "unique while queued or running".
    #[serde(default = "default_states")]
    pub states: Vec<JobState>,
}

fn by_queue_default() -> bool {
    true
}

fn default_states() -> Vec<JobState> {
    UniqueSpec::UNFINISHED.to_vec()
}

impl Default for UniqueSpec {
    fn default() -> Self {
        Self::whole_payload()
    }
}

impl UniqueSpec {
    /// The default `states`: unique while queued (blocked behind its sequence too) or running.
    pub const UNFINISHED: [JobState; 5] = JobState::UNFINISHED;

    /// Unique by kind, queue and the whole payload, while unfinished.
    pub fn whole_payload() -> Self {
        Self {
            args: None,
            by_queue: true,
            period_ms: None,
            states: default_states(),
        }
    }

    /// Unique by kind, queue and these top-level payload fields, while unfinished.
    pub fn by_args<I, S>(fields: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            args: Some(fields.into_iter().map(Into::into).collect()),
            ..Self::whole_payload()
        }
    }

    /// Only jobs created within `period` count (rounded down to milliseconds).
    pub fn period(mut self, period: Duration) -> Self {
        self.period_ms = Some(u64::try_from(period.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// The states in which an existing job blocks a new one.
    pub fn states(mut self, states: impl IntoIterator<Item = JobState>) -> Self {
        self.states = states.into_iter().collect();
        self
    }

    /// The same job in any queue is a duplicate (the queue is left out of the identity).
    pub fn across_queues(mut self) -> Self {
        self.by_queue = false;
        self
    }

    /// Whether an existing job in `state` blocks a new one.
    pub fn blocks_in(&self, state: JobState) -> bool {
        self.states.contains(&state)
    }

    /// The oldest creation time that still counts at `now`: an existing job blocks only when
    /// created strictly after it. `None` when every job counts (no period, or a period reaching
    /// back before the Unix epoch, when no job can have been created).
    pub fn window_start(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let period = chrono::Duration::milliseconds(i64::try_from(self.period_ms?).ok()?);
        now.checked_sub_signed(period)
            .filter(|start| start.timestamp_millis() >= 0)
    }

    /// Checks the spec; errors name the field as `unique.<field>`.
    pub fn validate(&self) -> Result<(), ValidationError> {
        if let Some(args) = &self.args {
            if args.is_empty() {
                return Err(ValidationError::new(
                    "unique.args",
                    "must name at least one payload field (leave it out to use the whole payload)",
                ));
            }
            if args.len() > MAX_UNIQUE_ARGS {
                return Err(ValidationError::new(
                    "unique.args",
                    format!("at most {MAX_UNIQUE_ARGS} fields"),
                ));
            }
            if args
                .iter()
                // Characters, as the API document's `maxLength` counts them.
                .any(|arg| arg.is_empty() || arg.chars().count() > MAX_UNIQUE_ARG_LEN)
            {
                return Err(ValidationError::new(
                    "unique.args",
                    format!("field names must be 1 to {MAX_UNIQUE_ARG_LEN} characters"),
                ));
            }
        }
        if self.period_ms == Some(0) {
            return Err(ValidationError::new(
                "unique.period_ms",
                "must be positive (leave it out for no window)",
            ));
        }
        if let Some(period) = self.period_ms {
            crate::fields::stored_integer("unique.period_ms", period)?;
        }
        if self.states.is_empty() {
            return Err(ValidationError::new(
                "unique.states",
                "must name at least one state",
            ));
        }
        Ok(())
    }
}

/// Parses a state name for `unique.states` (HTTP, CLI), naming that field when it is unknown.
pub fn parse_state(name: &str) -> Result<JobState, ValidationError> {
    name.parse::<JobState>()
        .map_err(|e| ValidationError::new("unique.states", e.message))
}

/// The unique key of a job of `kind` in `queue` with `payload` under `spec`: the SHA-256 (hex)
/// of the canonical JSON of `[kind, queue or null, selected payload]`. Canonical means object
/// keys sorted (recursively) and no whitespace, so producers serializing the same data in
/// another key order get the same key. Numbers keep their JSON spelling (`1` and `1.0` differ).
pub fn unique_key(kind: &str, queue: &str, payload: &Value, spec: &UniqueSpec) -> String {
    let mut text = String::with_capacity(64);
    text.push('[');
    write_canonical(&mut text, &Value::String(kind.to_string()));
    text.push(',');
    if spec.by_queue {
        write_canonical(&mut text, &Value::String(queue.to_string()));
    } else {
        text.push_str("null");
    }
    text.push(',');
    match &spec.args {
        None => write_canonical(&mut text, payload),
        Some(fields) => {
            // Sorted and deduplicated, so the order the producer lists them in does not matter.
            let mut fields: Vec<&str> = fields.iter().map(String::as_str).collect();
            fields.sort_unstable();
            fields.dedup();
            text.push('{');
            for (i, field) in fields.iter().enumerate() {
                if i > 0 {
                    text.push(',');
                }
                write_string(&mut text, field);
                text.push(':');
                write_canonical(&mut text, payload.get(field).unwrap_or(&Value::Null));
            }
            text.push('}');
        }
    }
    text.push(']');
    let digest = Sha256::digest(text.as_bytes());
    let mut hex = String::with_capacity(64);
    for byte in digest {
        // Writing to a String cannot fail.
        let _ = write!(hex, "{byte:02x}");
    }
    hex
}

/// Appends `value` as canonical JSON: object keys sorted by their UTF-8 bytes, no whitespace.
/// Done by hand rather than trusting `serde_json::Map`'s order, which a `preserve_order`
/// feature enabled anywhere in the build would change.
fn write_canonical(out: &mut String, value: &Value) {
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (key, value)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, key);
                out.push(':');
                write_canonical(out, value);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(out, item);
            }
            out.push(']');
        }
        // Scalars have one spelling in serde_json's compact output.
        scalar => out.push_str(&scalar.to_string()),
    }
}

fn write_string(out: &mut String, s: &str) {
    out.push_str(&Value::String(s.to_string()).to_string());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn key(payload: Value, spec: &UniqueSpec) -> String {
        unique_key("kind", "queue", &payload, spec)
    }

    #[test]
    fn key_ignores_object_key_order_at_every_depth() {
        let spec = UniqueSpec::whole_payload();
        let a: Value =
            serde_json::from_str(r#"{"a":1,"b":{"x":[1,{"p":1,"q":2}],"y":2}}"#).expect("json");
        let b: Value =
            serde_json::from_str(r#"{"b":{"y":2,"x":[1,{"q":2,"p":1}]},"a":1}"#).expect("json");
        assert_eq!(key(a, &spec), key(b, &spec));
        assert_ne!(
            key(json!({"x": [1, 2]}), &spec),
            key(json!({"x": [2, 1]}), &spec),
            "array order matters"
        );
    }

    #[test]
    fn key_is_a_sha256_hex_digest_and_stable() {
        let k = key(json!({"n": 1}), &UniqueSpec::whole_payload());
        assert_eq!(k.len(), 64);
        assert!(k
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        // Pinned: keys are stored, so the canonical form must never change between releases.
        let mut expected = String::new();
        for byte in Sha256::digest(br#"["kind","queue",{"n":1}]"#) {
            let _ = write!(expected, "{byte:02x}");
        }
        assert_eq!(k, expected);
    }

    #[test]
    fn key_with_args_uses_only_those_fields_missing_ones_as_null() {
        let spec = UniqueSpec::by_args(["user", "day"]);
        assert_eq!(
            key(json!({"user": 1, "day": "mon", "noise": 1}), &spec),
            key(json!({"day": "mon", "user": 1, "noise": 2}), &spec)
        );
        assert_ne!(
            key(json!({"user": 1, "day": "mon"}), &spec),
            key(json!({"user": 2, "day": "mon"}), &spec)
        );
        assert_eq!(
            key(json!({"user": 1}), &spec),
            key(json!({"user": 1, "day": null}), &spec),
            "a missing field counts as null"
        );
        assert_eq!(
            key(json!({"user": 1}), &UniqueSpec::by_args(["day", "user"])),
            key(json!({"user": 1}), &spec),
            "the order fields are named in does not matter"
        );
    }

    #[test]
    fn key_separates_kinds_and_queues_unless_across_queues() {
        let spec = UniqueSpec::whole_payload();
        let payload = json!({"n": 1});
        let base = unique_key("a", "q", &payload, &spec);
        assert_ne!(base, unique_key("b", "q", &payload, &spec));
        assert_ne!(base, unique_key("a", "r", &payload, &spec));
        let any = spec.clone().across_queues();
        assert_eq!(
            unique_key("a", "q", &payload, &any),
            unique_key("a", "r", &payload, &any)
        );
        assert_ne!(unique_key("a", "q", &payload, &any), base);
    }

    #[test]
    fn validation_names_the_field() {
        assert!(UniqueSpec::default().validate().is_ok());
        let field = |spec: UniqueSpec| spec.validate().expect_err("invalid").field;
        assert_eq!(
            field(UniqueSpec::by_args(Vec::<String>::new())),
            "unique.args"
        );
        assert_eq!(field(UniqueSpec::by_args([""])), "unique.args");
        let zero = UniqueSpec {
            period_ms: Some(0),
            ..UniqueSpec::default()
        };
        assert_eq!(field(zero), "unique.period_ms");
        assert_eq!(field(UniqueSpec::default().states([])), "unique.states");
        assert_eq!(
            parse_state("bogus").expect_err("unknown").field,
            "unique.states"
        );
        assert_eq!(parse_state("running"), Ok(JobState::Running));
    }

    #[test]
    fn job_options_carry_the_spec_and_validate_it() {
        use crate::client::JobOptions;
        let job = JobOptions::default()
            .unique(UniqueSpec::by_args(["id"]).period(Duration::from_secs(60)))
            .into_new_job("k", json!({"id": 1}))
            .expect("valid");
        let spec = job.unique.clone().expect("set");
        assert_eq!(spec.period_ms, Some(60_000));
        assert_eq!(
            job.unique_key(),
            Some(unique_key("k", "default", &json!({"id": 1}), &spec))
        );
        let err = JobOptions::default()
            .unique(UniqueSpec::by_args(Vec::<String>::new()))
            .into_new_job("k", json!({}))
            .expect_err("empty args");
        assert_eq!(err.field, "unique.args");
    }

    #[test]
    fn serde_defaults_and_window() {
        let spec: UniqueSpec = serde_json::from_value(json!({})).expect("defaults");
        assert_eq!(spec, UniqueSpec::whole_payload());
        assert!(serde_json::from_value::<UniqueSpec>(json!({"bogus": 1})).is_err());
        let now = DateTime::from_timestamp_millis(10_000).expect("time");
        assert_eq!(spec.window_start(now), None);
        let hour = spec.clone().period(Duration::from_secs(1));
        assert_eq!(
            hour.window_start(now),
            DateTime::from_timestamp_millis(9_000)
        );
        let huge = spec.period(Duration::from_secs(u64::MAX));
        assert_eq!(huge.window_start(now), None, "reaches before any job");
    }
}
