//! Alerts: signed webhook notifications when jobs enter the dead-letter queue, when a queue's
//! depth or oldest job's age stays past its threshold, and when a worker goes stale.
//!
//! **Who alerts.** The engine runs in every server but acts only while its node leads
//! maintenance (the same leadership that marks stale workers dead), so two servers never both
//! alert. It reads the store every [`AlertConfig::check_interval`]: the queues' counts and the
//! worker registry. Conditions seen before the node became leader are its baseline, not news.
//!
//! **When.** A dead-letter alert fires when a queue's dead count grows (one alert for every job
//! that died since the last one, with samples); a stale-worker alert when the registry shows a
//! worker newly marked dead; a threshold alert once the queue has been past its threshold for
//! [`AlertConfig::sustain`] without a break. Each (alert, subject) pair is then quiet for
//! [`AlertConfig::cooldown`]: deaths during it are summed into the next dead-letter alert, a
//! condition that still holds afterwards alerts again, and a worker that goes stale twice within
//! it alerts once.
//!
//! **Delivery.** Alerts go into a bounded queue ([`AlertConfig::queue_capacity`]; when it is
//! full, new alerts are dropped and logged) drained by a background task that POSTs each one
//! as JSON, retrying with exponential backoff. Nothing here ever waits on the job path.
//!
//! **Signature.** Each request carries `X-Conveyor-Timestamp: <unix seconds>` and
//! `X-Conveyor-Signature: sha256=<hex>`, the HMAC-SHA256 under the shared secret of
//! `"{timestamp}.{body}"`. A receiver recomputes it over the raw body, compares in constant
//! time, and refuses timestamps more than a few minutes old, so a captured request cannot be
//! replayed later ([`verify`] does all three).

use chrono::{DateTime, Utc};
use conveyor_core::{JobListParams, JobState, QueueStats, Store, WorkerInfo, WorkerState};
use hmac::{Hmac, Mac};
use serde::Serialize;
use serde_json::{json, Value};
use sha2::Sha256;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// The target of this module's log lines: `conveyor::alerts`, as operators filter it
/// (`CONVEYOR_LOG=warn,conveyor::alerts=info`), wherever the module lives.
pub const LOG_TARGET: &str = "conveyor::alerts";

/// The header holding the request's Unix time in seconds (part of the signed string).
pub const TIMESTAMP_HEADER: &str = "x-conveyor-timestamp";
/// The header holding `sha256=<hex HMAC>`.
pub const SIGNATURE_HEADER: &str = "x-conveyor-signature";
/// Most dead jobs described in one dead-letter alert.
const DEAD_SAMPLES: usize = 10;
/// Longest error message quoted in an alert.
const MESSAGE_LIMIT: usize = 500;

#[derive(Debug, thiserror::Error)]
pub enum AlertError {
    #[error("invalid {field}: {message}")]
    Config {
        field: &'static str,
        message: String,
    },
    #[error("cannot build the webhook client: {0}")]
    Client(#[from] reqwest::Error),
    #[error("the webhook's extra CA certificates: {0}")]
    Ca(String),
}

fn config_error(field: &'static str, message: impl Into<String>) -> AlertError {
    AlertError::Config {
        field,
        message: message.into(),
    }
}

/// A threshold per queue, with an optional one for every other queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Thresholds {
    pub default: Option<u64>,
    pub per_queue: BTreeMap<String, u64>,
}

impl Thresholds {
    pub fn for_queue(&self, queue: &str) -> Option<u64> {
        self.per_queue.get(queue).copied().or(self.default)
    }

    pub fn is_empty(&self) -> bool {
        self.default.is_none() && self.per_queue.is_empty()
    }

