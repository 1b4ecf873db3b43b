//! Workflows: steps start when their parents finish (in the parent's transaction), results are
//! handed on, failure policies, compensation, durable waits, cancellation, progress.
//!
//! One cohesive thing (~850 lines): the workflow behaviours every store must show.

use conveyor_core::workflow::{
    CompensationState, CreatedFlow, FlowFailurePolicy, FlowListParams, FlowState, FlowView,
    NewFlow, NewStep, ParentFailurePolicy, SignalOutcome, StepState, ValidFlow,
};
use conveyor_core::{Job, JobState, LeaseOutcome, NewJob, RescueParams, RetryPlan, StoreError};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

use crate::kit::{
    backoff, bogus_lease, complete, fail, fetch, fetch_none, fetch_one, get, insert, lease_of,
    list_all, new_job, Harness, LEASE,
};

fn step_job(kind: &str, queue: &str) -> NewJob {
    let mut job = new_job(kind);
    job.queue = queue.to_string();
    job.payload = json!({ "kind": kind });
    job
}

async fn create(h: &Harness, flow: NewFlow) -> CreatedFlow {
    h.store
        .flow_create(ValidFlow::new(flow).expect("a valid flow"))
        .await
        .expect("flow_create should succeed")
}

async fn view(h: &Harness, id: Uuid) -> FlowView {
    h.store
        .flow_get(id)
        .await
        .expect("flow_get should succeed")
        .unwrap_or_else(|| panic!("flow {id} should exist"))
}

fn step_state(flow: &FlowView, step: &str) -> StepState {
    flow.steps
        .iter()
        .find(|s| s.name == step)
        .unwrap_or_else(|| panic!("flow has step {step:?}: {flow:?}"))
        .state
}

/// Fetches the one available job of `queue`, asserting it is the step named.
async fn fetch_step(h: &Harness, queue: &str, step: &str) -> Job {
    let job = fetch_one(h, queue).await;
    let link = job
        .flow
        .as_ref()
        .unwrap_or_else(|| panic!("a flow's job: {job:?}"));
    assert_eq!(link.step, step, "the step that should run now: {job:?}");
    job
}

async fn run_step(h: &Harness, queue: &str, step: &str, result: serde_json::Value) -> Job {
    let job = fetch_step(h, queue, step).await;
    assert_eq!(
        complete(h, lease_of(&job), Some(result)).await,
        LeaseOutcome::Applied
    );
    job
}

async fn kill_step(h: &Harness, queue: &str, step: &str) -> Job {
    let job = fetch_step(h, queue, step).await;
    fail(h, lease_of(&job), "boom", RetryPlan::Never)
        .await
        .expect("fail should succeed")
}

pub async fn flow_chain_runs_steps_in_order_handing_on_results(h: &Harness) {
    let q = "wf-chain";
    let created = create(
        h,
        NewFlow::chain([
            ("a", step_job("a", q)),
            ("b", step_job("b", q)),
            ("c", step_job("c", q)),
        ])
        .named("order"),
    )
    .await;
    assert_eq!(created.steps.len(), 3);
    // Only the first step's job exists; the others wait for their parents.
    let a = fetch_step(h, q, "a").await;
    assert_eq!(a.id, created.steps["a"]);
    assert!(h
        .store
        .job_get(created.steps["b"])
        .await
        .expect("get")
        .is_none());
    assert_eq!(
        complete(h, lease_of(&a), Some(json!({"n": 1}))).await,
        LeaseOutcome::Applied
    );
    let b = fetch_step(h, q, "b").await;
    assert_eq!(b.id, created.steps["b"]);
    let link = b.flow.clone().expect("flow link");
    assert_eq!(link.flow_id, created.id);
    assert_eq!(
        link.parents.get("a"),
        Some(&json!({"n": 1})),
        "b gets a's result"
    );
    fetch_none(h, q, "c waits for b").await;
    assert_eq!(
        complete(h, lease_of(&b), Some(json!(2))).await,
        LeaseOutcome::Applied
    );
    let c = run_step(h, q, "c", json!("done")).await;
    assert_eq!(c.flow.expect("link").parents.get("b"), Some(&json!(2)));
    let flow = view(h, created.id).await;
    assert_eq!(flow.state, FlowState::Completed, "{flow:?}");
    assert!(flow.finished_at.is_some());
    assert_eq!(flow.name.as_deref(), Some("order"));
    let c_view = flow.steps.iter().find(|s| s.name == "c").expect("c");
    assert_eq!(c_view.result, Some(json!("done")));
    assert_eq!(c_view.job_state, Some(JobState::Completed));
    assert_eq!(c_view.attempts, 1);
}

