//! The worker under injected faults (`conveyor_core::faults`): store calls that fail or panic in
//! its fetch loop, completer and heartbeats. The worker carries on, and every job still ends
//! completed exactly once (a completion that never landed is rescued and run again; a late
//! completion of a rescued job is refused).
//!
//! Failpoints are process-wide; each test takes the lock so plain `cargo test` (threads of one
//! process) runs them one at a time. Under nextest each test is a process of its own anyway.

mod common;

use common::{env, spawn_worker, wait_for_state};
use conveyor_core::{error_class, JobState, NewJob, RetryPolicy, Store};
use conveyor_worker::{Maintenance, Outcome, Worker, WorkerBuilder};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn worker(store: &Arc<dyn Store>) -> WorkerBuilder {
    Worker::builder(store.clone())
        .queue("default", 4)
        .default_retry(RetryPolicy::fixed_exponential(
            Duration::from_millis(10),
            Duration::from_millis(50),
        ))
        .poll_interval(Duration::from_millis(20))
        .with_maintenance(
            Maintenance::new(store.clone())
                .interval(Duration::from_millis(20))
                .rescue_retry(RetryPolicy::fixed_exponential(
                    Duration::from_millis(10),
                    Duration::from_millis(50),
                )),
        )
}

async fn enqueue(store: &Arc<dyn Store>, kind: &str) -> Uuid {
    let mut job = NewJob::new(kind, json!({}));
    job.max_attempts = 5;
    store.jobs_insert_many(vec![job]).await.expect("insert")[0]
        .job
        .id
}

/// Fetches that fail, then panic, are retried with backoff; the jobs still run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_and_panicking_fetches_are_retried() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    fail::cfg("worker_fetch", "2*return->1*panic(fetch exploded)->off").expect("failpoint");
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let w = worker(&env.store)
        .handle_json("work", move |_, _| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                Outcome::ok()
            }
        })
        .build()
        .expect("worker");
    let ids = [
        enqueue(&env.store, "work").await,
        enqueue(&env.store, "work").await,
    ];
    let (stop, handle) = spawn_worker(w);
    for id in ids {
        let done = wait_for_state(&env.store, id, JobState::Completed).await;
        assert_eq!(done.attempt, 1);
    }
    let _ = stop.send(());
    handle.await.expect("worker ends");
    fail::remove("worker_fetch");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each job ran once");
}

/// Completions that never land (every retry of the batch fails, then one panics) leave the
/// job running; its lease expires, maintenance rescues it, and it runs and completes again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_completion_is_rescued_and_the_job_completes() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    fail::cfg(
        "worker_complete",
        "5*return->1*panic(complete exploded)->off",
    )
    .expect("failpoint");
    let w = worker(&env.store)
        .lease(Duration::from_millis(400))
        .handle_json("work", |_, _| async { Outcome::ok() })
        .build()
        .expect("worker");
    let id = enqueue(&env.store, "work").await;
    let (stop, handle) = spawn_worker(w);
    let done = wait_for_state(&env.store, id, JobState::Completed).await;
    let _ = stop.send(());
    handle.await.expect("worker ends");
    fail::remove("worker_complete");
    assert!(
        done.attempt >= 2,
        "ran again after the lost completion: {done:?}"
    );
    assert!(
        done.errors
            .iter()
            .any(|e| e.class == error_class::LEASE_EXPIRED),
        "{:?}",
        done.errors
    );
}

/// Heartbeats that fail let a long job's lease expire: it is rescued and run again, and the
/// first run's late completion is refused, so the job completes exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_heartbeats_cost_a_rerun_never_a_double_completion() {
    let _one = ONE_AT_A_TIME.lock().await;
    let env = env();
    // The first attempt's heartbeats all fail (and one panics); later ones get through.
    fail::cfg("worker_heartbeat", "6*return->1*panic(beat exploded)->off").expect("failpoint");
    let attempts = Arc::new(AtomicUsize::new(0));
    let seen = attempts.clone();
    let w = worker(&env.store)
        .lease(Duration::from_millis(300))
        .handle_json("slow", move |ctx, _| {
            let seen = seen.clone();
            async move {
                seen.fetch_add(1, Ordering::SeqCst);
                if ctx.attempt == 1 {
                    // Outlives its lease while no heartbeat lands; cancelled when the worker
                    // learns the lease is lost, or completes too late to count.
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                }
                Outcome::complete_with(json!({"attempt": ctx.attempt}))
            }
        })
        .build()
        .expect("worker");
    let id = enqueue(&env.store, "slow").await;
    let (stop, handle) = spawn_worker(w);
    let done = wait_for_state(&env.store, id, JobState::Completed).await;
    let _ = stop.send(());
    handle.await.expect("worker ends");
    fail::remove("worker_heartbeat");
    assert!(done.attempt >= 2, "{done:?}");
    assert_eq!(
        done.result,
        Some(json!({"attempt": done.attempt})),
        "the completion that counted is the last attempt's"
    );
    assert!(done
        .errors
        .iter()
        .any(|e| e.class == error_class::LEASE_EXPIRED));
}
