//! Event sources: a broker the teams already run (Redis Streams, RabbitMQ, NATS JetStream, MQTT,
//! SQS, Kafka), read by `conveyor serve`, each message turned into a job. This is the pure part: what a source is, the checks
//! on it, and how one message becomes one job. Reading and acknowledging are in
//! `conveyor-sources`.
//!
//! A message's job carries the idempotency key `source:{name}:{identity}`, where the identity
//! is the broker's own (a stream entry's id, an AMQP message-id, a JetStream stream sequence, an
//! SQS MessageId, a Kafka topic, partition and offset, or a hash of the content where the broker has none), so a redelivered message finds the job it already
//! made instead of making a second.
//!
//! A source may emit an event instead (`event` in place of `job`): the message's body is the
//! event's payload, `source:{name}:{identity}` its id, and the subscriptions to it make the
//! jobs and flows (`crate::subscriptions`).

use base64::Engine as _;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;

use crate::error::ValidationError;
use crate::fields;
use crate::job::{NewJob, DEFAULT_QUEUE};
use crate::subscriptions::Event;
use crate::wire;

/// The longest wait a source's settings take (ms).
const DAY_MS: u64 = 86_400_000;

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
    /// How a message becomes a job; or `event`.
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub job: Option<JobMapping>,
    /// How a message becomes an event, fanned out to its subscriptions; or `job`.
    #[serde(
        default,
        deserialize_with = "wire::non_null",
        skip_serializing_if = "Option::is_none"
    )]
    pub event: Option<EventMapping>,
    /// Messages read, committed as jobs in one transaction, then acknowledged together.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: usize,
    /// Where a new consumer group starts.
    #[serde(default)]
    pub start: Start,
    /// What becomes of a body that is not JSON.
    #[serde(default)]
    pub on_invalid: OnInvalid,
    /// Stopped by an operator (`POST /v1/sources/{name}/pause`): no server reads it until it
    /// is resumed; what the broker holds waits there.
    #[serde(default)]
    pub paused: bool,
}

fn default_max_in_flight() -> usize {
    1000
}

/// The broker of a source, by `type`. Every broker names its URL as `url` or, for a URL with a
/// password, `url_env`: the name of an environment variable holding it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum BrokerSpec {
    /// A Redis stream read by a consumer group (XREADGROUP, XACK; XAUTOCLAIM takes over the
    /// entries a dead consumer held).
    RedisStream {
        /// `redis://host:port/db`.
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
    /// A RabbitMQ (AMQP 0-9-1) queue, consumed with manual acknowledgements and a prefetch of
    /// `max_in_flight`. The queue must exist (declared passively).
    Amqp {
        /// `amqp://user:password@host:port/vhost` (`amqps://` for TLS).
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        url_env: Option<String>,
        queue: String,
        /// The consumer tag (default: host name and process id).
        #[serde(default)]
        consumer: Option<String>,
    },
    /// A NATS JetStream stream, read by a durable pull consumer with explicit acknowledgements
    /// (made if missing, filtered on `subject`).
    Nats {
        /// `nats://host:port`.
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        url_env: Option<String>,
        stream: String,
        /// The subjects read (wildcards allowed; default: all of the stream's).
        #[serde(default)]
        subject: Option<String>,
        /// The durable consumer's name.
        consumer: String,
        /// How long JetStream waits for an acknowledgement before redelivering (ms, default
        /// 30,000); the source tells it the work is in progress while a commit is slow.
        #[serde(default)]
        ack_wait_ms: Option<u64>,
    },
    /// An MQTT topic filter, subscribed at QoS 1 in a persistent session (clean session off)
    /// with manual acknowledgements.
    Mqtt {
        /// `mqtt://host:port` (`mqtts://` for TLS); a user and password may be in it.
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        url_env: Option<String>,
        topic: String,
        /// The session's client id: the broker keeps the subscription and the unacknowledged
        /// messages under it while the source is away.
        client_id: String,
    },
    /// An Amazon SQS queue (or one speaking its API): ReceiveMessage, DeleteMessageBatch once
    /// the jobs are durable, ChangeMessageVisibility while a commit is slow.
    Sqs {
        /// The endpoint (for a local stand-in such as moto); default: AWS's for the region.
        #[serde(default)]
        url: Option<String>,
        #[serde(default)]
        url_env: Option<String>,
        queue_url: String,
        region: String,
        /// Environment variables holding the credentials (default: the AWS SDK's own chain:
        /// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, profiles, instance roles).
        #[serde(default)]
        access_key_id_env: Option<String>,
        #[serde(default)]
        secret_access_key_env: Option<String>,
        /// How long a received message stays hidden from other consumers (s, default 30).
        #[serde(default)]
        visibility_timeout_secs: Option<u32>,
    },
    /// A Kafka topic read by a consumer group (its members share the partitions); the group's
    /// offsets are committed only after the jobs are durable.
    Kafka {
        /// The bootstrap brokers, `host:port[,host:port...]`.
        #[serde(default)]
        brokers: Option<String>,
        /// The name of an environment variable holding them.
        #[serde(default)]
        brokers_env: Option<String>,
        topic: String,
        group: String,
        /// The client id the brokers see (default: host name and process id).
        #[serde(default)]
        client_id: Option<String>,
        /// How long the group waits for a member's heartbeat before handing its partitions to
        /// the others (ms, default 30,000).
        #[serde(default)]
        session_timeout_ms: Option<u64>,
    },
}