pub async fn flow_fan_in_callback_starts_once_with_every_result(h: &Harness) {
    let q = "wf-fan";
    let members: Vec<(String, NewJob)> = (0..20)
        .map(|i| (format!("m{i}"), step_job("member", q)))
        .collect();
    let created = create(
        h,
        NewFlow::group(members).then("sum", step_job("sum", "wf-sum")),
    )
    .await;
    let jobs = fetch(h, &[q], 50).await;
    assert_eq!(jobs.len(), 20, "every member starts at once");
    for (i, job) in jobs.iter().enumerate() {
        fetch_none(h, "wf-sum", "the callback waits for every member").await;
        assert_eq!(
            complete(h, lease_of(job), Some(json!(i))).await,
            LeaseOutcome::Applied
        );
    }
    let sum = fetch_step(h, "wf-sum", "sum").await;
    let parents = sum.flow.expect("link").parents;
    assert_eq!(parents.len(), 20, "every member's result: {parents:?}");
    fetch_none(h, "wf-sum", "the callback starts once").await;
    assert_eq!(view(h, created.id).await.state, FlowState::Running);
}

pub async fn flow_dead_step_fails_the_flow_and_its_replay_resumes_it(h: &Harness) {
    let q = "wf-fail";
    let created = create(
        h,
        NewFlow::chain([("a", step_job("a", q)), ("b", step_job("b", q))]),
    )
    .await;
    let dead = kill_step(h, q, "a").await;
    assert_eq!(dead.state, JobState::Dead);
    let flow = view(h, created.id).await;
    assert_eq!(flow.state, FlowState::Failed);
    assert_eq!(flow.failed_step.as_deref(), Some("a"));
    assert_eq!(step_state(&flow, "a"), StepState::Failed);
    let error = flow.steps[0].error.clone().expect("the step's error");
    assert_eq!(error.message, "boom");
    assert_eq!(step_state(&flow, "b"), StepState::Pending);
    fetch_none(h, q, "a failed flow starts nothing").await;
    let replayed = h
        .store
        .dead_replay(conveyor_core::ReplaySelector {
            ids: Some(vec![dead.id]),
            ..Default::default()
        })
        .await
        .expect("replay");
    assert_eq!(replayed, 1);
    assert_eq!(
        view(h, created.id).await.state,
        FlowState::Running,
        "replay resumes the flow"
    );
    run_step(h, q, "a", json!(1)).await;
    run_step(h, q, "b", json!(2)).await;
    assert_eq!(view(h, created.id).await.state, FlowState::Completed);
}

pub async fn flow_skip_and_continue_policies_absorb_a_failure(h: &Harness) {
    let q = "wf-policy";
    let created = create(
        h,
        NewFlow::new()
            .step(NewStep::job("a", step_job("a", q)))
            .step(
                NewStep::job("optional", step_job("o", q))
                    .after(["a"])
                    .on_parent_failure(ParentFailurePolicy::Skip),
            )
            .step(NewStep::job("after_optional", step_job("ao", q)).after(["optional"]))
            .step(
                NewStep::job("cleanup", step_job("c", q))
                    .after(["a"])
                    .on_parent_failure(ParentFailurePolicy::Continue),
            ),
    )
    .await;
    kill_step(h, q, "a").await;
    let flow = view(h, created.id).await;
    assert_eq!(step_state(&flow, "optional"), StepState::Skipped);
    assert_eq!(step_state(&flow, "after_optional"), StepState::Skipped);
    assert_eq!(flow.state, FlowState::Running);
    let cleanup = run_step(h, q, "cleanup", json!("cleaned")).await;
    assert!(
        cleanup.flow.expect("link").parents.is_empty(),
        "a failed parent has no result"
    );
    let flow = view(h, created.id).await;
    assert_eq!(flow.state, FlowState::Completed, "{flow:?}");
    assert_eq!(flow.step_counts.get("skipped"), Some(&2));
}