    /// Adds one `[QUEUE=]N` setting (the `serve` flags' syntax): `N` for every queue, or
    /// `QUEUE=N` for one.
    pub fn add(&mut self, setting: &str, field: &'static str) -> Result<(), AlertError> {
        let (queue, value) = match setting.split_once('=') {
            Some((queue, value)) => (Some(queue.trim()), value.trim()),
            None => (None, setting.trim()),
        };
        let value = u64::from_str(value).map_err(|_| {
            config_error(
                field,
                format!("{setting:?} is not [QUEUE=]N with N a whole number"),
            )
        })?;
        match queue {
            Some(queue) => {
                conveyor_core::validate::name(field, queue)
                    .map_err(|e| config_error(field, e.message))?;
                self.per_queue.insert(queue.to_string(), value);
            }
            None => self.default = Some(value),
        }
        Ok(())
    }
}

/// How the alert engine behaves.
#[derive(Clone)]
pub struct AlertConfig {
    /// Where alerts are POSTed (`http://` or `https://`).
    pub webhook: String,
    /// CA certificates (PEM) trusted for an `https://` webhook besides the public roots.
    pub extra_ca_pem: Option<Vec<u8>>,
    /// The HMAC key.
    pub secret: Vec<u8>,
    /// How often the store is read.
    pub check_interval: Duration,
    /// How long a threshold must be crossed without a break before it alerts.
    pub sustain: Duration,
    /// How long an (alert, subject) pair stays quiet after alerting.
    pub cooldown: Duration,
    /// Unfinished jobs (scheduled, available, running, retryable) per queue.
    pub max_depth: Thresholds,
    /// Seconds the oldest available job of a queue has waited.
    pub max_age_secs: Thresholds,
    /// Alerts waiting for delivery; more are dropped.
    pub queue_capacity: usize,
    /// Tries per alert, the first included.
    pub delivery_attempts: u32,
    /// Wait before the second try; doubled for each one after.
    pub retry_base: Duration,
    /// Longest wait for the receiver's answer.
    pub request_timeout: Duration,
}

impl std::fmt::Debug for AlertConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("AlertConfig")
            .field("webhook", &self.webhook)
            .field("check_interval", &self.check_interval)
            .field("sustain", &self.sustain)
            .field("cooldown", &self.cooldown)
            .field("max_depth", &self.max_depth)
            .field("max_age_secs", &self.max_age_secs)
            .finish_non_exhaustive()
    }
}

impl AlertConfig {
    /// Defaults for everything but the receiver and the secret.
    pub fn new(webhook: impl Into<String>, secret: impl Into<Vec<u8>>) -> Self {
        Self {
            webhook: webhook.into(),
            extra_ca_pem: None,
            secret: secret.into(),
            check_interval: Duration::from_secs(1),
            sustain: Duration::from_secs(60),
            cooldown: Duration::from_secs(15 * 60),
            max_depth: Thresholds::default(),
            max_age_secs: Thresholds::default(),
            queue_capacity: 256,
            delivery_attempts: 6,
            retry_base: Duration::from_millis(500),
            request_timeout: Duration::from_secs(10),
        }
    }

    fn validate(&self) -> Result<(), AlertError> {
        let parsed = reqwest::Url::parse(&self.webhook)
            .map_err(|e| config_error("alert webhook", format!("{:?}: {e}", self.webhook)))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(config_error(
                "alert webhook",
                "must be an http:// or https:// URL",
            ));
        }
        if self.secret.is_empty() {
            return Err(config_error("alert secret", "must not be empty"));
        }
        if self.queue_capacity == 0 || self.delivery_attempts == 0 {
            return Err(config_error(
                "alert delivery",
                "queue capacity and attempts must be at least 1",
            ));
        }
        if self.check_interval.is_zero() {
            return Err(config_error("alert check interval", "must be positive"));
        }
        Ok(())
    }
}