impl BrokerSpec {
    pub fn type_name(&self) -> &'static str {
        match self {
            BrokerSpec::RedisStream { .. } => "redis_stream",
            BrokerSpec::Amqp { .. } => "amqp",
            BrokerSpec::Nats { .. } => "nats",
            BrokerSpec::Mqtt { .. } => "mqtt",
            BrokerSpec::Sqs { .. } => "sqs",
            BrokerSpec::Kafka { .. } => "kafka",
        }
    }

    /// The `url` and `url_env` fields (Kafka's `brokers` and `brokers_env`), and the URL
    /// schemes this broker takes (none: a list of `host:port`).
    fn url_fields(&self) -> (&Option<String>, &Option<String>, &'static [&'static str]) {
        match self {
            BrokerSpec::Kafka {
                brokers,
                brokers_env,
                ..
            } => (brokers, brokers_env, &[]),
            BrokerSpec::RedisStream { url, url_env, .. } => {
                (url, url_env, &["redis://", "rediss://"])
            }
            BrokerSpec::Amqp { url, url_env, .. } => (url, url_env, &["amqp://", "amqps://"]),
            BrokerSpec::Nats { url, url_env, .. } => {
                (url, url_env, &["nats://", "tls://", "ws://", "wss://"])
            }
            BrokerSpec::Mqtt { url, url_env, .. } => {
                (url, url_env, &["mqtt://", "mqtts://", "tcp://"])
            }
            BrokerSpec::Sqs { url, url_env, .. } => (url, url_env, &["http://", "https://"]),
        }
    }

    /// The broker's URL: `url`, or the value of the variable `url_env` names. `None` for an SQS
    /// source without an endpoint (AWS's own).
    pub fn resolve_url(&self) -> Result<Option<String>, String> {
        match self.url_fields() {
            (Some(url), _, _) => Ok(Some(url.clone())),
            (None, Some(name), _) => std::env::var(name)
                .map(Some)
                .map_err(|_| format!("the environment variable {name} is not set")),
            (None, None, _) => Ok(None),
        }
    }

    /// The names of the `url` and `url_env` fields of this broker.
    fn url_names(&self) -> (&'static str, &'static str) {
        match self {
            BrokerSpec::Kafka { .. } => ("brokers", "brokers_env"),
            _ => ("url", "url_env"),
        }
    }

    fn validate(&self) -> Result<(), ValidationError> {
        let (url, url_env, schemes) = self.url_fields();
        let (url_name, url_env_name) = self.url_names();
        let optional = matches!(self, BrokerSpec::Sqs { .. });
        match (url, url_env) {
            (Some(_), Some(_)) => {
                return Err(ValidationError::new(
                    url_name,
                    format!("give {url_name} or {url_env_name}, not both"),
                ))
            }
            (None, None) if !optional => return Err(ValidationError::new(url_name, "is required")),
            (None, None) => {}
            (Some(addresses), None) if schemes.is_empty() => kafka_addresses(url_name, addresses)?,
            (Some(url), None) => {
                if !schemes.iter().any(|scheme| url.starts_with(scheme)) {
                    return Err(ValidationError::new(
                        url_name,
                        format!("must start with {}", schemes.join(" or ")),
                    ));
                }
            }
            (None, Some(name)) => fields::text_without_nul(url_env_name, name)?,
        }
        let required: Vec<(&str, &String)> = match self {
            BrokerSpec::RedisStream { stream, group, .. } => {
                vec![("stream", stream), ("group", group)]
            }
            BrokerSpec::Amqp { queue, .. } => vec![("queue", queue)],
            BrokerSpec::Nats {
                stream, consumer, ..
            } => vec![("stream", stream), ("consumer", consumer)],
            BrokerSpec::Mqtt {
                topic, client_id, ..
            } => vec![("topic", topic), ("client_id", client_id)],
            BrokerSpec::Sqs {
                queue_url, region, ..
            } => vec![("queue_url", queue_url), ("region", region)],
            BrokerSpec::Kafka { topic, group, .. } => vec![("topic", topic), ("group", group)],
        };
        for (field, value) in required {
            if value.is_empty() {
                return Err(ValidationError::new(field, "must not be empty"));
            }
            fields::text_without_nul(field, value)?;
        }
        let optional: Vec<(&str, &Option<String>)> = match self {
            BrokerSpec::RedisStream {
                consumer,
                body_field,
                ..
            } => vec![("consumer", consumer), ("body_field", body_field)],
            BrokerSpec::Amqp { consumer, .. } => vec![("consumer", consumer)],
            BrokerSpec::Nats { subject, .. } => vec![("subject", subject)],
            BrokerSpec::Mqtt { .. } => vec![],
            BrokerSpec::Sqs {
                access_key_id_env,
                secret_access_key_env,
                ..
            } => vec![
                ("access_key_id_env", access_key_id_env),
                ("secret_access_key_env", secret_access_key_env),
            ],
            BrokerSpec::Kafka { client_id, .. } => vec![("client_id", client_id)],
        };
        for (field, value) in optional {
            if let Some(value) = value {
                fields::text_without_nul(field, value)?;
            }
        }
        let waits = match self {
            BrokerSpec::RedisStream { claim_idle_ms, .. } => Some(("claim_idle_ms", claim_idle_ms)),
            BrokerSpec::Nats { ack_wait_ms, .. } => Some(("ack_wait_ms", ack_wait_ms)),
            BrokerSpec::Kafka {
                session_timeout_ms, ..
            } => Some(("session_timeout_ms", session_timeout_ms)),
            _ => None,
        };
        if let Some((field, Some(ms))) = waits {
            if *ms == 0 || *ms > DAY_MS {
                return Err(ValidationError::new(field, "must be 1 to 86400000 (a day)"));
            }
        }
        if let BrokerSpec::Sqs {
            visibility_timeout_secs: Some(secs),
            ..
        } = self
        {
            if *secs == 0 || *secs > 43_200 {
                return Err(ValidationError::new(
                    "visibility_timeout_secs",
                    "must be 1 to 43200 (12 hours, SQS's limit)",
                ));
            }
        }
        Ok(())
    }
}

