//! Shared by the worker's integration tests: a store in a temp dir, waiting for a job's state,
//! and a worker run in the background.
#![allow(dead_code)]

use conveyor_core::{Job, JobState, Store};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use conveyor_storetest::eventually::eventually;
use conveyor_worker::{ShutdownReport, Worker};
use std::sync::Arc;
use tokio::sync::oneshot;
use uuid::Uuid;

pub struct Env {
    pub store: Arc<dyn Store>,
    _dir: tempfile::TempDir,
}

pub fn env() -> Env {
    env_with(SqliteOptions::default())
}

/// A store opened with these options (say, a `ManualClock`) in a temp dir.
pub fn env_with(options: SqliteOptions) -> Env {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("jobs.db"), options).expect("open store");
    Env {
        store: Arc::new(store),
        _dir: dir,
    }
}

/// Waits until the job reaches `state` (polling the store, which has no signal for it).
pub async fn wait_for_state(store: &Arc<dyn Store>, id: Uuid, state: JobState) -> Job {
    eventually(&format!("job {id} to be {state:?}"), || async {
        let job = store.job_get(id).await.expect("get").expect("job exists");
        if job.state == state {
            Ok(job)
        } else {
            Err(format!("{:?}: {job:?}", job.state))
        }
    })
    .await
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
