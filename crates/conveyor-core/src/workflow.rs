//! Workflows: a flow is a directed acyclic graph of named steps, each a job (or a durable wait
//! for a signal) that starts once its parents have finished as its dependency policy accepts.
//!
//! The policy lives here, once, for every store: [`FlowGraph::apply`] takes a flow's current
//! state and one event (a step's job finished, a signal arrived, a wait timed out, the flow was
//! cancelled, a dead step was replayed) and returns the [`Effect`]s the store writes, in the
//! same transaction as the event itself. Stores load the graph (locked), apply, write; they
//! decide nothing.
//!
//! One cohesive thing, kept whole on purpose (~1,200 lines): the graph, its validation and the
//! one `apply` that every event goes through read best side by side.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

use crate::error::ValidationError;
use crate::fields;
pub use crate::job::FlowLink;
use crate::job::NewJob;
use crate::state::JobState;
use crate::validate;

/// Most steps one flow may have.
pub const MAX_FLOW_STEPS: usize = 1000;
/// Longest step name.
pub const MAX_STEP_NAME_LEN: usize = 128;
/// Longest wait for a signal: a year.
pub const MAX_WAIT_TIMEOUT_MS: u64 = 365 * 24 * 3600 * 1000;

/// What a step does when one of its parents failed (dead-lettered, cancelled, timed out).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParentFailurePolicy {
    /// The flow fails (the default).
    #[default]
    Fail,
    /// This step and every step after it are skipped; the rest of the flow goes on.
    Skip,
    /// This step runs anyway once all its parents finished; the failure stays on the parent.
    Continue,
}

/// What a flow does when it fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FlowFailurePolicy {
    /// Nothing new starts; steps already queued run to their end (the default). Replaying the
    /// failed step's dead job resumes the flow.
    #[default]
    Stop,
    /// Unfinished steps are cancelled, then each completed step's `compensate` job runs, one
    /// at a time, latest-completed first (a saga).
    Compensate,
}

/// A durable wait: the step completes when the signal arrives (its payload becomes the step's
/// result) or fails with class `timeout` once `timeout_ms` has passed since it began waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WaitSpec {
    pub signal: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

/// What a step does: run a job, or wait for a signal.
// Unboxed for the builder's sake: a flow holds at most 1,000 steps, built once.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepAction {
    Job(NewJob),
    Wait(WaitSpec),
}

/// One step of a new flow.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewStep {
    pub name: String,
    pub action: StepAction,
    /// The steps that must finish first.
    #[serde(default)]
    pub after: Vec<String>,
    #[serde(default)]
    pub on_parent_failure: ParentFailurePolicy,
    /// Run (with this step's payload unless it sets its own, and this step's result under the
    /// step's name in `parents`) when the flow compensates after this step completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensate: Option<NewJob>,
}

impl NewStep {
    /// A step that runs `job`.
    pub fn job(name: impl Into<String>, job: NewJob) -> Self {
        Self {
            name: name.into(),
            action: StepAction::Job(job),
            after: Vec::new(),
            on_parent_failure: ParentFailurePolicy::Fail,
            compensate: None,
        }
    }

    /// A step that waits for `signal` (at most `timeout_ms`, when set).
    pub fn wait(
        name: impl Into<String>,
        signal: impl Into<String>,
        timeout_ms: Option<u64>,
    ) -> Self {
        Self {
            name: name.into(),
            action: StepAction::Wait(WaitSpec {
                signal: signal.into(),
                timeout_ms,
            }),
            after: Vec::new(),
            on_parent_failure: ParentFailurePolicy::Fail,
            compensate: None,
        }
    }

    /// Starts after these steps.
    pub fn after<I, S>(mut self, parents: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.after = parents.into_iter().map(Into::into).collect();
        self
    }

    pub fn on_parent_failure(mut self, policy: ParentFailurePolicy) -> Self {
        self.on_parent_failure = policy;
        self
    }

    pub fn compensate(mut self, job: NewJob) -> Self {
        self.compensate = Some(job);
        self
    }
}

/// A flow to create. Build one with [`NewFlow::new`] and [`NewFlow::step`], or the
/// [`NewFlow::chain`] and [`NewFlow::group`] shorthands.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[non_exhaustive]
pub struct NewFlow {
    pub name: Option<String>,
    pub steps: Vec<NewStep>,
    pub on_failure: FlowFailurePolicy,
    /// A second create with the same key returns the first flow (while it is stored).
    pub idempotency_key: Option<String>,
    /// Labels kept with the flow (the server records the creating token's owner tag here).
    #[serde(default)]
    pub tags: Vec<String>,
}

