//! A Kafka topic, read by a member of a consumer group (krafka: the classic group protocol,
//! so the group's members share the topic's partitions and take over a dead member's). Offsets
//! are committed to the group only after the batch's jobs are durable, never automatically: a
//! crash or a rebalance makes the next reader start from the last offset committed, and the
//! messages read again find their jobs by their idempotency keys.
//!
//! A message's identity is `{topic}:{partition}:{offset}`: the same on every read.
//!
//! Each poll takes whole fetches (no record cap in the consumer), and this side hands them to
//! the ingest loop `max_in_flight` at a time. A consumer that cuts a fetch short parks its
//! position inside a record batch, and brokers differ on what a fetch from mid-batch returns:
//! Tansu 0.6 answers with the next batch, skipping the rest of the cut one.

use conveyor_core::sources::{BrokerSpec, Message, SourceSpec, Start};
use krafka::consumer::{
    AutoOffsetReset, Consumer, ConsumerRecord, OffsetAndMetadata, TopicPartition,
};
use krafka::error::{ErrorCode, KrafkaError};
use krafka::Kafka;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use crate::ingest::{default_consumer, Broker, BrokerError};

/// How long a poll waits for the first record.
const POLL_WAIT: Duration = Duration::from_secs(1);

pub(crate) struct KafkaTopic {
    consumer: Consumer,
    topic: String,
    /// Records polled and not yet handed out, in the order read (so per partition, by offset).
    fetched: VecDeque<Message>,
}

fn failed(what: &'static str) -> impl Fn(KrafkaError) -> BrokerError {
    move |error| BrokerError(format!("kafka: {what}: {error}"))
}

/// Joins the group and subscribes to the topic. A new group starts at the oldest record the
/// brokers hold (`start = "earliest"`) or at the end (`"latest"`).
pub(crate) async fn connect(spec: &SourceSpec) -> Result<Box<dyn Broker>, BrokerError> {
    let BrokerSpec::Kafka {
        topic,
        group,
        client_id,
        session_timeout_ms,
        ..
    } = &spec.broker
    else {
        return Err(BrokerError("not a kafka source".into()));
    };
    let brokers = spec
        .broker
        .resolve_url()
        .map_err(BrokerError)?
        .ok_or_else(|| BrokerError("kafka: no brokers given".into()))?;
    let kafka = Kafka::builder(brokers)
        .client_id(client_id.clone().unwrap_or_else(default_consumer))
        .connect()
        .await
        .map_err(failed("connect"))?;
    let reset = match spec.start {
        Start::Earliest => AutoOffsetReset::Earliest,
        Start::Latest => AutoOffsetReset::Latest,
    };
    let mut builder = kafka
        .consumer(group.as_str())
        .auto_offset_reset(reset)
        .enable_auto_commit(false)
        // Whole fetches: see the module's comment.
        .max_poll_records(-1)
        .max_buffered_records(0);
    if let Some(ms) = session_timeout_ms {
        let session = Duration::from_millis(*ms);
        // The member's heartbeats must come well within the session for it to stay in.
        builder = builder
            .session_timeout(session)
            .heartbeat_interval(session / 3);
    }
    let consumer = builder.build().await.map_err(failed("join the group"))?;
    consumer
        .subscribe([topic.as_str()])
        .await
        .map_err(failed("subscribe"))?;
    Ok(Box::new(KafkaTopic {
        consumer,
        topic: topic.clone(),
        fetched: VecDeque::new(),
    }))
}

/// The partition and offset in a message's identity.
fn position(identity: &str) -> Option<(i32, i64)> {
    let mut parts = identity.rsplitn(3, ':');
    let offset = parts.next()?.parse().ok()?;
    let partition = parts.next()?.parse().ok()?;
    Some((partition, offset))
}

/// A record as the ingest loop reads it.
fn message(record: ConsumerRecord) -> Message {
    let headers: BTreeMap<String, String> = record
        .headers
        .iter()
        .filter_map(|(name, value)| {
            let value = value.as_ref()?;
            Some((name.clone(), String::from_utf8_lossy(value).into_owned()))
        })
        .collect();
    Message {
        identity: format!("{}:{}:{}", record.topic, record.partition, record.offset),
        sent_at: chrono::DateTime::from_timestamp_millis(record.timestamp),
        headers,
        subject: Some(record.topic.to_string()),
        body: record.value.map(|value| value.to_vec()).unwrap_or_default(),
    }
}

/// A commit the group refused because the partitions moved to another member (a rebalance):
/// that member reads from the last committed offset, and finds these messages' jobs.
fn moved(error: &KrafkaError) -> bool {
    matches!(
        error,
        KrafkaError::Broker {
            code: ErrorCode::RebalanceInProgress
                | ErrorCode::IllegalGeneration
                | ErrorCode::UnknownMemberId
                | ErrorCode::FencedInstanceId,
            ..
        }
    )
}

#[async_trait::async_trait]
impl Broker for KafkaTopic {
    /// At most `max` records: those left from the last poll, else a new poll's.
    async fn receive(&mut self, max: usize) -> Result<Vec<Message>, BrokerError> {
        if self.fetched.is_empty() {
            let records = self
                .consumer
                .poll(POLL_WAIT)
                .await
                .map_err(failed("poll"))?;
            self.fetched = records.into_iter().map(message).collect();
        }
        let take = max.max(1).min(self.fetched.len());
        Ok(self.fetched.drain(..take).collect())
    }

    /// Commits, for each partition, the offset after the batch's last message.
    async fn ack(&mut self, identities: &[String]) -> Result<(), BrokerError> {
        let mut next: HashMap<i32, i64> = HashMap::new();
        for (partition, offset) in identities.iter().filter_map(|id| position(id)) {
            let entry = next.entry(partition).or_insert(offset + 1);
            *entry = (*entry).max(offset + 1);
        }
        if next.is_empty() {
            return Ok(());
        }
        let offsets: Vec<(TopicPartition, OffsetAndMetadata)> = next
            .into_iter()
            .map(|(partition, offset)| {
                (
                    TopicPartition::new(self.topic.as_str(), partition),
                    OffsetAndMetadata::new(offset),
                )
            })
            .collect();
        match self.consumer.commit_offsets(offsets).await {
            Ok(()) => Ok(()),
            Err(error) if moved(&error) => {
                tracing::debug!(%error, "kafka: the partitions moved before their offsets were committed");
                Ok(())
            }
            Err(error) => Err(failed("commit offsets")(error)),
        }
    }

    /// The records after this member's positions, over the partitions it holds, as the last
    /// fetches reported them, and those polled and not yet handed out; unknown until it holds
    /// partitions and knows where it stands in each.
    async fn lag(&mut self) -> Result<Option<u64>, BrokerError> {
        let lags = self.consumer.lag().await;
        if lags.is_empty() || lags.values().any(|lag| lag.position.is_none()) {
            return Ok(None);
        }
        let behind: u64 = lags.values().filter_map(|lag| lag.lag).sum();
        Ok(Some(behind + self.fetched.len() as u64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_identity_gives_back_its_partition_and_offset() {
        assert_eq!(position("orders:2:1234"), Some((2, 1234)));
        // A topic name may not hold ':', but the parse reads from the right regardless.
        assert_eq!(position("a:b:0:7"), Some((0, 7)));
        assert_eq!(position("orders:x:1"), None);
    }
}
