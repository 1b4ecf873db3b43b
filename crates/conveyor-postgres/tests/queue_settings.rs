//! Queue settings across processes: depth limits under concurrent producers, pausing with
//! several queues, wake-ups on resume, and limits inside the application's transaction.

mod common;

use conveyor_core::{FetchParams, NewJob, QueueSettings, Store, StoreError};
use conveyor_core::{JobStore, LeaseStore, QueueStore};
use serde_json::json;
use std::time::Duration;

fn job_in(queue: &str, tenant: Option<&str>) -> NewJob {
    let mut job = NewJob::new("k", json!({}));
    job.queue = queue.to_string();
    job.tenant = tenant.map(str::to_string);
    job
}

fn fetch_params(queues: &[&str]) -> FetchParams {
    FetchParams {
        worker_id: "w".into(),
        queues: queues.iter().map(|q| q.to_string()).collect(),
        max: 10,
        lease: Duration::from_secs(30),
        kinds: None,
        excluded_kinds: Vec::new(),
    }
}

async fn unfinished(store: &impl Store, queue: &str) -> u64 {
    let stats = store.queues_stats().await.expect("stats");
    stats
        .iter()
        .find(|q| q.name == queue)
        .map_or(0, |q| q.scheduled + q.available + q.running + q.retryable)
}

/// Batches of three from two instances at once into a queue with room for 25: exactly the eight
/// batches that fit are stored, never a job more, and the others are told the queue is full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_batches_from_two_instances_never_pass_the_maximum_depth() {
    let (first, clock, _guard) = common::fresh_store().await;
    let second = common::connect(first.schema(), clock).await;
    let limited = {
        let mut settings = QueueSettings::default();
        settings.max_depth = Some(25);
        settings
    };
    first
        .queue_settings_put("bounded", limited)
        .await
        .expect("limit");
    let stores = [first.clone(), second];
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = stores[i % 2].clone();
            tokio::spawn(async move {
                // Keyed jobs too, so the depth locks meet the idempotency locks.
                let mut batch = vec![job_in("bounded", None), job_in("bounded", None)];
                let mut keyed = job_in("bounded", None);
                keyed.idempotency_key = Some(format!("key-{i}"));
                batch.push(keyed);
                store.jobs_insert_many(batch).await
            })
        })
        .collect();
    let (mut accepted, mut refused) = (0, 0);
    for outcome in futures::future::join_all(tasks).await {
        match outcome.expect("task") {
            Ok(inserted) => accepted += inserted.len() as u64,
            Err(StoreError::QueueFull { depth, limit, .. }) => {
                assert_eq!(limit, 25);
                assert!(depth + 3 > 25, "refused with room left: depth {depth}");
                refused += 1;
            }
            Err(other) => panic!("unexpected error: {other:?}"),
        }
    }
    assert_eq!(accepted, 24, "every batch that fits, and no more");
    assert_eq!(refused, 12);
    assert_eq!(unfinished(&first, "bounded").await, 24);
}

/// The per-tenant limit holds under concurrency too, for each tenant separately.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_tenants_each_stop_at_their_own_limit() {
    let (store, _clock, _guard) = common::fresh_store().await;
    let limited = {
        let mut settings = QueueSettings::default();
        settings.max_depth_per_tenant = Some(5);
        settings
    };
    store
        .queue_settings_put("shared", limited)
        .await
        .expect("limit");
    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let store = store.clone();
            let tenant = ["acme", "globex", "initech"][i % 3];
            tokio::spawn(async move {
                store
                    .jobs_insert_many(vec![job_in("shared", Some(tenant))])
                    .await
            })
        })
        .collect();
    let mut accepted = 0;
    for outcome in futures::future::join_all(tasks).await {
        match outcome.expect("task") {
            Ok(_) => accepted += 1,
            Err(StoreError::QueueFull { tenant, depth, .. }) => {
                assert!(tenant.is_some());
                assert_eq!(depth, 5);
            }
            Err(other) => panic!("unexpected error: {other:?}"),
        }
    }
    assert_eq!(accepted, 15, "five for each of the three tenants");
    // Jobs without a tenant are not limited by the per-tenant maximum.
    store
        .jobs_insert_many((0..10).map(|_| job_in("shared", None)).collect())
        .await
        .expect("jobs without a tenant");
}

/// Resubmitting an accepted job (same idempotency key) returns it even when the queue is full:
/// duplicates take no room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_duplicate_of_a_stored_job_is_accepted_when_the_queue_is_full() {
    let (store, _clock, _guard) = common::fresh_store().await;
    let limited = {
        let mut settings = QueueSettings::default();
        settings.max_depth = Some(1);
        settings
    };
    store
        .queue_settings_put("one", limited)
        .await
        .expect("limit");
    let mut keyed = job_in("one", None);
    keyed.idempotency_key = Some("order-1".into());
    let first = store
        .jobs_insert_many(vec![keyed.clone()])
        .await
        .expect("first");
    let again = store
        .jobs_insert_many(vec![keyed])
        .await
        .expect("the duplicate is not refused");
    assert!(again[0].duplicate);
    assert_eq!(again[0].job.id, first[0].job.id);
    let full = store
        .jobs_insert_many(vec![job_in("one", None)])
        .await
        .expect_err("a new job is refused");
    assert!(
        matches!(full, StoreError::QueueFull { depth: 1, .. }),
        "{full:?}"
    );
}

