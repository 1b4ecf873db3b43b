//! The worker runtime against a real SQLite store in a temp dir: outcomes, failure classes,
//! timeouts, panics, leases and graceful shutdown.

mod common;

use chrono::Utc;
use common::{env, env_with, spawn_worker, wait_for_state};
use conveyor_core::{error_class, JobState, NewJob, RetryPolicy, Store};
use conveyor_core::{Clock, ManualClock};
use conveyor_sqlite::SqliteOptions;
use conveyor_worker::{JobContext, Maintenance, Outcome, ShutdownReport, Worker, WorkerBuilder};
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use uuid::Uuid;

fn fast_retry() -> RetryPolicy {
    RetryPolicy::fixed_exponential(Duration::from_millis(10), Duration::from_millis(50))
}

fn worker(store: &Arc<dyn Store>) -> WorkerBuilder {
    Worker::builder(store.clone())
        .queue("default", 4)
        .default_retry(fast_retry())
        .poll_interval(Duration::from_millis(20))
        .with_maintenance(Maintenance::new(store.clone()).interval(Duration::from_millis(20)))
}

async fn enqueue(store: &Arc<dyn Store>, job: NewJob) -> Uuid {
    store.jobs_insert_many(vec![job]).await.expect("insert")[0]
        .job
        .id
}

