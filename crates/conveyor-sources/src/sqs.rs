//! An Amazon SQS queue (or a service speaking its API): ReceiveMessage (up to ten messages a
//! call, gathered into a batch for about a second), DeleteMessageBatch once their jobs are
//! durable, ChangeMessageVisibilityBatch while a batch is held back, and the queue's
//! ApproximateNumberOfMessages as its lag.
//!
//! A message's identity is its MessageId, which SQS keeps on every redelivery (the receipt
//! handle changes with each receive; it is what deleting needs, so it is kept beside).

use aws_sdk_sqs::config::{Credentials, Region};
use aws_sdk_sqs::error::DisplayErrorContext;
use aws_sdk_sqs::types::{
    ChangeMessageVisibilityBatchRequestEntry, DeleteMessageBatchRequestEntry,
    MessageSystemAttributeName, QueueAttributeName,
};
use aws_sdk_sqs::Client;
use conveyor_core::sources::{BrokerSpec, Message, SourceSpec};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use crate::ingest::{Broker, BrokerError};

/// The field's documented default.
const DEFAULT_VISIBILITY_SECS: u32 = 30;

/// SQS's limit on messages per ReceiveMessage and entries per batch call.
const SQS_BATCH: usize = 10;

/// How long a receive gathers messages into one batch.
const GATHER: Duration = Duration::from_secs(1);

/// Rounds of a delete or visibility change for entries SQS failed on its side.
const BATCH_ATTEMPTS: usize = 3;

pub(crate) struct Sqs {
    client: Client,
    queue_url: String,
    visibility_secs: i32,
    /// The receipt handle of each message read and not yet deleted, by identity: the latest
    /// one, as SQS only deletes a message by the handle of its latest receive.
    held: HashMap<String, String>,
}

fn failed<E: std::error::Error>(what: &str) -> impl Fn(E) -> BrokerError + '_ {
    move |error| BrokerError(format!("sqs: {what}: {}", DisplayErrorContext(&error)))
}

/// Builds the client (the endpoint, region and credentials the configuration gives, else the
/// SDK's defaults) and checks the queue answers.
pub(crate) async fn connect(spec: &SourceSpec) -> Result<Box<dyn Broker>, BrokerError> {
    let BrokerSpec::Sqs {
        queue_url,
        region,
        access_key_id_env,
        secret_access_key_env,
        visibility_timeout_secs,
        ..
    } = &spec.broker
    else {
        return Err(BrokerError("not an sqs source".into()));
    };
    let endpoint = spec.broker.resolve_url().map_err(BrokerError)?;
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(Region::new(region.clone()))
        // A dead endpoint fails a call (after the SDK's own retries) instead of hanging it;
        // the source then reconnects with backoff and shows the error.
        .timeout_config(
            aws_config::timeout::TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(5))
                .operation_attempt_timeout(Duration::from_secs(10))
                .operation_timeout(Duration::from_secs(30))
                .build(),
        );
    if let Some(endpoint) = endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    match (access_key_id_env, secret_access_key_env) {
        (Some(id_env), Some(secret_env)) => {
            let read = |name: &String| {
                std::env::var(name).map_err(|_| {
                    BrokerError(format!(
                        "sqs: the environment variable {name} (named for the credentials) is not set"
                    ))
                })
            };
            let credentials =
                Credentials::new(read(id_env)?, read(secret_env)?, None, None, "conveyor");
            loader = loader.credentials_provider(credentials);
        }
        (None, None) => {}
        _ => return Err(BrokerError(
            "sqs: give both access_key_id_env and secret_access_key_env, or neither (the SDK's \
                 own chain)"
                .into(),
        )),
    }
    let client = Client::new(&loader.load().await);
    let visibility = visibility_timeout_secs.unwrap_or(DEFAULT_VISIBILITY_SECS);
    let mut sqs = Sqs {
        client,
        queue_url: queue_url.clone(),
        visibility_secs: i32::try_from(visibility).unwrap_or(i32::MAX),
        held: HashMap::new(),
    };
    // A queue that is not there (or credentials it refuses) shows now, not at the first read.
    sqs.lag().await?;
    Ok(Box::new(sqs))
}

impl Sqs {
    /// One ReceiveMessage of up to `max` (at most ten), waiting up to `wait` seconds.
    async fn receive_once(
        &self,
        max: usize,
        wait: i32,
    ) -> Result<Vec<aws_sdk_sqs::types::Message>, BrokerError> {
        let output = self
            .client
            .receive_message()
            .queue_url(&self.queue_url)
            .max_number_of_messages(i32::try_from(max.min(SQS_BATCH)).unwrap_or(1))
            .wait_time_seconds(wait)
            .visibility_timeout(self.visibility_secs)
            .message_attribute_names("All")
            .message_system_attribute_names(MessageSystemAttributeName::SentTimestamp)
            .send()
            .await
            .map_err(failed("receive"))?;
        Ok(output.messages.unwrap_or_default())
    }
}

/// A received message as a source's, with its receipt handle.
fn message(received: aws_sdk_sqs::types::Message) -> Option<(Message, String)> {
    let identity = received.message_id?;
    let receipt = received.receipt_handle?;
    let sent_at = received
        .attributes
        .as_ref()
        .and_then(|attributes| attributes.get(&MessageSystemAttributeName::SentTimestamp))
        .and_then(|millis| millis.parse::<i64>().ok())
        .and_then(chrono::DateTime::from_timestamp_millis);
    // String and Number attributes are text; Binary ones are not headers and are left out.
    let headers: BTreeMap<String, String> = received
        .message_attributes
        .unwrap_or_default()
        .into_iter()
        .filter_map(|(name, value)| value.string_value.map(|text| (name, text)))
        .collect();
    Some((
        Message {
            identity,
            sent_at,
            headers,
            subject: None,
            body: received.body.unwrap_or_default().into_bytes(),
        },
        receipt,
    ))
}