pub async fn flow_compensates_completed_steps_latest_first(h: &Harness) {
    let q = "wf-saga";
    let mut refund = step_job("refund", q);
    refund.payload = serde_json::Value::Null;
    let created = create(
        h,
        NewFlow::new()
            .on_failure(FlowFailurePolicy::Compensate)
            .step(
                NewStep::job("reserve", step_job("reserve", q))
                    .compensate(step_job("unreserve", q)),
            )
            .step(
                NewStep::job("charge", step_job("charge", q))
                    .after(["reserve"])
                    .compensate(refund),
            )
            .step(NewStep::job("ship", step_job("ship", q)).after(["charge"])),
    )
    .await;
    run_step(h, q, "reserve", json!({"reservation": 7})).await;
    run_step(h, q, "charge", json!({"charge": 9})).await;
    kill_step(h, q, "ship").await;
    assert_eq!(view(h, created.id).await.state, FlowState::Compensating);
    let refund = fetch_one(h, q).await;
    assert_eq!(
        refund.kind, "refund",
        "the latest completed step is compensated first"
    );
    assert_eq!(
        refund.payload,
        json!({"kind": "charge"}),
        "with the step's payload"
    );
    assert_eq!(
        refund.flow.clone().expect("link").parents.get("charge"),
        Some(&json!({"charge": 9}))
    );
    assert_eq!(
        complete(h, lease_of(&refund), None).await,
        LeaseOutcome::Applied
    );
    let unreserve = fetch_one(h, q).await;
    assert_eq!(unreserve.kind, "unreserve");
    assert_eq!(
        unreserve.payload,
        json!({"kind": "unreserve"}),
        "its own payload when it has one"
    );
    assert_eq!(
        complete(h, lease_of(&unreserve), None).await,
        LeaseOutcome::Applied
    );
    let flow = view(h, created.id).await;
    assert_eq!(flow.state, FlowState::Compensated);
    assert_eq!(flow.failed_step.as_deref(), Some("ship"));
    assert!(flow
        .steps
        .iter()
        .filter(|s| s.name != "ship")
        .all(|s| s.compensation == Some(CompensationState::Completed)));
}

pub async fn flow_dying_compensation_fails_the_flow_naming_the_step(h: &Harness) {
    let q = "wf-saga-dies";
    let mut undo = step_job("undo", q);
    undo.max_attempts = 1;
    let created = create(
        h,
        NewFlow::new()
            .on_failure(FlowFailurePolicy::Compensate)
            .step(NewStep::job("a", step_job("a", q)).compensate(undo))
            .step(NewStep::job("b", step_job("b", q)).after(["a"])),
    )
    .await;
    run_step(h, q, "a", json!(1)).await;
    kill_step(h, q, "b").await;
    let undo = fetch_one(h, q).await;
    fail(h, lease_of(&undo), "cannot undo", RetryPlan::Never)
        .await
        .expect("fail");
    let flow = view(h, created.id).await;
    assert_eq!(flow.state, FlowState::Failed);
    assert_eq!(flow.failed_step.as_deref(), Some("a"));
    assert_eq!(flow.steps[0].compensation, Some(CompensationState::Failed));
}

