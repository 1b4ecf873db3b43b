//! Workflows on PostgreSQL: loading a flow's graph, writing the effects
//! `conveyor_core::workflow` decides, and the flow views. Every change runs in the transaction
//! of the event that caused it (a job's completion, failure, rescue, cancellation or replay, a
//! signal, a timeout, a cancel of the flow).
//!
//! Several servers may finish steps of one flow at the same moment (the members of a fan-out).
//! Every event locks its flow's row (`SELECT ... FOR UPDATE`) before it loads the graph, so the
//! events of one flow are applied one after the other, each seeing the last one's writes: a
//! fan-in's callback starts once, from the event that finished its last parent.
//!
//! Lock order. A flow's effects may cancel its active steps' jobs, which waits for their row
//! locks; a transaction that held one of those rows while waiting for the flow would deadlock
//! with it. So a transaction that changes a job of a flow locks the flow first: completion,
//! failure, cancellation and replay read the job's flow without a lock (it never changes once
//! the job is stored), lock the flow, then change the job. Lease rescue and stale workers pick
//! their jobs locked (`FOR UPDATE SKIP LOCKED`) before they know their flows; they only try
//! the flow's lock, and leave a job whose flow is busy to their next pass. A transaction that
//! locks several flows locks them in id order.
//!
//! A batch of events (a completion batch, the replays or timed-out waits of one call) is
//! handled as a set: one statement locks all its flows in id order and reads their heads
//! (`lock_heads`), one reads all their steps, each graph takes its events in memory through
//! the policy (`FlowGraph::apply`, the only place of policy), and the effects of all flows are
//! written together, a few statements however many flows moved (`write_effects`). A
//! completion batch locks its flows before it completes their jobs, as the lock order wants.
//!
//! One cohesive thing, kept whole on purpose (~1,150 lines): loading the graphs and the one
//! `write_effects` that applies the policy's effects. Its statements are in `sql/workflow.rs`,
//! reached through `Ctx` as the operations on jobs that call in here reach theirs.

use chrono::{DateTime, Utc};
use conveyor_core::workflow::{
    compensation_job, wait_deadline, CompensationState, CreatedFlow, Effect, FlowEvent, FlowGraph,
    FlowLink, FlowListParams, FlowState, FlowView, GraphStep, SignalOutcome, StepAction, StepError,
    StepState, StepView, ValidFlow, WaitSpec,
};
use conveyor_core::{Job, JobState, NewJob, StoreError, StoreResult, ValidationError};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, PgConnection, Row};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::str::FromStr;
use uuid::Uuid;

use crate::ctx::{notify, Ctx};
use crate::errors::db;
use crate::jobs::store_exactly;
use crate::sql::HEAD_COLUMNS;

/// A backend error for a flow row that cannot be read back.
fn unreadable(what: impl std::fmt::Display) -> StoreError {
    StoreError::backend(format!("postgres: unreadable flow row: {what}"))
}

/// Reads column `name` of a flow or step row, naming it in the error.
fn column<'r, T>(row: &'r PgRow, name: &str) -> StoreResult<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(name)
        .map_err(|e| unreadable(format!("column {name}: {e}")))
}

/// A policy as stored: its serde name (`stop`, `compensate`, `fail`, `skip`, `continue`).
fn policy_text<T: serde::Serialize>(policy: &T) -> StoreResult<String> {
    match serde_json::to_value(policy) {
        Ok(Value::String(text)) => Ok(text),
        _ => Err(StoreError::backend(
            "postgres: a flow policy did not serialize to a string",
        )),
    }
}

fn policy_of<T: serde::de::DeserializeOwned>(text: String) -> StoreResult<T> {
    serde_json::from_value(Value::String(text.clone()))
        .map_err(|e| unreadable(format!("policy {text:?}: {e}")))
}

fn flow_state(text: &str) -> StoreResult<FlowState> {
    FlowState::from_str(text).map_err(unreadable)
}

fn step_state(text: &str) -> StoreResult<StepState> {
    StepState::from_str(text).map_err(unreadable)
}

/// A stored compensation state, `None` when the step has none.
fn compensation_of(text: Option<String>) -> StoreResult<Option<CompensationState>> {
    text.map(|text| {
        CompensationState::parse(&text).ok_or_else(|| unreadable(format!("compensation {text:?}")))
    })
    .transpose()
}

/// `now` plus a stored timeout (positive: the column is checked).
fn deadline(now: DateTime<Utc>, timeout_ms: Option<i64>) -> Option<DateTime<Utc>> {
    wait_deadline(now, timeout_ms.map(|ms| ms.max(0) as u64))
}

/// Locks the flows `ids` (those that exist), in id order, until the transaction ends.
pub(crate) async fn lock_flows(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    mut ids: Vec<Uuid>,
) -> StoreResult<()> {
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query(ctx.sql.workflow.lock_many.clone())
        .bind(&ids)
        .fetch_all(conn)
        .await
        .map_err(db("lock flows"))?;
    Ok(())
}

