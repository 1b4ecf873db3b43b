//! The fault-injection behaviours: every store operation that changes jobs (insert, fetch,
//! complete, fail, rescue, schedule fire) is made to fail, then to panic, at its injection
//! point (`conveyor_core::faults`). Each behaviour shows that the operation fails cleanly (an
//! error, or a panic confined to the caller), that the store is left as it was (job states,
//! attempts, per-queue counts that agree with the jobs), and that the same operation then
//! succeeds.
//!
//! A store crate runs them from a test file of their own with [`fault_tests!`]. Failpoints are
//! process-wide: the behaviours take a lock, so test harnesses that run tests as threads of
//! one process (plain `cargo test`) run them one at a time.

use conveyor_core::schedule::DEFAULT_MISFIRE_THRESHOLD;
use conveyor_core::{
    CompleteParams, FailParams, FireRequest, Job, JobListParams, JobState, JobTemplate,
    LeaseOutcome, QueueStats, RescueParams, RetryPlan, Schedule, ScheduleSpec, StoreResult,
};
use futures::FutureExt;
use std::collections::BTreeMap;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use crate::kit::{
    backoff, complete, fetch, fetch_none, fetch_one, fetch_params, get, insert, job_in, lease_of,
    list, new_job, secs, Harness, LEASE,
};