impl NewFlow {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    pub fn step(mut self, step: NewStep) -> Self {
        self.steps.push(step);
        self
    }

    pub fn on_failure(mut self, policy: FlowFailurePolicy) -> Self {
        self.on_failure = policy;
        self
    }

    pub fn idempotency_key(mut self, key: impl Into<String>) -> Self {
        self.idempotency_key = Some(key.into());
        self
    }

    /// Each step after the one before it; each gets its predecessor's result in `parents`.
    pub fn chain<I, S>(steps: I) -> Self
    where
        I: IntoIterator<Item = (S, NewJob)>,
        S: Into<String>,
    {
        let mut flow = Self::new();
        let mut previous: Option<String> = None;
        for (name, job) in steps {
            let name = name.into();
            let mut step = NewStep::job(name.clone(), job);
            step.after = previous.into_iter().collect();
            previous = Some(name);
            flow.steps.push(step);
        }
        flow
    }

    /// Steps that run side by side; finish with [`Group::then`] for a callback that gets every
    /// result (a chord).
    pub fn group<I, S>(steps: I) -> Group
    where
        I: IntoIterator<Item = (S, NewJob)>,
        S: Into<String>,
    {
        Group {
            flow: Self {
                steps: steps
                    .into_iter()
                    .map(|(name, job)| NewStep::job(name, job))
                    .collect(),
                ..Self::default()
            },
        }
    }
}

/// Parallel steps waiting for their callback (see [`NewFlow::group`]).
#[derive(Debug, Clone)]
pub struct Group {
    flow: NewFlow,
}

impl Group {
    /// The callback: runs after every step of the group, with all their results.
    pub fn then(mut self, name: impl Into<String>, job: NewJob) -> NewFlow {
        let parents: Vec<String> = self.flow.steps.iter().map(|s| s.name.clone()).collect();
        self.flow.steps.push(NewStep::job(name, job).after(parents));
        self.flow
    }

    /// The group alone, without a callback.
    pub fn into_flow(self) -> NewFlow {
        self.flow
    }
}

/// A flow that passed [`validate_flow`]: names unique, parents known, no cycle, every job valid.
/// Stores take only these.
#[derive(Debug, Clone, PartialEq)]
pub struct ValidFlow(NewFlow);

impl ValidFlow {
    pub fn new(flow: NewFlow) -> Result<Self, ValidationError> {
        validate_flow(&flow)?;
        Ok(Self(flow))
    }

    pub fn flow(&self) -> &NewFlow {
        &self.0
    }

    pub fn into_flow(self) -> NewFlow {
        self.0
    }

    /// Each step's job and compensation as (its place in the HTTP body, kind, payload):
    /// `("steps[2].job", ..)`, `("steps[2].compensate", ..)`.
    pub fn step_jobs(&self) -> impl Iterator<Item = (String, &str, &serde_json::Value)> + '_ {
        self.step_new_jobs()
            .map(|(path, job)| (path, job.kind.as_str(), &job.payload))
    }

    /// Each step's and compensation's job, with its place in the request (`steps[i].job`,
    /// `steps[i].compensate`).
    pub fn step_new_jobs(&self) -> impl Iterator<Item = (String, &NewJob)> + '_ {
        self.0.steps.iter().enumerate().flat_map(|(i, step)| {
            let job = match &step.action {
                StepAction::Job(job) => Some((format!("steps[{i}].job"), job)),
                StepAction::Wait(_) => None,
            };
            let compensate = step
                .compensate
                .as_ref()
                .map(|job| (format!("steps[{i}].compensate"), job));
            job.into_iter().chain(compensate)
        })
    }

    /// The same flow with its jobs' payloads replaced by a decorator that transforms what is
    /// stored (encryption at rest); `seal` gets each step's and compensation's job.
    pub fn map_jobs(mut self, mut seal: impl FnMut(&mut NewJob)) -> Self {
        for step in &mut self.0.steps {
            if let StepAction::Job(job) = &mut step.action {
                seal(job);
            }
            if let Some(job) = &mut step.compensate {
                seal(job);
            }
        }
        self
    }
}

