use super::*;
use serde_json::json;

fn job(kind: &str) -> NewJob {
    NewJob::new(kind, json!({}))
}

/// A graph as a store would load it right after creating `flow` (steps without parents started).
fn graph(flow: &NewFlow) -> FlowGraph {
    let mut graph = FlowGraph::new(
        Uuid::now_v7(),
        FlowState::Running,
        flow.on_failure,
        None,
        flow.steps
            .iter()
            .map(|s| GraphStep {
                name: s.name.clone(),
                state: StepState::Pending,
                after: s.after.clone(),
                on_parent_failure: s.on_parent_failure,
                job_id: matches!(s.action, StepAction::Job(_)).then(Uuid::now_v7),
                wait_signal: match &s.action {
                    StepAction::Wait(w) => Some(w.signal.clone()),
                    StepAction::Job(_) => None,
                },
                signalled: false,
                has_compensate: s.compensate.is_some(),
                compensation: None,
                compensation_job_id: None,
                completed_seq: None,
            })
            .collect(),
    );
    graph.settle(&mut Vec::new());
    graph
}

fn job_of(g: &FlowGraph, step: &str) -> Uuid {
    g.steps
        .iter()
        .find(|s| s.name == step)
        .and_then(|s| s.job_id)
        .expect("job step")
}

fn state(g: &FlowGraph, step: &str) -> StepState {
    g.steps.iter().find(|s| s.name == step).expect("step").state
}

fn finish(g: &mut FlowGraph, step: &str, state: JobState) -> Vec<Effect> {
    let job_id = job_of(g, step);
    g.apply(FlowEvent::JobFinished { job_id, state })
}

