//! Opening the database: bad files fail at start with a clear error, never a panic, and a
//! restart keeps what was committed.

use conveyor_core::{NewJob, Store, StoreError};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use serde_json::json;

fn open(path: &std::path::Path) -> Result<SqliteStore, StoreError> {
    SqliteStore::open(path, SqliteOptions::default())
}

#[test]
fn a_file_that_is_not_a_database_is_a_clear_error_and_is_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let garbage =
        b"this is not an SQLite database, just some text that happens to be here".repeat(100);
    std::fs::write(&path, &garbage).unwrap();
    let error = open(&path).err().expect("opening garbage must fail");
    let message = error.to_string();
    assert!(
        message.contains("jobs.db"),
        "error names the file: {message}"
    );
    assert!(
        message.contains("not a database"),
        "error says what is wrong: {message}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        garbage,
        "the file was not modified"
    );
}

#[test]
fn a_directory_that_cannot_be_created_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("not-a-dir");
    std::fs::write(&blocker, b"file").unwrap();
    let error = open(&blocker.join("jobs.db")).err().expect("must fail");
    assert!(
        error.to_string().contains("cannot create directory"),
        "{error}"
    );
}

#[test]
fn a_database_from_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    drop(open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(conn);
    let error = open(&path).err().expect("must refuse");
    assert!(error.to_string().contains("newer"), "{error}");
}

#[tokio::test]
async fn committed_jobs_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nested/dir/jobs.db");
    let store = open(&path).unwrap();
    let id = store
        .jobs_insert_many(vec![NewJob::new("keep", json!({"a": [1, 2]}))])
        .await
        .unwrap()[0]
        .job
        .id;
    drop(store);
    let reopened = open(&path).unwrap();
    let job = reopened.job_get(id).await.unwrap().expect("job survives");
    assert_eq!(job.payload, json!({"a": [1, 2]}));
}
