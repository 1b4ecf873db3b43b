//! Opening the database: bad files fail at start with a clear error, never a panic, and a
//! restart keeps what was committed.

use conveyor_core::{JobStore, LeadershipStore, LeaseStore};
use conveyor_core::{NewJob, StoreError};
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

/// The per-queue state counts the writer maintains agree with the rows, after every kind of
/// state change (insert, promote, fetch, complete, fail, snooze, release, cancel, replay,
/// discard).
#[tokio::test]
async fn queue_state_counts_match_the_rows_after_every_kind_of_change() {
    use conveyor_core::{
        CompleteParams, FailParams, FetchParams, JobState, LeaseRef, ReplaySelector, RetryPlan,
        SnoozeParams,
    };
    use std::time::Duration;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("jobs.db");
    let store = open(&path).unwrap();
    let mut jobs: Vec<NewJob> = (0..12).map(|i| NewJob::new("k", json!({"i": i}))).collect();
    jobs[0].queue = "other".into();
    jobs[1].run_at = Some(chrono::Utc::now() + chrono::Duration::hours(1));
    store.jobs_insert_many(jobs).await.unwrap();
    let fetch = |max| FetchParams {
        worker_id: "w".into(),
        queues: vec!["default".into(), "other".into()],
        max,
        lease: Duration::from_secs(60),
        kinds: None,
        excluded_kinds: Vec::new(),
    };
    let lease = |job: &conveyor_core::Job| LeaseRef {
        id: job.id,
        lease_token: job.lease.as_ref().unwrap().token,
    };
    let got = store.jobs_fetch(fetch(8)).await.unwrap();
    store
        .jobs_complete_many(vec![CompleteParams {
            lease: lease(&got[0]),
            result: None,
        }])
        .await
        .unwrap();
    for (job, retry) in [
        (&got[1], RetryPlan::Never),
        (&got[2], RetryPlan::At(chrono::Utc::now())),
    ] {
        store
            .job_fail(FailParams {
                lease: lease(job),
                class: "error".into(),
                message: "x".into(),
                retry,
                backtrace: None,
            })
            .await
            .unwrap();
    }
    let until = chrono::Utc::now() + chrono::Duration::hours(1);
    store
        .job_snooze(SnoozeParams {
            lease: lease(&got[3]),
            until,
        })
        .await
        .unwrap();
    store.jobs_release_many(vec![lease(&got[4])]).await.unwrap();
    store.job_cancel(got[5].id).await.unwrap();
    store.jobs_promote_due().await.unwrap();
    let dead = store
        .job_fail(FailParams {
            lease: lease(&got[6]),
            class: "e".into(),
            message: "x".into(),
            retry: RetryPlan::Never,
            backtrace: None,
        })
        .await
        .unwrap();
    store.dead_discard(dead.id).await.unwrap();
    store
        .dead_replay(ReplaySelector {
            ids: Some(vec![got[1].id]),
            ..Default::default()
        })
        .await
        .unwrap();

    let conn = rusqlite::Connection::open(&path).unwrap();
    let mut actual: Vec<(String, String, i64)> = conn
        .prepare("SELECT queue, state, COUNT(*) FROM jobs GROUP BY queue, state ORDER BY 1, 2")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let kept: Vec<(String, String, i64)> = conn
        .prepare("SELECT queue, state, n FROM queue_state_counts WHERE n <> 0 ORDER BY 1, 2")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    actual.sort();
    assert_eq!(kept, actual);
    let states: Vec<&str> = actual.iter().map(|(_, s, _)| s.as_str()).collect();
    for state in [
        JobState::Completed,
        JobState::Cancelled,
        JobState::Scheduled,
        JobState::Available,
        JobState::Running,
    ] {
        assert!(
            states.contains(&state.as_str()),
            "workload did not reach {state}: {actual:?}"
        );
    }
}