/// Checks a new flow; the first problem is returned with its field named as in the HTTP body
/// (`steps[2].after[0]`, `steps[0].job.kind`).
pub fn validate_flow(flow: &NewFlow) -> Result<(), ValidationError> {
    if let Some(name) = &flow.name {
        fields::name("name", name)?;
    }
    if let Some(key) = &flow.idempotency_key {
        if key.is_empty() || key.chars().count() > fields::MAX_IDEMPOTENCY_KEY_LEN {
            return Err(ValidationError::new(
                "idempotency_key",
                format!(
                    "must be 1 to {} characters",
                    fields::MAX_IDEMPOTENCY_KEY_LEN
                ),
            ));
        }
        fields::text_without_nul("idempotency_key", key)?;
    }
    if flow.tags.len() > fields::MAX_TAGS {
        return Err(ValidationError::new(
            "tags",
            format!("at most {} tags", fields::MAX_TAGS),
        ));
    }
    for tag in &flow.tags {
        fields::name("tags", tag)?;
    }
    if flow.steps.is_empty() || flow.steps.len() > MAX_FLOW_STEPS {
        return Err(ValidationError::new(
            "steps",
            format!("must hold 1 to {MAX_FLOW_STEPS} steps"),
        ));
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(flow.steps.len());
    for (i, step) in flow.steps.iter().enumerate() {
        let field = format!("steps[{i}].name");
        if step.name.is_empty() || step.name.chars().count() > MAX_STEP_NAME_LEN {
            return Err(ValidationError::new(
                field,
                format!("must be 1 to {MAX_STEP_NAME_LEN} characters"),
            ));
        }
        fields::text_without_nul(&field, &step.name)?;
        if index.insert(step.name.as_str(), i).is_some() {
            return Err(ValidationError::new(
                field,
                format!("duplicate step name {:?}", step.name),
            ));
        }
    }
    for (i, step) in flow.steps.iter().enumerate() {
        match &step.action {
            StepAction::Job(job) => step_job(&format!("steps[{i}].job"), job)?,
            StepAction::Wait(wait) => {
                fields::name(&format!("steps[{i}].wait.signal"), &wait.signal)?;
                if let Some(timeout) = wait.timeout_ms {
                    if timeout == 0 || timeout > MAX_WAIT_TIMEOUT_MS {
                        return Err(ValidationError::new(
                            format!("steps[{i}].wait.timeout_ms"),
                            format!("must be 1 to {MAX_WAIT_TIMEOUT_MS}"),
                        ));
                    }
                }
                if flow.steps.iter().enumerate().any(|(j, other)| {
                    j < i && matches!(&other.action, StepAction::Wait(w) if w.signal == wait.signal)
                }) {
                    return Err(ValidationError::new(
                        format!("steps[{i}].wait.signal"),
                        format!("another step already waits for {:?}", wait.signal),
                    ));
                }
            }
        }
        if let Some(job) = &step.compensate {
            if matches!(step.action, StepAction::Wait(_)) {
                return Err(ValidationError::new(
                    format!("steps[{i}].compensate"),
                    "a wait step has nothing to compensate",
                ));
            }
            step_job(&format!("steps[{i}].compensate"), job)?;
        }
        for (j, parent) in step.after.iter().enumerate() {
            let field = format!("steps[{i}].after[{j}]");
            match index.get(parent.as_str()) {
                None => {
                    return Err(ValidationError::new(
                        field,
                        format!("no step is named {parent:?}"),
                    ))
                }
                Some(&p) if p == i => {
                    return Err(ValidationError::new(field, "a step cannot wait for itself"))
                }
                Some(_) => {}
            }
            if step.after[..j].contains(parent) {
                return Err(ValidationError::new(
                    field,
                    format!("{parent:?} is listed twice"),
                ));
            }
        }
    }
    if let Some(i) = first_in_cycle(flow, &index) {
        return Err(ValidationError::new(
            format!("steps[{i}].after"),
            format!(
                "step {:?} depends on itself through its parents (a cycle)",
                flow.steps[i].name
            ),
        ));
    }
    Ok(())
}

fn step_job(prefix: &str, job: &NewJob) -> Result<(), ValidationError> {
    validate::new_job(job)
        .map_err(|e| ValidationError::new(format!("{prefix}.{}", e.field), e.message))?;
    if job.idempotency_key.is_some() {
        return Err(ValidationError::new(
            format!("{prefix}.idempotency_key"),
            "not allowed on a flow's job; give the flow an idempotency_key",
        ));
    }
    if job.sequence.is_some() {
        return Err(ValidationError::new(
            format!("{prefix}.sequence"),
            "not allowed on a flow's job: a flow orders its own steps (after)",
        ));
    }
    for (field, given) in [
        ("debounce", job.debounce.is_some()),
        ("throttle", job.throttle.is_some()),
    ] {
        if given {
            return Err(ValidationError::new(
                format!("{prefix}.{field}"),
                "not allowed on a flow's job: a flow runs each step once",
            ));
        }
    }
    if job.unique.is_some() {
        return Err(ValidationError::new(
            format!("{prefix}.unique"),
            "not allowed on a flow's job",
        ));
    }
    Ok(())
}

/// A step on a cycle, if there is one (Kahn's algorithm: what cannot be ordered is cyclic).
fn first_in_cycle(flow: &NewFlow, index: &HashMap<&str, usize>) -> Option<usize> {
    let n = flow.steps.len();
    let mut waiting: Vec<usize> = flow.steps.iter().map(|s| s.after.len()).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, step) in flow.steps.iter().enumerate() {
        for parent in &step.after {
            if let Some(&p) = index.get(parent.as_str()) {
                children[p].push(i);
            }
        }
    }
    let mut ready: Vec<usize> = (0..n).filter(|&i| waiting[i] == 0).collect();
    let mut ordered = 0;
    while let Some(i) = ready.pop() {
        ordered += 1;
        for &c in &children[i] {
            waiting[c] -= 1;
            if waiting[c] == 0 {
                ready.push(c);
            }
        }
    }
    (ordered < n)
        .then(|| (0..n).find(|&i| waiting[i] > 0))
        .flatten()
}

