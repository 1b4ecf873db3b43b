//! The loop every source runs, whatever its broker: read a batch, commit its jobs in one
//! store call, and only then acknowledge the batch at the broker. A failed commit acknowledges
//! nothing (the broker redelivers); a refusal (a queue at its maximum depth) stops the reading,
//! keeps the batch and tries it again after a pause, instead of taking more.
//!
//! A source that emits events fans each message's event out to its subscriptions
//! (`conveyor_engine::events`), and the batch's jobs and flows go in the same one store call.

use chrono::Utc;
use conveyor_core::error_class;
use conveyor_core::sources::{raw_payload, Message, OnInvalid, SourceSpec};
use conveyor_core::subscriptions::Event;
use conveyor_core::{ErrorRecord, Job, JobState, NewJob, Store, StoreError, ValidJob};
use conveyor_engine::events::{self, Fanout};
use conveyor_engine::KindRegistry;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// What a broker failed to do (connect, read, acknowledge), as it said it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BrokerError(pub String);

/// One connection to a broker, read by one source.
#[async_trait::async_trait]
pub trait Broker: Send {
    /// Up to `max` messages, waiting a short while (about a second) for the first; empty when
    /// none came.
    async fn receive(&mut self, max: usize) -> Result<Vec<Message>, BrokerError>;

    /// Acknowledges messages by identity, once their jobs are durable.
    async fn ack(&mut self, identities: &[String]) -> Result<(), BrokerError>;

    /// Tells the broker that messages read but not yet acknowledged are still being worked on
    /// (a JetStream ack-progress, an SQS visibility extension), while their commit is slow or
    /// the target queue holds them back. Brokers that redeliver only on a lost connection
    /// need nothing.
    async fn keep(&mut self, _identities: &[String]) -> Result<(), BrokerError> {
        Ok(())
    }

    /// How often `keep` must run for a held batch not to be redelivered: a third of the
    /// broker's acknowledgement deadline where it has one.
    fn keep_every(&self) -> Duration {
        KEEP_EVERY
    }

    /// How many messages wait at the broker for this source, where the broker says (a stream
    /// group's lag, a queue's ready count, a consumer's pending count).
    async fn lag(&mut self) -> Result<Option<u64>, BrokerError> {
        Ok(None)
    }
}

/// A consumer's name where the configuration gives none: the host's name and this process's
/// id, so servers sharing a source are told apart by the broker.
pub fn default_consumer() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "conveyor".into());
    format!("{host}-{}", std::process::id())
}

/// A broker connection that hands over one message at a time (AMQP deliveries, MQTT
/// publishes), gathered into batches by [`gather`].
#[async_trait::async_trait]
pub(crate) trait OneAtATime: Send {
    /// The next message, waiting at most `wait`; `None` when none came.
    async fn next(&mut self, wait: Duration) -> Result<Option<Message>, BrokerError>;
}

/// How long a batch waits for its first message, and then for each next one: brokers that push
/// send what they hold ahead (a prefetch, an in-flight window), so a pause of a few
/// milliseconds means they hold no more right now.
const FIRST_WAIT: Duration = Duration::from_secs(1);
const MORE_WAIT: Duration = Duration::from_millis(5);

/// Up to `max` messages: waits about a second for the first, then takes what follows until a
/// few milliseconds pass with nothing new.
pub(crate) async fn gather(
    source: &mut dyn OneAtATime,
    max: usize,
) -> Result<Vec<Message>, BrokerError> {
    let mut messages = Vec::new();
    let Some(first) = source.next(FIRST_WAIT).await? else {
        return Ok(messages);
    };
    messages.push(first);
    while messages.len() < max {
        match source.next(MORE_WAIT).await? {
            Some(message) => messages.push(message),
            None => break,
        }
    }
    Ok(messages)
}

/// What a source is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceState {
    Starting,
    Running,
    /// Paused by an operator: not reading.
    Paused,
    /// The target queue refused the batch (back-pressure): reading waits.
    BackingOff,
    /// The broker or the store failed; the source retries with backoff.
    Error,
    Stopped,
}

impl SourceState {
    pub fn as_str(self) -> &'static str {
        match self {
            SourceState::Starting => "starting",
            SourceState::Running => "running",
            SourceState::Paused => "paused",
            SourceState::BackingOff => "backing_off",
            SourceState::Error => "error",
            SourceState::Stopped => "stopped",
        }
    }
}