/// What an alert is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum AlertKind {
    /// Jobs entered a queue's dead-letter queue (subject: the queue).
    JobDead,
    /// A queue's unfinished jobs stayed past its threshold (subject: the queue).
    QueueDepth,
    /// A queue's oldest available job waited past its threshold (subject: the queue).
    QueueAge,
    /// A worker stopped heartbeating and was marked dead (subject: the worker id).
    WorkerStale,
    /// A circuit breaker opened: its queue's or kind's jobs are held back (subject:
    /// `queue:NAME` or `kind:NAME`).
    CircuitOpen,
}

/// One alert, as POSTed (JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Alert {
    pub id: Uuid,
    pub alert: AlertKind,
    pub subject: String,
    pub summary: String,
    pub at: DateTime<Utc>,
    pub details: Value,
}

impl Alert {
    fn new(alert: AlertKind, subject: &str, summary: String, details: Value) -> Self {
        Self {
            id: Uuid::now_v7(),
            alert,
            subject: subject.to_string(),
            summary,
            at: Utc::now(),
            details,
        }
    }
}

/// `sha256=<hex>` of HMAC-SHA256(secret, `"{timestamp}.{body}"`).
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> Result<String, AlertError> {
    let mut mac = mac(secret, timestamp)?;
    mac.update(body);
    let digest = mac.finalize().into_bytes();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("sha256={hex}"))
}

/// The MAC keyed with `secret`, fed the signed string's prefix `"{timestamp}."`.
fn mac(secret: &[u8], timestamp: i64) -> Result<Hmac<Sha256>, AlertError> {
    // HMAC accepts keys of any length, so this error cannot happen; it is still an error
    // rather than a panic or a fallback key.
    let mut mac = Hmac::<Sha256>::new_from_slice(secret)
        .map_err(|e| config_error("alert secret", e.to_string()))?;
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    Ok(mac)
}

/// Checks a received alert: the signature over `timestamp` and the raw `body`, in constant
/// time, and a timestamp no further than `tolerance` from `now` (replay protection).
pub fn verify(
    secret: &[u8],
    timestamp: &str,
    signature: &str,
    body: &[u8],
    now: DateTime<Utc>,
    tolerance: Duration,
) -> bool {
    let Ok(at) = i64::from_str(timestamp) else {
        return false;
    };
    let age = (now.timestamp() - at).unsigned_abs();
    if age > tolerance.as_secs() {
        return false;
    }
    let Some(hex) = signature.strip_prefix("sha256=") else {
        return false;
    };
    let Some(bytes) = decode_hex(hex) else {
        return false;
    };
    let Ok(mut mac) = mac(secret, at) else {
        return false;
    };
    mac.update(body);
    mac.verify_slice(&bytes).is_ok()
}

fn decode_hex(hex: &str) -> Option<Vec<u8>> {
    if !hex.len().is_multiple_of(2) {
        return None;
    }
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(hex.get(i..i + 2)?, 16).ok())
        .collect()
}

/// A dead-letter alert waiting for its samples.
struct DeadNews {
    queue: String,
    count: u64,
}

/// The rules, apart from I/O: fed the store's state at each check, says what to alert.
struct Evaluator {
    sustain: Duration,
    cooldown: Duration,
    max_depth: Thresholds,
    max_age_secs: Thresholds,
    /// Dead count per queue at the last check; `None` before the first one.
    dead_seen: Option<HashMap<String, u64>>,
    /// Deaths not yet alerted (held back by the cool-down).
    dead_pending: BTreeMap<String, u64>,
    /// Dead workers already known (by id and when they were marked), `None` before the first
    /// check.
    workers_seen: Option<HashSet<(String, Option<DateTime<Utc>>)>>,
    /// Open breakers already known (by subject and when they opened), `None` before the first
    /// check.
    breakers_seen: Option<HashSet<(String, Option<DateTime<Utc>>)>>,
    /// Since when each threshold condition has held without a break.
    crossing_since: HashMap<(AlertKind, String), Instant>,
    last_sent: HashMap<(AlertKind, String), Instant>,
}