/// A flow's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum FlowState {
    Running,
    Completed,
    /// A step failed (or a compensation died): see `failed_step`.
    Failed,
    Compensating,
    Compensated,
    Cancelled,
}

impl FlowState {
    pub const ALL: [FlowState; 6] = [
        FlowState::Running,
        FlowState::Completed,
        FlowState::Failed,
        FlowState::Compensating,
        FlowState::Compensated,
        FlowState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FlowState::Running => "running",
            FlowState::Completed => "completed",
            FlowState::Failed => "failed",
            FlowState::Compensating => "compensating",
            FlowState::Compensated => "compensated",
            FlowState::Cancelled => "cancelled",
        }
    }

    /// Nothing more happens to a finished flow (a `failed` one may resume when its failed
    /// step is replayed, so it counts as finished only for waiting producers).
    pub fn is_finished(self) -> bool {
        !matches!(self, FlowState::Running | FlowState::Compensating)
    }
}

impl std::fmt::Display for FlowState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for FlowState {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        FlowState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                ValidationError::new(
                    "state",
                    format!(
                        "unknown flow state {s:?}; expected one of {}",
                        FlowState::ALL.map(FlowState::as_str).join(", ")
                    ),
                )
            })
    }
}

/// A step's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StepState {
    /// Waiting for its parents; its job does not exist yet.
    Pending,
    /// Its job is queued, running or retrying.
    Active,
    /// A wait step waiting for its signal.
    Waiting,
    Completed,
    /// Its job died, or its wait timed out.
    Failed,
    /// Skipped because a parent failed (`on_parent_failure: skip`) or was skipped.
    Skipped,
    Cancelled,
}

impl StepState {
    pub const ALL: [StepState; 7] = [
        StepState::Pending,
        StepState::Active,
        StepState::Waiting,
        StepState::Completed,
        StepState::Failed,
        StepState::Skipped,
        StepState::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StepState::Pending => "pending",
            StepState::Active => "active",
            StepState::Waiting => "waiting",
            StepState::Completed => "completed",
            StepState::Failed => "failed",
            StepState::Skipped => "skipped",
            StepState::Cancelled => "cancelled",
        }
    }

    pub fn is_finished(self) -> bool {
        matches!(
            self,
            StepState::Completed | StepState::Failed | StepState::Skipped | StepState::Cancelled
        )
    }

    /// Cancelled steps count as failures, as dead ones do.
    pub fn is_failure(self) -> bool {
        matches!(self, StepState::Failed | StepState::Cancelled)
    }
}

impl std::str::FromStr for StepState {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        StepState::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| ValidationError::new("state", format!("unknown step state {s:?}")))
    }
}

/// Where a step's compensation stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CompensationState {
    Running,
    Completed,
    Failed,
}