pub async fn flow_wait_completes_on_its_signal_even_one_sent_early(h: &Harness) {
    let q = "wf-wait";
    let flow = NewFlow::new()
        .step(NewStep::job("draft", step_job("draft", q)))
        .step(NewStep::wait("approval", "approved", Some(60_000)).after(["draft"]))
        .step(NewStep::job("publish", step_job("publish", q)).after(["approval"]));
    let created = create(h, flow.clone()).await;
    run_step(h, q, "draft", json!("v1")).await;
    let waiting = view(h, created.id).await;
    assert_eq!(step_state(&waiting, "approval"), StepState::Waiting);
    assert!(waiting.steps[1].wait_deadline.is_some());
    let outcome = h
        .store
        .flow_signal(created.id, "approved", json!({"by": "ana"}))
        .await
        .expect("signal");
    assert_eq!(outcome, SignalOutcome::Delivered);
    let publish = fetch_step(h, q, "publish").await;
    assert_eq!(
        publish.flow.expect("link").parents.get("approval"),
        Some(&json!({"by": "ana"}))
    );
    // A wait that has ended has no deadline left.
    let signalled = view(h, created.id).await;
    assert_eq!(step_state(&signalled, "approval"), StepState::Completed);
    assert_eq!(signalled.steps[1].wait_deadline, None);
    // A second signal for a finished step is refused.
    let again = h.store.flow_signal(created.id, "approved", json!(1)).await;
    assert!(
        matches!(again, Err(StoreError::FlowConflict { .. })),
        "{again:?}"
    );

    // Early: the signal comes before the step waits, and is kept.
    let early = create(h, flow).await;
    let outcome = h
        .store
        .flow_signal(early.id, "approved", json!("early"))
        .await
        .expect("signal");
    assert_eq!(outcome, SignalOutcome::Stored);
    run_step(h, q, "draft", json!("v2")).await;
    let publish = fetch_step(h, q, "publish").await;
    assert_eq!(
        publish.flow.expect("link").parents.get("approval"),
        Some(&json!("early"))
    );
}

pub async fn flow_wait_fails_with_timeout_when_its_deadline_passes(h: &Harness) {
    let q = "wf-timeout";
    let created = create(
        h,
        NewFlow::new()
            .step(NewStep::job("draft", step_job("draft", q)))
            .step(NewStep::wait("approval", "approved", Some(5_000)).after(["draft"])),
    )
    .await;
    run_step(h, q, "draft", json!(1)).await;
    assert_eq!(
        h.store.flows_expire_waits(100).await.expect("expire"),
        0,
        "not yet due"
    );
    h.advance(Duration::from_secs(6));
    assert_eq!(h.store.flows_expire_waits(100).await.expect("expire"), 1);
    let flow = view(h, created.id).await;
    assert_eq!(step_state(&flow, "approval"), StepState::Failed);
    assert_eq!(
        flow.steps[1].error.as_ref().map(|e| e.class.as_str()),
        Some("timeout")
    );
    assert_eq!(flow.steps[1].wait_deadline, None, "the wait has ended");
    assert_eq!(flow.state, FlowState::Failed);
    let late = h.store.flow_signal(created.id, "approved", json!(1)).await;
    assert!(
        matches!(late, Err(StoreError::FlowConflict { .. })),
        "{late:?}"
    );
}

pub async fn flow_signal_errors_name_what_is_wrong(h: &Harness) {
    let created = create(h, NewFlow::new().step(NewStep::wait("w", "go", None))).await;
    let unknown = h.store.flow_signal(created.id, "stop", json!(1)).await;
    assert!(
        matches!(&unknown, Err(StoreError::Invalid(e)) if e.field == "signal"),
        "{unknown:?}"
    );
    let missing = h.store.flow_signal(Uuid::now_v7(), "go", json!(1)).await;
    assert!(
        matches!(missing, Err(StoreError::FlowNotFound(_))),
        "{missing:?}"
    );
    let flow = view(h, created.id).await;
    assert_eq!(
        step_state(&flow, "w"),
        StepState::Waiting,
        "a wait without parents waits at once"
    );
    h.store
        .flow_signal(created.id, "go", json!(null))
        .await
        .expect("signal");
    assert_eq!(view(h, created.id).await.state, FlowState::Completed);
}

pub async fn flow_cancel_cancels_every_unfinished_step(h: &Harness) {
    let q = "wf-cancel";
    let created = create(
        h,
        NewFlow::new()
            .step(NewStep::job("running", step_job("r", q)))
            .step(NewStep::job("queued", step_job("q", "wf-cancel-other")))
            .step(NewStep::job("later", step_job("l", q)).after(["running", "queued"])),
    )
    .await;
    let running = fetch_step(h, q, "running").await;
    let flow = h.store.flow_cancel(created.id).await.expect("cancel");
    assert_eq!(flow.state, FlowState::Cancelled);
    assert!(
        flow.steps.iter().all(|s| s.state == StepState::Cancelled),
        "{flow:?}"
    );
    assert_eq!(
        get(h, created.steps["queued"]).await.state,
        JobState::Cancelled
    );
    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::LeaseLost,
        "a running step loses its lease"
    );
    fetch_none(h, "wf-cancel-other", "the queued step was cancelled").await;
    let again = h.store.flow_cancel(created.id).await;
    assert!(
        matches!(again, Err(StoreError::FlowConflict { .. })),
        "{again:?}"
    );
    let missing = h.store.flow_cancel(Uuid::now_v7()).await;
    assert!(
        matches!(missing, Err(StoreError::FlowNotFound(_))),
        "{missing:?}"
    );
}