/// Locks flow `id` unless another transaction holds it: true when this transaction now holds
/// it (or the flow does not exist, so there is nothing to wait for), false when it is busy.
/// For transactions that already hold job rows (see the module's lock order).
pub(crate) async fn try_lock_flow(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    id: Uuid,
) -> StoreResult<bool> {
    let locked: Option<Uuid> = sqlx::query_scalar(ctx.sql.workflow.try_lock.clone())
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("try to lock a flow"))?;
    if locked.is_some() {
        return Ok(true);
    }
    let exists: bool = sqlx::query_scalar(ctx.sql.workflow.exists.clone())
        .bind(id)
        .fetch_one(conn)
        .await
        .map_err(db("look up a flow"))?;
    Ok(!exists)
}

/// Creates a flow and starts its steps without parents, in the caller's transaction.
pub(crate) async fn create(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flow: ValidFlow,
) -> StoreResult<CreatedFlow> {
    let flow = flow.into_flow();
    let sql = &ctx.sql.workflow;
    let id = Uuid::now_v7();
    let stored: Option<Uuid> = sqlx::query_scalar(sql.insert_flow.clone())
        .bind(id)
        .bind(flow.name.as_deref())
        .bind(policy_text(&flow.on_failure)?)
        .bind(flow.idempotency_key.as_deref())
        .bind(&flow.tags)
        .bind(ctx.now)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("insert flow"))?;
    if stored.is_none() {
        // Only the idempotency key can conflict: return the flow holding it.
        let existing: Option<Uuid> = match &flow.idempotency_key {
            Some(key) => sqlx::query_scalar(sql.flow_by_key.clone())
                .bind(key)
                .fetch_optional(&mut *conn)
                .await
                .map_err(db("find flow by idempotency key"))?,
            None => None,
        };
        let existing = existing.ok_or_else(|| {
            StoreError::backend("postgres: a flow insert conflicted, but no flow holds its key")
        })?;
        return Ok(CreatedFlow {
            id: existing,
            steps: step_jobs(conn, ctx, existing).await?,
            duplicate: true,
        });
    }

    let n = flow.steps.len();
    let mut names = Vec::with_capacity(n);
    let mut positions = Vec::with_capacity(n);
    let mut afters = Vec::with_capacity(n);
    let mut policies = Vec::with_capacity(n);
    let mut job_ids = Vec::with_capacity(n);
    let mut jobs = Vec::with_capacity(n);
    let mut compensates = Vec::with_capacity(n);
    let mut signals = Vec::with_capacity(n);
    let mut timeouts = Vec::with_capacity(n);
    let mut steps = BTreeMap::new();
    for (position, step) in flow.steps.iter().enumerate() {
        names.push(step.name.as_str());
        positions.push(
            i32::try_from(position).map_err(|_| ValidationError::new("steps", "too many steps"))?,
        );
        afters.push(Json(&step.after));
        policies.push(policy_text(&step.on_parent_failure)?);
        compensates.push(step.compensate.as_ref().map(Json));
        match &step.action {
            StepAction::Job(job) => {
                // The job's id is reserved now, so the caller can follow every step at once;
                // the job itself is inserted when the step starts.
                let job_id = Uuid::now_v7();
                steps.insert(step.name.clone(), job_id);
                job_ids.push(Some(job_id));
                jobs.push(Some(Json(job)));
                signals.push(None);
                timeouts.push(None);
            }
            StepAction::Wait(wait) => {
                job_ids.push(None);
                jobs.push(None);
                signals.push(Some(wait.signal.as_str()));
                timeouts.push(
                    wait.timeout_ms
                        .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
                );
            }
        }
    }
    sqlx::query(sql.insert_steps.clone())
        .bind(id)
        .bind(&names)
        .bind(&positions)
        .bind(&afters)
        .bind(&policies)
        .bind(&job_ids)
        .bind(&jobs)
        .bind(&compensates)
        .bind(&signals)
        .bind(&timeouts)
        .execute(&mut *conn)
        .await
        .map_err(db("insert flow steps"))?;
    handle(conn, ctx, id, FlowEvent::Created).await?;
    Ok(CreatedFlow {
        id,
        steps,
        duplicate: false,
    })
}

/// Every job step's reserved job id by name.
async fn step_jobs(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flow_id: Uuid,
) -> StoreResult<BTreeMap<String, Uuid>> {
    let rows = sqlx::query(ctx.sql.workflow.step_jobs.clone())
        .bind(flow_id)
        .fetch_all(conn)
        .await
        .map_err(db("read flow step jobs"))?;
    rows.iter()
        .map(|row| Ok((column(row, "name")?, column(row, "job_id")?)))
        .collect()
}

/// A flow's head as read under its lock: everything of its graph but the steps.
pub(crate) struct Head {
    id: Uuid,
    state: FlowState,
    on_failure: conveyor_core::workflow::FlowFailurePolicy,
    failed_step: Option<String>,
}

/// The planner settings a flow event changes for the rest of its transaction (see
/// `plan_flow_statements`), as they are now: for a caller's own transaction, which keeps them
/// through the savepoint's release, to get them back (`restore_planner`).
pub(crate) async fn planner_settings(conn: &mut PgConnection) -> StoreResult<[String; 4]> {
    let row = sqlx::query(
        "SELECT current_setting('plan_cache_mode'), current_setting('enable_hashjoin'), \
             current_setting('enable_mergejoin'), current_setting('jit')",
    )
    .fetch_one(conn)
    .await
    .map_err(db("read planner settings"))?;
    let read = |i: usize| -> StoreResult<String> {
        row.try_get::<String, _>(i)
            .map_err(|e| unreadable(e.to_string()))
    };
    Ok([read(0)?, read(1)?, read(2)?, read(3)?])
}

