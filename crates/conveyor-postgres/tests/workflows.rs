//! Workflows across servers: two stores on one schema (two pools, as two processes have)
//! finishing steps of one flow at the same moment, and the lock order that keeps a flow's
//! events from deadlocking with changes to its jobs.

mod common;

use conveyor_core::workflow::{
    FlowFailurePolicy, FlowState, NewFlow, NewStep, StepState, ValidFlow,
};
use conveyor_core::{
    CompleteParams, FailParams, FetchParams, FlowStore, Job, JobState, JobStore, LeadershipStore,
    LeaseOutcome, LeaseStore, NewJob, RescueParams, RetryPlan, RetryPolicy,
};
use conveyor_postgres::PgStore;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Barrier;
use uuid::Uuid;

const LEASE: Duration = Duration::from_secs(60);

fn step_job(kind: &str, queue: &str) -> NewJob {
    let mut job = NewJob::new(kind, json!({ "kind": kind }));
    job.queue = queue.to_string();
    job
}

async fn fetch(store: &PgStore, queue: &str, max: usize) -> Vec<Job> {
    store
        .jobs_fetch(FetchParams {
            worker_id: "w".into(),
            queues: vec![queue.into()],
            max,
            lease: LEASE,
            kinds: None,
            excluded_kinds: Vec::new(),
        })
        .await
        .expect("fetch")
}

fn completion(job: &Job, result: serde_json::Value) -> CompleteParams {
    CompleteParams {
        lease: job.lease_ref().expect("a fetched job holds a lease"),
        result: Some(result),
    }
}

/// Fails `job` for good.
fn fail_params(job: &Job) -> FailParams {
    FailParams {
        lease: job.lease_ref().expect("a fetched job holds a lease"),
        class: conveyor_core::error_class::ERROR.to_string(),
        message: "boom".to_string(),
        retry: RetryPlan::Never,
        backtrace: None,
    }
}

/// The step's name of a flow's job.
fn step_of(job: &Job) -> String {
    job.flow.as_ref().expect("a flow's job").step.clone()
}

async fn fan_out(store: &PgStore, members: usize, on_failure: FlowFailurePolicy) -> (Uuid, Uuid) {
    let steps: Vec<(String, NewJob)> = (0..members)
        .map(|i| (format!("m{i:02}"), step_job("member", "fan")))
        .collect();
    let flow = NewFlow::group(steps)
        .then("sum", step_job("sum", "fan-sum"))
        .on_failure(on_failure);
    let created = store
        .flow_create(ValidFlow::new(flow).expect("a valid flow"))
        .await
        .expect("create the flow");
    (created.id, created.steps["sum"])
}