fn started(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Start { step } => Some(step.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_chain_starts_each_step_after_the_previous_and_completes() {
    let flow = NewFlow::chain([("a", job("a")), ("b", job("b")), ("c", job("c"))]);
    let mut g = graph(&flow);
    assert_eq!(state(&g, "a"), StepState::Active);
    assert_eq!(state(&g, "b"), StepState::Pending);
    assert_eq!(started(&finish(&mut g, "a", JobState::Completed)), ["b"]);
    assert_eq!(started(&finish(&mut g, "b", JobState::Completed)), ["c"]);
    let last = finish(&mut g, "c", JobState::Completed);
    assert!(last.contains(&Effect::FlowState {
        state: FlowState::Completed,
        failed_step: None
    }));
    assert_eq!(g.state, FlowState::Completed);
}

#[test]
fn a_chord_callback_starts_once_after_every_member() {
    let flow =
        NewFlow::group([("x", job("x")), ("y", job("y")), ("z", job("z"))]).then("sum", job("sum"));
    let mut g = graph(&flow);
    assert!(started(&finish(&mut g, "x", JobState::Completed)).is_empty());
    assert!(started(&finish(&mut g, "z", JobState::Completed)).is_empty());
    assert_eq!(started(&finish(&mut g, "y", JobState::Completed)), ["sum"]);
    // A second report of a finished step (at-least-once delivery) changes nothing.
    assert!(finish(&mut g, "y", JobState::Completed).is_empty());
}

#[test]
fn a_failed_parent_fails_the_flow_by_default_and_its_replay_resumes_it() {
    let flow = NewFlow::chain([("a", job("a")), ("b", job("b"))]);
    let mut g = graph(&flow);
    finish(&mut g, "a", JobState::Dead);
    assert_eq!(g.state, FlowState::Failed);
    assert_eq!(g.failed_step.as_deref(), Some("a"));
    assert_eq!(state(&g, "b"), StepState::Pending);
    let a = job_of(&g, "a");
    g.apply(FlowEvent::JobReplayed { job_id: a });
    assert_eq!(g.state, FlowState::Running);
    assert_eq!(started(&finish(&mut g, "a", JobState::Completed)), ["b"]);
}

#[test]
fn skip_skips_the_step_and_its_dependents_and_continue_runs_anyway() {
    let flow = NewFlow::new()
        .step(NewStep::job("a", job("a")))
        .step(
            NewStep::job("skipper", job("s"))
                .after(["a"])
                .on_parent_failure(ParentFailurePolicy::Skip),
        )
        .step(
            NewStep::job("after_skipper", job("s2"))
                .after(["skipper"])
                .on_parent_failure(ParentFailurePolicy::Continue),
        )
        .step(
            NewStep::job("cleanup", job("c"))
                .after(["a"])
                .on_parent_failure(ParentFailurePolicy::Continue),
        );
    let mut g = graph(&flow);
    let effects = finish(&mut g, "a", JobState::Dead);
    assert_eq!(state(&g, "skipper"), StepState::Skipped);
    assert_eq!(state(&g, "after_skipper"), StepState::Skipped);
    assert_eq!(started(&effects), ["cleanup"]);
    assert_eq!(g.state, FlowState::Running);
    finish(&mut g, "cleanup", JobState::Completed);
    assert_eq!(
        g.state,
        FlowState::Completed,
        "the failure was absorbed by its dependents"
    );
}

#[test]
fn a_failing_leaf_fails_the_flow() {
    let flow = NewFlow::group([("x", job("x")), ("y", job("y"))]).into_flow();
    let mut g = graph(&flow);
    finish(&mut g, "x", JobState::Cancelled);
    assert_eq!(g.state, FlowState::Failed);
    assert_eq!(g.failed_step.as_deref(), Some("x"));
}

#[test]
fn compensation_runs_latest_completed_first_then_ends_compensated() {
    let flow = NewFlow::new()
        .on_failure(FlowFailurePolicy::Compensate)
        .step(NewStep::job("reserve", job("r")).compensate(job("unreserve")))
        .step(
            NewStep::job("charge", job("c"))
                .after(["reserve"])
                .compensate(job("refund")),
        )
        .step(NewStep::job("side", job("s")))
        .step(NewStep::job("ship", job("ship")).after(["charge"]));
    let mut g = graph(&flow);
    finish(&mut g, "reserve", JobState::Completed);
    finish(&mut g, "charge", JobState::Completed);
    let effects = finish(&mut g, "ship", JobState::Dead);
    assert_eq!(g.state, FlowState::Compensating);
    let side = job_of(&g, "side");
    assert!(
        effects.contains(&Effect::CancelJob { job_id: side }),
        "{effects:?}"
    );
    assert!(effects.contains(&Effect::Compensate {
        step: "charge".into()
    }));
    let charge = g
        .steps
        .iter()
        .position(|s| s.name == "charge")
        .expect("charge");
    let refund = Uuid::now_v7();
    g.steps[charge].compensation_job_id = Some(refund);
    let effects = g.apply(FlowEvent::JobFinished {
        job_id: refund,
        state: JobState::Completed,
    });
    assert!(effects.contains(&Effect::Compensate {
        step: "reserve".into()
    }));
    let reserve = g
        .steps
        .iter()
        .position(|s| s.name == "reserve")
        .expect("reserve");
    let unreserve = Uuid::now_v7();
    g.steps[reserve].compensation_job_id = Some(unreserve);
    g.apply(FlowEvent::JobFinished {
        job_id: unreserve,
        state: JobState::Completed,
    });
    assert_eq!(g.state, FlowState::Compensated);
    assert_eq!(g.failed_step.as_deref(), Some("ship"));
}

#[test]
fn a_dying_compensation_fails_the_flow_naming_its_step() {
    let flow = NewFlow::new()
        .on_failure(FlowFailurePolicy::Compensate)
        .step(NewStep::job("a", job("a")).compensate(job("undo")))
        .step(NewStep::job("b", job("b")).after(["a"]));
    let mut g = graph(&flow);
    finish(&mut g, "a", JobState::Completed);
    finish(&mut g, "b", JobState::Dead);
    let undo = Uuid::now_v7();
    g.steps[0].compensation_job_id = Some(undo);
    g.apply(FlowEvent::JobFinished {
        job_id: undo,
        state: JobState::Dead,
    });
    assert_eq!(g.state, FlowState::Failed);
    assert_eq!(g.failed_step.as_deref(), Some("a"));
}

#[test]
fn a_wait_completes_on_its_signal_even_one_sent_early_and_fails_on_timeout() {
    let flow = NewFlow::new()
        .step(NewStep::job("draft", job("d")))
        .step(NewStep::wait("approval", "approved", Some(1000)).after(["draft"]))
        .step(NewStep::job("publish", job("p")).after(["approval"]));
    let mut g = graph(&flow);
    assert!(g
        .apply(FlowEvent::Signal {
            step: "approval".into()
        })
        .is_empty());
    let effects = finish(&mut g, "draft", JobState::Completed);
    assert_eq!(state(&g, "approval"), StepState::Completed);
    assert_eq!(started(&effects), ["publish"]);

    let mut g = graph(&flow);
    assert_eq!(
        started(&finish(&mut g, "draft", JobState::Completed)),
        ["approval"]
    );
    assert_eq!(state(&g, "approval"), StepState::Waiting);
    g.apply(FlowEvent::WaitTimedOut {
        step: "approval".into(),
    });
    assert_eq!(state(&g, "approval"), StepState::Failed);
    assert_eq!(g.state, FlowState::Failed);
}

#[test]
fn cancelling_cancels_unfinished_steps_and_their_jobs() {
    let flow = NewFlow::chain([("a", job("a")), ("b", job("b"))]);
    let mut g = graph(&flow);
    let a = job_of(&g, "a");
    let effects = g.apply(FlowEvent::Cancel);
    assert!(effects.contains(&Effect::CancelJob { job_id: a }));
    assert_eq!(state(&g, "b"), StepState::Cancelled);
    assert_eq!(g.state, FlowState::Cancelled);
    // The cancelled job's own report comes later and changes nothing.
    assert!(finish(&mut g, "a", JobState::Cancelled).is_empty());
}

#[test]
fn validation_names_the_field_at_fault() {
    let field = |flow: NewFlow| validate_flow(&flow).expect_err("invalid").field;
    assert_eq!(field(NewFlow::new()), "steps");
    assert_eq!(
        field(
            NewFlow::new()
                .step(NewStep::job("a", job("a")))
                .step(NewStep::job("a", job("b")))
        ),
        "steps[1].name"
    );
    assert_eq!(
        field(
            NewFlow::new()
                .step(NewStep::job("a", job("a")))
                .step(NewStep::job("b", job("b")).after(["a", "zz"]))
        ),
        "steps[1].after[1]"
    );
    assert_eq!(
        field(
            NewFlow::new()
                .step(NewStep::job("a", job("a")).after(["c"]))
                .step(NewStep::job("b", job("b")).after(["a"]))
                .step(NewStep::job("c", job("c")).after(["b"]))
        ),
        "steps[0].after"
    );
    assert_eq!(
        field(NewFlow::new().step(NewStep::job("a", job("")))),
        "steps[0].job.kind"
    );
    let mut keyed = job("a");
    keyed.idempotency_key = Some("k".into());
    assert_eq!(
        field(NewFlow::new().step(NewStep::job("a", keyed))),
        "steps[0].job.idempotency_key"
    );
    let too_many = (0..=MAX_FLOW_STEPS).fold(NewFlow::new(), |f, i| {
        f.step(NewStep::job(format!("s{i}"), job("k")))
    });
    assert_eq!(field(too_many), "steps");
    let chain = NewFlow::chain((0..MAX_FLOW_STEPS).map(|i| (format!("s{i}"), job("k"))));
    assert!(validate_flow(&chain).is_ok());
}

#[test]
fn a_compensation_gets_the_steps_payload_unless_it_has_its_own_and_the_steps_result() {
    let flow = Uuid::now_v7();
    let step_job = NewJob::new("charge", serde_json::json!({"order": 7}));
    let refund = NewJob::new("refund", Value::Null);
    let (job, link) = compensation_job(
        flow,
        "charge",
        refund,
        Some(step_job.clone()),
        serde_json::json!({"charge_id": "ch_1"}),
    );
    assert_eq!(job.kind, "refund");
    assert_eq!(job.payload, serde_json::json!({"order": 7}));
    assert_eq!(link.flow_id, flow);
    assert_eq!(link.step, "charge");
    assert_eq!(
        link.parents,
        BTreeMap::from([(
            "charge".to_string(),
            serde_json::json!({"charge_id": "ch_1"})
        )])
    );

    let own = NewJob::new("refund", serde_json::json!({"why": "cancelled"}));
    let (job, _) = compensation_job(flow, "charge", own, Some(step_job), Value::Null);
    assert_eq!(job.payload, serde_json::json!({"why": "cancelled"}));
}
