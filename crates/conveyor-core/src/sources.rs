//! Event sources: a broker the teams already run (a Redis stream today), read by `conveyor
//! serve`, each message turned into a job. This is the pure part: what a source is, the checks
//! on it, and how one message becomes one job. Reading and acknowledging are in
//! `conveyor-sources`.
//!
//! A message's job carries the idempotency key `source:{name}:{identity}`, where the identity
//! is the broker's own (a stream entry's id), so a redelivered message finds the job it already
//! made instead of making a second.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

use crate::error::ValidationError;
use crate::fields;
use crate::job::{NewJob, DEFAULT_QUEUE};

/// Most messages a source reads before its jobs are committed and the messages acknowledged.
pub const MAX_IN_FLIGHT: usize = 10_000;

/// One source, as configured (`serve --sources FILE`).
/// (Unknown fields are ignored: serde cannot refuse them beside a flattened broker.)
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceSpec {
    /// Its name (in a sources file and in `PUT /v1/sources/{name}`, the key or path names it).
    #[serde(default)]
    pub name: String,
    /// The broker and what to read from it.
    #[serde(flatten)]
    pub broker: BrokerSpec,
    /// How a message becomes a job.
    pub job: JobMapping,
    /// Messages read, committed as jobs in one transaction, then acknowledged together.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Where a new consumer group starts.
    #[serde(default)]
    pub start: Start,
    /// What becomes of a body that is not JSON.
    #[serde(default)]
    pub on_invalid: OnInvalid,
}

fn default_max_in_flight() -> usize {
    1000
}

/// The broker of a source, by `type`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BrokerSpec {
    /// A Redis stream read by a consumer group (XREADGROUP, XACK; XAUTOCLAIM takes over the
    /// entries a dead consumer held).
    RedisStream {
        /// `redis://host:port/db`; or `url_env`, the name of an environment variable holding
        /// it (for a URL with a password, which is never written to the configuration).
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        url_env: Option<String>,
        stream: String,
        group: String,
        /// This server's name in the group (default: host name and process id).
        #[serde(default)]
        consumer: Option<String>,
        /// The entry field holding the body (default `body`); the other fields are headers.
        #[serde(default)]
        body_field: Option<String>,
        /// How long an entry stays with a consumer that does not acknowledge it before another
        /// takes it over (ms, default 60,000).
        #[serde(default)]
        claim_idle_ms: Option<u64>,
    },
}

impl BrokerSpec {
    pub fn type_name(&self) -> &'static str {
        match self {
            BrokerSpec::RedisStream { .. } => "redis_stream",
        }
    }
}

/// Where a new consumer group starts reading.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Start {
    /// The oldest message the broker still holds.
    #[default]
    Earliest,
    /// Only messages that arrive from now on.
    Latest,
}

/// What a body that is not JSON becomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnInvalid {
    /// A job whose payload is `{"raw_base64": "..."}`.
    #[default]
    Raw,
    /// A job that goes straight to the dead-letter queue, the raw body kept in its payload.
    DeadLetter,
}

/// How a message becomes a job: each part fixed, or taken from the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobMapping {
    pub kind: Field,
    #[serde(default)]
    pub queue: Option<Field>,
    #[serde(default)]
    pub tenant: Option<Field>,
    #[serde(default)]
    pub priority: Option<Field>,
}

/// A value fixed in the configuration, or `{"from": "header:NAME" | "body:/json/pointer" |
/// "subject"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Field {
    Fixed(String),
    From { from: String },
}

/// A message as a source read it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Message {
    /// The broker's identity of the message (a stream entry id): the same on redelivery.
    pub identity: String,
    /// When the broker stamped the message, where it says (a stream entry id's first part).
    pub sent_at: Option<DateTime<Utc>>,
    pub headers: BTreeMap<String, String>,
    pub subject: Option<String>,
    pub body: Vec<u8>,
}

/// The job a message becomes, and whether its body was not JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedJob {
    pub job: NewJob,
    /// The body was not JSON: the payload holds it as `raw_base64`.
    pub invalid: bool,
}