#[async_trait::async_trait]
impl Broker for Sqs {
    /// ReceiveMessage returns at most ten: the first call waits up to a second (long polling),
    /// then calls without waiting gather more until `max`, an empty answer, or a second.
    async fn receive(&mut self, max: usize) -> Result<Vec<Message>, BrokerError> {
        let mut messages: Vec<Message> = Vec::new();
        let mut started: Option<Instant> = None;
        while messages.len() < max {
            let wait = if started.is_none() { 1 } else { 0 };
            let received = self.receive_once(max - messages.len(), wait).await?;
            let started_at = *started.get_or_insert_with(Instant::now);
            if received.is_empty() {
                break;
            }
            for received in received {
                let Some((message, receipt)) = message(received) else {
                    continue;
                };
                // SQS delivers at least once: a message may come twice in one gathering, and
                // is read once, deleted by its latest handle.
                if self
                    .held
                    .insert(message.identity.clone(), receipt)
                    .is_none()
                {
                    messages.push(message);
                }
            }
            if started_at.elapsed() >= GATHER {
                break;
            }
        }
        Ok(messages)
    }

    /// DeleteMessageBatch, ten at a time. Entries SQS failed on its side are tried again;
    /// any left failing (or refused as the sender's fault, such as a receipt handle that
    /// expired) are an error: the messages come again and their jobs are found by their
    /// idempotency keys.
    async fn ack(&mut self, identities: &[String]) -> Result<(), BrokerError> {
        let mut pending: Vec<(String, String)> = identities
            .iter()
            .filter_map(|identity| {
                let receipt = self.held.remove(identity)?;
                Some((identity.clone(), receipt))
            })
            .collect();
        for _ in 0..BATCH_ATTEMPTS {
            let mut retry = Vec::new();
            for chunk in pending.chunks(SQS_BATCH) {
                let entries = chunk
                    .iter()
                    .enumerate()
                    .map(|(index, (_, receipt))| {
                        DeleteMessageBatchRequestEntry::builder()
                            .id(index.to_string())
                            .receipt_handle(receipt)
                            .build()
                            .map_err(failed("build a delete"))
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let output = self
                    .client
                    .delete_message_batch()
                    .queue_url(&self.queue_url)
                    .set_entries(Some(entries))
                    .send()
                    .await
                    .map_err(failed("delete"))?;
                for failure in output.failed() {
                    let entry = failure
                        .id()
                        .parse::<usize>()
                        .ok()
                        .and_then(|index| chunk.get(index));
                    match entry {
                        Some(entry) if !failure.sender_fault() => retry.push(entry.clone()),
                        _ => {
                            return Err(BrokerError(format!(
                                "sqs: delete: {} ({})",
                                failure.code(),
                                failure.message().unwrap_or("no message")
                            )))
                        }
                    }
                }
            }
            if retry.is_empty() {
                return Ok(());
            }
            pending = retry;
        }
        Err(BrokerError(format!(
            "sqs: delete: {} messages failed on SQS's side {BATCH_ATTEMPTS} times",
            pending.len()
        )))
    }

    /// ChangeMessageVisibilityBatch: the held messages stay hidden for another
    /// `visibility_timeout_secs`. A failure is an error (the messages may come again, and are
    /// found by their idempotency keys).
    fn keep_every(&self) -> Duration {
        let visibility = Duration::from_secs(u64::try_from(self.visibility_secs).unwrap_or(1));
        (visibility / 3).min(crate::ingest::KEEP_EVERY)
    }

    async fn keep(&mut self, identities: &[String]) -> Result<(), BrokerError> {
        let held: Vec<&String> = identities
            .iter()
            .filter_map(|identity| self.held.get(identity))
            .collect();
        for chunk in held.chunks(SQS_BATCH) {
            let entries = chunk
                .iter()
                .enumerate()
                .map(|(index, receipt)| {
                    ChangeMessageVisibilityBatchRequestEntry::builder()
                        .id(index.to_string())
                        .receipt_handle(receipt.as_str())
                        .visibility_timeout(self.visibility_secs)
                        .build()
                        .map_err(failed("build a visibility change"))
                })
                .collect::<Result<Vec<_>, _>>()?;
            let output = self
                .client
                .change_message_visibility_batch()
                .queue_url(&self.queue_url)
                .set_entries(Some(entries))
                .send()
                .await
                .map_err(failed("extend the visibility timeout"))?;
            if let Some(failure) = output.failed().first() {
                return Err(BrokerError(format!(
                    "sqs: extend the visibility timeout: {} ({})",
                    failure.code(),
                    failure.message().unwrap_or("no message")
                )));
            }
        }
        Ok(())
    }

    /// ApproximateNumberOfMessages: the messages visible in the queue, waiting to be read (the
    /// ones received and not yet deleted are not counted).
    async fn lag(&mut self) -> Result<Option<u64>, BrokerError> {
        let output = self
            .client
            .get_queue_attributes()
            .queue_url(&self.queue_url)
            .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
            .send()
            .await
            .map_err(failed("read the queue's attributes"))?;
        Ok(output
            .attributes()
            .and_then(|attributes| attributes.get(&QueueAttributeName::ApproximateNumberOfMessages))
            .and_then(|count| count.parse().ok()))
    }
}