/// A source's state and counts in this process, shown by `GET /v1/sources/{name}`.
#[derive(Debug)]
pub struct SourceStatus {
    pub spec: SourceSpec,
    state: Mutex<(SourceState, Option<String>)>,
    received: AtomicU64,
    enqueued: AtomicU64,
    duplicates: AtomicU64,
    invalid: AtomicU64,
    refused: AtomicU64,
    /// Messages whose event no subscription takes (acknowledged, nothing stored).
    unmatched: AtomicU64,
    /// The broker's last answer to [`Broker::lag`] (`u64::MAX`: none yet, or not reported).
    lag: AtomicU64,
}

impl SourceStatus {
    pub fn new(spec: SourceSpec) -> Self {
        let state = if spec.paused {
            SourceState::Paused
        } else {
            SourceState::Starting
        };
        Self {
            spec,
            state: Mutex::new((state, None)),
            received: AtomicU64::new(0),
            enqueued: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
            invalid: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            unmatched: AtomicU64::new(0),
            lag: AtomicU64::new(u64::MAX),
        }
    }

    pub fn state(&self) -> SourceState {
        self.state.lock().map(|s| s.0).unwrap_or(SourceState::Error)
    }

    pub(crate) fn set(&self, state: SourceState, error: Option<String>) {
        if let Ok(mut current) = self.state.lock() {
            // The last error stays shown after the source recovers, until another replaces it.
            let last = error.or_else(|| current.1.take());
            *current = (state, last);
        }
    }

