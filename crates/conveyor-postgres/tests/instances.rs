//! Two stores on one schema, each with its own pool and listener, as two processes have.

mod common;

use conveyor_core::{FetchParams, NewJob};
use conveyor_core::{JobStore, LeaseStore};
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_enqueued_by_another_instance_wakes_a_waiting_fetcher() {
    let (first, clock, _guard) = common::fresh_store().await;
    let second = common::connect(first.schema(), clock).await;

    // Registered before the insert, so the wake-up cannot slip past.
    let wakeup = first.wakeup();
    let notified = wakeup.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();

    second
        .jobs_insert_many(vec![NewJob::new("cross-process", json!({}))])
        .await
        .expect("insert via the second instance");
    tokio::time::timeout(Duration::from_secs(5), notified)
        .await
        .expect("the first instance is woken by the second's NOTIFY");

    let fetched = first
        .jobs_fetch(FetchParams {
            worker_id: "w".into(),
            queues: vec!["default".into()],
            max: 10,
            lease: Duration::from_secs(30),
            kinds: None,
            excluded_kinds: Vec::new(),
        })
        .await
        .expect("fetch");
    assert_eq!(fetched.len(), 1);
    assert_eq!(fetched[0].kind, "cross-process");
}

/// A completion batch sends the wake-ups for the steps it starts after its commit, in a
/// statement of its own (`complete_flow_jobs`): another instance's waiting fetcher still hears
/// of the next step at once, and finds it committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flow_step_started_by_another_instance_wakes_a_waiting_fetcher() {
    use conveyor_core::workflow::{NewFlow, ValidFlow};
    use conveyor_core::{CompleteParams, FlowStore, LeaseOutcome};
    let (first, clock, _guard) = common::fresh_store().await;
    let second = common::connect(first.schema(), clock).await;
    let fetch = |queue: &str| FetchParams {
        worker_id: "w".into(),
        queues: vec![queue.into()],
        max: 10,
        lease: Duration::from_secs(30),
        kinds: None,
        excluded_kinds: Vec::new(),
    };
    let mut second_step = NewJob::new("second", json!({}));
    second_step.queue = "later".into();
    let flow = NewFlow::chain([("a", NewJob::new("first", json!({}))), ("b", second_step)]);
    second
        .flow_create(ValidFlow::new(flow).expect("valid"))
        .await
        .expect("create");
    let running = second.jobs_fetch(fetch("default")).await.expect("fetch a");
    assert_eq!(running.len(), 1, "step a runs");

    // Registered before the completion, so the wake-up cannot slip past.
    let wakeup = first.wakeup();
    let notified = wakeup.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    let outcomes = second
        .jobs_complete_many(vec![CompleteParams {
            lease: running[0].lease_ref().expect("lease"),
            result: Some(json!({"made": 1})),
        }])
        .await
        .expect("complete a");
    assert_eq!(outcomes, vec![LeaseOutcome::Applied]);
    tokio::time::timeout(Duration::from_secs(5), notified)
        .await
        .expect("the first instance is woken for step b");

    let fetched = first.jobs_fetch(fetch("later")).await.expect("fetch b");
    assert_eq!(
        fetched.len(),
        1,
        "step b is committed when its wake-up arrives"
    );
    assert_eq!(fetched[0].kind, "second");
    let parents = &fetched[0].flow.as_ref().expect("flow link").parents;
    assert_eq!(parents.get("a"), Some(&json!({"made": 1})));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_enqueues_from_two_instances_yield_one_job() {
    let (first, clock, _guard) = common::fresh_store().await;
    let second = common::connect(first.schema(), clock).await;
    let stores = [first.clone(), second];
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = stores[i % 2].clone();
            tokio::spawn(async move {
                let mut job = NewJob::new("pay", json!({ "attempt": i }));
                job.idempotency_key = Some("order-7".into());
                store.jobs_insert_many(vec![job]).await
            })
        })
        .collect();
    let mut ids = HashSet::new();
    let mut fresh = 0;
    for outcome in futures::future::join_all(tasks).await {
        let inserted = outcome.expect("task").expect("insert");
        ids.insert(inserted[0].job.id);
        fresh += usize::from(!inserted[0].duplicate);
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert_eq!(fresh, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_sharing_keys_in_opposite_orders_do_not_deadlock() {
    let (store, _clock, _guard) = common::fresh_store().await;
    let keyed = |key: &str| {
        let mut job = NewJob::new("k", json!({}));
        job.idempotency_key = Some(key.to_string());
        job
    };
    let keys: Vec<String> = (0..20).map(|i| format!("key-{i}")).collect();
    let tasks: Vec<_> = (0..8)
        .map(|round| {
            let store = store.clone();
            let mut batch: Vec<NewJob> = keys.iter().map(|k| keyed(k)).collect();
            if round % 2 == 1 {
                batch.reverse();
            }
            tokio::spawn(async move { store.jobs_insert_many(batch).await })
        })
        .collect();
    let finished = tokio::time::timeout(Duration::from_secs(30), futures::future::join_all(tasks))
        .await
        .expect("no deadlock");
    for outcome in finished {
        outcome.expect("task").expect("insert");
    }
    let all = store
        .jobs_list({
            let mut params = conveyor_core::JobListParams::default();
            params.limit = 1000;
            params
        })
        .await
        .expect("list");
    assert_eq!(all.len(), keys.len(), "one job per key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clock_not_the_database_sets_every_timestamp() {
    let (store, clock, _guard) = common::fresh_store().await;
    clock.advance(Duration::from_secs(10 * 365 * 24 * 3600)); // ten years from the wall clock
    let now = conveyor_core::Clock::now(&*clock);
    let inserted = store
        .jobs_insert_many(vec![NewJob::new("future", json!({}))])
        .await
        .expect("insert");
    assert_eq!(inserted[0].job.created_at, now);
    assert_eq!(inserted[0].job.run_at, now);
    // Sub-millisecond input is kept at the store's millisecond precision.
    let mut precise = NewJob::new("precise", json!({}));
    precise.run_at = Some(now + chrono::Duration::microseconds(60_000_123));
    let stored = store
        .jobs_insert_many(vec![precise])
        .await
        .expect("insert")
        .remove(0)
        .job;
    assert_eq!(stored.run_at, now + chrono::Duration::milliseconds(60_000));
}
