//! What the AMQP and MQTT source tests share: a real SQLite store in a temporary directory, a
//! source run as `conveyor serve` runs it (`conveyor_sources::run`), and checks on the jobs it
//! made, polled against a deadline.
#![allow(dead_code)]

use conveyor_core::sources::SourceSpec;
use conveyor_core::store::JobListParams;
use conveyor_core::{Job, JobState, QueueSettings, Store};
use conveyor_sources::{SourceState, SourceStatus};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use serde_json::Value;
use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// The queue the tests' jobs go to.
pub const QUEUE: &str = "orders";

/// A name no other run uses: the prefix, this process's id and the time.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("conveyor-test-{prefix}-{}-{nanos}", std::process::id())
}

pub struct TestStore {
    pub store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

pub fn store() -> TestStore {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
        .expect("open the store");
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

/// A source running in this process.
pub struct Running {
    pub status: Arc<SourceStatus>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

pub fn start(spec: SourceSpec, store: &Arc<dyn Store>) -> Running {
    let status = Arc::new(SourceStatus::new(spec));
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(conveyor_sources::run(
        status.clone(),
        store.clone(),
        shutdown.clone(),
    ));
    Running {
        status,
        shutdown,
        task,
    }
}

impl Running {
    /// Stops the source as `serve` does on shutdown, and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(30), self.task).await;
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
            .map(|(_, n)| *n)
            .unwrap_or(0)
    }

    pub fn state(&self) -> SourceState {
        self.status.state()
    }

    pub fn last_error(&self) -> Option<String> {
        self.status.view()["last_error"].as_str().map(String::from)
    }
}

/// Polls `check` every 20 ms until it holds, failing with `what` after `limit`.
#[macro_export]
macro_rules! wait_until {
    ($limit:expr, $what:expr, $check:expr) => {{
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
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }};
}

/// Unfinished jobs in the queue (what a maximum depth counts), and dead ones.
pub async fn depth(store: &Arc<dyn Store>) -> u64 {
    let stats = store.queues_stats().await.expect("queue stats");
    stats
        .iter()
        .find(|q| q.name == QUEUE)
        .map(|q| q.available + q.scheduled + q.running + q.retryable + q.dead)
        .unwrap_or(0)
}

pub async fn jobs(store: &Arc<dyn Store>) -> Vec<Job> {
    let mut params = JobListParams::default();
    params.queue = Some(QUEUE.to_string());
    params.limit = 1_000_000;
    store.jobs_list(params).await.expect("list jobs")
}

/// Checks that the queue holds one job for each `n` of `expected` (the number each body
/// carries), none twice, each with its own `source:{name}:` idempotency key.
pub async fn each_once(store: &Arc<dyn Store>, source: &str, expected: std::ops::Range<u64>) {
    let jobs = jobs(store).await;
    let mut numbers = BTreeSet::new();
    let mut keys = BTreeSet::new();
    let prefix = format!("source:{source}:");
    for job in &jobs {
        let n = job.payload["n"].as_u64().expect("payload n");
        assert!(numbers.insert(n), "message {n} became two jobs");
        let key = job.idempotency_key.clone().expect("an idempotency key");
        assert!(key.starts_with(&prefix), "{key}");
        assert!(keys.insert(key.clone()), "two jobs with the key {key}");
        assert_eq!(job.state, JobState::Available);
    }
    assert_eq!(jobs.len(), expected.clone().count(), "jobs");
    assert_eq!(numbers, expected.collect::<BTreeSet<u64>>());
}

pub async fn set_max_depth(store: &Arc<dyn Store>, max_depth: Option<u64>) {
    let mut settings = QueueSettings::default();
    settings.max_depth = max_depth;
    store
        .queue_settings_put(QUEUE, settings)
        .await
        .expect("queue settings");
}

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

/// How long a check waits before failing.
pub const LONG: Duration = Duration::from_secs(180);
pub const SHORT: Duration = Duration::from_secs(30);

pub fn elapsed_ms(since: Instant) -> u128 {
    since.elapsed().as_millis()
}
