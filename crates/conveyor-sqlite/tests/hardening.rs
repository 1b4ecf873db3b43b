//! The embedded store under conditions hostile testing found: absurd configuration, panics on
//! the writer thread, a dead writer, damaged files, a second process on the same file, and
//! idle long-polls.

use conveyor_core::{FetchParams, NewJob, StoreOptions, Valid};
use conveyor_core::{JobStore, LeadershipStore, LeaseStore};
use conveyor_engine::fetch_waiting;
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn open_with(path: &std::path::Path, options: SqliteOptions) -> SqliteStore {
    SqliteStore::open(path, options).expect("open store")
}

fn keyed(key: &str) -> NewJob {
    let mut job = NewJob::new("charge", json!({"n": 1}));
    job.idempotency_key = Some(key.to_string());
    job
}

fn fetch_params() -> FetchParams {
    FetchParams {
        worker_id: "w".to_string(),
        queues: vec!["default".to_string()],
        max: 10,
        lease: Duration::from_secs(30),
        kinds: None,
        excluded_kinds: Vec::new(),
    }
}

/// The same, checked, as the long-poll takes it.
fn valid_fetch() -> Valid<FetchParams> {
    Valid::fetch(fetch_params()).expect("a valid fetch")
}

/// `--idempotency-window-secs 10000000000000` once made the window check overflow on the
/// writer thread (`DateTime + TimeDelta overflowed`), after which every write failed.
#[tokio::test]
async fn an_absurd_idempotency_window_neither_panics_nor_stops_the_writer() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open_with(
        &dir.path().join("jobs.db"),
        SqliteOptions {
            store: {
                let mut options = StoreOptions::default();
                options.completed_idempotency_window = Duration::from_secs(10_000_000_000_000);
                options
            },
            ..SqliteOptions::default()
        },
    );
    let first = store
        .jobs_insert_many(vec![keyed("k")])
        .await
        .expect("insert");
    let job = store
        .jobs_fetch(fetch_params())
        .await
        .expect("fetch")
        .pop()
        .expect("job");
    let lease = conveyor_core::LeaseRef {
        id: job.id,
        lease_token: job.lease.expect("lease").token,
    };
    store
        .jobs_complete_many(vec![conveyor_core::CompleteParams {
            lease,
            result: None,
        }])
        .await
        .expect("complete");
    let again = store
        .jobs_insert_many(vec![keyed("k")])
        .await
        .expect("re-enqueue");
    assert!(again[0].duplicate, "still inside the (endless) window");
    assert_eq!(again[0].job.id, first[0].job.id);
    assert!(store
        .leader_try_acquire("a", Duration::MAX)
        .await
        .expect("leader"));
    assert!(store.health().await.ready);
}

/// A file with damaged pages is refused at open (naming the opt-out); opened anyway, the
/// damage shows in health once an operation meets it.
#[tokio::test]
async fn a_damaged_file_is_refused_at_open_and_reported_by_health() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("jobs.db");
    {
        let store = open_with(&path, SqliteOptions::default());
        let jobs: Vec<NewJob> = (0..2000)
            .map(|i| NewJob::new("bulk", json!({"i": i, "pad": "x".repeat(200)})))
            .collect();
        store.jobs_insert_many(jobs).await.expect("insert");
    }
    // The writer thread closes its connection after the store is dropped; checkpoint and
    // truncate the WAL so every page is in the main file, then damage pages in its middle.
    let checkpoint = || -> rusqlite::Result<()> {
        let conn = rusqlite::Connection::open(&path)?;
        conn.busy_timeout(Duration::from_secs(10))?;
        conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    };
    checkpoint().expect("checkpoint");
    let size = std::fs::metadata(&path).expect("size").len();
    {
        use std::io::{Seek, SeekFrom, Write};
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("open file");
        for page in [size / 2 / 4096, size / 3 / 4096] {
            file.seek(SeekFrom::Start(page * 4096)).expect("seek");
            file.write_all(&[0xA5; 4096]).expect("damage");
        }
    }
    let refused = SqliteStore::open(&path, SqliteOptions::default())
        .err()
        .expect("a damaged file is refused");
    let message = refused.to_string();
    assert!(
        message.contains("damaged") && message.contains("--skip-integrity-check"),
        "{message}"
    );

    let store = open_with(
        &path,
        SqliteOptions {
            integrity_check: false,
            ..SqliteOptions::default()
        },
    );
    // A filter no index serves reads every row, so it meets the damage.
    let listed = store
        .jobs_list({
            let mut params = conveyor_core::JobListParams::default();
            params.queue = None;
            params.state = None;
            params.kind = Some("no-such-kind".to_string());
            params.limit = 500;
            params.after = None;
            params
        })
        .await;
    let error = listed.expect_err("the damaged pages are met").to_string();
    assert!(error.contains("malformed"), "{error}");
    let health = store.health().await;
    assert!(!health.live, "{health:?}");
    assert!(
        health.problem.unwrap_or_default().contains("malformed"),
        "names SQLite's verdict"
    );
}

/// One process per file: a second open (here in the same process) is refused naming the
/// holder's pid; once the first store is dropped, the file opens again.
#[tokio::test]
async fn a_second_open_of_the_same_file_is_refused_naming_the_holder() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("jobs.db");
    let first = open_with(&path, SqliteOptions::default());
    let refused = SqliteStore::open(&path, SqliteOptions::default())
        .err()
        .expect("second open refused");
    assert!(
        refused
            .to_string()
            .contains(&format!("pid {}", std::process::id())),
        "{refused}"
    );
    // Tools that share the file on purpose (the token commands) may.
    let shared = SqliteStore::open(
        &path,
        SqliteOptions {
            exclusive: false,
            ..SqliteOptions::default()
        },
    )
    .expect("non-exclusive open");
    drop(shared);
    drop(first);
    open_with(&path, SqliteOptions::default());
}