/// Puts back planner settings read by `planner_settings`, for the rest of the transaction.
pub(crate) async fn restore_planner(
    conn: &mut PgConnection,
    settings: &[String; 4],
) -> StoreResult<()> {
    sqlx::query(
        "SELECT set_config('plan_cache_mode', $1, true), set_config('enable_hashjoin', $2, true), \
             set_config('enable_mergejoin', $3, true), set_config('jit', $4, true)",
    )
    .bind(&settings[0])
    .bind(&settings[1])
    .bind(&settings[2])
    .bind(&settings[3])
    .execute(conn)
    .await
    .map_err(db("restore planner settings"))?;
    Ok(())
}

/// Locks the flows `ids` (those that exist) in id order, in one statement, and reads their
/// heads. The locks are held until the transaction ends, so the heads stay true for it. The
/// first statement of every flow event: see the module's lock order.
pub(crate) async fn lock_heads(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    mut ids: Vec<Uuid>,
) -> StoreResult<Vec<Head>> {
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let rows = sqlx::query(ctx.sql.workflow.lock_heads.clone())
        .bind(&ids)
        .fetch_all(conn)
        .await
        .map_err(db("lock flows"))?;
    rows.iter()
        .map(|row| {
            Ok(Head {
                id: column(row, "id")?,
                state: flow_state(&column::<String>(row, "state")?)?,
                on_failure: policy_of(column(row, "on_failure")?)?,
                failed_step: column(row, "failed_step")?,
            })
        })
        .collect()
}

/// The graphs of the flows whose heads were locked, as the policy sees them, by id: all their
/// steps in one statement. Run after the lock (a statement of its own, so that it reads the
/// steps as the last holder of the lock left them) and after `plan_flow_statements`.
async fn load_graphs(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    heads: Vec<Head>,
) -> StoreResult<BTreeMap<Uuid, FlowGraph>> {
    if heads.is_empty() {
        return Ok(BTreeMap::new());
    }
    let ids: Vec<Uuid> = heads.iter().map(|head| head.id).collect();
    let rows = sqlx::query(ctx.sql.workflow.graph_steps.clone())
        .bind(&ids)
        .fetch_all(conn)
        .await
        .map_err(db("load flow steps"))?;
    // Each flow's steps in their order in the flow, sorted here rather than by the server
    // (a sort of every row of the batch, on the database's cores).
    let mut steps: HashMap<Uuid, Vec<(i32, GraphStep)>> = HashMap::with_capacity(heads.len());
    for row in &rows {
        let compensation: Option<String> = column(row, "compensation")?;
        steps.entry(column(row, "flow_id")?).or_default().push((
            column(row, "position")?,
            GraphStep {
                name: column(row, "name")?,
                state: step_state(&column::<String>(row, "state")?)?,
                after: column(row, "after")?,
                on_parent_failure: policy_of(column(row, "on_parent_failure")?)?,
                job_id: column(row, "job_id")?,
                wait_signal: column(row, "wait_signal")?,
                signalled: column(row, "signalled")?,
                has_compensate: column(row, "has_compensate")?,
                compensation: compensation_of(compensation)?,
                compensation_job_id: column(row, "compensation_job_id")?,
                completed_seq: column(row, "completed_seq")?,
            },
        ));
    }
    Ok(heads
        .into_iter()
        .map(|head| {
            let mut found = steps.remove(&head.id).unwrap_or_default();
            found.sort_unstable_by_key(|(position, _)| *position);
            let graph = FlowGraph::new(
                head.id,
                head.state,
                head.on_failure,
                head.failed_step,
                found.into_iter().map(|(_, step)| step).collect(),
            );
            (head.id, graph)
        })
        .collect())
}

/// Sets the planner up for the rest of the transaction as flow statements need it: custom
/// plans, joins as nested loops only, no JIT.
///
/// The statements that write a flow's steps find them by joining the table to the (flow,
/// step) pairs they are given. A plan cached while the table was small (PostgreSQL's generic
/// plan, after five runs of a prepared statement on one connection) hashes the whole table
/// and keeps doing so as it grows: seen at a second per completion batch once a benchmark
/// had filled it, where the index probes take milliseconds, and nothing re-plans it while
/// the table has no statistics (the server's autovacuum off). Planned for each run, with
/// the batch's own sizes, these joins probe the primary key. Even planned afresh, a join of
/// a batch of (flow, step) keys to the steps table was costed as a hash of the whole table
/// (every completion batch of a benchmark hashed all 5,000 steps there were, 6 ms, and it
/// grows with the table), where probing the key is 3 us a step: every statement of a flow
/// event is driven by a handful of keys, so this transaction plans joins as nested loops
/// only. For the rest of this transaction, which moves flows; a savepoint's transaction
/// keeps it until it ends, which only changes how its later statements are planned.
/// JIT compilation is off as well: the steps table's estimates, without statistics, passed
/// its threshold, and compiling the graph read cost 130 ms where running it took 7.
/// Set after the lock, not with it: the lock's other callers go on with statements of their
/// own. A completion batch sets them before it completes its jobs (`ops::leases`), whose
/// statement is written to be planned as key probes under them; every other flow event right
/// after its lock (`handle_many`, `load_graph`).
pub(crate) async fn plan_flow_statements(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
) -> StoreResult<()> {
    sqlx::query(ctx.sql.workflow.custom_plans.clone())
        .execute(conn)
        .await
        .map_err(db("plan flow statements"))?;
    Ok(())
}