pub async fn flow_step_cancelled_alone_counts_as_a_failure(h: &Harness) {
    let q = "wf-step-cancel";
    let created = create(
        h,
        NewFlow::chain([("a", step_job("a", q)), ("b", step_job("b", q))]),
    )
    .await;
    h.store
        .job_cancel(created.steps["a"])
        .await
        .expect("cancel the step's job");
    let flow = view(h, created.id).await;
    assert_eq!(step_state(&flow, "a"), StepState::Cancelled);
    assert_eq!(flow.state, FlowState::Failed);
    assert_eq!(flow.failed_step.as_deref(), Some("a"));
}

pub async fn flow_step_whose_lease_expires_on_its_last_attempt_fails_the_flow(h: &Harness) {
    let q = "wf-rescue";
    let mut once = step_job("a", q);
    once.max_attempts = 1;
    let created = create(h, NewFlow::new().step(NewStep::job("a", once))).await;
    fetch_step(h, q, "a").await;
    h.advance(LEASE + Duration::from_secs(1));
    let report = h
        .store
        .jobs_rescue_expired(RescueParams {
            limit: 10,
            retry: backoff(Duration::from_secs(1)),
        })
        .await
        .expect("rescue");
    assert_eq!(report.dead, vec![created.steps["a"]]);
    assert_eq!(view(h, created.id).await.state, FlowState::Failed);
}

pub async fn flow_create_is_validated_and_all_or_nothing(h: &Harness) {
    let invalid = NewFlow::new()
        .step(NewStep::job("a", step_job("a", "wf-valid")))
        .step(NewStep::job("b", step_job("b", "wf-valid")).after(["nope"]));
    let error = ValidFlow::new(invalid).expect_err("unknown parent");
    assert_eq!(error.field, "steps[1].after[0]");
    let listed = h
        .store
        .flows_list(FlowListParams::newest(10))
        .await
        .expect("list");
    assert!(listed.is_empty());
    fetch_none(h, "wf-valid", "nothing of a refused flow is stored").await;
}

pub async fn flow_idempotency_key_returns_the_first_flow(h: &Harness) {
    let flow = NewFlow::chain([("a", step_job("a", "wf-idem"))]).idempotency_key("order-1");
    let first = create(h, flow.clone()).await;
    let second = create(h, flow).await;
    assert!(!first.duplicate);
    assert!(second.duplicate);
    assert_eq!(second.id, first.id);
    assert_eq!(second.steps, first.steps);
    assert_eq!(
        fetch(h, &["wf-idem"], 10).await.len(),
        1,
        "one flow, one first step"
    );
}

pub async fn flows_list_filters_by_state_and_name_newest_first(h: &Harness) {
    let q = "wf-list";
    let a = create(h, NewFlow::chain([("a", step_job("a", q))]).named("import")).await;
    let b = create(h, NewFlow::chain([("a", step_job("a", q))]).named("export")).await;
    let c = create(h, NewFlow::chain([("a", step_job("a", q))]).named("import")).await;
    h.store.flow_cancel(b.id).await.expect("cancel");
    let list = |state: Option<FlowState>, name: Option<&str>| {
        let mut params = FlowListParams::newest(10);
        params.state = state;
        params.name = name.map(str::to_string);
        let store = h.store.clone();
        async move { store.flows_list(params).await.expect("list") }
    };
    let ids = |flows: Vec<FlowView>| flows.into_iter().map(|f| f.id).collect::<Vec<_>>();
    assert_eq!(ids(list(None, None).await), vec![c.id, b.id, a.id]);
    assert_eq!(ids(list(None, Some("import")).await), vec![c.id, a.id]);
    assert_eq!(
        ids(list(Some(FlowState::Cancelled), None).await),
        vec![b.id]
    );
    let all = list(Some(FlowState::Running), Some("import")).await;
    assert_eq!(all[0].step_counts.get("active"), Some(&1), "{all:?}");
    assert!(all[0].steps.is_empty(), "lists carry counts, not steps");
    let mut page = FlowListParams::newest(1);
    page.after = Some(c.id);
    assert_eq!(
        ids(h.store.flows_list(page).await.expect("list")),
        vec![b.id]
    );
}

