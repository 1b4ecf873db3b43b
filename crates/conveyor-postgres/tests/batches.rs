//! Batch statements over running jobs from several connections at once.

mod common;

use conveyor_core::{CompleteParams, FetchParams, HeartbeatParams, LeaseOutcome, NewJob};
use conveyor_core::{JobStore, LeaseStore};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

const ROUNDS: usize = 20;
const JOBS: usize = 200;

/// A worker's heartbeat batch and its completion batch name the same jobs, in whatever order
/// each was gathered. Each statement locks its rows in the order of its arrays, so two batches
/// in opposite orders used to deadlock (PostgreSQL fails one after `deadlock_timeout`, 1 s; seen
/// during a million-job drain). The store now sends every such batch in id order: racing a
/// reversed heartbeat batch against a completion batch never fails, and every job completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn heartbeats_and_completions_in_opposite_orders_never_deadlock() {
    let (store, clock, _guard) = common::fresh_store().await;
    let other = common::connect(store.schema(), clock).await;
    let (store, other) = (Arc::new(store), Arc::new(other));
    for round in 0..ROUNDS {
        let jobs: Vec<NewJob> = (0..JOBS)
            .map(|n| NewJob::new("batch", json!({ "round": round, "n": n })))
            .collect();
        store.jobs_insert_many(jobs).await.expect("insert");
        let claimed = store
            .jobs_fetch(FetchParams {
                worker_id: "w".into(),
                queues: vec!["default".into()],
                max: JOBS,
                lease: Duration::from_secs(60),
                kinds: None,
                excluded_kinds: Vec::new(),
            })
            .await
            .expect("fetch");
        assert_eq!(claimed.len(), JOBS);
        let leases: Vec<_> = claimed.iter().filter_map(|job| job.lease_ref()).collect();
        let beats: Vec<HeartbeatParams> = leases
            .iter()
            .rev()
            .map(|lease| HeartbeatParams {
                lease: *lease,
                extend_by: Duration::from_secs(60),
            })
            .collect();
        let completions: Vec<CompleteParams> = leases
            .iter()
            .map(|lease| CompleteParams {
                lease: *lease,
                result: None,
            })
            .collect();
        let (beating, completing) = (other.clone(), store.clone());
        let (beaten, completed) = tokio::join!(
            tokio::spawn(async move { beating.jobs_heartbeat_many(beats).await }),
            tokio::spawn(async move { completing.jobs_complete_many(completions).await }),
        );
        beaten
            .expect("heartbeat task")
            .unwrap_or_else(|e| panic!("round {round}: heartbeat failed: {e}"));
        let outcomes = completed
            .expect("completion task")
            .unwrap_or_else(|e| panic!("round {round}: completion failed: {e}"));
        assert!(
            outcomes.iter().all(|o| *o == LeaseOutcome::Applied),
            "round {round}: every completion applies (a heartbeat does not take the lease)"
        );
    }
}