impl CompensationState {
    pub fn as_str(self) -> &'static str {
        match self {
            CompensationState::Running => "running",
            CompensationState::Completed => "completed",
            CompensationState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Running, Self::Completed, Self::Failed]
            .into_iter()
            .find(|state| state.as_str() == s)
    }
}

/// The job that compensates a completed step: the compensation's own spec, given the step's
/// payload when it has none (`original`, the step's job spec), linked to the flow with the
/// step's result under the step's name in `parents`. One rule for every store.
pub fn compensation_job(
    flow_id: Uuid,
    step: &str,
    mut compensate: NewJob,
    original: Option<NewJob>,
    result: Value,
) -> (NewJob, FlowLink) {
    if compensate.payload.is_null() {
        if let Some(original) = original {
            compensate.payload = original.payload;
        }
    }
    let link = FlowLink {
        flow_id,
        step: step.to_string(),
        parents: BTreeMap::from([(step.to_string(), result)]),
    };
    (compensate, link)
}

/// One step as the policy sees it: no payloads or results.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphStep {
    pub name: String,
    pub state: StepState,
    pub after: Vec<String>,
    pub on_parent_failure: ParentFailurePolicy,
    /// The step's job (reserved when the flow is created; the job exists once the step starts).
    pub job_id: Option<Uuid>,
    /// A wait step's signal.
    pub wait_signal: Option<String>,
    /// A wait step whose signal came before the step began waiting.
    pub signalled: bool,
    pub has_compensate: bool,
    pub compensation: Option<CompensationState>,
    pub compensation_job_id: Option<Uuid>,
    /// Order of completion within the flow (compensation runs latest first).
    pub completed_seq: Option<i64>,
}

/// A flow as the policy sees it, loaded (and locked) by a store for one event.
#[derive(Debug, Clone, PartialEq)]
pub struct FlowGraph {
    pub id: Uuid,
    pub state: FlowState,
    pub on_failure: FlowFailurePolicy,
    pub failed_step: Option<String>,
    pub steps: Vec<GraphStep>,
    /// Each step's parents by position, computed once per graph (the steps and their `after`
    /// never change; a store keeping a graph between events keeps this too).
    parents: Vec<Vec<usize>>,
}

/// Something that happened to a flow.
#[derive(Debug, Clone, PartialEq)]
pub enum FlowEvent {
    /// The flow was just stored: its steps without parents start.
    Created,
    /// A job of the flow finished: completed, dead or cancelled.
    JobFinished { job_id: Uuid, state: JobState },
    /// A signal arrived for the wait step named (the store has stored its payload).
    Signal { step: String },
    /// A wait step's timeout passed.
    WaitTimedOut { step: String },
    /// A dead job of the flow was replayed.
    JobReplayed { job_id: Uuid },
    /// An operator cancelled the flow.
    Cancel,
}

/// A change for the store to write, in order, in the event's transaction.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Set a step's state. `error` is recorded for failures the store cannot read from a job
    /// (a wait's timeout, a cancellation, a skip); a step completed by its job takes the job's
    /// result, one failed by its job the job's last error.
    StepState {
        step: String,
        state: StepState,
        error: Option<StepError>,
    },
    /// Start a step: insert its job (with its completed parents' results), or begin its wait.
    Start { step: String },
    /// Cancel a step's job that is queued or running (a running job loses its lease).
    CancelJob { job_id: Uuid },
    /// Insert the compensation job of a completed step.
    Compensate { step: String },
    CompensationState {
        step: String,
        state: CompensationState,
    },
    /// The flow's new state, and the step it failed at (`None` clears it).
    FlowState {
        state: FlowState,
        failed_step: Option<String>,
    },
}

/// Why a step failed, when no job says so.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepError {
    pub class: String,
    pub message: String,
}

impl StepError {
    pub fn new(class: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            class: class.into(),
            message: message.into(),
        }
    }
}