/// How an injection point misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The operation returns an error.
    Error,
    /// The operation panics.
    Panic,
}

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Turns an injection point on for as long as it lives.
struct Armed(&'static str);

impl Armed {
    fn new(point: &'static str, fault: Fault) -> Self {
        let action = match fault {
            Fault::Error => "return(injected by the fault suite)",
            Fault::Panic => "panic(injected by the fault suite)",
        };
        if let Err(e) = fail::cfg(point, action) {
            panic!("cannot arm failpoint {point}: {e}");
        }
        Armed(point)
    }
}

impl Drop for Armed {
    fn drop(&mut self) {
        fail::remove(self.0);
    }
}

/// Runs `operation` with `point` armed and asserts it failed, by an error or a panic.
async fn fails<T: std::fmt::Debug>(
    point: &'static str,
    fault: Fault,
    operation: impl Future<Output = StoreResult<T>>,
) {
    let armed = Armed::new(point, fault);
    let outcome = AssertUnwindSafe(operation).catch_unwind().await;
    drop(armed);
    if let Ok(Ok(value)) = outcome {
        panic!("{point} ({fault:?}): the operation succeeded: {value:?}");
    }
}

/// Every job (the behaviours make a handful).
async fn all_jobs(h: &Harness) -> Vec<Job> {
    list(h, {
        let mut params = JobListParams::default();
        params.queue = None;
        params.state = None;
        params.kind = None;
        params.limit = 1000;
        params.after = None;
        params
    })
    .await
}

/// Per-queue counts as the store reports them must agree with its jobs, state by state.
async fn assert_counts_agree(h: &Harness) {
    let jobs = all_jobs(h).await;
    let mut expected: BTreeMap<String, QueueStats> = BTreeMap::new();
    for job in &jobs {
        expected
            .entry(job.queue.clone())
            .or_insert_with(|| QueueStats {
                name: job.queue.clone(),
                ..QueueStats::default()
            })
            .add(job.state, 1);
    }
    let stats = h.store.queues_stats().await.expect("queues_stats");
    for queue in stats {
        let want = expected.remove(&queue.name).unwrap_or_else(|| QueueStats {
            name: queue.name.clone(),
            ..QueueStats::default()
        });
        assert_eq!(
            (
                queue.available,
                queue.scheduled,
                queue.running,
                queue.retryable,
                queue.dead,
                queue.completed,
                queue.cancelled
            ),
            (
                want.available,
                want.scheduled,
                want.running,
                want.retryable,
                want.dead,
                want.completed,
                want.cancelled
            ),
            "counts of queue {} disagree with its jobs",
            queue.name
        );
    }
    assert!(
        expected.is_empty(),
        "queues with jobs but no counts: {expected:?}"
    );
}

/// States and attempts of every job, to compare before and after a failed operation.
async fn snapshot(h: &Harness) -> Vec<(uuid::Uuid, JobState, u32)> {
    all_jobs(h)
        .await
        .into_iter()
        .map(|job| (job.id, job.state, job.attempt))
        .collect()
}

pub async fn fault_in_insert_stores_nothing(h: &Harness, fault: Fault) {
    let _one = ONE_AT_A_TIME.lock().await;
    insert(h, new_job("before")).await;
    let before = snapshot(h).await;
    let batch = vec![new_job("a"), job_in("other", "b")];
    fails("insert", fault, h.store.jobs_insert_many(batch.clone())).await;
    assert_eq!(snapshot(h).await, before, "nothing of the batch stored");
    assert_counts_agree(h).await;
    let inserted = h.store.jobs_insert_many(batch).await.expect("retry");
    assert_eq!(inserted.len(), 2);
    assert_counts_agree(h).await;
}

pub async fn fault_in_fetch_claims_nothing(h: &Harness, fault: Fault) {
    let _one = ONE_AT_A_TIME.lock().await;
    insert(h, new_job("a")).await;
    insert(h, new_job("b")).await;
    let before = snapshot(h).await;
    fails(
        "fetch",
        fault,
        h.store.jobs_fetch(fetch_params(&["default"], 10)),
    )
    .await;
    assert_eq!(
        snapshot(h).await,
        before,
        "still available, no attempt used"
    );
    assert_counts_agree(h).await;
    assert_eq!(
        fetch(h, &["default"], 10).await.len(),
        2,
        "retry claims both"
    );
    assert_counts_agree(h).await;
}

pub async fn fault_in_complete_leaves_the_job_running(h: &Harness, fault: Fault) {
    let _one = ONE_AT_A_TIME.lock().await;
    let job = insert(h, new_job("a")).await;
    let running = fetch_one(h, "default").await;
    let completion = vec![CompleteParams {
        lease: lease_of(&running),
        result: Some(serde_json::json!({"ok": true})),
    }];
    fails(
        "complete",
        fault,
        h.store.jobs_complete_many(completion.clone()),
    )
    .await;
    assert_eq!(get(h, job.id).await.state, JobState::Running);
    assert_counts_agree(h).await;
    let outcomes = h.store.jobs_complete_many(completion).await.expect("retry");
    assert_eq!(outcomes, vec![LeaseOutcome::Applied]);
    assert_eq!(get(h, job.id).await.state, JobState::Completed);
    assert_counts_agree(h).await;
}

/// A step's completion that fails starts none of its children, and the flow goes on as if it
/// had never been tried (the SQLite writer's cached graph is forgotten with the operation).
pub async fn fault_in_completing_a_flow_step_starts_nothing(h: &Harness, fault: Fault) {
    use conveyor_core::workflow::{NewFlow, StepState, ValidFlow};
    let _one = ONE_AT_A_TIME.lock().await;
    let told = crate::workflows::ToldStarts::observe(h);
    let flow = NewFlow::chain([
        ("a", new_job("a")),
        ("b", new_job("b")),
        ("c", new_job("c")),
    ]);
    let created = h
        .store
        .flow_create(ValidFlow::new(flow).expect("valid"))
        .await
        .expect("create");
    let a = fetch_one(h, "default").await;
    let completion = vec![CompleteParams {
        lease: lease_of(&a),
        result: Some(serde_json::json!(1)),
    }];
    fails(
        "complete",
        fault,
        h.store.jobs_complete_many(completion.clone()),
    )
    .await;
    let view = h
        .store
        .flow_get(created.id)
        .await
        .expect("get")
        .expect("flow");
    assert_eq!(view.steps[0].state, StepState::Active, "{view:?}");
    assert_eq!(view.steps[1].state, StepState::Pending, "{view:?}");
    fetch_none(h, "default", "b waits for a's completion").await;
    assert_counts_agree(h).await;
    assert_eq!(
        told.ids(),
        vec![created.steps["a"]],
        "a step rolled back with its parent's completion is not told of"
    );
    let outcomes = h.store.jobs_complete_many(completion).await.expect("retry");
    assert_eq!(outcomes, vec![LeaseOutcome::Applied]);
    assert_eq!(told.ids(), vec![created.steps["a"], created.steps["b"]]);
    let b = fetch_one(h, "default").await;
    assert_eq!(b.id, created.steps["b"]);
    fetch_none(h, "default", "b starts once").await;
    complete(h, lease_of(&b), None).await;
    let c = fetch_one(h, "default").await;
    assert_eq!(c.id, created.steps["c"]);
    complete(h, lease_of(&c), None).await;
    let view = h
        .store
        .flow_get(created.id)
        .await
        .expect("get")
        .expect("flow");
    assert_eq!(
        view.state,
        conveyor_core::workflow::FlowState::Completed,
        "{view:?}"
    );
    assert_counts_agree(h).await;
    assert_eq!(
        told.ids(),
        vec![created.steps["a"], created.steps["b"], created.steps["c"]],
        "each step told of once"
    );
}

pub async fn fault_in_fail_leaves_the_job_running(h: &Harness, fault: Fault) {
    let _one = ONE_AT_A_TIME.lock().await;
    let job = insert(h, new_job("a")).await;
    let running = fetch_one(h, "default").await;
    let failure = FailParams {
        lease: lease_of(&running),
        class: "error".to_string(),
        message: "boom".to_string(),
        retry: RetryPlan::Backoff(backoff(secs(1))),
        backtrace: None,
    };
    fails("fail", fault, h.store.job_fail(failure.clone())).await;
    let stored = get(h, job.id).await;
    assert_eq!(stored.state, JobState::Running);
    assert!(stored.errors.is_empty(), "no error recorded: {stored:?}");
    assert_counts_agree(h).await;
    let failed = h.store.job_fail(failure).await.expect("retry");
    assert_eq!(failed.state, JobState::Retryable);
    assert_eq!(get(h, job.id).await.errors.len(), 1);
    assert_counts_agree(h).await;
}

pub async fn fault_in_rescue_leaves_expired_leases_for_the_next_pass(h: &Harness, fault: Fault) {
    let _one = ONE_AT_A_TIME.lock().await;
    let job = insert(h, new_job("a")).await;
    fetch_one(h, "default").await;
    h.advance(LEASE + secs(1));
    let params = RescueParams {
        limit: 100,
        retry: backoff(secs(1)),
    };
    fails("rescue", fault, h.store.jobs_rescue_expired(params.clone())).await;
    assert_eq!(get(h, job.id).await.state, JobState::Running);
    assert_counts_agree(h).await;
    let report = h.store.jobs_rescue_expired(params).await.expect("retry");
    assert_eq!(report.retried, vec![job.id]);
    assert_eq!(get(h, job.id).await.state, JobState::Retryable);
    assert_counts_agree(h).await;
}

pub async fn fault_in_schedule_fire_fires_the_tick_later_exactly_once(h: &Harness, fault: Fault) {
    let _one = ONE_AT_A_TIME.lock().await;
    let schedule = Schedule::from_spec(
        "every-second",
        ScheduleSpec::new(
            "* * * * * *",
            JobTemplate::new("tick", serde_json::json!({})),
        ),
    )
    .expect("valid schedule");
    h.store.schedule_put(schedule).await.expect("put");
    h.advance(secs(2));
    let current = h
        .store
        .schedule_get("every-second")
        .await
        .expect("get")
        .expect("exists");
    let plan = current
        .schedule
        .plan(current.due_after, h.now(), DEFAULT_MISFIRE_THRESHOLD);
    let request = FireRequest::from_plan(&current, &plan).expect("a tick is due");
    let ticks = request.ticks.len();
    fails(
        "schedule_fire",
        fault,
        h.store.schedule_fire(request.clone()),
    )
    .await;
    let after = h
        .store
        .schedule_get("every-second")
        .await
        .expect("get")
        .expect("exists");
    assert_eq!(after.due_after, current.due_after, "nothing fired");
    assert!(all_jobs(h).await.is_empty(), "no job enqueued");
    assert_counts_agree(h).await;
    assert!(h
        .store
        .schedule_runs("every-second", 100)
        .await
        .expect("runs")
        .is_empty());
    h.store.schedule_fire(request).await.expect("retry");
    let runs = h
        .store
        .schedule_runs("every-second", 100)
        .await
        .expect("runs");
    assert_eq!(runs.len(), ticks, "one run per tick: {runs:?}");
    assert!(
        !all_jobs(h).await.is_empty(),
        "the first tick enqueued its job"
    );
    assert_counts_agree(h).await;
}

/// One `#[tokio::test]` per fault behaviour and kind of fault, each on a fresh harness from
/// `$make().await`. Put it in a test file of its own.
#[macro_export]
macro_rules! fault_tests {
    ($make:ident) => {
        $crate::__fault_tests!($make;
            fault_in_insert_stores_nothing,
            fault_in_fetch_claims_nothing,
            fault_in_complete_leaves_the_job_running,
            fault_in_completing_a_flow_step_starts_nothing,
            fault_in_fail_leaves_the_job_running,
            fault_in_rescue_leaves_expired_leases_for_the_next_pass,
            fault_in_schedule_fire_fires_the_tick_later_exactly_once,
        );
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __fault_tests {
    ($make:ident; $($name:ident,)*) => {
        mod error {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let h = super::$make().await;
                    $crate::faults::$name(&h, $crate::faults::Fault::Error).await;
                }
            )*
        }
        mod panic {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let h = super::$make().await;
                    $crate::faults::$name(&h, $crate::faults::Fault::Panic).await;
                }
            )*
        }
    };
}