/// Checks Kafka's bootstrap list: `host:port`, comma-separated, each host a name or an IPv4
/// address (letters, digits, `.`, `_`, `-`), each port 1 to 65535.
fn kafka_addresses(field: &str, addresses: &str) -> Result<(), ValidationError> {
    for address in addresses.split(',') {
        let valid = address.split_once(':').is_some_and(|(host, port)| {
            !host.is_empty()
                && host
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
                && !port.is_empty()
                && port.len() <= 5
                && port.chars().all(|c| c.is_ascii_digit())
                && port.parse::<u16>().is_ok_and(|port| port > 0)
        });
        if !valid {
            return Err(ValidationError::new(
                field,
                format!("{address:?} is not host:port (give host:port[,host:port...])"),
            ));
        }
    }
    Ok(())
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

/// How a message becomes an event: its name, fixed or taken from the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EventMapping {
    pub name: Field,
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

/// The event a message becomes, and whether its body was not JSON.
#[derive(Debug, Clone, PartialEq)]
pub struct MappedEvent {
    pub event: Event,
    /// The body was not JSON: the payload holds it as `raw_base64`.
    pub invalid: bool,
}

impl SourceSpec {
    /// Reads and checks a source named `name` from a request's JSON body (a `name` in the body
    /// is ignored: the path names it). Errors name the field: a missing or mistyped field, an
    /// unknown `type`, or a value the checks refuse.
    pub fn from_json(name: &str, body: Value) -> Result<Self, ValidationError> {
        let mut spec: SourceSpec = wire::read_body(body, "type")?;
        spec.name = name.to_string();
        spec.validate()?;
        Ok(spec)
    }

    /// Checks the configuration; errors name the field.
    pub fn validate(&self) -> Result<(), ValidationError> {
        fields::name("name", &self.name)?;
        if self.max_in_flight == 0 || self.max_in_flight > MAX_IN_FLIGHT {
            return Err(ValidationError::new(
                "max_in_flight",
                format!("must be 1 to {MAX_IN_FLIGHT}"),
            ));
        }
        self.broker.validate()?;
        check_target(self.job.as_ref(), self.event.as_ref())
    }

    /// The idempotency key of the job a message becomes.
    pub fn idempotency_key(&self, message: &Message) -> String {
        format!("source:{}:{}", self.name, message.identity)
    }

    /// The job `message` becomes. A message the mapping cannot place (a kind taken from a
    /// header it lacks, a priority that is not a number) is an error naming the field; the
    /// caller turns it into a dead job keeping the raw message.
    pub fn job_for(&self, message: &Message) -> Result<MappedJob, ValidationError> {
        self.job
            .as_ref()
            .ok_or_else(|| ValidationError::new("job", "this source emits events"))?
            .job_for(message, self.idempotency_key(message))
    }

    /// The event `message` becomes, its id the idempotency key a job of it would carry
    /// (`source:{name}:{identity}`). An error names the field, as [`SourceSpec::job_for`]'s.
    pub fn event_for(&self, message: &Message) -> Result<MappedEvent, ValidationError> {
        self.event
            .as_ref()
            .ok_or_else(|| ValidationError::new("event", "this source makes jobs"))?
            .event_for(message, self.idempotency_key(message))
    }
}

/// A source's or a hook's `job` or `event`: exactly one, checked.
pub(crate) fn check_target(
    job: Option<&JobMapping>,
    event: Option<&EventMapping>,
) -> Result<(), ValidationError> {
    match (job, event) {
        (Some(job), None) => job.validate(),
        (None, Some(event)) => event.validate(),
        (Some(_), Some(_)) => Err(ValidationError::new("event", "give job or event, not both")),
        (None, None) => Err(ValidationError::new(
            "job",
            "is required (or event, to emit an event)",
        )),
    }
}

impl EventMapping {
    /// Checks the name's mapping, naming `event.name`.
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_field("event.name", &self.name)
    }

    /// The event `message` becomes, with the id `id`: its payload the body (a body that is
    /// not JSON kept as `raw_base64`, as a job's payload would be).
    pub fn event_for(&self, message: &Message, id: String) -> Result<MappedEvent, ValidationError> {
        let body: Option<Value> = serde_json::from_slice(&message.body).ok();
        let name = resolve("event.name", &self.name, message, body.as_ref())?;
        fields::name("event.name", &name)?;
        let invalid = body.is_none();
        let payload = body.unwrap_or_else(|| raw_payload(message));
        Ok(MappedEvent {
            event: Event {
                name,
                payload,
                id: Some(id),
            },
            invalid,
        })
    }
}