fn job(kind: &str, max_attempts: u32) -> NewJob {
    let mut job = NewJob::new(kind, json!({"n": 1}));
    job.max_attempts = max_attempts;
    job
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_with_backoff_then_completes() {
    let env = env();
    let w = worker(&env.store)
        .handle_json("flaky", |ctx: JobContext, _| async move {
            if ctx.attempt < 3 {
                Outcome::retry(format!("upstream 503 on attempt {}", ctx.attempt))
            } else {
                Outcome::complete_with(json!({"ok": true}))
            }
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("flaky", 5)).await;
    let (stop, handle) = spawn_worker(w);
    let done = wait_for_state(&env.store, id, JobState::Completed).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(done.attempt, 3);
    assert_eq!(done.result, Some(json!({"ok": true})));
    let classes: Vec<_> = done.errors.iter().map(|e| e.class.as_str()).collect();
    assert_eq!(classes, [error_class::ERROR, error_class::ERROR]);
    assert_eq!(done.errors[1].message, "upstream 503 on attempt 2");
    assert_eq!(done.errors[1].attempt, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exhausted_retries_go_to_the_dead_letter_queue() {
    let env = env();
    let w = worker(&env.store)
        .handle_json("always_fails", |_, _| async {
            Outcome::retry("still broken")
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("always_fails", 3)).await;
    let (stop, handle) = spawn_worker(w);
    let dead = wait_for_state(&env.store, id, JobState::Dead).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(dead.attempt, 3);
    assert_eq!(dead.errors.len(), 3);
    assert_eq!(dead.payload, json!({"n": 1}), "dead job keeps its payload");
}

/// On the store's injected clock (the worker is given the same one): the retry is stored for
/// exactly the time the handler asked, and the job does not run again until the clock gets
/// there, however long the wall clock waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_honoured() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let env = env_with(SqliteOptions {
        clock: clock.clone(),
        ..SqliteOptions::default()
    });
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    let (marker_ran, mut markers) = mpsc::unbounded_channel();
    let w = worker(&env.store)
        .clock(clock.clone())
        .handle_json("marker", move |_, _| {
            let marker_ran = marker_ran.clone();
            async move {
                marker_ran.send(()).unwrap();
                Outcome::ok()
            }
        })
        .handle_json("rate_limited", move |ctx: JobContext, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if ctx.attempt == 1 {
                    Outcome::retry_after(Duration::from_secs(3600), "429 Retry-After: 3600")
                } else {
                    Outcome::ok()
                }
            }
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("rate_limited", 5)).await;
    let (stop, handle) = spawn_worker(w);
    let failed_at = clock.now();
    let waiting = wait_for_state(&env.store, id, JobState::Retryable).await;
    assert_eq!(
        waiting.run_at,
        conveyor_core::clock::truncate_to_millis(failed_at) + chrono::Duration::hours(1),
        "stored for exactly the hour asked, on the store's clock"
    );
    // An hour short by a millisecond runs nothing: a marker job enqueued after the clock moved
    // proves the worker fetched since (a due retry would have been claimed by then too).
    clock.advance(Duration::from_secs(3600) - Duration::from_millis(1));
    enqueue(&env.store, job("marker", 1)).await;
    markers.recv().await.unwrap();
    assert_eq!(
        attempts.load(Ordering::SeqCst),
        1,
        "ran again before its time"
    );
    let still = env.store.job_get(id).await.unwrap().unwrap();
    assert_eq!(still.state, JobState::Retryable);
    clock.advance(Duration::from_millis(1));
    let done = wait_for_state(&env.store, id, JobState::Completed).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(attempts.load(Ordering::SeqCst), 2);
    assert_eq!(done.errors[0].class, error_class::RETRY_AFTER);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permanent_failure_goes_dead_at_once() {
    let env = env();
    let w = worker(&env.store)
        .handle_json("invalid_email", |_, _| async {
            Outcome::permanent("address rejected: no such domain")
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("invalid_email", 10)).await;
    let (stop, handle) = spawn_worker(w);
    let dead = wait_for_state(&env.store, id, JobState::Dead).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(dead.attempt, 1, "no retries for a permanent failure");
    assert_eq!(dead.errors[0].class, error_class::PERMANENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn panic_is_recorded_and_the_worker_keeps_running() {
    let env = env();
    let w = worker(&env.store)
        .handle_json("panicky", |ctx: JobContext, _| async move {
            if ctx.attempt == 1 {
                panic!("index out of bounds in report builder");
            }
            Outcome::ok()
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("panicky", 3)).await;
    let (stop, handle) = spawn_worker(w);
    let done = wait_for_state(&env.store, id, JobState::Completed).await;
    let after = enqueue(&env.store, job("panicky", 3)).await;
    wait_for_state(&env.store, after, JobState::Completed).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(done.errors[0].class, error_class::PANIC);
    assert!(
        done.errors[0].message.contains("index out of bounds"),
        "{:?}",
        done.errors
    );
    // The attempt's history names the worker, its start, and the panic's backtrace (which
    // passes through this test's handler).
    let failure = &done.errors[0];
    assert!(failure.worker_id.is_some(), "{failure:?}");
    let started = failure.started_at.expect("started_at");
    assert!(started <= failure.at);
    let backtrace = failure.backtrace.as_deref().expect("a backtrace");
    assert!(backtrace.contains("panic_is_recorded"), "{backtrace}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_fails_the_attempt_and_never_retries_forever() {
    let env = env();
    let w = worker(&env.store)
        .handle_json("hangs", |_, _| async {
            std::future::pending::<()>().await;
            Outcome::ok()
        })
        .build()
        .unwrap();
    let mut hanging = job("hangs", 2);
    hanging.timeout_ms = Some(100);
    let id = enqueue(&env.store, hanging).await;
    let (stop, handle) = spawn_worker(w);
    let dead = wait_for_state(&env.store, id, JobState::Dead).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(dead.attempt, 2);
    assert!(
        dead.errors.iter().all(|e| e.class == error_class::TIMEOUT),
        "{:?}",
        dead.errors
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_kind_is_a_classified_failure() {
    let env = env();
    let w = worker(&env.store)
        .handle_json("known", |_, _| async { Outcome::ok() })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("nobody_handles_this", 2)).await;
    let (stop, handle) = spawn_worker(w);
    let dead = wait_for_state(&env.store, id, JobState::Dead).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(dead.errors.len(), 2);
    assert!(dead
        .errors
        .iter()
        .all(|e| e.class == error_class::UNKNOWN_KIND));
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Resize {
    width: u32,
}
impl conveyor_core::TypedJob for Resize {
    const KIND: &'static str = "resize";
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_handler_gets_its_payload_and_bad_payloads_fail_permanently() {
    let env = env();
    let (seen_tx, mut seen) = mpsc::unbounded_channel();
    let w = worker(&env.store)
        .handle(move |_, job: Resize| {
            let seen_tx = seen_tx.clone();
            async move {
                seen_tx.send(job.width).unwrap();
                Outcome::ok()
            }
        })
        .build()
        .unwrap();
    let client = conveyor_engine::Client::new(env.store.clone());
    let good = client.enqueue(Resize { width: 640 }).await.unwrap().job.id;
    let mut bad = NewJob::new("resize", json!({"width": "wide"}));
    bad.max_attempts = 5;
    let bad = enqueue(&env.store, bad).await;
    let (stop, handle) = spawn_worker(w);
    wait_for_state(&env.store, good, JobState::Completed).await;
    let dead = wait_for_state(&env.store, bad, JobState::Dead).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(seen.recv().await, Some(640));
    assert_eq!(dead.attempt, 1);
    assert_eq!(dead.errors[0].class, error_class::INVALID_PAYLOAD);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snooze_runs_again_without_counting_an_attempt() {
    let env = env();
    let w = worker(&env.store)
        .handle_json("waits_for_data", |ctx: JobContext, _| async move {
            static CALLS: AtomicUsize = AtomicUsize::new(0);
            if CALLS.fetch_add(1, Ordering::SeqCst) == 0 {
                assert_eq!(ctx.attempt, 1);
                Outcome::snooze(Duration::from_millis(50))
            } else {
                Outcome::complete_with(json!({"attempt_seen": ctx.attempt}))
            }
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("waits_for_data", 1)).await;
    let (stop, handle) = spawn_worker(w);
    let done = wait_for_state(&env.store, id, JobState::Completed).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(done.attempt, 1, "a snooze is not an attempt");
    assert_eq!(done.result, Some(json!({"attempt_seen": 1})));
    assert!(done.errors.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_queue_concurrency_is_never_exceeded() {
    let env = env();
    const JOBS: usize = 30;
    // (running, started): a handler goes on only once every slot is taken (or nothing is left
    // to start), so the worker must reach three; then it works a little, giving the worker the
    // chance to start a fourth beside the three.
    let slots = Arc::new(tokio::sync::watch::Sender::new((0usize, 0usize)));
    let peak = Arc::new(AtomicUsize::new(0));
    let (s, p) = (slots.clone(), peak.clone());
    let w = Worker::builder(env.store.clone())
        .queue("default", 3)
        .handle_json("busy", move |_, _| {
            let (slots, p) = (s.clone(), p.clone());
            async move {
                slots.send_modify(|(running, started)| {
                    *running += 1;
                    *started += 1;
                    p.fetch_max(*running, Ordering::SeqCst);
                });
                let _ = slots
                    .subscribe()
                    .wait_for(|&(running, started)| running >= 3 || started == JOBS)
                    .await;
                tokio::time::sleep(Duration::from_millis(20)).await;
                slots.send_modify(|(running, _)| *running -= 1);
                Outcome::ok()
            }
        })
        .build()
        .unwrap();
    let ids = env
        .store
        .jobs_insert_many((0..JOBS).map(|_| job("busy", 1)).collect())
        .await
        .unwrap();
    let (stop, handle) = spawn_worker(w);
    for inserted in &ids {
        wait_for_state(&env.store, inserted.job.id, JobState::Completed).await;
    }
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "expected to reach but never exceed 3"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_jobs_finish_within_the_drain_timeout() {
    let env = env();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (finish_tx, finish) = tokio::sync::watch::channel(false);
    let w = worker(&env.store)
        .drain_timeout(Duration::from_secs(10))
        .handle_json("report", move |_, _| {
            let started_tx = started_tx.clone();
            let mut finish = finish.clone();
            async move {
                started_tx.send(()).unwrap();
                let _ = finish.wait_for(|go| *go).await;
                Outcome::ok()
            }
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("report", 3)).await;
    let drain_started = w.drain_started();
    let (stop, handle) = spawn_worker(w);
    started.recv().await.unwrap();
    stop.send(()).unwrap();
    drain_started.await;
    // Jobs enqueued after shutdown began are not fetched by this worker.
    let later = enqueue(&env.store, job("report", 3)).await;
    finish_tx.send(true).unwrap();
    let report = handle.await.unwrap();
    assert_eq!(
        report,
        ShutdownReport {
            drained: 1,
            released: 0
        }
    );
    let done = env.store.job_get(id).await.unwrap().unwrap();
    assert_eq!(done.state, JobState::Completed);
    let untouched = env.store.job_get(later).await.unwrap().unwrap();
    assert_eq!(untouched.state, JobState::Available);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_releases_unfinished_jobs_for_another_worker() {
    let env = env();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let first = worker(&env.store)
        .drain_timeout(Duration::from_millis(200))
        .handle_json("long", move |ctx: JobContext, _| {
            let started_tx = started_tx.clone();
            async move {
                started_tx.send(()).unwrap();
                ctx.cancelled().await;
                Outcome::ok()
            }
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("long", 3)).await;
    let (stop, handle) = spawn_worker(first);
    started.recv().await.unwrap();
    stop.send(()).unwrap();
    let report = handle.await.unwrap();
    assert_eq!(
        report,
        ShutdownReport {
            drained: 0,
            released: 1
        }
    );
    let released = env.store.job_get(id).await.unwrap().unwrap();
    assert_eq!(released.state, JobState::Available);
    assert_eq!(
        released.attempt, 0,
        "a released job's attempt is not counted"
    );

    let second = worker(&env.store)
        .handle_json("long", |_, _| async { Outcome::ok() })
        .build()
        .unwrap();
    let (stop, handle) = spawn_worker(second);
    let done = wait_for_state(&env.store, id, JobState::Completed).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(done.attempt, 1);
    assert!(done.errors.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_keep_a_long_job_leased() {
    let env = env();
    let w = worker(&env.store)
        .lease(Duration::from_millis(300))
        .handle_json("slow", |_, _| async {
            tokio::time::sleep(Duration::from_millis(1200)).await;
            Outcome::ok()
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("slow", 3)).await;
    let (stop, handle) = spawn_worker(w);
    let done = wait_for_state(&env.store, id, JobState::Completed).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(
        done.attempt, 1,
        "the lease was renewed, so the job was never rescued"
    );
    assert!(done.errors.is_empty(), "{:?}", done.errors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelling_a_running_job_stops_its_handler() {
    let env = env();
    let (started_tx, mut started) = mpsc::unbounded_channel();
    let (stopped_tx, mut stopped) = mpsc::unbounded_channel();
    let w = worker(&env.store)
        .lease(Duration::from_millis(300))
        .handle_json("cancellable", move |ctx: JobContext, _| {
            let (started_tx, stopped_tx) = (started_tx.clone(), stopped_tx.clone());
            async move {
                started_tx.send(()).unwrap();
                ctx.cancelled().await;
                stopped_tx.send(()).unwrap();
                Outcome::ok()
            }
        })
        .build()
        .unwrap();
    let id = enqueue(&env.store, job("cancellable", 3)).await;
    let (stop, handle) = spawn_worker(w);
    started.recv().await.unwrap();
    env.store.job_cancel(id).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), stopped.recv())
        .await
        .expect("handler saw the cancellation");
    stop.send(()).unwrap();
    handle.await.unwrap();
    let job = env.store.job_get(id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Cancelled);
}

/// A flow run by the Rust worker: each step reads its parent's result from `ctx.parents` and
/// reports progress with `ctx.progress`, which the step's job keeps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_steps_read_their_parents_and_report_progress() {
    use conveyor_core::workflow::{FlowState, NewFlow, ValidFlow};
    let env = env();
    let w = worker(&env.store)
        .handle_json("count", |ctx: JobContext, _| async move {
            ctx.progress(50, Some("halfway")).await.expect("progress");
            let before = ctx
                .parents
                .values()
                .next()
                .and_then(|v| v.as_u64())
                .unwrap_or(0);
            Outcome::complete_with(json!(before + 1))
        })
        .build()
        .unwrap();
    let flow = NewFlow::chain([
        ("one", NewJob::new("count", json!({}))),
        ("two", NewJob::new("count", json!({}))),
        ("three", NewJob::new("count", json!({}))),
    ]);
    let created = env
        .store
        .flow_create(ValidFlow::new(flow).unwrap())
        .await
        .unwrap();
    let (stop, handle) = spawn_worker(w);
    // The last step's job exists only once its parent has finished: wait for the flow.
    let store = env.store.clone();
    conveyor_storetest::eventually::eventually("the flow to complete", || async {
        match store.flow_get(created.id).await.expect("get") {
            Some(flow) if flow.state == FlowState::Completed => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let last = wait_for_state(&env.store, created.steps["three"], JobState::Completed).await;
    stop.send(()).unwrap();
    handle.await.unwrap();
    assert_eq!(
        last.result,
        Some(json!(3)),
        "each step added one to its parent's result"
    );
    let progress = last.progress.expect("progress kept");
    assert_eq!(
        (progress.percent, progress.message.as_deref()),
        (50, Some("halfway"))
    );
}

/// A handler's retry-after on a kind whose circuit breaker has `pause_on_retry_after` holds
/// the whole kind until then (other kinds run on); when the time is up one probe runs, its
/// success closes the breaker and the rest of the kind follows. On the injected clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_after_pauses_its_kind_until_then() {
    let clock = Arc::new(ManualClock::new(Utc::now()));
    let env = env_with(SqliteOptions {
        clock: clock.clone(),
        ..SqliteOptions::default()
    });
    env.store
        .kind_put(conveyor_core::kinds::KindSettings {
            kind: "charge".to_string(),
            schema: None,
            version: None,
            circuit_breaker: Some(conveyor_core::BreakerSettings {
                pause_on_retry_after: true,
                min_calls: 100,
                half_open_calls: 1,
                ..conveyor_core::BreakerSettings::default()
            }),
            limits: Vec::new(),
            sequence: None,
            batch: None,
            updated_at: Utc::now(),
        })
        .await
        .expect("kind settings");
    let (marker_ran, mut markers) = mpsc::unbounded_channel();
    let charges = Arc::new(AtomicUsize::new(0));
    let counted = charges.clone();
    let w = worker(&env.store)
        .clock(clock.clone())
        .handle_json("marker", move |_, _| {
            let marker_ran = marker_ran.clone();
            async move {
                marker_ran.send(()).unwrap();
                Outcome::ok()
            }
        })
        .handle_json("charge", move |ctx: JobContext, _| {
            counted.fetch_add(1, Ordering::SeqCst);
            // Only the very first attempt of all is rate limited.
            let first_attempt = FIRST.fetch_add(1, Ordering::SeqCst) == 0;
            async move {
                if first_attempt && ctx.attempt == 1 {
                    return Outcome::retry_after(Duration::from_secs(60), "429 Retry-After: 60");
                }
                Outcome::ok()
            }
        })
        .build()
        .unwrap();
    static FIRST: AtomicUsize = AtomicUsize::new(0);
    let first = enqueue(&env.store, job("charge", 5)).await;
    let (stop, handle) = spawn_worker(w);
    wait_for_state(&env.store, first, JobState::Retryable).await;
    // The audit entry is written after the worker's own view has the breaker open.
    conveyor_storetest::eventually::eventually(
        "the breaker's opening in the audit log",
        || async {
            let mut params = conveyor_core::AuditListParams::default();
            params.limit = 10;
            let entries = env.store.audit_list(params).await.expect("audit");
            entries
                .iter()
                .any(|e| {
                    e.action == conveyor_core::AuditAction::BreakerOpen
                        && e.target.as_deref() == Some("kind:charge")
                })
                .then_some(())
                .ok_or(format!("{} entries", entries.len()))
        },
    )
    .await;
    let open = env
        .store
        .breaker_get(conveyor_core::BreakerScope::Kind, "charge")
        .await
        .expect("read breaker")
        .expect("stored");
    assert_eq!(open.record.state, conveyor_core::BreakerState::Open);
    assert_eq!(
        open.record.open_until,
        Some(conveyor_core::clock::truncate_to_millis(clock.now()) + chrono::Duration::seconds(60))
    );
    let rest = [
        enqueue(&env.store, job("charge", 5)).await,
        enqueue(&env.store, job("charge", 5)).await,
    ];
    enqueue(&env.store, job("marker", 1)).await;
    markers.recv().await.unwrap();
    assert_eq!(charges.load(Ordering::SeqCst), 1, "the kind is paused");
    for id in rest {
        let job = env.store.job_get(id).await.unwrap().unwrap();
        assert_eq!(job.state, JobState::Available, "queued, not run");
    }
    clock.advance(Duration::from_secs(60));
    for id in rest.iter().chain([&first]) {
        wait_for_state(&env.store, *id, JobState::Completed).await;
    }
    stop.send(()).unwrap();
    handle.await.unwrap();
    let closed = env
        .store
        .breaker_get(conveyor_core::BreakerScope::Kind, "charge")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(closed.record.state, conveyor_core::BreakerState::Closed);
}

/// An operator's commands reach an embedded worker through its registry heartbeat: `quiet`
/// ends its fetching (a job enqueued afterwards stays available, the job it was running
/// completes), `resume` starts it fetching again without a restart (issue 27), `stop` makes
/// `run` return as a shutdown would, with the registry saying `stopped`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quiet_and_stop_commands_are_obeyed_from_the_registry() {
    let env = env();
    let (started_tx, mut started) = mpsc::unbounded_channel::<()>();
    let (release_tx, release) = tokio::sync::watch::channel(false);
    let w = worker(&env.store)
        .id("told-worker")
        .registry_interval(Duration::from_millis(20))
        .handle_json("slow", move |_ctx: JobContext, _| {
            let started_tx = started_tx.clone();
            let mut release = release.clone();
            async move {
                let _ = started_tx.send(());
                let _ = release.wait_for(|go| *go).await;
                Outcome::complete_with(json!({"done": true}))
            }
        })
        .build()
        .unwrap();
    let quiet = w.drain_started();
    let running = enqueue(&env.store, job("slow", 1)).await;
    let (_stop, handle) = spawn_worker(w);
    started.recv().await.expect("the job started");
    conveyor_storetest::eventually::eventually("the worker to register", || async {
        let listed = env.store.workers_list().await.map_err(|e| e.to_string())?;
        if listed.iter().any(|w| w.id == "told-worker") {
            Ok(())
        } else {
            Err("not yet".to_string())
        }
    })
    .await;
    env.store
        .worker_command("told-worker", Some(conveyor_core::WorkerCommand::Quiet))
        .await
        .expect("command")
        .expect("registered");
    quiet.await;
    let later = enqueue(&env.store, job("slow", 1)).await;
    release_tx.send(true).expect("release");
    wait_for_state(&env.store, running, JobState::Completed).await;
    assert_eq!(
        env.store.job_get(later).await.unwrap().unwrap().state,
        JobState::Available,
        "a quiet worker takes nothing new"
    );
    assert!(!handle.is_finished(), "quiet keeps the worker running");

    // `resume` clears the command: the same worker fetches again, without a restart.
    env.store
        .worker_command("told-worker", None)
        .await
        .expect("command")
        .expect("registered");
    wait_for_state(&env.store, later, JobState::Completed).await;
    let after_resume = enqueue(&env.store, job("slow", 1)).await;
    wait_for_state(&env.store, after_resume, JobState::Completed).await;

    env.store
        .worker_command("told-worker", Some(conveyor_core::WorkerCommand::Stop))
        .await
        .expect("command")
        .expect("registered");
    let report = tokio::time::timeout(Duration::from_secs(30), handle)
        .await
        .expect("run returns once told to stop")
        .expect("join");
    assert_eq!(report, ShutdownReport::default());
    let listed = env.store.workers_list().await.unwrap();
    let me = listed.iter().find(|w| w.id == "told-worker").unwrap();
    assert_eq!(me.state, conveyor_core::WorkerState::Stopped);
}
