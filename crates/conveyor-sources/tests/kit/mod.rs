//! What the source tests (amqp, mqtt, nats, sqs) share: a real SQLite store in a temporary
//! directory, a source run as `conveyor serve` runs it (`conveyor_sources::run`), checks on the
//! jobs it made, polled against a deadline, and clean-up of what a test made at its broker.
#![allow(dead_code)]

use conveyor_core::sources::SourceSpec;
use conveyor_core::store::JobListParams;
use conveyor_core::{Job, JobState, QueueSettings, Store};
use conveyor_sources::{SourceState, SourceStatus};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The queue the amqp and mqtt tests' jobs go to.
pub const QUEUE: &str = "orders";

/// How long a check waits before failing.
pub const LONG: Duration = Duration::from_secs(180);
pub const SHORT: Duration = Duration::from_secs(30);

/// A name no other run uses: `conveyor-test-`, the prefix, this process's id and the time in
/// nanoseconds. The first part makes what a test leaves at a broker recognisable; the name is
/// letters, digits and dashes only, so it is a valid RabbitMQ queue, MQTT client id and topic
/// level, JetStream stream (no `.`, `*`, `>` or whitespace) and SQS queue (under 80 characters).
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("conveyor-test-{prefix}-{}-{nanos}", std::process::id())
}

/// A store of the test's own, in a directory removed when dropped.
pub struct TestStore {
    pub store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

pub fn open_store() -> TestStore {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
        .expect("open the SQLite store");
    TestStore {
        store: Arc::new(store),
        _dir: dir,
    }
}

/// A source from its configuration as JSON (what a sources file holds).
pub fn spec(config: Value) -> SourceSpec {
    let spec: SourceSpec = serde_json::from_value(config).expect("a source's configuration");
    spec.validate().expect("a valid source");
    spec
}

/// A source running in a task of its own.
pub struct Running {
    pub status: Arc<SourceStatus>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

pub fn start(spec: SourceSpec, store: &TestStore) -> Running {
    let status = Arc::new(SourceStatus::new(spec));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(conveyor_sources::run(
        status.clone(),
        store.store.clone(),
        shutdown.clone(),
    ));
    Running {
        status,
        shutdown,
        task,
    }
}

impl Running {
    /// Stops the source as `serve` does on shutdown, and waits for it: it must stop within
    /// 30 s, and its task must not have panicked.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the source stops")
            .expect("the source's task");
    }

    /// Kills the source's task where it stands (a batch may be read and not committed, or
    /// committed and not acknowledged), as a killed server would leave it.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    pub fn count(&self, outcome: &str) -> u64 {
        self.status
            .counts()
            .iter()
            .find(|(name, _)| *name == outcome)
            .map_or(0, |(_, count)| *count)
    }

    pub fn state(&self) -> SourceState {
        self.status.state()
    }

    pub fn last_error(&self) -> Option<String> {
        self.status.view()["last_error"].as_str().map(String::from)
    }
}

/// Polls `check` every 20 ms (or every fourth argument) until it holds, failing with `what`
/// after `limit`. A macro so `check` may borrow and `.await` freely, and `what` (any `Display`)
/// is only formatted on failure, showing the state at the deadline.
///
/// The poll interval decides when a test acts after a wait (kills the source, cuts its
/// connections): the amqp and mqtt tests want 20 ms, so a kill lands before the whole queue is
/// read; the nats and sqs tests keep 100 ms ([`SLOW_POLL`]), as at 20 ms the sqs cut test can
/// cut its proxy between requests, when it carries no connection.
#[macro_export]
macro_rules! wait_until {
    ($limit:expr, $what:expr, $check:expr) => {
        $crate::wait_until!($limit, $what, $check, std::time::Duration::from_millis(20))
    };
    ($limit:expr, $what:expr, $check:expr, $every:expr) => {{
        let deadline = std::time::Instant::now() + $limit;
        loop {
            if $check {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {}",
                $what
            );
            tokio::time::sleep($every).await;
        }
    }};
}

/// The nats and sqs tests' poll interval for [`wait_until!`].
pub const SLOW_POLL: Duration = Duration::from_millis(100);

/// Every job of `queue` in `state` (any state when `None`), read page by page.
pub async fn jobs(store: &TestStore, queue: &str, state: Option<JobState>) -> Vec<Job> {
    let mut all = Vec::new();
    let mut after = None;
    loop {
        let mut params = JobListParams::default();
        params.queue = Some(queue.to_string());
        params.state = state;
        params.limit = 1000;
        params.after = after;
        let page = store.store.jobs_list(params).await.expect("list jobs");
        let Some(last) = page.last() else { break };
        after = Some(last.id);
        all.extend(page);
    }
    all
}

/// The queue's depth as a maximum depth counts it: its unfinished jobs (scheduled, available,
/// running, retryable). No worker runs in these tests, so where nothing is dead-lettered it is
/// also every job the source has stored.
pub async fn depth(store: &TestStore, queue: &str) -> u64 {
    store
        .store
        .queues_stats()
        .await
        .expect("queue stats")
        .iter()
        .find(|stats| stats.name == queue)
        .map_or(0, |s| s.scheduled + s.available + s.running + s.retryable)
}

/// Checks that `queue` holds one available job for each `n` of `expected` (the number each body
/// carries), none twice, each with its own `source:{source}:` idempotency key.
pub async fn each_once(
    store: &TestStore,
    queue: &str,
    source: &str,
    expected: std::ops::Range<u64>,
) {
    let jobs = jobs(store, queue, None).await;
    let mut numbers = BTreeSet::new();
    let mut keys = BTreeSet::new();
    let prefix = format!("source:{source}:");
    for job in &jobs {
        let n = job.payload["n"].as_u64().expect("a payload with n");
        assert!(numbers.insert(n), "message {n} became two jobs");
        let key = job.idempotency_key.clone().expect("an idempotency key");
        assert!(key.starts_with(&prefix), "idempotency key {key}");
        assert!(keys.insert(key.clone()), "two jobs with the key {key}");
        assert_eq!(job.state, JobState::Available);
    }
    assert_eq!(jobs.len(), expected.clone().count(), "jobs");
    assert_eq!(numbers, expected.collect::<BTreeSet<u64>>());
}

/// Sets (or lifts, with `None`) the queue's maximum depth.
pub async fn set_max_depth(store: &TestStore, queue: &str, max_depth: Option<u64>) {
    let mut settings = QueueSettings::default();
    settings.max_depth = max_depth;
    store
        .store
        .queue_settings_put(queue, settings)
        .await
        .expect("queue settings");
}

/// The body `{"n":n}`.
pub fn body(n: u64) -> Vec<u8> {
    serde_json::json!({ "n": n }).to_string().into_bytes()
}

/// Runs `cleanup` on a thread of its own with a runtime of its own when dropped: removes what
/// a test made at the broker even when the test fails half-way (its own runtime may be gone).
pub struct Cleanup(Option<Box<dyn FnOnce() + Send>>);

impl Cleanup {
    pub fn new<F, Fut>(cleanup: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        Cleanup(Some(Box::new(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(20), cleanup()).await;
            });
        })))
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(cleanup) = self.0.take() {
            let _ = std::thread::spawn(cleanup).join();
        }
    }
}
