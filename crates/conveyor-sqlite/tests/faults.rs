//! The fault-injection suite (`conveyor_storetest::faults`) against a fresh SQLite file per
//! behaviour: every write operation made to fail and to panic inside the writer.

mod common;

use common::make_harness;
use conveyor_core::JobStore;
use conveyor_core::{NewJob, StoreError};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use serde_json::json;

conveyor_storetest::fault_tests!(make_harness);

fn keyed(key: &str) -> NewJob {
    let mut job = NewJob::new("charge", json!({"n": 1}));
    job.idempotency_key = Some(key.to_string());
    job
}

fn open_with(path: &std::path::Path, options: SqliteOptions) -> SqliteStore {
    SqliteStore::open(path, options).expect("open store")
}

/// A panic inside one operation fails that call alone (a 500, not a 503 to retry forever);
/// the writer serves the next call and health stays good.
#[tokio::test]
async fn a_panicking_operation_fails_alone() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_with(&dir.path().join("jobs.db"), SqliteOptions::default());
    fail::cfg("insert", "1*panic(boom)").expect("failpoint");
    let outcome = store.jobs_insert_many(vec![keyed("a")]).await;
    fail::remove("insert");
    assert!(
        matches!(outcome, Err(StoreError::Internal(ref m)) if m.contains("boom")),
        "{outcome:?}"
    );
    store
        .jobs_insert_many(vec![keyed("b")])
        .await
        .expect("the writer goes on");
    let health = store.health().await;
    assert!(health.live && health.ready, "{health:?}");
}

/// If the writer thread itself dies, the store says so: health is not live (restart it) and
/// names the cause; calls fail fast instead of hanging.
#[tokio::test]
async fn a_dead_writer_is_reported_by_health() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_with(&dir.path().join("jobs.db"), SqliteOptions::default());
    assert!(store.health().await.live);
    fail::cfg("sqlite_commit", "1*panic(writer killed by the test)").expect("failpoint");
    let outcome = store.jobs_insert_many(vec![keyed("a")]).await;
    fail::remove("sqlite_commit");
    assert!(matches!(outcome, Err(StoreError::Closed)), "{outcome:?}");
    let health = store.health().await;
    assert!(!health.live && !health.ready, "{health:?}");
    let problem = health.problem.unwrap_or_default();
    assert!(
        problem.contains("writer thread died") && problem.contains("writer killed by the test"),
        "{problem}"
    );
    assert!(matches!(
        store.jobs_insert_many(vec![keyed("b")]).await,
        Err(StoreError::Closed)
    ));
}