/// One flow's graph, its row locked until the transaction ends; `None` when there is no such
/// flow.
async fn load_graph(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flow_id: Uuid,
) -> StoreResult<Option<FlowGraph>> {
    let heads = lock_heads(&mut *conn, ctx, vec![flow_id]).await?;
    if heads.is_empty() {
        return Ok(None);
    }
    plan_flow_statements(&mut *conn, ctx).await?;
    Ok(load_graphs(conn, ctx, heads).await?.remove(&flow_id))
}

/// Applies one event to a flow (locking it first) and writes what the policy decided. Returns
/// whether anything changed (false for an event that no longer applies, or a missing flow).
/// Must run inside a transaction, the event's own.
pub(crate) async fn handle(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flow_id: Uuid,
    event: FlowEvent,
) -> StoreResult<bool> {
    let changed = handle_many(conn, ctx, vec![(flow_id, event)]).await?;
    Ok(changed.first().copied().unwrap_or(false))
}

/// Applies events to their flows, locking every flow first (in id order), and writes what the
/// policy decided for all of them together (see `write_effects`). Returns, per event, whether
/// it changed anything. Must run inside a transaction, the events' own.
pub(crate) async fn handle_many(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    events: Vec<(Uuid, FlowEvent)>,
) -> StoreResult<Vec<bool>> {
    let heads = lock_heads(&mut *conn, ctx, events.iter().map(|(id, _)| *id).collect()).await?;
    if !heads.is_empty() {
        plan_flow_statements(&mut *conn, ctx).await?;
    }
    handle_locked(conn, ctx, heads, events).await
}

/// `handle_many` for flows whose heads the transaction has locked already (`lock_heads`, taken
/// before the jobs whose events these are: see the module's lock order), with the planner set
/// up for flow statements (`plan_flow_statements`). Every graph is loaded
/// once, takes its events in the order given (each seeing the ones before it, in memory, as
/// it would after writing them: none of these events can concern a job that the earlier ones
/// created, as such a job did not exist when the event happened), and all effects are written
/// together. An event of a flow that was not locked (there is no such flow) changes nothing.
pub(crate) async fn handle_locked(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    heads: Vec<Head>,
    events: Vec<(Uuid, FlowEvent)>,
) -> StoreResult<Vec<bool>> {
    let mut graphs = load_graphs(&mut *conn, ctx, heads).await?;
    let mut effects: BTreeMap<Uuid, Vec<Effect>> = BTreeMap::new();
    let mut changed = Vec::with_capacity(events.len());
    for (flow_id, event) in events {
        let Some(graph) = graphs.get_mut(&flow_id) else {
            changed.push(false);
            continue;
        };
        let decided = graph.apply(event);
        changed.push(!decided.is_empty());
        effects.entry(flow_id).or_default().extend(decided);
    }
    let flows = effects
        .into_iter()
        .filter_map(|(id, effects)| graphs.get(&id).map(|graph| (graph, effects)))
        .collect();
    write_effects(conn, ctx, flows).await?;
    Ok(changed)
}