impl JobMapping {
    /// The job `message` becomes, carrying `idempotency_key`.
    pub fn job_for(
        &self,
        message: &Message,
        idempotency_key: String,
    ) -> Result<MappedJob, ValidationError> {
        let body: Option<Value> = serde_json::from_slice(&message.body).ok();
        let invalid = body.is_none();
        let payload = match &body {
            Some(value) => value.clone(),
            None => raw_payload(message),
        };
        let kind = resolve("job.kind", &self.kind, message, body.as_ref())?;
        let mut job = NewJob::new(kind, payload);
        job.queue = match &self.queue {
            Some(field) => resolve("job.queue", field, message, body.as_ref())?,
            None => DEFAULT_QUEUE.to_string(),
        };
        if let Some(field) = &self.tenant {
            job.tenant = Some(resolve("job.tenant", field, message, body.as_ref())?);
        }
        if let Some(field) = &self.priority {
            let text = resolve("job.priority", field, message, body.as_ref())?;
            job.priority = text
                .trim()
                .parse()
                .map_err(|_| ValidationError::new("job.priority", "is not an integer"))?;
        }
        job.idempotency_key = Some(idempotency_key);
        Ok(MappedJob { job, invalid })
    }

    /// Checks each part; errors name the field (`job.kind`, ...).
    pub fn validate(&self) -> Result<(), ValidationError> {
        check_field("job.kind", &self.kind)?;
        for (name, field) in [
            ("job.queue", &self.queue),
            ("job.tenant", &self.tenant),
            ("job.priority", &self.priority),
        ] {
            if let Some(field) = field {
                check_field(name, field)?;
            }
        }
        Ok(())
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

/// A mapped field's checks: a value fixed here must be what a job takes (a name for the kind,
/// queue and tenant; a whole number for the priority), so a bad one is refused when the source
/// is set rather than dead-lettering every message; `from` must name a place in a message.
fn check_field(name: &str, field: &Field) -> Result<(), ValidationError> {
    match field {
        Field::Fixed(value) if name == "job.priority" => value
            .trim()
            .parse::<i32>()
            .map(|_| ())
            .map_err(|_| ValidationError::new(name, "must be a whole number")),
        Field::Fixed(value) => fields::name(name, value),
        Field::From { from } => {
            let known = from == "subject"
                || from.strip_prefix("header:").is_some_and(|h| !h.is_empty())
                || from
                    .strip_prefix("body:")
                    .is_some_and(|p| p.is_empty() || p.starts_with('/'));
            if known {
                fields::text_without_nul(name, from)
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
        // HTTP header names are case-insensitive (a hook's request has them lowercase), and
        // brokers' are written as their senders chose: an exact match first, then any case.
        message.headers.get(header).cloned().or_else(|| {
            message
                .headers
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(header))
                .map(|(_, value)| value.clone())
        })
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
