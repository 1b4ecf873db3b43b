//! A NATS JetStream stream read by a durable pull consumer with explicit acknowledgements: a
//! fetch of up to `max` messages (waiting about a second), one acknowledgement per message once
//! its job is durable, `+WPI` (ack-progress) while a batch is held back, and the consumer's
//! pending count as its lag.
//!
//! A message's identity is `{stream}:{stream sequence}`: JetStream keeps the sequence on every
//! redelivery, to this consumer or to another server sharing it.

use async_nats::jetstream::consumer::pull::Config as PullConfig;
use async_nats::jetstream::consumer::{AckPolicy, DeliverPolicy, PullConsumer};
use async_nats::jetstream::context::{ConsumerInfoErrorKind, GetStreamErrorKind};
use async_nats::jetstream::message::{AckKind, Acker};
use async_nats::jetstream::ErrorCode;
use conveyor_core::sources::{BrokerSpec, Message, SourceSpec, Start};
use futures::StreamExt;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::ingest::{Broker, BrokerError};

/// JetStream's own default, kept when the configuration gives none.
const DEFAULT_ACK_WAIT: Duration = Duration::from_secs(30);

/// How long a fetch waits for its first message.
const FETCH_WAIT: Duration = Duration::from_secs(1);

/// How long any one exchange with the server may take before the source gives up on the
/// connection (the client's own reconnecting would otherwise hide a dead link).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) struct Nats {
    client: async_nats::Client,
    consumer: PullConsumer,
    stream: String,
    /// Set by the client when its connection drops: it would reconnect by itself, but a pull
    /// request sent on the lost connection is gone, so the source reconnects instead (and shows
    /// the error meanwhile).
    lost: Arc<AtomicBool>,
    /// The acknowledgers of the messages read and not yet acknowledged, by identity (a
    /// redelivery during a slow commit adds a second one).
    held: HashMap<String, Vec<Acker>>,
    /// JetStream's acknowledgement deadline for this consumer.
    ack_wait: Duration,
}

fn failed<E: std::fmt::Display>(what: &str) -> impl Fn(E) -> BrokerError + '_ {
    move |error| BrokerError(format!("nats: {what}: {error}"))
}

/// Connects, finds the stream (it must exist: the source does not decide its retention or
/// storage) and makes the durable consumer if it is missing.
pub(crate) async fn connect(spec: &SourceSpec) -> Result<Box<dyn Broker>, BrokerError> {
    let BrokerSpec::Nats {
        stream,
        subject,
        consumer,
        ack_wait_ms,
        ..
    } = &spec.broker
    else {
        return Err(BrokerError("not a nats source".into()));
    };
    let url = spec
        .broker
        .resolve_url()
        .map_err(BrokerError)?
        .ok_or_else(|| BrokerError("no url".into()))?;
    let lost = Arc::new(AtomicBool::new(false));
    let flag = lost.clone();
    let client = async_nats::ConnectOptions::new()
        .name(format!("conveyor source {}", spec.name))
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(REQUEST_TIMEOUT))
        .event_callback(move |event| {
            let flag = flag.clone();
            async move {
                if matches!(event, async_nats::Event::Disconnected) {
                    flag.store(true, Ordering::Relaxed);
                }
            }
        })
        .connect(url.as_str())
        .await
        .map_err(failed("connect"))?;
    let jetstream = async_nats::jetstream::new(client.clone());
    let handle = match jetstream.get_stream(stream).await {
        Ok(handle) => handle,
        Err(error) => {
            let missing = matches!(
                error.kind(),
                GetStreamErrorKind::JetStream(error) if error.error_code() == ErrorCode::STREAM_NOT_FOUND
            );
            return Err(BrokerError(if missing {
                format!(
                    "nats: the stream {stream:?} does not exist (a source does not make it: \
                     create it with the subjects, retention and storage it needs)"
                )
            } else {
                format!("nats: read the stream {stream:?}: {error}")
            }));
        }
    };
    let ack_wait = ack_wait_ms.map_or(DEFAULT_ACK_WAIT, Duration::from_millis);
    // Room for the batch this source holds and one more: a batch read on a connection that
    // dropped stays pending until its ack wait ends, and must not stop the new connection.
    let max_ack_pending = i64::try_from(spec.max_in_flight.saturating_mul(2)).unwrap_or(i64::MAX);
    let filter = subject.clone().unwrap_or_default();
    let wanted = PullConfig {
        durable_name: Some(consumer.clone()),
        deliver_policy: match spec.start {
            Start::Earliest => DeliverPolicy::All,
            Start::Latest => DeliverPolicy::New,
        },
        ack_policy: AckPolicy::Explicit,
        ack_wait,
        filter_subject: filter.clone(),
        max_ack_pending,
        ..Default::default()
    };
    let existing = handle.consumer_info(consumer).await;
    let pull: PullConsumer = match existing {
        Err(error) if error.kind() == ConsumerInfoErrorKind::NotFound => handle
            .create_consumer(wanted)
            .await
            .map_err(failed("create the durable consumer"))?,
        Err(error) => return Err(failed("read the durable consumer")(error)),
        Ok(info) => {
            // Made earlier (by this source, or by hand): its start stays as it is; what the
            // source relies on is checked, and what it may change is brought in line.
            let mut config = info.config.clone();
            if config.ack_policy != AckPolicy::Explicit {
                return Err(BrokerError(format!(
                    "nats: the consumer {consumer:?} acknowledges {:?}; a source needs explicit \
                     acknowledgements (delete the consumer or name another)",
                    config.ack_policy
                )));
            }
            if config.filter_subject != filter {
                return Err(BrokerError(format!(
                    "nats: the consumer {consumer:?} reads the subject {:?}, not {filter:?} \
                     (delete the consumer or name another)",
                    config.filter_subject
                )));
            }
            if config.deliver_subject.is_some() {
                return Err(BrokerError(format!(
                    "nats: the consumer {consumer:?} is a push consumer; a source needs a pull \
                     consumer (delete it or name another)"
                )));
            }
            let stale = config.ack_wait != ack_wait
                || (config.max_ack_pending >= 0 && config.max_ack_pending < max_ack_pending);
            if stale {
                config.ack_wait = ack_wait;
                config.max_ack_pending = config.max_ack_pending.max(max_ack_pending);
                handle
                    .create_consumer(config)
                    .await
                    .map_err(failed("update the durable consumer"))?;
            }
            handle
                .get_consumer(consumer)
                .await
                .map_err(failed("open the durable consumer"))?
        }
    };
    Ok(Box::new(Nats {
        client,
        consumer: pull,
        stream: stream.clone(),
        lost,
        held: HashMap::new(),
        ack_wait,
    }))
}