impl FlowGraph {
    pub fn new(
        id: Uuid,
        state: FlowState,
        on_failure: FlowFailurePolicy,
        failed_step: Option<String>,
        steps: Vec<GraphStep>,
    ) -> Self {
        let index: HashMap<&str, usize> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| (s.name.as_str(), i))
            .collect();
        let parents = steps
            .iter()
            .map(|s| {
                s.after
                    .iter()
                    .filter_map(|p| index.get(p.as_str()).copied())
                    .collect()
            })
            .collect();
        Self {
            id,
            state,
            on_failure,
            failed_step,
            steps,
            parents,
        }
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.steps.iter().position(|s| s.name == name)
    }

    fn set_step(
        &mut self,
        effects: &mut Vec<Effect>,
        i: usize,
        state: StepState,
        error: Option<StepError>,
    ) {
        self.steps[i].state = state;
        if state == StepState::Completed {
            let next = self
                .steps
                .iter()
                .filter_map(|s| s.completed_seq)
                .max()
                .unwrap_or(0)
                + 1;
            self.steps[i].completed_seq = Some(next);
        }
        effects.push(Effect::StepState {
            step: self.steps[i].name.clone(),
            state,
            error,
        });
    }

    fn set_flow(
        &mut self,
        effects: &mut Vec<Effect>,
        state: FlowState,
        failed_step: Option<String>,
    ) {
        self.state = state;
        self.failed_step = failed_step.clone();
        effects.push(Effect::FlowState { state, failed_step });
    }

    /// Whether the flow may be cancelled: only a running or a stopped (failed) one.
    pub fn check_cancel(&self) -> Result<(), crate::StoreError> {
        if matches!(self.state, FlowState::Running | FlowState::Failed) {
            return Ok(());
        }
        Err(crate::StoreError::FlowConflict {
            id: self.id,
            message: format!(
                "the flow is {}; only a running or failed flow can be cancelled",
                self.state
            ),
        })
    }

    /// The step a signal is for and how it will be taken: `Invalid` naming `signal` when no
    /// step waits for it, `FlowConflict` when the flow is not running or the step has had its
    /// signal (or finished).
    pub fn signal_target(
        &self,
        signal: &str,
    ) -> Result<(String, SignalOutcome), crate::StoreError> {
        let id = self.id;
        let step = self
            .steps
            .iter()
            .find(|s| s.wait_signal.as_deref() == Some(signal))
            .ok_or_else(|| {
                ValidationError::new(
                    "signal",
                    format!("no step of flow {id} waits for {signal:?}"),
                )
            })?;
        if self.state != FlowState::Running {
            return Err(crate::StoreError::FlowConflict {
                id,
                message: format!(
                    "the flow is {}; signals are taken only while it runs",
                    self.state
                ),
            });
        }
        let outcome = match step.state {
            StepState::Waiting => SignalOutcome::Delivered,
            StepState::Pending if !step.signalled => SignalOutcome::Stored,
            state => {
                let again = if step.signalled {
                    " and already signalled"
                } else {
                    ""
                };
                return Err(crate::StoreError::FlowConflict {
                    id,
                    message: format!(
                        "step {:?} is {}{again}; it takes one signal",
                        step.name,
                        state.as_str()
                    ),
                });
            }
        };
        Ok((step.name.clone(), outcome))
    }

    /// Applies one event; returns what the store must write (nothing for an event that no
    /// longer applies, such as a late completion of a job cancelled by its flow).
    pub fn apply(&mut self, event: FlowEvent) -> Vec<Effect> {
        let mut effects = Vec::new();
        match event {
            FlowEvent::Created => self.settle(&mut effects),
            FlowEvent::JobFinished { job_id, state } => {
                self.job_finished(&mut effects, job_id, state)
            }
            FlowEvent::Signal { step } => {
                if let Some(i) = self.position(&step) {
                    match self.steps[i].state {
                        StepState::Waiting => {
                            self.set_step(&mut effects, i, StepState::Completed, None);
                            self.settle(&mut effects);
                        }
                        StepState::Pending => self.steps[i].signalled = true,
                        _ => {}
                    }
                }
            }
            FlowEvent::WaitTimedOut { step } => {
                if let Some(i) = self.position(&step) {
                    if self.steps[i].state == StepState::Waiting {
                        let error = StepError::new("timeout", "the signal did not come in time");
                        self.set_step(&mut effects, i, StepState::Failed, Some(error));
                        self.settle(&mut effects);
                    }
                }
            }
            FlowEvent::JobReplayed { job_id } => {
                let Some(i) = self.steps.iter().position(|s| s.job_id == Some(job_id)) else {
                    return effects;
                };
                // Only the replay of the step the flow stopped at resumes it.
                if self.state == FlowState::Failed
                    && self.on_failure == FlowFailurePolicy::Stop
                    && self.failed_step.as_deref() == Some(self.steps[i].name.as_str())
                    && self.steps[i].state.is_failure()
                {
                    self.set_step(&mut effects, i, StepState::Active, None);
                    self.set_flow(&mut effects, FlowState::Running, None);
                    self.settle(&mut effects);
                }
            }
            FlowEvent::Cancel => {
                self.cancel_unfinished(&mut effects, "the flow was cancelled");
                self.set_flow(&mut effects, FlowState::Cancelled, self.failed_step.clone());
            }
        }
        effects
    }

    fn job_finished(&mut self, effects: &mut Vec<Effect>, job_id: Uuid, state: JobState) {
        if let Some(i) = self.steps.iter().position(|s| s.job_id == Some(job_id)) {
            if self.steps[i].state != StepState::Active {
                return;
            }
            let step_state = match state {
                JobState::Completed => StepState::Completed,
                JobState::Cancelled => StepState::Cancelled,
                _ => StepState::Failed,
            };
            let error = match state {
                JobState::Cancelled => {
                    Some(StepError::new("cancelled", "the step's job was cancelled"))
                }
                JobState::Expired => Some(StepError::new(
                    "expired",
                    "the step's job expired before it started",
                )),
                _ => None,
            };
            self.set_step(effects, i, step_state, error);
            self.settle(effects);
        } else if let Some(i) = self
            .steps
            .iter()
            .position(|s| s.compensation_job_id == Some(job_id))
        {
            if self.steps[i].compensation != Some(CompensationState::Running) {
                return;
            }
            let name = self.steps[i].name.clone();
            if state == JobState::Completed {
                self.steps[i].compensation = Some(CompensationState::Completed);
                effects.push(Effect::CompensationState {
                    step: name,
                    state: CompensationState::Completed,
                });
                if self.state == FlowState::Compensating {
                    self.next_compensation(effects);
                }
            } else {
                self.steps[i].compensation = Some(CompensationState::Failed);
                effects.push(Effect::CompensationState {
                    step: name.clone(),
                    state: CompensationState::Failed,
                });
                if self.state == FlowState::Compensating {
                    self.set_flow(effects, FlowState::Failed, Some(name));
                }
            }
        }
    }

    /// Moves every step whose parents allow it, then finishes the flow when nothing is left.
    /// Runs only while the flow runs: a failed, compensating or cancelled flow starts nothing.
    fn settle(&mut self, effects: &mut Vec<Effect>) {
        if self.state != FlowState::Running {
            return;
        }
        // A failure nobody downstream absorbs fails the flow: a failed step without children,
        // or with a child whose policy is `fail`.
        if self.steps.iter().any(|s| s.state.is_failure()) {
            // Whether each step has a child, and one whose policy is `fail`.
            let mut has_child: HashMap<&str, bool> = HashMap::new();
            for child in &self.steps {
                for parent in &child.after {
                    let strict = has_child.entry(parent.as_str()).or_insert(false);
                    *strict |= child.on_parent_failure == ParentFailurePolicy::Fail;
                }
            }
            let unabsorbed = self
                .steps
                .iter()
                .find(|s| {
                    s.state.is_failure()
                        && has_child.get(s.name.as_str()).is_none_or(|&strict| strict)
                })
                .map(|s| s.name.clone());
            if let Some(name) = unabsorbed {
                self.fail(effects, name);
                return;
            }
        }
        // Steps become ready in dependency order, so one pass in a loop until nothing moves
        // reaches a fixed point (a pre-signalled wait completes at once and frees its children).
        let parent_positions = std::mem::take(&mut self.parents);
        loop {
            let mut moved = false;
            for (i, positions) in parent_positions.iter().enumerate() {
                if self.steps[i].state != StepState::Pending {
                    continue;
                }
                let parents: Vec<StepState> =
                    positions.iter().map(|&j| self.steps[j].state).collect();
                let any_skipped = parents.contains(&StepState::Skipped);
                let any_failed = parents.iter().any(|s| s.is_failure());
                let policy = self.steps[i].on_parent_failure;
                if any_skipped || (any_failed && policy == ParentFailurePolicy::Skip) {
                    let error = StepError::new("skipped", "a parent failed or was skipped");
                    self.set_step(effects, i, StepState::Skipped, Some(error));
                    moved = true;
                } else if parents.iter().all(|s| s.is_finished()) {
                    self.start(effects, i);
                    moved = true;
                }
            }
            if !moved {
                break;
            }
        }
        self.parents = parent_positions;
        if self.steps.iter().all(|s| s.state.is_finished()) {
            self.set_flow(effects, FlowState::Completed, None);
        }
    }

    fn start(&mut self, effects: &mut Vec<Effect>, i: usize) {
        if self.steps[i].wait_signal.is_some() && self.steps[i].signalled {
            self.set_step(effects, i, StepState::Completed, None);
            return;
        }
        let state = if self.steps[i].wait_signal.is_some() {
            StepState::Waiting
        } else {
            StepState::Active
        };
        self.steps[i].state = state;
        effects.push(Effect::Start {
            step: self.steps[i].name.clone(),
        });
    }

    fn fail(&mut self, effects: &mut Vec<Effect>, step: String) {
        match self.on_failure {
            FlowFailurePolicy::Stop => self.set_flow(effects, FlowState::Failed, Some(step)),
            FlowFailurePolicy::Compensate => {
                self.cancel_unfinished(effects, "the flow is compensating");
                self.set_flow(effects, FlowState::Compensating, Some(step));
                self.next_compensation(effects);
            }
        }
    }

    fn cancel_unfinished(&mut self, effects: &mut Vec<Effect>, why: &str) {
        for i in 0..self.steps.len() {
            let state = self.steps[i].state;
            if state.is_finished() {
                continue;
            }
            if state == StepState::Active {
                if let Some(job_id) = self.steps[i].job_id {
                    effects.push(Effect::CancelJob { job_id });
                }
            }
            self.set_step(
                effects,
                i,
                StepState::Cancelled,
                Some(StepError::new("cancelled", why)),
            );
        }
    }

    /// Starts the compensation of the latest-completed step not yet compensated, or ends the
    /// flow `compensated` when none is left.
    fn next_compensation(&mut self, effects: &mut Vec<Effect>) {
        let next = self
            .steps
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.state == StepState::Completed && s.has_compensate && s.compensation.is_none()
            })
            .max_by_key(|(_, s)| s.completed_seq)
            .map(|(i, _)| i);
        match next {
            Some(i) => {
                self.steps[i].compensation = Some(CompensationState::Running);
                effects.push(Effect::Compensate {
                    step: self.steps[i].name.clone(),
                });
            }
            None => {
                let failed_step = self.failed_step.clone();
                self.set_flow(effects, FlowState::Compensated, failed_step);
            }
        }
    }
}