pub async fn job_progress_is_recorded_while_the_lease_holds(h: &Harness) {
    let job = insert(h, new_job("long")).await;
    let fetched = fetch_one(h, &job.queue).await;
    h.store
        .job_progress(lease_of(&fetched), 40, Some("copying".into()))
        .await
        .expect("progress");
    let progress = get(h, job.id).await.progress.expect("progress kept");
    assert_eq!(progress.percent, 40);
    assert_eq!(progress.message.as_deref(), Some("copying"));
    assert_eq!(progress.at, h.now());
    let too_much = h.store.job_progress(lease_of(&fetched), 101, None).await;
    assert!(
        matches!(&too_much, Err(StoreError::Invalid(e)) if e.field == "progress"),
        "{too_much:?}"
    );
    let lost = h.store.job_progress(bogus_lease(job.id), 50, None).await;
    assert!(matches!(lost, Err(StoreError::LeaseLost(_))), "{lost:?}");
    complete(h, lease_of(&fetched), None).await;
    assert_eq!(
        get(h, job.id).await.progress.map(|p| p.percent),
        Some(40),
        "kept after completion"
    );
}

/// A completed step keeps its state, result and finish time when retention deletes its job
/// while the flow still runs, and a later step is still handed that result.
pub async fn flow_step_keeps_its_outcome_when_its_job_is_pruned(h: &Harness) {
    let q = "wf-pruned-step";
    let created = create(
        h,
        NewFlow::group([("a", step_job("a", q)), ("b", step_job("b", q))])
            .then("sum", step_job("sum", q)),
    )
    .await;
    let a = fetch_step(h, q, "a").await;
    assert_eq!(
        complete(h, lease_of(&a), Some(json!({ "n": 1 }))).await,
        LeaseOutcome::Applied
    );
    let finished = view(h, created.id).await.steps[0].finished_at;
    assert!(finished.is_some(), "a finished");
    h.advance(Duration::from_secs(24 * 3600 + 1));
    let report = h
        .store
        .jobs_prune(conveyor_core::PruneParams {
            retention: conveyor_core::RetentionPolicy::default(),
            limit: 100,
        })
        .await
        .expect("prune");
    assert_eq!(report.completed, 1, "a's job is past its retention");
    assert!(h.store.job_get(a.id).await.expect("get").is_none());
    let flow = view(h, created.id).await;
    let step_a = &flow.steps[0];
    assert_eq!(step_a.state, StepState::Completed, "{flow:?}");
    assert_eq!(step_a.result, Some(json!({ "n": 1 })), "{flow:?}");
    assert_eq!(step_a.finished_at, finished, "{flow:?}");
    assert_eq!(step_a.job_state, None, "its job is gone: {flow:?}");
    assert!(step_a.error.is_none(), "{flow:?}");
    assert_eq!(flow.step_counts.get("completed"), Some(&1), "{flow:?}");
    run_step(h, q, "b", json!(2)).await;
    let sum = fetch_step(h, q, "sum").await;
    let parents = sum.flow.clone().expect("link").parents;
    assert_eq!(parents.get("a"), Some(&json!({ "n": 1 })), "{parents:?}");
    assert_eq!(parents.get("b"), Some(&json!(2)), "{parents:?}");
    complete(h, lease_of(&sum), None).await;
    let flow = view(h, created.id).await;
    assert_eq!(flow.state, FlowState::Completed, "{flow:?}");
    let listed = h
        .store
        .flows_list(FlowListParams::newest(10))
        .await
        .expect("list");
    let counts = &listed
        .iter()
        .find(|f| f.id == created.id)
        .expect("listed")
        .step_counts;
    assert_eq!(counts.get("completed"), Some(&3), "{counts:?}");
}