/// The flow hook for a job that reached `job.state`: tells its flow when the job belongs to
/// one and has finished (completed, dead, cancelled). Plain jobs, and jobs that will run again,
/// cost nothing. The caller's transaction must hold the flow's lock or be free to wait for it
/// (see the module's lock order).
pub(crate) async fn job_finished(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    job: &Job,
) -> StoreResult<()> {
    match &job.flow {
        Some(link) if job.state.is_finished() => {
            let event = FlowEvent::JobFinished {
                job_id: job.id,
                state: job.state,
            };
            handle(conn, ctx, link.flow_id, event).await?;
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A step's new state, as an `Effect::StepState` gives it, with the order of completion the
/// policy gave the step (stored only when it completed).
struct StepChange {
    step: String,
    state: StepState,
    error: Option<StepError>,
    seq: Option<i64>,
}

/// A run of one flow's effects, in order.
enum Segment {
    /// Step changes, starts and at most one flow state, touching each step once, so that
    /// writing them as all step changes, then all starts, then the flow state, is the same as
    /// writing them in order (see `Cutter`). Runs of many flows are written together.
    Plain(Plain),
    /// Rare effects (the flow is failing, compensating or being cancelled), written one by
    /// one, in order.
    Ordered(Vec<Rare>),
}

#[derive(Default)]
struct Plain {
    steps: Vec<StepChange>,
    starts: Vec<String>,
    flow: Option<(FlowState, Option<String>)>,
}

enum Rare {
    CancelJob(Uuid),
    Compensate(String),
    CompensationState(String, CompensationState),
}

/// Cuts one flow's effects into segments, in order. A plain segment ends before an effect
/// that would make writing it out of order differ from writing it in order: a second change
/// or start of a step it touched (a step changed twice is written twice, in order), a second
/// flow state, a change of a parent of a step it started (the start reads the parent's result
/// as it was before; the policy never does this, as a parent has finished before its child
/// starts), or a rare effect.
struct Cutter<'g> {
    steps: HashMap<&'g str, &'g GraphStep>,
    out: Vec<Segment>,
    plain: Plain,
    touched: HashSet<String>,
    started_parents: HashSet<&'g str>,
}

impl<'g> Cutter<'g> {
    fn cut(graph: &'g FlowGraph, effects: Vec<Effect>) -> Vec<Segment> {
        let mut cutter = Cutter {
            steps: graph.steps.iter().map(|s| (s.name.as_str(), s)).collect(),
            out: Vec::new(),
            plain: Plain::default(),
            touched: HashSet::new(),
            started_parents: HashSet::new(),
        };
        for effect in effects {
            cutter.push(effect);
        }
        cutter.close();
        cutter.out
    }

    fn push(&mut self, effect: Effect) {
        match effect {
            Effect::StepState { step, state, error } => {
                if self.touched.contains(&step) || self.started_parents.contains(step.as_str()) {
                    self.close();
                }
                self.touched.insert(step.clone());
                let seq = self.steps.get(step.as_str()).and_then(|s| s.completed_seq);
                self.plain.steps.push(StepChange {
                    step,
                    state,
                    error,
                    seq,
                });
            }
            Effect::Start { step } => {
                if self.touched.contains(&step) {
                    self.close();
                }
                if let Some(s) = self.steps.get(step.as_str()) {
                    self.started_parents
                        .extend(s.after.iter().map(String::as_str));
                }
                self.touched.insert(step.clone());
                self.plain.starts.push(step);
            }
            Effect::FlowState { state, failed_step } => {
                if self.plain.flow.is_some() {
                    self.close();
                }
                self.plain.flow = Some((state, failed_step));
            }
            Effect::CancelJob { job_id } => self.rare(Rare::CancelJob(job_id)),
            Effect::Compensate { step } => self.rare(Rare::Compensate(step)),
            Effect::CompensationState { step, state } => {
                self.rare(Rare::CompensationState(step, state))
            }
        }
    }

    fn rare(&mut self, rare: Rare) {
        self.close();
        match self.out.last_mut() {
            Some(Segment::Ordered(rares)) => rares.push(rare),
            _ => self.out.push(Segment::Ordered(vec![rare])),
        }
    }

    /// Ends the current plain segment.
    fn close(&mut self) {
        let plain = std::mem::take(&mut self.plain);
        if !plain.steps.is_empty() || !plain.starts.is_empty() || plain.flow.is_some() {
            self.out.push(Segment::Plain(plain));
        }
        self.touched.clear();
        self.started_parents.clear();
    }
}

/// The plain segments of many flows, gathered to be written by one statement of each kind.
#[derive(Default)]
struct PlainBatch {
    step_flows: Vec<Uuid>,
    step_names: Vec<String>,
    step_states: Vec<&'static str>,
    step_finished: Vec<Option<DateTime<Utc>>>,
    step_seqs: Vec<Option<i64>>,
    step_errors: Vec<Option<Json<StepError>>>,
    starts: Vec<(Uuid, String)>,
    flow_ids: Vec<Uuid>,
    flow_states: Vec<&'static str>,
    flow_failed: Vec<Option<String>>,
    flow_finished: Vec<Option<DateTime<Utc>>>,
}

impl PlainBatch {
    fn add(&mut self, now: DateTime<Utc>, flow_id: Uuid, plain: Plain) {
        for change in plain.steps {
            self.step_flows.push(flow_id);
            self.step_names.push(change.step);
            self.step_states.push(change.state.as_str());
            self.step_finished
                .push(change.state.is_finished().then_some(now));
            self.step_seqs.push(change.seq);
            self.step_errors.push(change.error.map(Json));
        }
        self.starts
            .extend(plain.starts.into_iter().map(|step| (flow_id, step)));
        if let Some((state, failed_step)) = plain.flow {
            self.flow_ids.push(flow_id);
            self.flow_states.push(state.as_str());
            self.flow_failed.push(failed_step);
            self.flow_finished.push(state.is_finished().then_some(now));
        }
    }
}

/// Writes the effects of flows, each flow's in order. Each flow's effects are cut into
/// segments (`Cutter`); the first segments of all flows are written, then the second ones,
/// and so on. Flows share no rows, so only each flow's own order matters. Plain segments of
/// one round are written together: one statement for all step changes, one start (a read and
/// an insert of all new jobs) and one for all flow states, so a completion batch costs the
/// same few round trips however many flows it moves. Ordered segments (rare) are written
/// effect by effect.
async fn write_effects(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flows: Vec<(&FlowGraph, Vec<Effect>)>,
) -> StoreResult<()> {
    let mut queues: Vec<(Uuid, VecDeque<Segment>)> = flows
        .into_iter()
        .map(|(graph, effects)| (graph.id, Cutter::cut(graph, effects).into()))
        .collect();
    loop {
        let mut batch = PlainBatch::default();
        let mut any = false;
        for (flow_id, queue) in &mut queues {
            match queue.pop_front() {
                Some(Segment::Plain(plain)) => batch.add(ctx.now, *flow_id, plain),
                Some(Segment::Ordered(rares)) => {
                    write_ordered(&mut *conn, ctx, *flow_id, rares).await?
                }
                None => continue,
            }
            any = true;
        }
        if !any {
            return Ok(());
        }
        write_plain(&mut *conn, ctx, batch).await?;
    }
}

/// Writes rare effects of one flow, one by one in order.
async fn write_ordered(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flow_id: Uuid,
    effects: Vec<Rare>,
) -> StoreResult<()> {
    for effect in effects {
        match effect {
            // The flow is cancelling its own step: the hook must not hear of it again.
            Rare::CancelJob(job_id) => {
                sqlx::query(ctx.sql.cancel_unhooked.clone())
                    .bind(ctx.now)
                    .bind(job_id)
                    .execute(&mut *conn)
                    .await
                    .map_err(db("cancel a flow's job"))?;
            }
            Rare::Compensate(step) => compensate(&mut *conn, ctx, flow_id, &step).await?,
            Rare::CompensationState(step, state) => {
                sqlx::query(ctx.sql.workflow.compensation_state.clone())
                    .bind(state.as_str())
                    .bind(flow_id)
                    .bind(&step)
                    .execute(&mut *conn)
                    .await
                    .map_err(db("record a compensation"))?;
            }
        }
    }
    Ok(())
}

/// Writes the plain segments of one round: every step change in one statement, then every
/// start, then every flow state in one statement (see `Segment::Plain` for why this order is
/// the effects' own).
async fn write_plain(conn: &mut PgConnection, ctx: &Ctx<'_>, batch: PlainBatch) -> StoreResult<()> {
    let sql = &ctx.sql.workflow;
    if !batch.step_names.is_empty() {
        sqlx::query(sql.set_steps.clone())
            .bind(&batch.step_flows)
            .bind(&batch.step_names)
            .bind(&batch.step_states)
            .bind(&batch.step_finished)
            .bind(&batch.step_seqs)
            .bind(&batch.step_errors)
            .execute(&mut *conn)
            .await
            .map_err(db("record flow steps' states"))?;
    }
    if !batch.starts.is_empty() {
        start_steps(&mut *conn, ctx, &batch.starts).await?;
    }
    if !batch.flow_ids.is_empty() {
        sqlx::query(sql.flow_state.clone())
            .bind(&batch.flow_ids)
            .bind(&batch.flow_states)
            .bind(&batch.flow_failed)
            .bind(&batch.flow_finished)
            .execute(conn)
            .await
            .map_err(db("record flows' states"))?;
    }
    Ok(())
}

/// Starts steps of any number of flows, `(flow, step)` each once: marks them and reads their
/// specs and their completed parents' results in one statement, inserts every job step's job
/// (under its reserved id, with those results) in one import, and gives each wait step its
/// deadline.
async fn start_steps(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    starting: &[(Uuid, String)],
) -> StoreResult<()> {
    let sql = &ctx.sql.workflow;
    let (flows, names): (Vec<Uuid>, Vec<&str>) = starting
        .iter()
        .map(|(flow, name)| (*flow, name.as_str()))
        .unzip();
    let rows = sqlx::query(sql.start_steps.clone())
        .bind(&flows)
        .bind(&names)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("start flow steps"))?;
    struct Starting {
        job: Option<NewJob>,
        job_id: Option<Uuid>,
        after: Vec<String>,
        wait_timeout_ms: Option<i64>,
    }
    let mut specs: HashMap<(Uuid, String), Starting> = HashMap::with_capacity(starting.len());
    let mut results: HashMap<Uuid, HashMap<String, Value>> = HashMap::new();
    for row in &rows {
        let key = (column(row, "flow_id")?, column(row, "name")?);
        if column(row, "starting")? {
            let job: Option<Json<NewJob>> = column(row, "job")?;
            specs.insert(
                key,
                Starting {
                    job: job.map(|Json(job)| job),
                    job_id: column(row, "job_id")?,
                    after: column(row, "after")?,
                    wait_timeout_ms: column(row, "wait_timeout_ms")?,
                },
            );
        } else {
            // A completed parent without a result is handed on as null.
            let result: Option<Json<Value>> = column(row, "result")?;
            results
                .entry(key.0)
                .or_default()
                .insert(key.1, result.map_or(Value::Null, |Json(v)| v));
        }
    }
    let mut jobs = Vec::new();
    let mut wait_flows = Vec::new();
    let mut waiting = Vec::new();
    let mut deadlines = Vec::new();
    for (flow_id, name) in starting {
        let step = specs
            .remove(&(*flow_id, name.clone()))
            .ok_or_else(|| unreadable(format!("flow {flow_id} has no step {name:?}")))?;
        match (step.job, step.job_id) {
            (Some(job), Some(job_id)) => {
                // Only completed parents have a result; a failed one the step runs despite
                // (`continue`) is absent.
                let done = results.get(flow_id);
                let parents = step
                    .after
                    .into_iter()
                    .filter_map(|p| {
                        let result = done?.get(&p)?.clone();
                        Some((p, result))
                    })
                    .collect();
                let link = FlowLink {
                    flow_id: *flow_id,
                    step: name.clone(),
                    parents,
                };
                jobs.push(flow_job(ctx.now, job, job_id, link));
            }
            _ => {
                wait_flows.push(*flow_id);
                waiting.push(name.as_str());
                deadlines.push(deadline(ctx.now, step.wait_timeout_ms));
            }
        }
    }
    if !jobs.is_empty() {
        // Queue depth limits do not apply: the flows were accepted whole when created.
        import_flow_jobs(&mut *conn, ctx, jobs).await?;
    }
    if !waiting.is_empty() {
        sqlx::query(sql.begin_waits.clone())
            .bind(&wait_flows)
            .bind(&waiting)
            .bind(&deadlines)
            .execute(conn)
            .await
            .map_err(db("begin flow waits"))?;
    }
    Ok(())
}

/// Stores the jobs of flows' steps as they start, as an import does: their wake-ups go where
/// the operation defers them (`Ctx::deferred_wakeups`), or else are sent in the transaction,
/// and the jobs stored wait for the commit to be told of (`Ctx::flow_started`).
async fn import_flow_jobs(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    jobs: Vec<Job>,
) -> StoreResult<()> {
    let (stored, woken) = store_exactly(&mut *conn, ctx.sql, &jobs).await?;
    if let Some(started) = &ctx.flow_started {
        let stored: HashSet<Uuid> = stored.into_iter().collect();
        started.keep(jobs.into_iter().filter(|job| stored.contains(&job.id)));
    }
    match ctx.deferred_wakeups {
        Some(deferred) => deferred
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .extend(woken),
        None => notify(conn, ctx.sql, &woken).await?,
    }
    Ok(())
}

/// A flow's job as it is stored when its step (or compensation) starts.
fn flow_job(now: DateTime<Utc>, new: NewJob, id: Uuid, link: FlowLink) -> Job {
    let mut job = new.into_stored(id, now);
    job.flow = Some(link);
    job
}

/// Inserts the compensation job of a completed step: its own payload or else the step's, and
/// the step's result under the step's name in `parents`.
async fn compensate(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flow_id: Uuid,
    step: &str,
) -> StoreResult<()> {
    let sql = &ctx.sql.workflow;
    let row = sqlx::query(sql.compensation_row.clone())
        .bind(flow_id)
        .bind(step)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("read a step to compensate"))?
        .ok_or_else(|| unreadable(format!("flow {flow_id} has no step {step:?}")))?;
    let Some(Json(compensate)) = column::<Option<Json<NewJob>>>(&row, "compensate")? else {
        return Ok(());
    };
    let original = column::<Option<Json<NewJob>>>(&row, "job")?.map(|Json(job)| job);
    let result = column::<Option<Json<Value>>>(&row, "result")?.map_or(Value::Null, |Json(v)| v);
    let (job, link) = compensation_job(flow_id, step, compensate, original, result);
    let id = Uuid::now_v7();
    import_flow_jobs(&mut *conn, ctx, vec![flow_job(ctx.now, job, id, link)]).await?;
    sqlx::query(sql.compensation_started.clone())
        .bind(id)
        .bind(flow_id)
        .bind(step)
        .execute(conn)
        .await
        .map_err(db("start a compensation"))?;
    Ok(())
}