/// Every job of `queue` (any state).
async fn jobs_of(store: &PgStore, queue: &str) -> Vec<Job> {
    let mut params = conveyor_core::JobListParams::default();
    params.queue = Some(queue.to_string());
    params.limit = 1000;
    store.jobs_list(params).await.expect("list jobs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_completing_a_fan_out_start_its_callback_once_with_every_result() {
    let (a, clock, _guard) = common::fresh_store().await;
    let b = common::connect(a.schema(), clock).await;
    let (flow_id, sum_id) = fan_out(&a, 50, FlowFailurePolicy::Stop).await;
    let mut members = fetch(&a, "fan", 100).await;
    assert_eq!(members.len(), 50, "every member starts at once");
    let second_half = members.split_off(25);

    // Each server completes its 25 one at a time, both starting together, so their
    // completions interleave; the last of each waits for the other server's 24th, so the two
    // completions that could each be the fan-in's last run at the same moment.
    let start = Arc::new(Barrier::new(2));
    let last = Arc::new(Barrier::new(2));
    let tasks: Vec<_> = [(a.clone(), members), (b.clone(), second_half)]
        .into_iter()
        .map(|(store, jobs)| {
            let (start, last) = (start.clone(), last.clone());
            tokio::spawn(async move {
                start.wait().await;
                for (i, job) in jobs.iter().enumerate() {
                    if i + 1 == jobs.len() {
                        last.wait().await;
                    }
                    let result = json!({ "member": step_of(job) });
                    let outcomes = store
                        .jobs_complete_many(vec![completion(job, result)])
                        .await
                        .expect("complete");
                    assert_eq!(outcomes, vec![LeaseOutcome::Applied], "{}", step_of(job));
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("a completing task");
    }

    let sums = jobs_of(&a, "fan-sum").await;
    assert_eq!(
        sums.len(),
        1,
        "the callback's job is inserted once: {sums:?}"
    );
    let sum = &sums[0];
    assert_eq!(sum.id, sum_id, "under the id reserved at creation");
    let parents = &sum.flow.as_ref().expect("a flow's job").parents;
    assert_eq!(parents.len(), 50, "every member's result: {parents:?}");
    for i in 0..50 {
        let name = format!("m{i:02}");
        assert_eq!(parents.get(&name), Some(&json!({ "member": name })));
    }
    let flow = a.flow_get(flow_id).await.expect("get").expect("the flow");
    assert_eq!(flow.state, FlowState::Running);
    assert_eq!(flow.step_counts.get("completed"), Some(&50), "{flow:?}");

    let fetched = fetch(&b, "fan-sum", 10).await;
    assert_eq!(fetched.len(), 1);
    let outcomes = b
        .jobs_complete_many(vec![completion(&fetched[0], json!("total"))])
        .await
        .expect("complete the callback");
    assert_eq!(outcomes, vec![LeaseOutcome::Applied]);
    let flow = a.flow_get(flow_id).await.expect("get").expect("the flow");
    assert_eq!(flow.state, FlowState::Completed, "{flow:?}");
    assert_eq!(flow.step_counts.get("completed"), Some(&51));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_and_handler_transactions_on_two_servers_count_a_fan_in_once() {
    let (a, clock, _guard) = common::fresh_store().await;
    let b = common::connect(a.schema(), clock).await;
    let (flow_id, _) = fan_out(&a, 50, FlowFailurePolicy::Stop).await;
    let mut members = fetch(&a, "fan", 100).await;
    let second_half = members.split_off(25);
    let start = Arc::new(Barrier::new(2));
    let last = Arc::new(Barrier::new(2));
    // One server completes in batches of five, the other inside handlers' own transactions;
    // the last batch and the last handler run at the same moment, as above.
    let batches = {
        let (store, start, last) = (a.clone(), start.clone(), last.clone());
        tokio::spawn(async move {
            start.wait().await;
            let batches: Vec<&[Job]> = members.chunks(5).collect();
            for (i, batch) in batches.iter().enumerate() {
                if i + 1 == batches.len() {
                    last.wait().await;
                }
                let completions = batch
                    .iter()
                    .map(|job| completion(job, json!(step_of(job))))
                    .collect();
                let outcomes = store
                    .jobs_complete_many(completions)
                    .await
                    .expect("complete");
                assert!(outcomes.iter().all(|o| *o == LeaseOutcome::Applied));
            }
        })
    };
    let handlers = {
        let (store, start, last) = (b.clone(), start.clone(), last.clone());
        tokio::spawn(async move {
            start.wait().await;
            let count = second_half.len();
            for (i, job) in second_half.into_iter().enumerate() {
                if i + 1 == count {
                    last.wait().await;
                }
                let mut tx = store.pool().begin().await.expect("begin");
                let lease = job.lease_ref().expect("lease");
                let outcome = store
                    .complete_tx(&mut tx, lease, Some(json!(step_of(&job))))
                    .await
                    .expect("complete in the handler's transaction");
                assert_eq!(outcome, LeaseOutcome::Applied);
                tx.commit().await.expect("commit");
            }
        })
    };
    batches.await.expect("batches");
    handlers.await.expect("handlers");

    let sums = jobs_of(&a, "fan-sum").await;
    assert_eq!(sums.len(), 1, "{sums:?}");
    let parents = &sums[0].flow.as_ref().expect("a flow's job").parents;
    assert_eq!(parents.len(), 50);
    assert!(parents.iter().all(|(name, result)| result == &json!(name)));
    let flow = a.flow_get(flow_id).await.expect("get").expect("the flow");
    assert_eq!(flow.step_counts.get("completed"), Some(&50), "{flow:?}");
    assert_eq!(
        flow.step_counts.get("active"),
        Some(&1),
        "the callback runs"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_step_dying_while_siblings_complete_elsewhere_compensates_without_deadlock() {
    let (a, clock, _guard) = common::fresh_store().await;
    let b = common::connect(a.schema(), clock).await;
    let (flow_id, _) = fan_out(&a, 30, FlowFailurePolicy::Compensate).await;
    let mut members = fetch(&a, "fan", 100).await;
    let doomed = members.remove(15);
    let start = Arc::new(Barrier::new(2));
    // The death cancels every unfinished sibling (waiting for their rows) while the other
    // server is completing them (each taking the flow's lock): neither may wait for the other.
    let completing = {
        let (store, start) = (b.clone(), start.clone());
        tokio::spawn(async move {
            start.wait().await;
            let mut applied = Vec::new();
            for job in members {
                let outcomes = store
                    .jobs_complete_many(vec![completion(&job, json!(1))])
                    .await
                    .expect("completion never fails, even racing the compensation");
                if outcomes == vec![LeaseOutcome::Applied] {
                    applied.push(step_of(&job));
                }
            }
            applied
        })
    };
    start.wait().await;
    let dead = a
        .job_fail(fail_params(&doomed))
        .await
        .expect("the failure never fails either");
    assert_eq!(dead.state, JobState::Dead);
    let applied = completing.await.expect("completing task");

    let flow = a.flow_get(flow_id).await.expect("get").expect("the flow");
    assert_eq!(flow.state, FlowState::Compensated, "{flow:?}");
    assert_eq!(flow.failed_step.as_deref(), Some(step_of(&doomed).as_str()));
    for step in &flow.steps {
        let expected = if step.name == step_of(&doomed) {
            StepState::Failed
        } else if applied.contains(&step.name) {
            StepState::Completed
        } else {
            StepState::Cancelled
        };
        assert_eq!(step.state, expected, "{step:?}");
        if step.state == StepState::Cancelled && step.name != "sum" {
            assert_eq!(step.job_state, Some(JobState::Cancelled), "{step:?}");
        }
    }
    assert!(
        jobs_of(&a, "fan-sum").await.is_empty(),
        "the callback never starts"
    );
}

/// A transaction holding `flow_id`'s lock, as a flow event on another server does.
async fn hold_flow(store: &PgStore, flow_id: Uuid) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = store.pool().begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM \"{}\".flows WHERE id = $1 FOR UPDATE",
        store.schema()
    )))
    .bind(flow_id)
    .fetch_one(&mut *tx)
    .await
    .expect("lock the flow");
    tx
}

/// Locks job `id`'s row in `tx`, as the holder of its flow does to cancel it: fails when
/// another transaction holds the row (which, waiting for the flow, would be a deadlock).
async fn lock_job_row(
    tx: &mut sqlx::Transaction<'static, sqlx::Postgres>,
    store: &PgStore,
    id: Uuid,
) {
    sqlx::raw_sql("SET LOCAL lock_timeout = '2s'")
        .execute(&mut **tx)
        .await
        .expect("set lock_timeout");
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SELECT id FROM \"{}\".jobs WHERE id = $1 FOR UPDATE",
        store.schema()
    )))
    .bind(id)
    .fetch_one(&mut **tx)
    .await
    .expect("the job's row is free while its flow is held elsewhere");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finishing_a_step_waits_for_its_flow_before_taking_the_jobs_row() {
    let (store, _clock, _guard) = common::fresh_store().await;
    let flow = NewFlow::new()
        .step(NewStep::job("a", step_job("a", "order")))
        .step(NewStep::job("b", step_job("b", "order")))
        .step(NewStep::job("c", step_job("c", "order")));
    let created = store
        .flow_create(ValidFlow::new(flow).expect("valid"))
        .await
        .expect("create");
    let jobs = fetch(&store, "order", 10).await;
    let job = |step: &str| {
        jobs.iter()
            .find(|j| step_of(j) == step)
            .cloned()
            .expect("the step's job")
    };
    let (a, b) = (job("a"), job("b"));

    // A completion, a dying failure and a cancel of the flow's jobs, each while the flow is
    // held: each waits for the flow without holding its job's row.
    let held = hold_flow(&store, created.id).await;
    let completing = {
        let store = store.clone();
        let lease = completion(&a, json!("a"));
        tokio::spawn(async move { store.jobs_complete_many(vec![lease]).await })
    };
    let failing = {
        let store = store.clone();
        let params = fail_params(&b);
        tokio::spawn(async move { store.job_fail(params).await })
    };
    let cancelling = {
        let store = store.clone();
        let id = created.steps["c"];
        tokio::spawn(async move { store.job_cancel(id).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!completing.is_finished() && !failing.is_finished() && !cancelling.is_finished());
    let mut held = held;
    for id in [a.id, b.id, created.steps["c"]] {
        lock_job_row(&mut held, &store, id).await;
    }
    held.commit().await.expect("release the flow");

    let completed = completing.await.expect("task").expect("complete");
    assert_eq!(completed, vec![LeaseOutcome::Applied]);
    let failed = failing.await.expect("task").expect("fail");
    assert_eq!(failed.state, JobState::Dead);
    let cancelled = cancelling.await.expect("task").expect("cancel");
    assert_eq!(cancelled.state, JobState::Cancelled);
    let view = store
        .flow_get(created.id)
        .await
        .expect("get")
        .expect("flow");
    let state_of = |name: &str| view.steps.iter().find(|s| s.name == name).map(|s| s.state);
    assert_eq!(state_of("a"), Some(StepState::Completed));
    assert_eq!(state_of("b"), Some(StepState::Failed));
    assert_eq!(state_of("c"), Some(StepState::Cancelled));
    assert_eq!(view.state, FlowState::Failed, "{view:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rescue_leaves_a_dying_step_whose_flow_is_busy_to_its_next_pass() {
    let (store, clock, _guard) = common::fresh_store().await;
    let mut once = step_job("a", "rescue");
    once.max_attempts = 1;
    let created = store
        .flow_create(ValidFlow::new(NewFlow::new().step(NewStep::job("a", once))).expect("valid"))
        .await
        .expect("create");
    assert_eq!(fetch(&store, "rescue", 1).await.len(), 1);
    clock.advance(LEASE + Duration::from_secs(1));
    let params = || RescueParams {
        limit: 10,
        retry: RetryPolicy::fixed_exponential(Duration::from_secs(1), Duration::from_secs(1)),
    };

    // The rescue holds the job's row (picked locked): it must not wait for the flow.
    let held = hold_flow(&store, created.id).await;
    let report = tokio::time::timeout(Duration::from_secs(5), store.jobs_rescue_expired(params()))
        .await
        .expect("the rescue does not wait for a busy flow")
        .expect("rescue");
    assert!(report.dead.is_empty(), "{report:?}");
    let job = store
        .job_get(created.steps["a"])
        .await
        .expect("get")
        .expect("job");
    assert_eq!(job.state, JobState::Running, "left for the next pass");
    held.rollback().await.expect("release the flow");

    let report = store.jobs_rescue_expired(params()).await.expect("rescue");
    assert_eq!(report.dead, vec![created.steps["a"]]);
    let view = store
        .flow_get(created.id)
        .await
        .expect("get")
        .expect("flow");
    assert_eq!(view.state, FlowState::Failed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_jobs_still_complete_in_one_statement_beside_flows() {
    // A batch mixing plain jobs, a flow's job and a lost lease: each gets its own outcome.
    let (store, _clock, _guard) = common::fresh_store().await;
    let created = store
        .flow_create(
            ValidFlow::new(NewFlow::chain([
                ("a", step_job("a", "mixed")),
                ("b", step_job("b", "mixed")),
            ]))
            .expect("valid"),
        )
        .await
        .expect("create");
    store
        .jobs_insert_many(vec![step_job("plain", "mixed"), step_job("plain", "mixed")])
        .await
        .expect("insert");
    let jobs = fetch(&store, "mixed", 10).await;
    assert_eq!(jobs.len(), 3);
    let mut completions: Vec<CompleteParams> = jobs
        .iter()
        .map(|job| completion(job, json!(job.kind)))
        .collect();
    let mut lost = completions[0].clone();
    lost.lease.lease_token = Uuid::now_v7();
    completions.push(lost);
    let outcomes = store
        .jobs_complete_many(completions)
        .await
        .expect("complete");
    assert_eq!(
        outcomes,
        vec![
            LeaseOutcome::Applied,
            LeaseOutcome::Applied,
            LeaseOutcome::Applied,
            LeaseOutcome::LeaseLost
        ]
    );
    let b = fetch(&store, "mixed", 10).await;
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].id, created.steps["b"]);
    assert_eq!(
        b[0].flow.as_ref().expect("link").parents.get("a"),
        Some(&json!("a"))
    );
}
