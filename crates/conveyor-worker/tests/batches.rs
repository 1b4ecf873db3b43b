//! Batch handlers (`WorkerBuilder::handle_batch`) against a real SQLite store: a batch kind's
//! jobs arrive together, each settles by its own outcome, and a failed one retries alone.

mod common;

use common::{env, spawn_worker, wait_for_state};
use conveyor_core::batch::BatchSpec;
use conveyor_core::kinds::KindSettings;
use conveyor_core::{error_class, JobState, NewJob, RetryPolicy, Store};
use conveyor_worker::{BatchJob, Maintenance, Outcome, Worker};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use uuid::Uuid;

/// Makes `rows.insert` a batch kind of `count` jobs (going out after `max_wait_ms` if fewer
/// wait) and enqueues `count` rows, numbered from 1: one full batch.
async fn one_batch_of_rows(store: &Arc<dyn Store>, count: u64, max_wait_ms: u64) -> Vec<Uuid> {
    let spec = BatchSpec::of(u32::try_from(count).expect("a batch size")).max_wait_ms(max_wait_ms);
    store
        .kind_put(KindSettings {
            batch: Some(spec),
            ..KindSettings::new("rows.insert")
        })
        .await
        .expect("kind settings");
    let jobs = (1..=count)
        .map(|n| {
            let mut job = NewJob::new("rows.insert", json!({ "n": n }));
            job.max_attempts = 5;
            job
        })
        .collect();
    store
        .jobs_insert_many(jobs)
        .await
        .expect("insert")
        .into_iter()
        .map(|inserted| inserted.job.id)
        .collect()
}

/// Five jobs go out as one batch; the handler fails #2 and #4. Three complete on their first
/// attempt, the two failed ones retry (alone, as a batch of two) and complete on their
/// second; each keeps its own attempts and error history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_partial_failure_retries_only_the_failed_jobs() {
    let env = env();
    // The five go out together because the batch is full; the two retried ones, by time.
    let ids = one_batch_of_rows(&env.store, 5, 300).await;
    let (batches_tx, mut batches) = mpsc::unbounded_channel::<Vec<u64>>();
    let w = Worker::builder(env.store.clone())
        .queue("default", 2)
        .default_retry(RetryPolicy::fixed_exponential(
            Duration::from_millis(10),
            Duration::from_millis(10),
        ))
        .poll_interval(Duration::from_millis(20))
        .with_maintenance(Maintenance::new(env.store.clone()).interval(Duration::from_millis(20)))
        .handle_batch("rows.insert", move |jobs: Vec<BatchJob>| {
            let batches_tx = batches_tx.clone();
            async move {
                let numbers: Vec<u64> = jobs
                    .iter()
                    .map(|job| job.payload["n"].as_u64().unwrap_or(0))
                    .collect();
                let _ = batches_tx.send(numbers);
                jobs.iter()
                    .map(|job| {
                        let n = job.payload["n"].as_u64().unwrap_or(0);
                        if job.context.attempt == 1 && (n == 2 || n == 4) {
                            Outcome::retry(format!("row {n} violates a constraint"))
                        } else {
                            Outcome::complete_with(json!({ "row": n }))
                        }
                    })
                    .collect()
            }
        })
        .build()
        .expect("worker");
    let (stop, handle) = spawn_worker(w);
    let mut first = batches.recv().await.expect("a first batch");
    first.sort_unstable();
    assert_eq!(first, vec![1, 2, 3, 4, 5], "one full batch");
    let mut done = Vec::new();
    for id in &ids {
        done.push(wait_for_state(&env.store, *id, JobState::Completed).await);
    }
    let mut second = batches.recv().await.expect("a second batch");
    second.sort_unstable();
    stop.send(()).expect("stop");
    handle.await.expect("worker ran");
    // The retried two waited for max_wait or came as a full batch of what was left: either
    // way, only they ran again.
    assert_eq!(second, vec![2, 4], "only the failed jobs run again");
    for job in &done {
        let n = job.payload["n"].as_u64().expect("n");
        assert_eq!(job.result, Some(json!({ "row": n })));
        if n == 2 || n == 4 {
            assert_eq!(job.attempt, 2, "job {n}: its own second attempt");
            assert_eq!(job.errors.len(), 1);
            assert_eq!(job.errors[0].class, error_class::ERROR);
            assert_eq!(
                job.errors[0].message,
                format!("row {n} violates a constraint")
            );
        } else {
            assert_eq!(job.attempt, 1, "job {n}: completed on its first attempt");
            assert!(job.errors.is_empty());
        }
    }
}

/// A batch handler that answers fewer outcomes than jobs, or panics, fails the jobs it gave
/// no outcome for; nothing is completed that the handler did not say was done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_without_an_outcome_fail() {
    let env = env();
    let ids = one_batch_of_rows(&env.store, 3, 60_000).await;
    let w = Worker::builder(env.store.clone())
        .queue("default", 1)
        .poll_interval(Duration::from_millis(20))
        .handle_batch("rows.insert", |jobs: Vec<BatchJob>| async move {
            // One outcome for a batch of three.
            vec![Outcome::complete_with(
                json!({ "first": jobs[0].payload["n"] }),
            )]
        })
        .build()
        .expect("worker");
    let (stop, handle) = spawn_worker(w);
    // The one outcome is the first job's (claim order is enqueue order here).
    let mut states = vec![wait_for_state(&env.store, ids[0], JobState::Completed).await];
    for id in &ids[1..] {
        states.push(wait_for_state(&env.store, *id, JobState::Retryable).await);
    }
    stop.send(()).expect("stop");
    handle.await.expect("worker ran");
    assert!(
        states[0].errors.is_empty(),
        "the job with an outcome completed as answered"
    );
    for job in &states[1..] {
        assert_eq!(job.errors.len(), 1);
        assert_eq!(job.errors[0].class, error_class::MISSING_OUTCOME);
        assert!(
            job.errors[0]
                .message
                .contains("1 outcome(s) for a batch of 3"),
            "{:?}",
            job.errors
        );
    }
}

/// A job of a running batch that loses its lease (cancelled by an operator) drops only its
/// own outcome: the others complete, and the cancelled one stays cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_drops_only_that_jobs_outcome() {
    let env = env();
    let ids = one_batch_of_rows(&env.store, 3, 60_000).await;
    let (started_tx, mut started) = mpsc::unbounded_channel::<Uuid>();
    let w = Worker::builder(env.store.clone())
        .queue("default", 1)
        // Heartbeats every 100 ms notice the cancelled job's lost lease.
        .lease(Duration::from_millis(300))
        .poll_interval(Duration::from_millis(20))
        .handle_batch("rows.insert", move |jobs: Vec<BatchJob>| {
            let started_tx = started_tx.clone();
            async move {
                let first = jobs[0].context.clone();
                let _ = started_tx.send(first.id);
                // Held until the first job's lease is lost; the others' leases are renewed.
                first.cancelled().await;
                jobs.iter().map(|_| Outcome::ok()).collect()
            }
        })
        .build()
        .expect("worker");
    let (stop, handle) = spawn_worker(w);
    let first = started.recv().await.expect("the batch started");
    env.store.job_cancel(first).await.expect("cancel");
    for id in ids.iter().filter(|id| **id != first) {
        let job = wait_for_state(&env.store, *id, JobState::Completed).await;
        assert_eq!(job.attempt, 1);
    }
    stop.send(()).expect("stop");
    handle.await.expect("worker ran");
    let cancelled = env.store.job_get(first).await.expect("get").expect("job");
    assert_eq!(cancelled.state, JobState::Cancelled);
}
