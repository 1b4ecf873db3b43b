//! What the NATS and SQS source tests share: a real SQLite store in a temporary directory, a
//! source running against it (as `conveyor serve` runs one), and reads of what it stored.
#![allow(dead_code)]

use conveyor_core::sources::SourceSpec;
use conveyor_core::{Job, JobListParams, JobState, QueueSettings, Store};
use conveyor_sources::{SourceState, SourceStatus};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use serde_json::Value;
use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A name no other run uses: the prefix, this process's id and the time in nanoseconds.
pub fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{prefix}-{}-{nanos}", std::process::id())
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

/// A source configured as `source` (a sources-file entry, as JSON).
pub fn spec(source: Value) -> SourceSpec {
    let spec: SourceSpec = serde_json::from_value(source).expect("a source");
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
    /// Stops it as `serve` does on shutdown, and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(30), self.task)
            .await
            .expect("the source stops")
            .expect("the source's task");
    }

    /// Kills it where it stands (mid-read, mid-commit or mid-acknowledgement), as a crash would.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    pub fn state(&self) -> SourceState {
        self.status.state()
    }

    pub fn count(&self, outcome: &str) -> u64 {
        self.status
            .counts()
            .iter()
            .find(|(name, _)| *name == outcome)
            .map_or(0, |(_, count)| *count)
    }
}

/// Polls `check` every 100 ms until it is true, failing with `what` after `limit`.
pub async fn wait_until<F, Fut>(limit: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    while !check().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Every job of `queue` in `state` (any state when `None`).
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

/// The queue's unfinished jobs (scheduled, available, running, retryable).
pub async fn unfinished(store: &TestStore, queue: &str) -> u64 {
    store
        .store
        .queues_stats()
        .await
        .expect("queue stats")
        .iter()
        .find(|stats| stats.name == queue)
        .map_or(0, |s| s.scheduled + s.available + s.running + s.retryable)
}

/// The `n` of each job's payload in `queue`: each must be there once, with its idempotency key
/// from the source `source`, and there must be as many distinct keys as jobs.
pub async fn numbers(store: &TestStore, queue: &str, source: &str) -> BTreeSet<u64> {
    let jobs = jobs(store, queue, None).await;
    let mut numbers = BTreeSet::new();
    let mut keys = BTreeSet::new();
    for job in &jobs {
        let n = job.payload["n"].as_u64().expect("a payload with n");
        assert!(numbers.insert(n), "message {n} became two jobs");
        let key = job.idempotency_key.clone().expect("an idempotency key");
        assert!(
            key.starts_with(&format!("source:{source}:")),
            "idempotency key {key}"
        );
        assert!(keys.insert(key), "two jobs with one idempotency key");
    }
    numbers
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

pub fn body(n: u64) -> Vec<u8> {
    format!("{{\"n\":{n}}}").into_bytes()
}