struct Verdict {
    alerts: Vec<Alert>,
    dead: Vec<DeadNews>,
}

impl Evaluator {
    fn new(config: &AlertConfig) -> Self {
        Self {
            sustain: config.sustain,
            cooldown: config.cooldown,
            max_depth: config.max_depth.clone(),
            max_age_secs: config.max_age_secs.clone(),
            dead_seen: None,
            breakers_seen: None,
            dead_pending: BTreeMap::new(),
            workers_seen: None,
            crossing_since: HashMap::new(),
            last_sent: HashMap::new(),
        }
    }

    /// Whether (kind, subject) may alert now; if so, the cool-down starts.
    fn take_turn(&mut self, kind: AlertKind, subject: &str, now: Instant) -> bool {
        let key = (kind, subject.to_string());
        if self
            .last_sent
            .get(&key)
            .is_some_and(|sent| now.duration_since(*sent) < self.cooldown)
        {
            return false;
        }
        self.last_sent.insert(key, now);
        true
    }

    fn check(&mut self, now: Instant, queues: &[QueueStats], workers: &[WorkerInfo]) -> Verdict {
        let mut verdict = Verdict {
            alerts: Vec::new(),
            dead: Vec::new(),
        };
        self.check_dead(now, queues, &mut verdict);
        for queue in queues {
            let depth = queue.scheduled + queue.available + queue.running + queue.retryable;
            if let Some(limit) = self.max_depth.for_queue(&queue.name) {
                self.check_threshold(
                    now,
                    AlertKind::QueueDepth,
                    queue,
                    depth > limit,
                    || {
                        (
                            format!(
                                "queue {} holds {depth} unfinished jobs (threshold {limit})",
                                queue.name
                            ),
                            json!({"queue": queue.name, "depth": depth, "threshold": limit,
                                   "available": queue.available, "running": queue.running}),
                        )
                    },
                    &mut verdict,
                );
            }
            let age_secs = queue.oldest_available_age_ms / 1000;
            if let Some(limit) = self.max_age_secs.for_queue(&queue.name) {
                self.check_threshold(
                    now,
                    AlertKind::QueueAge,
                    queue,
                    age_secs > limit,
                    || {
                        (
                            format!(
                                "the oldest available job of queue {} has waited {age_secs} s \
                                 (threshold {limit} s)",
                                queue.name
                            ),
                            json!({"queue": queue.name, "oldest_age_secs": age_secs,
                                   "threshold_secs": limit}),
                        )
                    },
                    &mut verdict,
                );
            }
        }
        // A queue without jobs is not in the counts: its conditions no longer hold.
        let present: HashSet<&str> = queues.iter().map(|q| q.name.as_str()).collect();
        self.crossing_since
            .retain(|(_, queue), _| present.contains(queue.as_str()));
        self.check_workers(now, workers, &mut verdict);
        verdict
    }

    fn check_dead(&mut self, now: Instant, queues: &[QueueStats], verdict: &mut Verdict) {
        let counts: HashMap<String, u64> =
            queues.iter().map(|q| (q.name.clone(), q.dead)).collect();
        if let Some(seen) = &self.dead_seen {
            for (queue, count) in &counts {
                let before = seen.get(queue).copied().unwrap_or(0);
                if *count > before {
                    *self.dead_pending.entry(queue.clone()).or_default() += count - before;
                }
            }
        }
        self.dead_seen = Some(counts);
        let pending: Vec<String> = self.dead_pending.keys().cloned().collect();
        for queue in pending {
            if self.take_turn(AlertKind::JobDead, &queue, now) {
                if let Some(count) = self.dead_pending.remove(&queue) {
                    verdict.dead.push(DeadNews { queue, count });
                }
            }
        }
    }

