//! A RabbitMQ (AMQP 0-9-1) queue, consumed with manual acknowledgements and a prefetch of
//! `max_in_flight`. The queue must exist: it is declared passively, never made, so a typo in
//! its name is an error instead of a new, empty queue nobody publishes to.
//!
//! Nothing is acknowledged before the commit holding its job. A message delivered and not
//! acknowledged stays with the connection that received it; RabbitMQ puts it back in the queue
//! when that connection (or its channel) closes — a killed server, a cut link, or the loop
//! reconnecting after an error — and another consumer gets it again, flagged as redelivered.
//! Its identity is the same then (the `message_id` property, or a hash of its content), so it
//! finds the job it already made.

use conveyor_core::sources::{BrokerSpec, Message, SourceSpec};
use futures::StreamExt;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, Consumer};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use crate::ingest::{Broker, BrokerError};

/// How long connecting (TCP, the AMQP handshake, the queue's check, the consumer) may take
/// before it counts as failed: a broker that accepts and never answers must not hang the source.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

/// Headers RabbitMQ itself adds or changes when it delivers a message again (quorum queues'
/// delivery count, dead-lettering's history): left out of the hash that is a message's
/// identity, which must not change on redelivery.
fn broker_header(name: &str) -> bool {
    name == "x-delivery-count"
        || name == "x-death"
        || name.starts_with("x-first-death-")
        || name.starts_with("x-last-death-")
}

pub(crate) struct Amqp {
    /// Kept so the connection lives as long as the consumer; dropping it closes the
    /// connection, which hands every unacknowledged delivery back to the queue.
    _connection: Connection,
    channel: Channel,
    consumer: Consumer,
    queue: String,
    /// Delivery tags by message identity, for the messages read and not yet acknowledged
    /// (several when one batch holds the same message twice).
    held: HashMap<String, Vec<u64>>,
    /// Every delivery tag read and not acknowledged, whether or not a batch returned it (a
    /// receive cancelled half-way leaves some here): acknowledging with `multiple` is only
    /// safe when none of these lies below the highest tag acknowledged.
    outstanding: BTreeSet<u64>,
}

fn failed<E: std::fmt::Display>(what: String) -> impl Fn(E) -> BrokerError {
    move |error| BrokerError(format!("amqp: {what}: {error}"))
}

/// Connects, checks the queue is there, sets the prefetch and starts consuming.
pub(crate) async fn connect(spec: &SourceSpec) -> Result<Box<dyn Broker>, BrokerError> {
    match tokio::time::timeout(CONNECT_TIMEOUT, open(spec)).await {
        Ok(Ok(broker)) => Ok(Box::new(broker)),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(BrokerError(format!(
            "amqp: connecting took more than {} s",
            CONNECT_TIMEOUT.as_secs()
        ))),
    }
}