/// Cancels a running or failed flow. Must run inside a transaction.
pub(crate) async fn cancel(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    id: Uuid,
) -> StoreResult<FlowView> {
    let mut graph = load_graph(&mut *conn, ctx, id)
        .await?
        .ok_or(StoreError::FlowNotFound(id))?;
    graph.check_cancel()?;
    let effects = graph.apply(FlowEvent::Cancel);
    write_effects(&mut *conn, ctx, vec![(&graph, effects)]).await?;
    view(conn, ctx, id)
        .await?
        .ok_or(StoreError::FlowNotFound(id))
}

/// Delivers a signal to the flow's step waiting for it. Must run inside a transaction.
pub(crate) async fn signal(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    id: Uuid,
    signal: &str,
    payload: &Value,
) -> StoreResult<SignalOutcome> {
    let mut graph = load_graph(&mut *conn, ctx, id)
        .await?
        .ok_or(StoreError::FlowNotFound(id))?;
    let (name, outcome) = graph.signal_target(signal)?;
    // The payload becomes the step's result: now when it is waiting, or when it begins to.
    sqlx::query(ctx.sql.workflow.signal.clone())
        .bind(Json(payload))
        .bind(id)
        .bind(&name)
        .execute(&mut *conn)
        .await
        .map_err(db("store a signal"))?;
    let effects = graph.apply(FlowEvent::Signal { step: name });
    write_effects(conn, ctx, vec![(&graph, effects)]).await?;
    Ok(outcome)
}

