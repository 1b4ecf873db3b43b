//! Unique jobs across processes: two stores with pools of their own (as two nodes have) on one
//! schema enqueue the same unique job at once, and batches mixing unique and keyed jobs in
//! opposite orders do not deadlock.

mod common;

use conveyor_core::JobStore;
use conveyor_core::{JobListParams, NewJob, UniqueSpec};
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;

fn unique_job(kind: &str, payload: serde_json::Value) -> NewJob {
    let mut job = NewJob::new(kind, payload);
    job.unique = Some(UniqueSpec::by_args(["customer"]));
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unique_enqueues_from_two_instances_yield_one_job() {
    let (first, clock, _guard) = common::fresh_store().await;
    let second = common::connect(first.schema(), clock).await;
    let stores = [first.clone(), second];
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = stores[i % 2].clone();
            tokio::spawn(async move {
                let job = unique_job("refresh", json!({ "customer": 9, "caller": i }));
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
async fn unique_batches_in_opposite_orders_do_not_deadlock() {
    let (store, _clock, _guard) = common::fresh_store().await;
    // Each batch holds ten unique identities and ten idempotency keys, interleaved; every other
    // batch is reversed, so without one sorted lock acquisition two would wait on each other.
    let batch: Vec<NewJob> = (0..10)
        .flat_map(|i| {
            let mut keyed = NewJob::new("keyed", json!({}));
            keyed.idempotency_key = Some(format!("key-{i}"));
            [unique_job("refresh", json!({ "customer": i })), keyed]
        })
        .collect();
    let tasks: Vec<_> = (0..8)
        .map(|round| {
            let store = store.clone();
            let mut batch = batch.clone();
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
            let mut params = JobListParams::default();
            params.limit = 1000;
            params
        })
        .await
        .expect("list");
    assert_eq!(all.len(), 20, "one job per identity and per key");
}
