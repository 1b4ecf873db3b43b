//! A database created before unique jobs (schema version 4, no `unique_key` column) is upgraded
//! in place when opened: its jobs read back unchanged and unique enqueues work.

use conveyor_core::JobStore;
use conveyor_core::{NewJob, UniqueSpec};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use serde_json::json;

/// The jobs table as versions 1 to 5 created it.
const JOBS_BEFORE_UNIQUE: &str = "
CREATE TABLE jobs (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, queue TEXT NOT NULL, payload TEXT NOT NULL,
    priority INTEGER NOT NULL, run_at INTEGER NOT NULL, attempt INTEGER NOT NULL,
    max_attempts INTEGER NOT NULL, timeout_ms INTEGER, idempotency_key TEXT, tags TEXT NOT NULL,
    tenant TEXT, state TEXT NOT NULL, errors TEXT NOT NULL, lease_worker TEXT, lease_token TEXT,
    lease_expires_at INTEGER, result TEXT, created_at INTEGER NOT NULL, started_at INTEGER,
    finished_at INTEGER
) WITHOUT ROWID;
INSERT INTO jobs VALUES ('0190b6a0-0000-7000-8000-000000000001', 'old', 'default', '{\"n\":1}',
    0, 1700000000000, 0, 25, NULL, NULL, '[]', NULL, 'available', '[]', NULL, NULL, NULL, NULL,
    1700000000000, NULL, NULL);
PRAGMA user_version = 4;
";

#[tokio::test]
async fn unique_jobs_work_on_a_database_upgraded_from_before_them() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("jobs.db");
    let conn = rusqlite::Connection::open(&path).expect("create old database");
    conn.execute_batch(JOBS_BEFORE_UNIQUE).expect("old schema");
    drop(conn);

    let store = SqliteStore::open(&path, SqliteOptions::default()).expect("upgrade on open");
    let old = store
        .job_get(
            "0190b6a0-0000-7000-8000-000000000001"
                .parse()
                .expect("uuid"),
        )
        .await
        .expect("read")
        .expect("the old job is kept");
    assert_eq!(old.payload, json!({"n": 1}));
    assert_eq!(old.unique_key, None);

    let mut job = NewJob::new("old", json!({"n": 1}));
    job.unique = Some(UniqueSpec::whole_payload());
    let first = store
        .jobs_insert_many(vec![job.clone()])
        .await
        .expect("unique insert");
    assert!(!first[0].duplicate, "the old job has no unique key");
    let again = store.jobs_insert_many(vec![job]).await.expect("insert");
    assert!(again[0].duplicate);
    assert_eq!(again[0].job.id, first[0].job.id);
}