pub async fn flows_prune_deletes_finished_flows_past_their_retention(h: &Harness) {
    let q = "wf-prune";
    let done = create(h, NewFlow::chain([("a", step_job("a", q))])).await;
    run_step(h, q, "a", json!(1)).await;
    let failed = create(h, NewFlow::chain([("a", step_job("a", q))])).await;
    kill_step(h, q, "a").await;
    let running = create(h, NewFlow::new().step(NewStep::wait("w", "go", None))).await;
    let params = conveyor_core::PruneParams {
        retention: conveyor_core::RetentionPolicy::default(),
        limit: 100,
    };
    assert_eq!(
        h.store.flows_prune(params).await.expect("prune"),
        0,
        "nothing expired yet"
    );
    h.advance(Duration::from_secs(24 * 3600 + 1));
    assert_eq!(h.store.flows_prune(params).await.expect("prune"), 1);
    assert!(h.store.flow_get(done.id).await.expect("get").is_none());
    assert!(
        h.store.flow_get(failed.id).await.expect("get").is_some(),
        "a failed flow is kept as long as its dead step, which could resume it"
    );
    h.advance(Duration::from_secs(14 * 24 * 3600));
    assert_eq!(h.store.flows_prune(params).await.expect("prune"), 1);
    assert!(h.store.flow_get(failed.id).await.expect("get").is_none());
    assert_eq!(
        view(h, running.id).await.state,
        FlowState::Running,
        "running flows stay"
    );
    let listed = h
        .store
        .flows_list(FlowListParams::newest(10))
        .await
        .expect("list");
    assert_eq!(listed.len(), 1);
}

/// What a store's `FlowStarts` told, in order: each job's id, queue and kind.
#[derive(Default)]
pub(crate) struct ToldStarts(std::sync::Mutex<Vec<(Uuid, String, String)>>);

impl ToldStarts {
    /// A recorder listening to `h`'s store.
    pub(crate) fn observe(h: &Harness) -> Arc<Self> {
        let told = Arc::new(Self::default());
        assert!(
            h.store.flow_starts().observe(told.clone()),
            "a fresh store has no observer yet"
        );
        told
    }

    pub(crate) fn ids(&self) -> Vec<Uuid> {
        self.told().into_iter().map(|(id, ..)| id).collect()
    }