    /// Counts by outcome: `received`, `enqueued`, `duplicate`, `invalid`, `refused`,
    /// `unmatched` (a source emitting events: an event no subscription takes). A source
    /// emitting events counts each job and flow its events make as `enqueued` or `duplicate`.
    pub fn counts(&self) -> [(&'static str, u64); 6] {
        [
            ("received", self.received.load(Ordering::Relaxed)),
            ("enqueued", self.enqueued.load(Ordering::Relaxed)),
            ("duplicate", self.duplicates.load(Ordering::Relaxed)),
            ("invalid", self.invalid.load(Ordering::Relaxed)),
            ("refused", self.refused.load(Ordering::Relaxed)),
            ("unmatched", self.unmatched.load(Ordering::Relaxed)),
        ]
    }

    /// How many messages wait at the broker, where it says.
    pub fn lag(&self) -> Option<u64> {
        Some(self.lag.load(Ordering::Relaxed)).filter(|&lag| lag != u64::MAX)
    }

    /// The source as the API shows it: its configuration, state, last error and counts.
    pub fn view(&self) -> Value {
        let (state, last_error) = self
            .state
            .lock()
            .map(|s| (s.0, s.1.clone()))
            .unwrap_or((SourceState::Error, None));
        let mut view = serde_json::to_value(&self.spec).unwrap_or_else(|_| json!({}));
        // A URL may carry a password: shown without it.
        if let Some(url) = view.get("url").and_then(Value::as_str) {
            view["url"] = json!(without_password(url));
        }
        view["state"] = json!(state.as_str());
        view["last_error"] = json!(last_error);
        view["received"] = json!(self.received.load(Ordering::Relaxed));
        view["enqueued"] = json!(self.enqueued.load(Ordering::Relaxed));
        view["duplicates"] = json!(self.duplicates.load(Ordering::Relaxed));
        view["invalid"] = json!(self.invalid.load(Ordering::Relaxed));
        view["refused"] = json!(self.refused.load(Ordering::Relaxed));
        view["unmatched"] = json!(self.unmatched.load(Ordering::Relaxed));
        view["lag"] = json!(self.lag());
        view
    }
}

fn without_password(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((user_info, host)) if user_info.contains(':') => {
            let user = user_info.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

/// How often a source asks its broker for its lag.
const LAG_EVERY: Duration = Duration::from_secs(5);

/// How often a batch held back (a slow or refused commit) is kept at the broker, unless the
/// broker asks for more often ([`Broker::keep_every`]).
pub(crate) const KEEP_EVERY: Duration = Duration::from_secs(5);

/// How long to wait before trying again after the `n`th failure in a row: 100 ms doubling to
/// 10 s.
fn backoff(n: u32) -> Duration {
    Duration::from_millis(100u64.saturating_mul(1 << n.min(7))).min(Duration::from_secs(10))
}

/// Runs one source until `shutdown`: connects with `connect` (again after any broker error,
/// with backoff) and ingests.
pub async fn run<F, Fut>(
    status: Arc<SourceStatus>,
    store: Arc<dyn Store>,
    connect: F,
    shutdown: CancellationToken,
) where
    F: Fn() -> Fut + Send,
    Fut: std::future::Future<Output = Result<Box<dyn Broker>, BrokerError>> + Send,
{
    // Payloads are checked against their kind's schema, as an enqueue over HTTP is.
    let kinds = KindRegistry::new(store.clone());
    let mut failures = 0u32;
    while !shutdown.is_cancelled() {
        let broker = tokio::select! {
            broker = connect() => broker,
            _ = shutdown.cancelled() => break,
        };
        let error = match broker {
            Ok(mut broker) => {
                status.set(SourceState::Running, None);
                failures = 0;
                match ingest(&status, store.as_ref(), &kinds, broker.as_mut(), &shutdown).await {
                    Ok(()) => break,
                    Err(error) => error,
                }
            }
            Err(error) => error,
        };
        tracing::warn!(source = %status.spec.name, %error, "source failed; retrying");
        status.set(SourceState::Error, Some(error.to_string()));
        failures = failures.saturating_add(1);
        tokio::select! {
            _ = tokio::time::sleep(backoff(failures)) => {}
            _ = shutdown.cancelled() => break,
        }
    }
    status.set(SourceState::Stopped, None);
}

/// Reads and commits until shutdown or a broker error.
async fn ingest(
    status: &SourceStatus,
    store: &dyn Store,
    kinds: &KindRegistry,
    broker: &mut dyn Broker,
    shutdown: &CancellationToken,
) -> Result<(), BrokerError> {
    let spec = &status.spec;
    let mut lag_read: Option<Instant> = None;
    while !shutdown.is_cancelled() {
        if lag_read.is_none_or(|at| at.elapsed() >= LAG_EVERY) {
            lag_read = Some(Instant::now());
            let lag = broker.lag().await?;
            status.lag.store(lag.unwrap_or(u64::MAX), Ordering::Relaxed);
        }
        let messages = tokio::select! {
            messages = broker.receive(spec.max_in_flight) => messages?,
            _ = shutdown.cancelled() => return Ok(()),
        };
        if messages.is_empty() {
            continue;
        }
        status
            .received
            .fetch_add(messages.len() as u64, Ordering::Relaxed);
        let identities: Vec<String> = messages.iter().map(|m| m.identity.clone()).collect();
        let mut batch = Batch::of(spec, &messages);
        // The batch is committed before anything is acknowledged; it is tried again (not read
        // again) until it is, or until shutdown leaves it to the broker to redeliver. Meanwhile
        // the broker is told the messages are still being worked on.
        let mut failures = 0u32;
        let mut kept = Instant::now();
        let keep_every = broker.keep_every().max(Duration::from_millis(100));
        loop {
            if kept.elapsed() >= keep_every {
                kept = Instant::now();
                broker.keep(&identities).await?;
            }
            let stored = match batch.check_schemas(spec, &messages, kinds).await {
                Ok(()) => match batch.fan_out(spec, &messages, store, kinds).await {
                    Ok((fanout, unmatched)) => batch
                        .commit(store, fanout)
                        .await
                        .map(|counts| (counts, unmatched)),
                    Err(error) => Err(error),
                },
                Err(error) => Err(error),
            };
            match stored {
                Ok(((enqueued, duplicates), unmatched)) => {
                    status.unmatched.fetch_add(unmatched, Ordering::Relaxed);
                    status.invalid.fetch_add(batch.invalid, Ordering::Relaxed);
                    status.enqueued.fetch_add(enqueued, Ordering::Relaxed);
                    status.duplicates.fetch_add(duplicates, Ordering::Relaxed);
                    break;
                }
                Err(error) => {
                    let wait = match &error {
                        StoreError::QueueFull { retry_after, .. } => {
                            status.refused.fetch_add(1, Ordering::Relaxed);
                            status.set(SourceState::BackingOff, Some(error.to_string()));
                            (*retry_after).max(Duration::from_millis(100))
                        }
                        _ => {
                            tracing::warn!(source = %spec.name, %error, "committing a source's batch failed");
                            status.set(SourceState::Error, Some(error.to_string()));
                            failures = failures.saturating_add(1);
                            backoff(failures)
                        }
                    };
                    tokio::select! {
                        _ = tokio::time::sleep(wait.min(keep_every)) => {}
                        _ = shutdown.cancelled() => return Ok(()),
                    }
                }
            }
        }
        status.set(SourceState::Running, None);
        broker.ack(&identities).await?;
    }
    Ok(())
}

/// A batch's jobs: the ones to enqueue, checked as an enqueue over HTTP is, and dead ones for
/// the messages that cannot run (a mapping that fails, a job that fails the checks, or with
/// `on_invalid = "dead_letter"` a body that is not JSON). One bad message must not hold up the
/// rest: the store refuses a whole batch for any invalid job, and the batch is tried again
/// until it is stored.
struct Batch {
    /// Each with the index of its message.
    jobs: Vec<(ValidJob, usize)>,
    /// A source emitting events: each message's, with the index of its message.
    events: Vec<(Event, usize)>,
    dead: Vec<Job>,
    invalid: u64,
}

impl Batch {
    fn of(spec: &SourceSpec, messages: &[Message]) -> Self {
        let mut batch = Batch {
            jobs: Vec::with_capacity(messages.len()),
            events: Vec::new(),
            dead: Vec::new(),
            invalid: 0,
        };
        for (index, message) in messages.iter().enumerate() {
            let unmapped = || unmapped(spec, message);
            if spec.event.is_some() {
                let (job, reason) = match spec.event_for(message) {
                    Ok(mapped) if mapped.invalid && spec.on_invalid == OnInvalid::DeadLetter => {
                        (unmapped(), "the body is not JSON".to_string())
                    }
                    Ok(mapped) => {
                        batch.invalid += u64::from(mapped.invalid);
                        batch.events.push((mapped.event, index));
                        continue;
                    }
                    Err(error) => (unmapped(), error.to_string()),
                };
                batch.invalid += 1;
                batch.dead.push(dead_job(spec, message, job, reason));
                continue;
            }
            let (job, reason) = match spec.job_for(message) {
                Ok(mapped) if mapped.invalid && spec.on_invalid == OnInvalid::DeadLetter => {
                    (mapped.job, "the body is not JSON".to_string())
                }
                Ok(mapped) => {
                    batch.invalid += u64::from(mapped.invalid);
                    match ValidJob::new(mapped.job) {
                        Ok(job) => {
                            batch.jobs.push((job, index));
                            continue;
                        }
                        Err(error) => (unmapped(), error.to_string()),
                    }
                }
                Err(error) => (unmapped(), error.to_string()),
            };
            batch.invalid += 1;
            batch.dead.push(dead_job(spec, message, job, reason));
        }
        batch
    }

    /// Moves the jobs whose payload their kind's schema refuses to the dead ones. Safe to run
    /// again on a batch tried again: only the jobs still to enqueue are checked.
    async fn check_schemas(
        &mut self,
        spec: &SourceSpec,
        messages: &[Message],
        kinds: &KindRegistry,
    ) -> Result<(), StoreError> {
        let mut index = 0;
        while let Some((job, message)) = self.jobs.get(index) {
            match kinds.check(&job.job().kind, &job.job().payload).await {
                Ok(()) => index += 1,
                Err(StoreError::Invalid(error)) => {
                    let reason = format!(
                        "the payload does not match the schema of kind {:?}: {error}",
                        job.job().kind
                    );
                    let message = &messages[*message];
                    let (job, _) = self.jobs.remove(index);
                    self.invalid += 1;
                    self.dead
                        .push(dead_job(spec, message, job.into_job(), reason));
                }
                // A store that could not be read: the caller tries the batch again.
                Err(other) => return Err(other),
            }
        }
        Ok(())
    }

    /// What the batch's events make, checked (see `conveyor_engine::events`), and how many
    /// events no subscription takes. A message whose event a check refuses goes to the dead
    /// ones, alone. Run again on a batch tried again: the subscriptions are read afresh.
    async fn fan_out(
        &mut self,
        spec: &SourceSpec,
        messages: &[Message],
        store: &dyn Store,
        kinds: &KindRegistry,
    ) -> Result<(Fanout, u64), StoreError> {
        let mut all = Fanout::default();
        let mut unmatched = 0;
        if self.events.is_empty() {
            return Ok((all, unmatched));
        }
        let subscriptions = events::subscriptions(store).await?;
        let mut index = 0;
        while let Some((event, message)) = self.events.get(index) {
            let id = event.id.clone().unwrap_or_default();
            match events::fan_out(&subscriptions, event, &id, kinds).await {
                Ok(fanout) => {
                    unmatched += u64::from(fanout.is_empty());
                    all.extend(fanout);
                    index += 1;
                }
                Err(StoreError::Invalid(error)) => {
                    let message = &messages[*message];
                    let reason = format!("its event {:?} is refused: {error}", event.name);
                    self.events.remove(index);
                    self.invalid += 1;
                    self.dead
                        .push(dead_job(spec, message, unmapped(spec, message), reason));
                }
                // A store that could not be read: the caller tries the batch again.
                Err(other) => return Err(other),
            }
        }
        Ok((all, unmatched))
    }

    /// Stores the batch: returns how many jobs (and flows, made by events) were new and how
    /// many were duplicates (a message seen before). The jobs and what the events make go in
    /// one call (`events_accept` when there are events' jobs or flows). The dead jobs go in a
    /// second call (`jobs_import`); if only the first is stored, the retry finds its jobs and
    /// flows by their idempotency keys and the dead ones by their ids, so nothing is stored
    /// twice.
    async fn commit(&self, store: &dyn Store, fanout: Fanout) -> Result<(u64, u64), StoreError> {
        let mut enqueued = 0;
        let mut duplicates = 0;
        let mut count = |duplicate: bool| {
            if duplicate {
                duplicates += 1;
            } else {
                enqueued += 1;
            }
        };
        if !fanout.is_empty() {
            let mut jobs: Vec<ValidJob> = self.jobs.iter().map(|(job, _)| job.clone()).collect();
            jobs.extend(fanout.jobs);
            let accepted = store.events_accept(jobs, fanout.flows).await?;
            accepted.jobs.iter().for_each(|job| count(job.duplicate));
            accepted.flows.iter().for_each(|flow| count(flow.duplicate));
        } else if !self.jobs.is_empty() {
            let jobs = self.jobs.iter().map(|(job, _)| job.clone()).collect();
            for inserted in store.jobs_insert_valid(jobs).await? {
                count(inserted.duplicate);
            }
        }
        if !self.dead.is_empty() {
            let stored = store.jobs_import(self.dead.clone()).await?;
            enqueued += stored;
            duplicates += (self.dead.len() as u64).saturating_sub(stored);
        }
        Ok((enqueued, duplicates))
    }
}

/// The job of a message that cannot be mapped, before it goes to the dead-letter queue.
fn unmapped(spec: &SourceSpec, message: &Message) -> NewJob {
    let mut job = NewJob::new(format!("{}.unmapped", spec.name), Value::Null);
    job.idempotency_key = Some(spec.idempotency_key(message));
    job
}

/// A message that cannot be run, stored in the dead-letter queue with its raw body. Its id is
/// derived from the message, so a redelivery finds it instead of adding another: a UUIDv7 of
/// the time the broker stamped on the message (ids stay in time order, which retention's scan
/// relies on) whose random part is a hash of the message's identity. A message without a time
/// takes now, and so a redelivery of it may add a second dead job.
fn dead_job(spec: &SourceSpec, message: &Message, job: NewJob, reason: String) -> Job {
    let now = Utc::now();
    let digest = Sha256::digest(spec.idempotency_key(message).as_bytes());
    let mut random = [0u8; 10];
    random.copy_from_slice(&digest[..10]);
    let at = message.sent_at.unwrap_or(now);
    let millis = u64::try_from(at.timestamp_millis()).unwrap_or(0);
    let id = uuid::Builder::from_unix_timestamp_millis(millis, &random).into_uuid();
    let mut job = job;
    job.payload = raw_payload(message);
    let mut stored = job.into_stored(id, now);
    stored.state = JobState::Dead;
    stored.finished_at = Some(now);
    stored.errors.push(ErrorRecord {
        attempt: 0,
        at: now,
        class: error_class::INVALID_PAYLOAD.to_string(),
        message: format!("source {}: {reason}", spec.name),
        worker_id: None,
        started_at: None,
        backtrace: None,
        replayed_at: None,
    });
    stored
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_password_in_a_url_is_not_shown() {
        assert_eq!(
            without_password("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(
            without_password("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
    }

    #[test]
    fn backoff_doubles_to_ten_seconds() {
        assert_eq!(backoff(0), Duration::from_millis(100));
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(20), Duration::from_secs(10));
    }
}
