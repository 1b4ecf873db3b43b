//! Shared by the worker's integration tests: a store in a temp dir, waiting for a job's state,
//! and a worker run in the background.
#![allow(dead_code)]

use conveyor_core::{Job, JobState, Store};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use conveyor_worker::{ShutdownReport, Worker};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use uuid::Uuid;

pub struct Env {
    pub store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

pub fn env() -> Env {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
        .expect("open store");
    Env {
        store: Arc::new(store),
        _dir: dir,
    }
}

/// Waits until the job reaches `state` (a condition, checked every few ms, with a deadline).
pub async fn wait_for_state(store: &Arc<dyn Store>, id: Uuid, state: JobState) -> Job {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let job = store.job_get(id).await.expect("get").expect("job exists");
        if job.state == state {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "job stuck in {:?}, wanted {state:?}: {job:?}",
            job.state
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Runs a worker in the background; returns a trigger for its shutdown and its report.
pub fn spawn_worker(
    worker: Worker,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<ShutdownReport>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let handle = tokio::spawn(worker.run(async move {
        let _ = stopped.await;
    }));
    (stop, handle)
}