    fn check_threshold(
        &mut self,
        now: Instant,
        kind: AlertKind,
        queue: &QueueStats,
        crossed: bool,
        describe: impl FnOnce() -> (String, Value),
        verdict: &mut Verdict,
    ) {
        let key = (kind, queue.name.clone());
        if !crossed {
            self.crossing_since.remove(&key);
            return;
        }
        let since = *self.crossing_since.entry(key).or_insert(now);
        if now.duration_since(since) >= self.sustain && self.take_turn(kind, &queue.name, now) {
            let (summary, mut details) = describe();
            details["sustained_secs"] = json!(now.duration_since(since).as_secs());
            verdict
                .alerts
                .push(Alert::new(kind, &queue.name, summary, details));
        }
    }

    fn check_workers(&mut self, now: Instant, workers: &[WorkerInfo], verdict: &mut Verdict) {
        let dead: HashSet<(String, Option<DateTime<Utc>>)> = workers
            .iter()
            .filter(|w| w.state == WorkerState::Dead)
            .map(|w| (w.id.clone(), w.ended_at))
            .collect();
        if let Some(seen) = &self.workers_seen {
            let mut fresh: Vec<&WorkerInfo> = workers
                .iter()
                .filter(|w| {
                    w.state == WorkerState::Dead && !seen.contains(&(w.id.clone(), w.ended_at))
                })
                .collect();
            fresh.sort_by(|a, b| a.id.cmp(&b.id));
            for worker in fresh {
                if self.take_turn(AlertKind::WorkerStale, &worker.id, now) {
                    verdict.alerts.push(Alert::new(
                        AlertKind::WorkerStale,
                        &worker.id,
                        format!(
                            "worker {} on {} stopped heartbeating and was marked dead; its \
                             running jobs were rescued",
                            worker.id, worker.host
                        ),
                        json!({"worker_id": worker.id, "host": worker.host, "pid": worker.pid,
                               "queues": worker.queues, "last_seen_at": worker.last_seen_at,
                               "marked_dead_at": worker.ended_at}),
                    ));
                }
            }
        }
        self.workers_seen = Some(dead);
    }

    /// An alert for each breaker that opened since the last check (breakers open at the
    /// first check are the baseline).
    fn check_breakers(
        &mut self,
        now: Instant,
        breakers: &[conveyor_core::StoredBreaker],
        verdict: &mut Verdict,
    ) {
        let open: HashSet<(String, Option<DateTime<Utc>>)> = breakers
            .iter()
            .filter(|b| b.record.state == conveyor_core::BreakerState::Open)
            .map(|b| {
                (
                    format!("{}:{}", b.scope.as_str(), b.name),
                    b.record.opened_at,
                )
            })
            .collect();
        if let Some(seen) = &self.breakers_seen {
            let mut fresh: Vec<&conveyor_core::StoredBreaker> = breakers
                .iter()
                .filter(|b| {
                    let subject = format!("{}:{}", b.scope.as_str(), b.name);
                    b.record.state == conveyor_core::BreakerState::Open
                        && !seen.contains(&(subject, b.record.opened_at))
                })
                .collect();
            fresh.sort_by(|a, b| (a.scope, &a.name).cmp(&(b.scope, &b.name)));
            for breaker in fresh {
                let subject = format!("{}:{}", breaker.scope.as_str(), breaker.name);
                if self.take_turn(AlertKind::CircuitOpen, &subject, now) {
                    let reason = breaker.record.reason.clone().unwrap_or_default();
                    verdict.alerts.push(Alert::new(
                        AlertKind::CircuitOpen,
                        &subject,
                        format!(
                            "the circuit breaker of {} {} opened: {reason}; its jobs stay \
                             queued until it closes",
                            breaker.scope.as_str(),
                            breaker.name
                        ),
                        json!({"scope": breaker.scope.as_str(), "name": breaker.name,
                               "reason": reason, "opened_at": breaker.record.opened_at,
                               "open_until": breaker.record.open_until,
                               "manual": breaker.record.manual}),
                    ));
                }
            }
        }
        self.breakers_seen = Some(open);
    }
}