impl SourceSpec {
    /// Checks the configuration; errors name the field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        fields::name("name", &self.name)?;
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT {
            return Err(ValidationError::new(
                "max_in_flight",
                format!("must be 1 to {MAX_IN_FLIGHT}"),
            ));
        }
        match &self.broker {
            BrokerSpec::RedisStream {
                url,
                url_env,
                stream,
                group,
                consumer,
                ..
            } => {
                match (url, url_env) {
                    (Some(_), Some(_)) => {
                        return Err(ValidationError::new("url", "give url or url_env, not both"))
                    }
                    (None, None) => return Err(ValidationError::new("url", "is required")),
                    (Some(url), None) => {
                        if !url.starts_with("redis://") && !url.starts_with("rediss://") {
                            return Err(ValidationError::new(
                                "url",
                                "must start with redis:// or rediss://",
                            ));
                        }
                    }
                    (None, Some(name)) => fields::text_without_nul("url_env", name)?,
                }
                for (field, value) in [("stream", stream), ("group", group)] {
                    if value.is_empty() {
                        return Err(ValidationError::new(field, "must not be empty"));
                    }
                    fields::text_without_nul(field, value)?;
                }
                if let Some(consumer) = consumer {
                    fields::text_without_nul("consumer", consumer)?;
                }
            }
        }
        check_field("job.kind", &self.job.kind)?;
        for (name, field) in [
            ("job.queue", &self.job.queue),
            ("job.tenant", &self.job.tenant),
            ("job.priority", &self.job.priority),
        ] {
            if let Some(field) = field {
                check_field(name, field)?;
            }
        }
        Ok(())
    }

    /// The idempotency key of the job a message becomes.
    pub fn idempotency_key(&self, message: &Message) -> String {
        format!("source:{}:{}", self.name, message.identity)
    }

    /// The job `message` becomes. A message the mapping cannot place (a kind taken from a
    /// header it lacks, a priority that is not a number) is an error naming the field; the
    /// caller turns it into a dead job keeping the raw message.
    pub fn job_for(&self, message: &Message) -> Result<MappedJob, ValidationError> {
        let body: Option<Value> = serde_json::from_slice(&message.body).ok();
        let invalid = body.is_none();
        let payload = match &body {
            Some(value) => value.clone(),
            None => raw_payload(message),
        };
        let kind = resolve("job.kind", &self.job.kind, message, body.as_ref())?;
        let mut job = NewJob::new(kind, payload);
        job.queue = match &self.job.queue {
            Some(field) => resolve("job.queue", field, message, body.as_ref())?,
            None => DEFAULT_QUEUE.to_string(),
        };
        if let Some(field) = &self.job.tenant {
            job.tenant = Some(resolve("job.tenant", field, message, body.as_ref())?);
        }
        if let Some(field) = &self.job.priority {
            let text = resolve("job.priority", field, message, body.as_ref())?;
            job.priority = text
                .trim()
                .parse()
                .map_err(|_| ValidationError::new("job.priority", "is not an integer"))?;
        }
        job.idempotency_key = Some(self.idempotency_key(message));
        Ok(MappedJob { job, invalid })
    }
}

/// A message's body kept as it came: `{"raw_base64": ...}`, with its headers.
pub fn raw_payload(message: &Message) -> Value {
    let mut payload = json!({
        "raw_base64": base64::engine::general_purpose::STANDARD.encode(&message.body),
    });
    if !message.headers.is_empty() {
        payload["headers"] = json!(message.headers);
    }
    payload
}

fn check_field(name: &str, field: &Field) -> Result<(), ValidationError> {
    match field {
        Field::Fixed(value) => fields::text_without_nul(name, value),
        Field::From { from } => {
            let known = from == "subject"
                || from.strip_prefix("header:").is_some_and(|h| !h.is_empty())
                || from
                    .strip_prefix("body:")
                    .is_some_and(|p| p.is_empty() || p.starts_with('/'));
            if known {
                Ok(())
            } else {
                Err(ValidationError::new(
                    name,
                    "from must be \"subject\", \"header:NAME\" or \"body:/json/pointer\"",
                ))
            }
        }
    }
}

fn resolve(
    name: &str,
    field: &Field,
    message: &Message,
    body: Option<&Value>,
) -> Result<String, ValidationError> {
    let from = match field {
        Field::Fixed(value) => return Ok(value.clone()),
        Field::From { from } => from,
    };
    let found = if from == "subject" {
        message.subject.clone()
    } else if let Some(header) = from.strip_prefix("header:") {
        message.headers.get(header).cloned()
    } else if let Some(pointer) = from.strip_prefix("body:") {
        body.and_then(|body| body.pointer(pointer))
            .map(|value| match value {
                Value::String(text) => text.clone(),
                other => other.to_string(),
            })
    } else {
        None
    };
    found.ok_or_else(|| ValidationError::new(name, format!("the message has no {from}")))
}

#[cfg(test)]
mod tests;