/// A fetch over several queues skips the paused ones and still serves the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_queue_is_skipped_when_fetching_several_queues() {
    let (store, _clock, _guard) = common::fresh_store().await;
    let paused = {
        let mut settings = QueueSettings::default();
        settings.paused = true;
        settings
    };
    store
        .queue_settings_put("held", paused)
        .await
        .expect("pause");
    store
        .jobs_insert_many(vec![
            job_in("held", None),
            job_in("open", None),
            job_in("held", None),
        ])
        .await
        .expect("insert");
    let fetched = store
        .jobs_fetch(fetch_params(&["held", "open"]))
        .await
        .expect("fetch");
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].queue, "open");
    store
        .queue_settings_put("held", QueueSettings::default())
        .await
        .expect("resume");
    let fetched = store
        .jobs_fetch(fetch_params(&["held", "open"]))
        .await
        .expect("fetch");
    assert_eq!(fetched.len(), 2);
    assert!(fetched.iter().all(|job| job.queue == "held"));
}

/// Resuming a queue wakes fetchers waiting in another process, as new jobs would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resuming_a_queue_wakes_fetchers_of_another_instance() {
    let (first, clock, _guard) = common::fresh_store().await;
    let second = common::connect(first.schema(), clock).await;
    let paused = {
        let mut settings = QueueSettings::default();
        settings.paused = true;
        settings
    };
    first
        .queue_settings_put("held", paused)
        .await
        .expect("pause");
    first
        .jobs_insert_many(vec![job_in("held", None)])
        .await
        .expect("insert");

    let wakeup = second.wakeup();
    let notified = wakeup.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    first
        .queue_settings_put("held", QueueSettings::default())
        .await
        .expect("resume");
    tokio::time::timeout(Duration::from_secs(5), notified)
        .await
        .expect("the other instance is woken by the resume");
    let fetched = second
        .jobs_fetch(fetch_params(&["held"]))
        .await
        .expect("fetch");
    assert_eq!(fetched.len(), 1);
}

/// `enqueue_tx` honours the limits, counting the transaction's own earlier jobs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_tx_counts_its_own_jobs_and_refuses_past_the_limit() {
    let (store, _clock, _guard) = common::fresh_store().await;
    let limited = {
        let mut settings = QueueSettings::default();
        settings.max_depth = Some(2);
        settings
    };
    store
        .queue_settings_put("small", limited)
        .await
        .expect("limit");
    let mut tx = store.pool().begin().await.expect("begin");
    store
        .enqueue_tx(&mut tx, vec![job_in("small", None), job_in("small", None)])
        .await
        .expect("two fit");
    let refused = store
        .enqueue_tx(&mut tx, vec![job_in("small", None)])
        .await
        .expect_err("the transaction's own jobs fill the queue");
    assert!(
        matches!(
            refused,
            StoreError::QueueFull {
                depth: 2,
                limit: 2,
                ..
            }
        ),
        "{refused:?}"
    );
    tx.rollback().await.expect("rollback");
    assert_eq!(unfinished(&store, "small").await, 0);
}

/// Ten fetchers on two instances at once, half of them also serving an unlimited queue, against
/// a concurrency limit of three: never more than three of the limited queue's jobs are claimed
/// in total (none is completed during the test), while the unlimited queue is fetched freely.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fetches_from_two_instances_never_pass_the_concurrency_limit() {
    let (first, clock, _guard) = common::fresh_store().await;
    let second = common::connect(first.schema(), clock).await;
    let limited = {
        let mut settings = QueueSettings::default();
        settings.concurrency_limit = Some(3);
        settings
    };
    first
        .queue_settings_put("capped", limited)
        .await
        .expect("limit");
    first
        .jobs_insert_many((0..20).map(|_| job_in("capped", None)).collect())
        .await
        .expect("capped jobs");
    first
        .jobs_insert_many((0..20).map(|_| job_in("open", None)).collect())
        .await
        .expect("open jobs");
    let stores = [first.clone(), second];
    for round in 0..3 {
        let tasks: Vec<_> = (0..10)
            .map(|i| {
                let store = stores[i % 2].clone();
                let queues: &[&str] = if i % 4 < 2 {
                    &["capped"]
                } else {
                    &["capped", "open"]
                };
                let mut params = fetch_params(queues);
                params.max = 5;
                tokio::spawn(async move { store.jobs_fetch(params).await })
            })
            .collect();
        let mut capped = 0;
        for outcome in futures::future::join_all(tasks).await {
            let jobs = outcome.expect("task").expect("fetch");
            capped += jobs.iter().filter(|job| job.queue == "capped").count();
        }
        let expected = if round == 0 { 3 } else { 0 };
        assert_eq!(capped, expected, "round {round}: claimed past the limit");
    }
    let stats = first.queues_stats().await.expect("stats");
    let of = |name: &str| stats.iter().find(|q| q.name == name).expect("counted");
    assert_eq!((of("capped").running, of("capped").available), (3, 17));
    assert_eq!(
        of("open").running,
        20,
        "the unlimited queue is not held back"
    );
}