/// An idle long-poll used to re-run the fetch every poll interval (200 waiting fetches cost
/// 15 % of a core); now it waits for the writer's wake-up and backs its safety-net poll off,
/// and a job enqueued meanwhile is still handed over at once.
#[tokio::test]
async fn idle_long_polls_leave_the_writer_alone_and_still_wake_at_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(open_with(
        &dir.path().join("jobs.db"),
        SqliteOptions::default(),
    ));
    let before = store.write_rounds();
    let jobs = fetch_waiting(
        store.as_ref(),
        None,
        valid_fetch(),
        Duration::from_secs(3),
        Duration::from_millis(100),
        std::future::pending(),
    )
    .await
    .expect("fetch");
    assert!(jobs.is_empty());
    let rounds = store.write_rounds() - before;
    // Polling every 100 ms would be 30 rounds; doubling from 100 ms is 5.
    assert!(
        rounds <= 8,
        "{rounds} write rounds for one idle 3 s long-poll"
    );

    // A long-poll waiting (with a huge poll interval, so only the wake-up can deliver).
    let waiting = {
        let store = store.clone();
        tokio::spawn(async move {
            fetch_waiting(
                store.as_ref(),
                None,
                valid_fetch(),
                Duration::from_secs(60),
                Duration::from_secs(60),
                std::future::pending(),
            )
            .await
        })
    };
    // Enqueue until the waiter has been woken and took the job.
    let job = store
        .jobs_insert_many(vec![NewJob::new("wake", json!({}))])
        .await
        .expect("insert")
        .remove(0)
        .job;
    let got = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("woken well before its poll interval")
        .expect("task")
        .expect("fetch");
    assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![job.id]);
}

/// Many idle long-polls on one queue share their empty looks (`IdleLooks`, as the server's
/// long-polls do): a safety-net poll is skipped when another fetch waiting the same found
/// nothing less than a poll ago, so most safety-net polls never reach the store; a job
/// enqueued meanwhile still reaches a waiter at once (issue 27: 1,000 idle long-polls cost 13 % of a core).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_long_polls_share_their_empty_looks_and_still_wake() {
    const WAITERS: usize = 100;
    let dir = tempfile::tempdir().expect("temp dir");
    let store = Arc::new(open_with(
        &dir.path().join("jobs.db"),
        SqliteOptions::default(),
    ));
    let wait_all = |idle: Option<Arc<conveyor_engine::IdleLooks>>, wait: Duration| {
        let tasks: Vec<_> = (0..WAITERS)
            .map(|_| {
                let (store, idle) = (store.clone(), idle.clone());
                tokio::spawn(async move {
                    conveyor_engine::fetch_waiting_with(
                        store.as_ref(),
                        conveyor_engine::Gates::default(),
                        valid_fetch(),
                        wait,
                        Duration::from_millis(50),
                        idle.as_deref(),
                        std::future::pending(),
                    )
                    .await
                    .expect("fetch")
                })
            })
            .collect();
        async move {
            let mut got = Vec::new();
            for task in tasks {
                got.extend(task.await.expect("task"));
            }
            got
        }
    };
    let idle = Arc::new(conveyor_engine::IdleLooks::new());
    assert!(wait_all(Some(idle.clone()), Duration::from_secs(2))
        .await
        .is_empty());
    // Counted in looks, not in the writer's rounds: how many looks a round batches depends on
    // how loaded the machine is, how many looks reach the store does not.
    let (looked, skipped) = (idle.looked(), idle.skipped());
    assert!(
        looked + skipped >= WAITERS as u64,
        "every waiter polled at least once more in 2 s: {looked} looked, {skipped} skipped"
    );
    assert!(
        skipped > 10 * looked,
        "{WAITERS} idle long-polls sharing their looks: {looked} polls looked, {skipped} skipped"
    );

    // Sharing, a wake-up still makes every waiter look: the job reaches one of them at once
    // (their safety-net poll is a minute).
    let (found_tx, mut found) = tokio::sync::mpsc::unbounded_channel();
    let waiters: Vec<_> = (0..WAITERS)
        .map(|_| {
            let (store, idle, found_tx) = (store.clone(), idle.clone(), found_tx.clone());
            tokio::spawn(async move {
                let jobs = conveyor_engine::fetch_waiting_with(
                    store.as_ref(),
                    conveyor_engine::Gates::default(),
                    valid_fetch(),
                    Duration::from_secs(120),
                    Duration::from_secs(60),
                    Some(&idle),
                    std::future::pending(),
                )
                .await
                .expect("fetch");
                let _ = found_tx.send(jobs);
            })
        })
        .collect();
    let job = store
        .jobs_insert_many(vec![NewJob::new("wake", json!({}))])
        .await
        .expect("insert")
        .remove(0)
        .job;
    let got = tokio::time::timeout(Duration::from_secs(30), found.recv())
        .await
        .expect("a waiter woken well before its poll interval")
        .expect("a waiter's answer");
    assert_eq!(got.iter().map(|j| j.id).collect::<Vec<_>>(), vec![job.id]);
    for waiter in waiters {
        waiter.abort();
    }
}