async fn open(spec: &SourceSpec) -> Result<Amqp, BrokerError> {
    let BrokerSpec::Amqp {
        queue, consumer, ..
    } = &spec.broker
    else {
        return Err(BrokerError("not an amqp source".into()));
    };
    let url = spec
        .broker
        .resolve_url()
        .map_err(BrokerError)?
        .ok_or_else(|| BrokerError("amqp: no url".into()))?;
    let properties = ConnectionProperties::default()
        .with_connection_name(format!("conveyor source {}", spec.name).into());
    let connection = Connection::connect(&url, properties)
        .await
        .map_err(failed("connect".into()))?;
    let channel = connection
        .create_channel()
        .await
        .map_err(failed("open a channel".into()))?;
    channel
        .queue_declare(
            queue.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!(
            "the queue {queue:?} cannot be read (it must exist: the source checks it and never declares it)"
        )))?;
    // The prefetch bounds what the broker hands over unacknowledged: one batch.
    let prefetch = u16::try_from(spec.max_in_flight).unwrap_or(u16::MAX);
    channel
        .basic_qos(prefetch, BasicQosOptions { global: false })
        .await
        .map_err(failed("set the prefetch".into()))?;
    let tag = consumer
        .clone()
        .unwrap_or_else(crate::ingest::default_consumer);
    let consumer = channel
        .basic_consume(
            queue.as_str().into(),
            tag.as_str().into(),
            BasicConsumeOptions {
                no_ack: false,
                ..BasicConsumeOptions::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(failed(format!("consume the queue {queue:?}")))?;
    Ok(Amqp {
        _connection: connection,
        channel,
        consumer,
        queue: queue.clone(),
        held: HashMap::new(),
        outstanding: BTreeSet::new(),
    })
}

/// A header's value as text, for the ones that have a plain text form (strings, numbers,
/// booleans, timestamps); tables, arrays and decimals are left out.
fn header_text(value: &AMQPValue) -> Option<String> {
    Some(match value {
        AMQPValue::ShortString(text) => text.as_str().to_string(),
        AMQPValue::LongString(text) => String::from_utf8_lossy(text.as_bytes()).into_owned(),
        AMQPValue::ByteArray(bytes) => String::from_utf8_lossy(bytes.as_slice()).into_owned(),
        AMQPValue::Boolean(value) => value.to_string(),
        AMQPValue::ShortShortInt(value) => value.to_string(),
        AMQPValue::ShortShortUInt(value) => value.to_string(),
        AMQPValue::ShortInt(value) => value.to_string(),
        AMQPValue::ShortUInt(value) => value.to_string(),
        AMQPValue::LongInt(value) => value.to_string(),
        AMQPValue::LongUInt(value) => value.to_string(),
        AMQPValue::LongLongInt(value) => value.to_string(),
        AMQPValue::Float(value) => value.to_string(),
        AMQPValue::Double(value) => value.to_string(),
        AMQPValue::Timestamp(value) => value.to_string(),
        AMQPValue::DecimalValue(_)
        | AMQPValue::FieldArray(_)
        | AMQPValue::FieldTable(_)
        | AMQPValue::Void => return None,
    })
}

/// The message's headers: its headers table's text values, and its `type` and
/// `content_type` properties under those names (a header of the same name wins).
fn headers_of(properties: &BasicProperties) -> BTreeMap<String, String> {
    let mut headers = BTreeMap::new();
    if let Some(kind) = properties.kind() {
        headers.insert("type".to_string(), kind.as_str().to_string());
    }
    if let Some(content_type) = properties.content_type() {
        headers.insert(
            "content_type".to_string(),
            content_type.as_str().to_string(),
        );
    }
    if let Some(table) = properties.headers() {
        for (name, value) in table.inner() {
            if let Some(text) = header_text(value) {
                headers.insert(name.as_str().to_string(), text);
            }
        }
    }
    headers
}

/// The identity of a message without a `message_id`: the SHA-256 (hex) of its body and
/// headers, each length-prefixed so no two different messages write the same bytes. Headers
/// RabbitMQ adds on redelivery are left out.
fn content_hash(body: &[u8], headers: &BTreeMap<String, String>) -> String {
    let mut hash = Sha256::new();
    hash.update((body.len() as u64).to_be_bytes());
    hash.update(body);
    for (name, value) in headers {
        if broker_header(name) {
            continue;
        }
        hash.update((name.len() as u64).to_be_bytes());
        hash.update(name.as_bytes());
        hash.update((value.len() as u64).to_be_bytes());
        hash.update(value.as_bytes());
    }
    hash.finalize()
        .iter()
        .map(|byte| format!("{byte:02x}"))
        .collect()
}

/// A delivery as a source's message.
fn message_of(delivery: &lapin::message::Delivery) -> Message {
    let headers = headers_of(&delivery.properties);
    let identity = match delivery.properties.message_id() {
        Some(id) if !id.as_str().is_empty() => id.as_str().to_string(),
        _ => content_hash(&delivery.data, &headers),
    };
    // AMQP timestamps are seconds since the epoch.
    let sent_at = (*delivery.properties.timestamp())
        .and_then(|seconds| i64::try_from(seconds).ok())
        .and_then(|seconds| chrono::DateTime::from_timestamp(seconds, 0));
    Message {
        identity,
        sent_at,
        headers,
        subject: Some(delivery.routing_key.as_str().to_string()),
        body: delivery.data.clone(),
    }
}

#[async_trait::async_trait]
impl crate::ingest::OneAtATime for Amqp {
    /// The next delivery, or `None` when none came within `wait`.
    async fn next(&mut self, wait: Duration) -> Result<Option<Message>, BrokerError> {
        let delivery = match tokio::time::timeout(wait, self.consumer.next()).await {
            Err(_) => return Ok(None),
            Ok(None) => {
                return Err(BrokerError(format!(
                    "amqp: the broker ended the consumer of {:?} (the queue deleted?)",
                    self.queue
                )))
            }
            Ok(Some(Err(error))) => return Err(failed("receive".into())(error)),
            Ok(Some(Ok(delivery))) => delivery,
        };
        let message = message_of(&delivery);
        // Noted at once, so a receive cancelled later still counts this tag as unacknowledged.
        self.outstanding.insert(delivery.delivery_tag);
        self.held
            .entry(message.identity.clone())
            .or_default()
            .push(delivery.delivery_tag);
        Ok(Some(message))
    }
}

#[async_trait::async_trait]
impl Broker for Amqp {
    async fn receive(&mut self, max: usize) -> Result<Vec<Message>, BrokerError> {
        crate::ingest::gather(self, max).await
    }

    /// Acknowledges every delivery of these identities: with one `basic.ack` (`multiple`) up
    /// to the highest tag when no other delivery read below it is still unacknowledged (the
    /// usual case: a batch is acknowledged whole), else one by one.
    async fn ack(&mut self, identities: &[String]) -> Result<(), BrokerError> {
        let mut tags = Vec::new();
        for identity in identities {
            if let Some(held) = self.held.remove(identity) {
                tags.extend(held);
            }
        }
        for tag in &tags {
            self.outstanding.remove(tag);
        }
        let Some(&highest) = tags.iter().max() else {
            return Ok(());
        };
        if self.outstanding.range(..highest).next().is_none() {
            self.channel
                .basic_ack(highest, BasicAckOptions { multiple: true })
                .await
                .map_err(failed("acknowledge".into()))?;
        } else {
            for tag in tags {
                self.channel
                    .basic_ack(tag, BasicAckOptions { multiple: false })
                    .await
                    .map_err(failed("acknowledge".into()))?;
            }
        }
        Ok(())
    }

    /// The queue's ready messages (its `message_count` from a passive declare): those not
    /// yet delivered to any consumer.
    async fn lag(&mut self) -> Result<Option<u64>, BrokerError> {
        let queue = self
            .channel
            .queue_declare(
                self.queue.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(failed(format!("read the depth of {:?}", self.queue)))?;
        Ok(Some(u64::from(queue.message_count())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_leaves_out_what_the_broker_adds_on_redelivery() {
        let mut headers = BTreeMap::from([("tenant".to_string(), "acme".to_string())]);
        let first = content_hash(b"{}", &headers);
        headers.insert("x-delivery-count".into(), "2".into());
        assert_eq!(content_hash(b"{}", &headers), first);
        headers.insert("tenant".into(), "other".into());
        assert_ne!(content_hash(b"{}", &headers), first);
        assert_eq!(first.len(), 64);
    }

    #[test]
    fn body_and_header_bytes_cannot_be_confused() {
        let a = content_hash(b"ab", &BTreeMap::from([("c".into(), "d".into())]));
        let b = content_hash(b"a", &BTreeMap::from([("bc".into(), "d".into())]));
        assert_ne!(a, b);
    }
}