/// Fails up to `limit` wait steps whose deadline passed (earliest first). Returns how many it
/// failed: a wait another pass already ended is not counted, so a maintenance loop that runs
/// until a short batch ends. Must run inside a transaction.
pub(crate) async fn expire_waits(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    limit: usize,
) -> StoreResult<u64> {
    let rows = sqlx::query(ctx.sql.workflow.due_waits.clone())
        .bind(ctx.now)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *conn)
        .await
        .map_err(db("find expired flow waits"))?;
    let due: Vec<(Uuid, String)> = rows
        .iter()
        .map(|row| Ok((column(row, "flow_id")?, column(row, "name")?)))
        .collect::<StoreResult<_>>()?;
    // All of them together, locked up front in id order (handling them one by one in deadline
    // order would lock them in an order another transaction might reverse).
    let events = due
        .into_iter()
        .map(|(flow_id, step)| (flow_id, FlowEvent::WaitTimedOut { step }))
        .collect();
    let changed = handle_many(conn, ctx, events).await?;
    Ok(changed.into_iter().filter(|&c| c).count() as u64)
}

/// Deletes finished flows past their retention, with their steps (see `FlowStore::flows_prune`).
pub(crate) async fn prune(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: &conveyor_core::PruneParams,
) -> StoreResult<u64> {
    let result = sqlx::query(ctx.sql.workflow.prune.clone())
        .bind(conveyor_core::clock::before(
            ctx.now,
            params.retention.completed,
        ))
        .bind(conveyor_core::clock::before(ctx.now, params.retention.dead))
        .bind(i64::try_from(params.limit).unwrap_or(i64::MAX))
        .execute(conn)
        .await
        .map_err(db("prune flows"))?;
    Ok(result.rows_affected())
}