impl Nats {
    fn check_connection(&self) -> Result<(), BrokerError> {
        if self.lost.load(Ordering::Relaxed) {
            return Err(BrokerError(
                "nats: the connection to the server was lost".into(),
            ));
        }
        Ok(())
    }

    /// Sends `kind` for every message held under `identities`, then flushes, so a dead
    /// connection shows here rather than in a redelivery later.
    async fn reply(&mut self, identities: &[String], kind: AckKind) -> Result<(), BrokerError> {
        let what = match kind {
            AckKind::Progress => "tell the server a message is in progress",
            _ => "acknowledge",
        };
        for identity in identities {
            if matches!(kind, AckKind::Ack) {
                for acker in self.held.remove(identity).unwrap_or_default() {
                    acker.ack_with(kind).await.map_err(failed(what))?;
                }
            } else if let Some(ackers) = self.held.get(identity) {
                for acker in ackers {
                    acker.ack_with(kind).await.map_err(failed(what))?;
                }
            }
        }
        tokio::time::timeout(REQUEST_TIMEOUT, self.client.flush())
            .await
            .map_err(|_| BrokerError(format!("nats: {what}: the server did not answer")))?
            .map_err(failed(what))
    }
}

#[async_trait::async_trait]
impl Broker for Nats {
    async fn receive(&mut self, max: usize) -> Result<Vec<Message>, BrokerError> {
        self.check_connection()?;
        // A fetch: the server answers as soon as it has messages (up to `max`), or after
        // FETCH_WAIT with none.
        let mut batch = self
            .consumer
            .fetch()
            .max_messages(max)
            .expires(FETCH_WAIT)
            .messages()
            .await
            .map_err(failed("fetch"))?;
        let mut messages = Vec::new();
        loop {
            let next = tokio::time::timeout(FETCH_WAIT + REQUEST_TIMEOUT, batch.next())
                .await
                .map_err(|_| BrokerError("nats: fetch: the server did not answer".into()))?;
            let Some(next) = next else { break };
            let message = match next {
                Ok(message) => message,
                // What was read before the error is kept: its messages are delivered, and
                // would otherwise wait their whole ack wait before coming again.
                Err(error) if !messages.is_empty() => {
                    tracing::debug!(%error, "nats: fetch ended early");
                    break;
                }
                Err(error) => return Err(failed("fetch")(error)),
            };
            let (identity, sent_at) = {
                let info = message
                    .info()
                    .map_err(failed("read a message's metadata"))?;
                let sent_at = chrono::DateTime::from_timestamp(
                    info.published.unix_timestamp(),
                    info.published.nanosecond(),
                );
                (format!("{}:{}", self.stream, info.stream_sequence), sent_at)
            };
            let (message, acker) = message.split();
            let mut headers = BTreeMap::new();
            if let Some(map) = &message.headers {
                for (name, values) in map.iter() {
                    // A header given more than once keeps its last value, as HTTP's would.
                    if let Some(value) = values.last() {
                        headers.insert(name.to_string(), value.to_string());
                    }
                }
            }
            self.held.entry(identity.clone()).or_default().push(acker);
            messages.push(Message {
                identity,
                sent_at,
                headers,
                subject: Some(message.subject.to_string()),
                body: message.payload.to_vec(),
            });
        }
        Ok(messages)
    }

    /// A plain acknowledgement (`+ACK`), not a double one waiting for the server's
    /// confirmation: an acknowledgement that is lost only brings the message again after its
    /// ack wait, and its idempotency key finds the job it already made. The flush makes a
    /// connection that died show as an error here.
    async fn ack(&mut self, identities: &[String]) -> Result<(), BrokerError> {
        self.reply(identities, AckKind::Ack).await
    }

    /// `+WPI` for every message still held: JetStream restarts its ack wait.
    fn keep_every(&self) -> Duration {
        (self.ack_wait / 3).min(crate::ingest::KEEP_EVERY)
    }

    async fn keep(&mut self, identities: &[String]) -> Result<(), BrokerError> {
        self.reply(identities, AckKind::Progress).await
    }

    /// The consumer's `num_pending`: messages in the stream (matching its subject) not yet
    /// delivered to it. Delivered and unacknowledged ones (`num_ack_pending`) are left out: they
    /// are the batch being committed, not messages waiting.
    async fn lag(&mut self) -> Result<Option<u64>, BrokerError> {
        self.check_connection()?;
        let info = self
            .consumer
            .info()
            .await
            .map_err(failed("read the consumer's pending count"))?;
        Ok(Some(info.num_pending))
    }
}