/// Watches the store and sends alerts while this node leads. Start it with [`AlertEngine::run`].
pub struct AlertEngine {
    store: Arc<dyn Store>,
    config: AlertConfig,
    leadership: watch::Receiver<bool>,
    client: reqwest::Client,
}

impl AlertEngine {
    /// `leadership` follows the maintenance leadership ([`conveyor_worker::Maintenance::leadership`]).
    pub fn new(
        store: Arc<dyn Store>,
        config: AlertConfig,
        leadership: watch::Receiver<bool>,
    ) -> Result<Self, AlertError> {
        config.validate()?;
        let mut builder = reqwest::Client::builder().timeout(config.request_timeout);
        if let Some(pem) = &config.extra_ca_pem {
            let certificates = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| AlertError::Ca(format!("not valid PEM certificates: {e}")))?;
            if certificates.is_empty() {
                return Err(AlertError::Ca(
                    "no certificate (-----BEGIN CERTIFICATE-----) in it".to_string(),
                ));
            }
            for certificate in certificates {
                builder = builder.add_root_certificate(certificate);
            }
        }
        let client = builder.build()?;
        Ok(Self {
            store,
            config,
            leadership,
            client,
        })
    }

    /// Checks every interval until `stop`, delivering in a background task that ends with it
    /// (alerts still queued then are dropped).
    pub async fn run(mut self, stop: CancellationToken) {
        let (outbox, inbox) = mpsc::channel::<Alert>(self.config.queue_capacity);
        let delivery = tokio::spawn(deliver(
            self.client.clone(),
            self.config.clone(),
            inbox,
            stop.clone(),
        ));
        let mut evaluator = Evaluator::new(&self.config);
        let mut leading = false;
        let mut watching = true;
        // Whether the current leadership's baseline has been taken.
        let mut armed = false;
        let mut ticker = tokio::time::interval(self.config.check_interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // A change of leadership is acted on at once: the baseline a new leader takes
            // should be as close as possible to the moment it took over.
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = ticker.tick() => {}
                changed = self.leadership.changed(), if watching => {
                    // An error means the maintenance loop is gone: nobody leads here any more.
                    watching = changed.is_ok();
                }
            }
            let now_leading = watching && *self.leadership.borrow_and_update();
            if now_leading != leading {
                // A new leader takes what it sees as its baseline.
                evaluator = Evaluator::new(&self.config);
                leading = now_leading;
                armed = false;
            }
            if !leading {
                continue;
            }
            match self.check(&mut evaluator, &outbox).await {
                Ok(()) if !armed => {
                    armed = true;
                    tracing::info!(target: LOG_TARGET, webhook = %self.config.webhook,
                        "this node leads: alerting on what happens from now on");
                }
                Ok(()) => {}
                Err(error) => {
                    tracing::warn!(target: LOG_TARGET, %error, "alert check failed; will retry")
                }
            }
        }
        drop(outbox);
        let _ = delivery.await;
    }

    async fn check(
        &self,
        evaluator: &mut Evaluator,
        outbox: &mpsc::Sender<Alert>,
    ) -> conveyor_core::StoreResult<()> {
        let queues = self.store.queues_stats().await?;
        let workers = self.store.workers_list().await?;
        let breakers = self.store.breakers_list().await?;
        let now = Instant::now();
        let mut verdict = evaluator.check(now, &queues, &workers);
        evaluator.check_breakers(now, &breakers, &mut verdict);
        let mut alerts = verdict.alerts;
        for news in verdict.dead {
            alerts.push(self.dead_alert(news).await);
        }
        for alert in alerts {
            tracing::warn!(target: LOG_TARGET, alert = ?alert.alert, subject = %alert.subject, summary = %alert.summary,
                "alert");
            if let Err(error) = outbox.try_send(alert) {
                tracing::error!(target: LOG_TARGET, %error, "alert delivery queue is full; alert dropped");
            }
        }
        Ok(())
    }

    /// A dead-letter alert with the newest dead jobs of the queue (ids, kinds, last errors;
    /// never payloads).
    async fn dead_alert(&self, news: DeadNews) -> Alert {
        let listed = self
            .store
            .jobs_list({
                let mut params = JobListParams::default();
                params.queue = Some(news.queue.clone());
                params.state = Some(JobState::Dead);
                params.limit =
                    DEAD_SAMPLES.min(usize::try_from(news.count).unwrap_or(DEAD_SAMPLES));
                params
            })
            .await;
        let samples: Vec<Value> = match listed {
            Ok(jobs) => jobs
                .iter()
                .map(|job| {
                    let last = job.errors.last();
                    json!({
                        "id": job.id, "kind": job.kind, "attempt": job.attempt,
                        "finished_at": job.finished_at,
                        "error_class": last.map(|e| e.class.as_str()),
                        "error": last.map(|e| truncate(&e.message, MESSAGE_LIMIT)),
                    })
                })
                .collect(),
            Err(error) => {
                tracing::warn!(target: LOG_TARGET, %error, "alert: cannot list dead jobs for the samples");
                Vec::new()
            }
        };
        let noun = if news.count == 1 { "job" } else { "jobs" };
        Alert::new(
            AlertKind::JobDead,
            &news.queue,
            format!(
                "{} {noun} entered the dead-letter queue of {}",
                news.count, news.queue
            ),
            json!({"queue": news.queue, "count": news.count, "jobs": samples}),
        )
    }
}