/// One step as shown to users.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepView {
    pub name: String,
    pub state: StepState,
    #[serde(default)]
    pub after: Vec<String>,
    pub on_parent_failure: ParentFailurePolicy,
    /// The step's job id (reserved at creation; the job exists once the step starts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_id: Option<Uuid>,
    /// The job's kind, or `None` for a wait step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait: Option<WaitSpec>,
    /// The job's state while it exists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_state: Option<JobState>,
    #[serde(default)]
    pub attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub progress: Option<crate::job::Progress>,
    /// When a wait step gives up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_deadline: Option<DateTime<Utc>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<CompensationState>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation_job_id: Option<Uuid>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
}

/// A flow as shown to users.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowView {
    pub id: Uuid,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    pub state: FlowState,
    pub on_failure: FlowFailurePolicy,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_step: Option<String>,
    #[serde(default)]
    pub tags: Vec<String>,
    pub created_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
    /// In the order they were given (empty in lists).
    #[serde(default)]
    pub steps: Vec<StepView>,
    /// How many steps are in each state.
    #[serde(default)]
    pub step_counts: BTreeMap<String, u64>,
}

/// Filters for listing flows, newest first; `after` is the last id of the previous page.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct FlowListParams {
    pub state: Option<FlowState>,
    pub name: Option<String>,
    pub limit: usize,
    pub after: Option<Uuid>,
}

impl FlowListParams {
    /// The newest `limit` flows, unfiltered.
    pub fn newest(limit: usize) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }
}

/// What creating a flow returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CreatedFlow {
    pub id: Uuid,
    /// Every step's job id by step name (wait steps have none).
    pub steps: BTreeMap<String, Uuid>,
    /// True when the idempotency key matched an existing flow, which is returned instead.
    #[serde(default)]
    pub duplicate: bool,
}

/// How a signal was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SignalOutcome {
    /// The waiting step completed with the signal's payload.
    Delivered,
    /// The step has not begun waiting yet; it completes as soon as it does.
    Stored,
}

/// When a step's wait ends: `None` without a timeout.
pub fn wait_deadline(now: DateTime<Utc>, timeout_ms: Option<u64>) -> Option<DateTime<Utc>> {
    timeout_ms.map(|ms| crate::clock::after(now, std::time::Duration::from_millis(ms)))
}

#[cfg(test)]
mod tests;