fn head_view(row: &PgRow) -> StoreResult<FlowView> {
    Ok(FlowView {
        id: column(row, "id")?,
        name: column(row, "name")?,
        state: flow_state(&column::<String>(row, "state")?)?,
        on_failure: policy_of(column(row, "on_failure")?)?,
        failed_step: column(row, "failed_step")?,
        tags: column(row, "tags")?,
        created_at: column(row, "created_at")?,
        finished_at: column(row, "finished_at")?,
        steps: Vec::new(),
        step_counts: BTreeMap::new(),
    })
}

/// A flow with every step, its job's state, attempts and progress.
pub(crate) async fn view(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    id: Uuid,
) -> StoreResult<Option<FlowView>> {
    let sql = &ctx.sql.workflow;
    let Some(head) = sqlx::query(sql.view_head.clone())
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("read flow"))?
    else {
        return Ok(None);
    };
    let mut flow = head_view(&head)?;
    let rows = sqlx::query(sql.view_steps.clone())
        .bind(id)
        .fetch_all(conn)
        .await
        .map_err(db("read flow steps"))?;
    for row in &rows {
        let state = step_state(&column::<String>(row, "state")?)?;
        *flow
            .step_counts
            .entry(state.as_str().to_string())
            .or_default() += 1;
        let signal: Option<String> = column(row, "wait_signal")?;
        let timeout_ms: Option<i64> = column(row, "wait_timeout_ms")?;
        let compensation: Option<String> = column(row, "compensation")?;
        let job_state: Option<String> = column(row, "job_state")?;
        let attempts: Option<i32> = column(row, "attempt")?;
        flow.steps.push(StepView {
            name: column(row, "name")?,
            state,
            after: column(row, "after")?,
            on_parent_failure: policy_of(column(row, "on_parent_failure")?)?,
            job_id: column(row, "job_id")?,
            kind: column(row, "kind")?,
            wait: signal.map(|signal| WaitSpec {
                signal,
                timeout_ms: timeout_ms.map(|ms| ms.max(0) as u64),
            }),
            result: column::<Option<Json<Value>>>(row, "result")?.map(|Json(v)| v),
            error: column::<Option<Json<StepError>>>(row, "error")?.map(|Json(e)| e),
            compensation: compensation_of(compensation)?,
            compensation_job_id: column(row, "compensation_job_id")?,
            wait_deadline: column(row, "wait_deadline")?,
            finished_at: column(row, "finished_at")?,
            job_state: job_state
                .map(|s| JobState::from_str(&s).map_err(unreadable))
                .transpose()?,
            attempts: attempts.unwrap_or(0).max(0) as u32,
            progress: column::<Option<Json<conveyor_core::Progress>>>(row, "progress")?
                .map(|Json(p)| p),
        });
    }
    Ok(Some(flow))
}

/// Flows newest first, with their step counts but not their steps.
pub(crate) async fn list(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: &FlowListParams,
) -> StoreResult<Vec<FlowView>> {
    let sql = &ctx.sql.workflow;
    // Only the filters given become conditions, so each combination gets a plan that can use
    // `flows_state` or `flows_name` for the order and the cursor.
    let mut text = format!(
        "SELECT {HEAD_COLUMNS}, \
             (SELECT jsonb_object_agg(c.state, c.n) FROM \
                 (SELECT state, count(*) AS n FROM {steps} s WHERE s.flow_id = f.id \
                  GROUP BY state) c) AS step_counts \
         FROM {flows} f WHERE TRUE",
        steps = sql.steps,
        flows = sql.flows,
    );
    let mut placeholders = 0;
    let mut condition = |column: &str| {
        placeholders += 1;
        format!(" AND {column} ${placeholders}")
    };
    let state = params.state.map(FlowState::as_str);
    if state.is_some() {
        text.push_str(&condition("state ="));
    }
    if params.name.is_some() {
        text.push_str(&condition("name ="));
    }
    if params.after.is_some() {
        text.push_str(&condition("id <"));
    }
    placeholders += 1;
    text.push_str(&format!(" ORDER BY id DESC LIMIT ${placeholders}"));
    let mut query = sqlx::query(AssertSqlSafe(text));
    if let Some(state) = state {
        query = query.bind(state);
    }
    if let Some(name) = &params.name {
        query = query.bind(name);
    }
    if let Some(after) = params.after {
        query = query.bind(after);
    }
    let limit = params.limit.clamp(1, 1000) as i64;
    let rows = query
        .bind(limit)
        .fetch_all(conn)
        .await
        .map_err(db("list flows"))?;
    rows.iter()
        .map(|row| {
            let mut flow = head_view(row)?;
            let counts: Option<Json<BTreeMap<String, u64>>> = column(row, "step_counts")?;
            flow.step_counts = counts.map(|Json(c)| c).unwrap_or_default();
            Ok(flow)
        })
        .collect()
}