fn truncate(text: &str, limit: usize) -> String {
    if text.len() <= limit {
        return text.to_string();
    }
    let end = (0..=limit)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    format!("{}...", &text[..end])
}

async fn deliver(
    client: reqwest::Client,
    config: AlertConfig,
    mut inbox: mpsc::Receiver<Alert>,
    stop: CancellationToken,
) {
    loop {
        let alert = tokio::select! {
            _ = stop.cancelled() => return,
            next = inbox.recv() => match next {
                Some(alert) => alert,
                None => return,
            },
        };
        let body = match serde_json::to_vec(&alert) {
            Ok(body) => body,
            Err(error) => {
                tracing::error!(target: LOG_TARGET, %error, "cannot serialize an alert");
                continue;
            }
        };
        let mut wait = config.retry_base;
        for attempt in 1..=config.delivery_attempts {
            // Signed afresh per try: the timestamp is that of the request.
            let timestamp = Utc::now().timestamp();
            let signature = match sign(&config.secret, timestamp, &body) {
                Ok(signature) => signature,
                Err(error) => {
                    tracing::error!(target: LOG_TARGET, %error, "cannot sign an alert; dropped");
                    break;
                }
            };
            let sent = client
                .post(&config.webhook)
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .header(TIMESTAMP_HEADER, timestamp.to_string())
                .header(SIGNATURE_HEADER, signature)
                .body(body.clone())
                .send()
                .await;
            let problem = match sent {
                Ok(response) if response.status().is_success() => None,
                Ok(response) => Some(format!("receiver answered {}", response.status())),
                Err(error) => Some(error.to_string()),
            };
            let Some(problem) = problem else {
                tracing::info!(target: LOG_TARGET, alert_id = %alert.id, alert = ?alert.alert,
                    subject = %alert.subject, "alert delivered");
                break;
            };
            if attempt == config.delivery_attempts {
                tracing::error!(target: LOG_TARGET, alert_id = %alert.id, %problem, attempts = attempt,
                    "alert not delivered; giving up");
                break;
            }
            tracing::warn!(target: LOG_TARGET, alert_id = %alert.id, %problem, retry_in = ?wait,
                "alert delivery failed; will retry");
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
            }
            wait = wait.saturating_mul(2).min(Duration::from_secs(300));
        }
    }
}

#[cfg(test)]
mod tests;