    fn told(&self) -> Vec<(Uuid, String, String)> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl conveyor_core::JobObserver for ToldStarts {
    fn attempt_finished(&self, _: &conveyor_core::AttemptEvent<'_>) {}

    fn jobs_enqueued(&self, inserted: &[conveyor_core::Inserted]) {
        // No assertion here: this runs inside the store (on SQLite's writer thread).
        let mut told = self.0.lock().unwrap_or_else(|e| e.into_inner());
        for one in inserted {
            let kind = if one.duplicate {
                "(told as a duplicate)".to_string()
            } else {
                one.job.kind.clone()
            };
            told.push((one.job.id, one.job.queue.clone(), kind));
        }
    }
}

/// Every job a flow starts is told to the store's `FlowStarts` once, with its queue and kind,
/// when the operation that started it returns: the first steps at creation, later ones at a
/// parent's completion, failure (`continue`), cancellation or lease rescue, at a signal, and
/// compensations. Nothing else is told: not a duplicate flow, not a plain job.
pub async fn flow_started_jobs_are_told_once_committed(h: &Harness) {
    let q = "wf-told";
    let starts = h.store.flow_starts();
    let told = ToldStarts::observe(h);
    assert!(
        !starts.observe(Arc::new(ToldStarts::default())),
        "the first observer stays"
    );
    assert!(
        Arc::ptr_eq(&starts, &h.store.flow_starts()),
        "one FlowStarts per store"
    );
    insert(h, step_job("plain", "wf-told-plain")).await;
    assert!(told.ids().is_empty(), "a plain enqueue is not a flow's");

    // Creation: the first steps (a chain's head, a fan-out's root and a wait-free member).
    let chain = NewFlow::chain([
        ("a", step_job("chain", q)),
        ("b", step_job("chain", q)),
        ("c", step_job("chain", q)),
    ])
    .idempotency_key("told-chain");
    let chain = create(h, chain).await;
    assert_eq!(told.ids(), vec![chain.steps["a"]]);
    let again = create(
        h,
        NewFlow::chain([("a", step_job("chain", q))]).idempotency_key("told-chain"),
    )
    .await;
    assert!(again.duplicate);
    assert_eq!(told.ids().len(), 1, "a duplicate flow starts nothing");
    let fan = create(
        h,
        NewFlow::new()
            .step(NewStep::job("split", step_job("split", "wf-told-fan")))
            .step(NewStep::job("m0", step_job("member", "wf-told-fan")).after(["split"]))
            .step(NewStep::job("m1", step_job("member", "wf-told-fan")).after(["split"])),
    )
    .await;
    assert_eq!(told.ids(), vec![chain.steps["a"], fan.steps["split"]]);

    // Completions: the next step, every member of the fan-out.
    run_step(h, q, "a", json!(1)).await;
    assert_eq!(told.ids().last(), Some(&chain.steps["b"]));
    run_step(h, "wf-told-fan", "split", json!("s")).await;
    let members: Vec<Uuid> = told.ids().into_iter().rev().take(2).collect();
    assert!(
        members.contains(&fan.steps["m0"]) && members.contains(&fan.steps["m1"]),
        "{members:?}"
    );

    // A parent's failure starts a `continue` child; a step cancelled alone, and one rescued on
    // its last attempt, likewise.
    let continued = |name: &str| {
        let mut once = step_job("first", q);
        once.max_attempts = 1;
        NewFlow::new()
            .named(name)
            .step(NewStep::job("first", once))
            .step(
                NewStep::job("then", step_job("then", q))
                    .after(["first"])
                    .on_parent_failure(ParentFailurePolicy::Continue),
            )
    };
    run_step(h, q, "b", json!(2)).await;
    run_step(h, q, "c", json!(3)).await;
    let failed = create(h, continued("failed")).await;
    kill_step(h, q, "first").await;
    assert_eq!(told.ids().last(), Some(&failed.steps["then"]));
    run_step(h, q, "then", json!(null)).await;
    let cancelled = create(h, continued("cancelled")).await;
    h.store
        .job_cancel(cancelled.steps["first"])
        .await
        .expect("cancel");
    assert_eq!(told.ids().last(), Some(&cancelled.steps["then"]));
    run_step(h, q, "then", json!(null)).await;
    let rescued = create(h, continued("rescued")).await;
    fetch_step(h, q, "first").await;
    h.advance(LEASE + Duration::from_secs(1));
    h.store
        .jobs_rescue_expired(RescueParams {
            limit: 10,
            retry: backoff(Duration::from_secs(1)),
        })
        .await
        .expect("rescue");
    assert_eq!(told.ids().last(), Some(&rescued.steps["then"]));
    run_step(h, q, "then", json!(null)).await;

    // A signal starts the wait's child; a failure in a compensating flow its compensation.
    let waited = create(
        h,
        NewFlow::new()
            .step(NewStep::wait("approval", "go", None))
            .step(NewStep::job("publish", step_job("publish", q)).after(["approval"])),
    )
    .await;
    h.store
        .flow_signal(waited.id, "go", json!(true))
        .await
        .expect("signal");
    assert_eq!(told.ids().last(), Some(&waited.steps["publish"]));
    run_step(h, q, "publish", json!(null)).await;
    let saga = create(
        h,
        NewFlow::new()
            .on_failure(FlowFailurePolicy::Compensate)
            .step(NewStep::job("reserve", step_job("reserve", q)).compensate(step_job("undo", q)))
            .step(NewStep::job("ship", step_job("ship", q)).after(["reserve"])),
    )
    .await;
    run_step(h, q, "reserve", json!(1)).await;
    kill_step(h, q, "ship").await;
    let undo = fetch_one(h, q).await;
    assert_eq!(undo.kind, "undo");
    assert_eq!(told.ids().last(), Some(&undo.id), "the compensation");
    complete(h, lease_of(&undo), None).await;
    assert_eq!(view(h, saga.id).await.state, FlowState::Compensated);

    // Told once each, exactly the jobs flows started, with their queues and kinds.
    let mut stored: Vec<(Uuid, String, String)> = list_all(h)
        .await
        .into_iter()
        .filter(|job| job.flow.is_some())
        .map(|job| (job.id, job.queue, job.kind))
        .collect();
    let mut told = told.told();
    stored.sort();
    told.sort();
    assert_eq!(told, stored);
}
