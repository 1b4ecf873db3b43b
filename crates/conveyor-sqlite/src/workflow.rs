//! Workflows on SQLite: loading a flow's graph, writing the effects `conveyor_core::workflow`
//! decides, and the flow views. Every change runs on the writer thread in the transaction of
//! the event that caused it (a job's completion, failure, cancellation or replay).
//!
//! One cohesive thing, kept whole on purpose (~900 lines): the flow tables' statements and
//! the one `write_effects` that applies the policy's effects with them.

use conveyor_core::clock::{self, from_millis};
use conveyor_core::workflow::{
    compensation_job, CompensationState, CreatedFlow, Effect, FlowEvent, FlowFailurePolicy,
    FlowGraph, FlowLink, FlowListParams, FlowState, FlowView, GraphStep, ParentFailurePolicy,
    SignalOutcome, StepAction, StepError, StepState, StepView, ValidFlow,
};
use conveyor_core::{Job, JobState, NewJob, StoreError, StoreResult};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};
use serde_json::Value;
use std::collections::BTreeMap;
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::backend;
use crate::jobs;
use crate::rows::{json_text, millis};
use crate::writer::WriteCtx;

fn from_json<T: serde::de::DeserializeOwned>(text: &str, field: &str) -> StoreResult<T> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::backend(format!("stored {field} is not valid: {e}")))
}

fn policy_text<T: serde::Serialize>(policy: &T) -> StoreResult<String> {
    match serde_json::to_value(policy) {
        Ok(Value::String(text)) => Ok(text),
        _ => Err(StoreError::backend(
            "a policy did not serialize to a string",
        )),
    }
}

fn policy_of<T: serde::de::DeserializeOwned>(text: String) -> StoreResult<T> {
    from_json(&Value::String(text).to_string(), "policy")
}

fn flow_state(text: &str) -> StoreResult<FlowState> {
    FlowState::from_str(text).map_err(|e| StoreError::backend(e.to_string()))
}

fn step_state(text: &str) -> StoreResult<StepState> {
    StepState::from_str(text).map_err(|e| StoreError::backend(e.to_string()))
}

fn uuid_of(text: Option<String>) -> StoreResult<Option<Uuid>> {
    text.map(|t| Uuid::parse_str(&t).map_err(|e| StoreError::backend(e.to_string())))
        .transpose()
}

/// Creates a flow and starts its first steps, all in the caller's transaction.
pub(crate) fn create(ctx: &mut WriteCtx<'_>, flow: ValidFlow) -> StoreResult<CreatedFlow> {
    let flow = flow.into_flow();
    if let Some(key) = &flow.idempotency_key {
        let existing: Option<String> = ctx
            .conn
            .prepare_cached("SELECT id FROM flows WHERE idempotency_key = ?1")
            .and_then(|mut stmt| stmt.query_row(params![key], |row| row.get(0)).optional())
            .map_err(backend)?;
        if let Some(id) = uuid_of(existing)? {
            return Ok(CreatedFlow {
                id,
                steps: step_jobs(ctx.conn, id)?,
                duplicate: true,
            });
        }
    }
    let id = Uuid::now_v7();
    ctx.conn
        .prepare_cached(
            "INSERT INTO flows (id, name, state, on_failure, idempotency_key, tags, created_at) \
             VALUES (?1, ?2, 'running', ?3, ?4, ?5, ?6)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                id.to_string(),
                flow.name,
                policy_text(&flow.on_failure).map_err(to_sql)?,
                flow.idempotency_key,
                json_text(&flow.tags, "tags").map_err(to_sql)?,
                millis(ctx.now),
            ])
        })
        .map_err(backend)?;
    let mut steps = BTreeMap::new();
    for (position, step) in flow.steps.iter().enumerate() {
        let (job_id, job, wait) = match &step.action {
            StepAction::Job(job) => {
                let job_id = Uuid::now_v7();
                steps.insert(step.name.clone(), job_id);
                (Some(job_id), Some(json_text(job, "job")?), None)
            }
            StepAction::Wait(wait) => (None, None, Some(wait)),
        };
        let compensate = step
            .compensate
            .as_ref()
            .map(|job| json_text(job, "compensate"))
            .transpose()?;
        ctx.conn
            .prepare_cached(
                "INSERT INTO flow_steps (flow_id, name, position, state, after, \
                 on_parent_failure, job_id, job, compensate, wait_signal, wait_timeout_ms) \
                 VALUES (?1, ?2, ?3, 'pending', ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    id.to_string(),
                    step.name,
                    position as i64,
                    json_text(&step.after, "after").map_err(to_sql)?,
                    policy_text(&step.on_parent_failure).map_err(to_sql)?,
                    job_id.map(|j| j.to_string()),
                    job,
                    compensate,
                    wait.map(|w| w.signal.clone()),
                    wait.and_then(|w| w.timeout_ms).map(|ms| ms as i64),
                ])
            })
            .map_err(backend)?;
    }
    handle(ctx, id, FlowEvent::Created)?;
    Ok(CreatedFlow {
        id,
        steps,
        duplicate: false,
    })
}

fn to_sql(error: StoreError) -> rusqlite::Error {
    rusqlite::Error::ToSqlConversionFailure(Box::new(error))
}

/// Every job step's reserved job id by name.
fn step_jobs(conn: &Connection, flow_id: Uuid) -> StoreResult<BTreeMap<String, Uuid>> {
    let rows: Vec<(String, Option<String>)> = conn
        .prepare_cached("SELECT name, job_id FROM flow_steps WHERE flow_id = ?1")
        .and_then(|mut stmt| {
            stmt.query_map(params![flow_id.to_string()], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?
            .collect()
        })
        .map_err(backend)?;
    let mut steps = BTreeMap::new();
    for (name, job_id) in rows {
        if let Some(job_id) = uuid_of(job_id)? {
            steps.insert(name, job_id);
        }
    }
    Ok(steps)
}

/// The flow's graph as the policy sees it. `completing` is the job whose completion the
/// current operation is applying: its row already says `completed`, but its step is still
/// active until the policy has seen that completion (see `STEP_COMPLETED_BY_JOB`).
fn load_graph(
    conn: &Connection,
    flow_id: Uuid,
    completing: Option<Uuid>,
) -> StoreResult<Option<FlowGraph>> {
    let head: Option<(String, String, Option<String>)> = conn
        .prepare_cached("SELECT state, on_failure, failed_step FROM flows WHERE id = ?1")
        .and_then(|mut stmt| {
            stmt.query_row(params![flow_id.to_string()], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .optional()
        })
        .map_err(backend)?;
    let Some((state, on_failure, failed_step)) = head else {
        return Ok(None);
    };
    type Row = (
        String,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        bool,
        bool,
        Option<String>,
        Option<String>,
        Option<i64>,
    );
    let rows: Vec<Row> = conn
        .prepare_cached(&format!(
            "SELECT s.name, \
                 CASE WHEN s.job_id = ?2 AND s.state IN ('pending', 'active') THEN 'active' \
                     ELSE {STEP_STATE} END, \
                 s.after, s.on_parent_failure, s.job_id, \
                 s.wait_signal, s.signalled, s.compensate IS NOT NULL, s.compensation, \
                 s.compensation_job_id, s.completed_seq \
                 FROM flow_steps s LEFT JOIN jobs j ON j.id = s.job_id \
                 WHERE s.flow_id = ?1 ORDER BY s.position"
        ))
        .and_then(|mut stmt| {
            stmt.query_map(
                params![flow_id.to_string(), completing.map(|id| id.to_string())],
                |row| Row::try_from(row),
            )?
            .collect()
        })
        .map_err(backend)?;
    let mut steps = Vec::with_capacity(rows.len());
    for row in rows {
        steps.push(GraphStep {
            name: row.0,
            state: step_state(&row.1)?,
            after: from_json(&row.2, "after")?,
            on_parent_failure: policy_of::<ParentFailurePolicy>(row.3)?,
            job_id: uuid_of(row.4)?,
            wait_signal: row.5,
            signalled: row.6,
            has_compensate: row.7,
            compensation: row.8.as_deref().and_then(CompensationState::parse),
            compensation_job_id: uuid_of(row.9)?,
            completed_seq: row.10,
        });
    }
    Ok(Some(FlowGraph::new(
        flow_id,
        flow_state(&state)?,
        policy_of::<FlowFailurePolicy>(on_failure)?,
        failed_step,
        steps,
    )))
}

/// The condition of `STEP_COMPLETED_BY_JOB`, as a literal so the statements built on it can
/// be put together at compile time.
macro_rules! completed_by_job {
    () => {
        "(s.state IN ('pending', 'active') AND j.state = 'completed')"
    };
}

/// A step's state as read (`s` a `flow_steps` row, `j` its job's row or NULL). A job step that
/// started is still stored `pending`: its job's existence says it is active (the job is inserted
/// when the step starts, in the same transaction). A job step whose job completed is, in most
/// flows, still stored `pending` (or `active`, after a replay): its completed job says it is
/// completed, with the job's result and finish time (see `STEP_COMPLETED_BY_JOB`).
pub(crate) const STEP_STATE: &str = concat!(
    "CASE WHEN ",
    completed_by_job!(),
    " THEN 'completed' WHEN s.state = 'pending' AND j.id IS NOT NULL THEN 'active' \
     ELSE s.state END"
);

/// Whether a step (`s`, its job `j`) is completed by its job without its row saying so.
///
/// Why: writing `completed` into the step's row cost every step of a chain a page of
/// `flow_steps` in its commit (a scattered page per flow in flight: written to the sub-journal,
/// the WAL and at checkpoint again); skipping that write made chain steps a quarter to a
/// third faster (docs/benchmarks.md, "Workflows, sixth round"). The job row already holds the same
/// facts: state, result, finish time. So the completion of a step by its own job leaves the row
/// alone unless the step's completion order matters (a step with a compensation in a flow that
/// compensates, see `write_effects`), and before a completed flow job is pruned the row is
/// written (`materialize_completed_step`), so the row alone is the truth once the job is gone.
pub(crate) const STEP_COMPLETED_BY_JOB: &str = completed_by_job!();

/// A step's result as read (`s`, its job `j`): its completed job's, when only the job says the
/// step completed (see `STEP_COMPLETED_BY_JOB`).
pub(crate) const STEP_RESULT: &str = concat!(
    "CASE WHEN ",
    completed_by_job!(),
    " THEN j.result ELSE s.result END"
);

/// Applies one event to a flow and writes what the policy decided.
pub(crate) fn handle(ctx: &mut WriteCtx<'_>, flow_id: Uuid, event: FlowEvent) -> StoreResult<()> {
    ctx.graphs.touched.push(flow_id);
    let cached = ctx.graphs.take(flow_id);
    let mut graph = match cached {
        Some(graph) => graph,
        None => match load_graph(
            ctx.conn,
            flow_id,
            ctx.graphs.completing.as_ref().map(|(job_id, _)| *job_id),
        )? {
            Some(graph) => graph,
            None => return Ok(()),
        },
    };
    let effects = graph.apply(event);
    write_effects(ctx, &mut graph, effects)?;
    ctx.graphs.keep(graph);
    Ok(())
}

/// The flow hook for a job of a flow that reached `state` (completed, dead, cancelled).
pub(crate) fn job_finished(ctx: &mut WriteCtx<'_>, job: &Job) -> StoreResult<()> {
    match &job.flow {
        Some(link) if job.state.is_finished() => handle(
            ctx,
            link.flow_id,
            FlowEvent::JobFinished {
                job_id: job.id,
                state: job.state,
            },
        ),
        _ => Ok(()),
    }
}

fn write_effects(
    ctx: &mut WriteCtx<'_>,
    graph: &mut FlowGraph,
    effects: Vec<Effect>,
) -> StoreResult<()> {
    let flow = graph.id.to_string();
    for effect in effects {
        match effect {
            Effect::StepState { step, state, error } => {
                let found = graph.steps.iter().find(|s| s.name == step);
                let seq = found.and_then(|s| s.completed_seq);
                // The result of the job just completed is known; any other is read.
                let known = match (&ctx.graphs.completing, found.and_then(|s| s.job_id)) {
                    (Some((job_id, result)), Some(step_job)) if *job_id == step_job => {
                        Some(result.clone())
                    }
                    _ => None,
                };
                if state == StepState::Completed {
                    if let Some(result) = &known {
                        ctx.graphs
                            .results
                            .insert((graph.id, step.clone()), result.clone());
                        // Completed by the job just completed: its row says so (see
                        // STEP_COMPLETED_BY_JOB), unless the step's place in the completion
                        // order must be kept for a compensation.
                        let order_matters = graph.on_failure == FlowFailurePolicy::Compensate
                            && found.is_some_and(|s| s.has_compensate);
                        if !order_matters {
                            continue;
                        }
                    }
                }
                let error = error.map(|e| json_text(&e, "error")).transpose()?;
                let finished = state.is_finished().then(|| millis(ctx.now));
                // A job step takes its job's result, or its job's last error.
                ctx.conn
                    .prepare_cached(
                        "UPDATE flow_steps SET state = ?1, finished_at = ?2, \
                         wait_deadline = CASE WHEN ?1 = 'waiting' THEN wait_deadline END, \
                         completed_seq = CASE WHEN ?1 = 'completed' THEN ?3 ELSE completed_seq END, \
                         result = CASE WHEN ?1 = 'completed' AND job_id IS NOT NULL \
                             THEN CASE WHEN ?7 THEN ?8 \
                                 ELSE (SELECT result FROM jobs WHERE jobs.id = flow_steps.job_id) END \
                             ELSE result END, \
                         error = CASE \
                             WHEN ?1 IN ('active', 'completed') THEN NULL \
                             WHEN ?4 IS NOT NULL THEN ?4 \
                             WHEN ?1 = 'failed' AND job_id IS NOT NULL \
                             THEN (SELECT json_extract(errors, '$[#-1]') FROM jobs \
                                   WHERE jobs.id = flow_steps.job_id) \
                             ELSE error END \
                         WHERE flow_id = ?5 AND name = ?6",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![
                            state.as_str(),
                            finished,
                            seq,
                            error,
                            flow,
                            step,
                            known.is_some(),
                            known.flatten()
                        ])
                    })
                    .map_err(backend)?;
            }
            Effect::Start { step } => start_step(ctx, graph, &step)?,
            Effect::CancelJob { job_id } => {
                jobs::cancel_unhooked(ctx, job_id)?;
            }
            Effect::Compensate { step } => {
                let job_id = compensate(ctx, graph.id, &step)?;
                // The policy learns the compensation's job when it finishes.
                if let Some(s) = graph.steps.iter_mut().find(|s| s.name == step) {
                    s.compensation_job_id = job_id;
                }
            }
            Effect::CompensationState { step, state } => {
                ctx.conn
                    .prepare_cached(
                        "UPDATE flow_steps SET compensation = ?1 WHERE flow_id = ?2 AND name = ?3",
                    )
                    .and_then(|mut stmt| stmt.execute(params![state.as_str(), flow, step]))
                    .map_err(backend)?;
            }
            Effect::FlowState { state, failed_step } => {
                let finished = state.is_finished().then(|| millis(ctx.now));
                ctx.conn
                    .prepare_cached(
                        "UPDATE flows SET state = ?1, failed_step = ?2, finished_at = ?3 \
                         WHERE id = ?4",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![state.as_str(), failed_step, finished, flow])
                    })
                    .map_err(backend)?;
            }
        }
    }
    Ok(())
}

/// Writes into a step's row that its job `job_id` completed it, with the job's result and
/// finish time, for a step whose row does not say so yet (see `STEP_COMPLETED_BY_JOB`): run
/// before the job's row is deleted.
pub(crate) fn materialize_completed_step(
    ctx: &WriteCtx<'_>,
    flow_id: &str,
    step: &str,
    job_id: &str,
    result: Option<&str>,
    finished_at: Option<i64>,
) -> StoreResult<()> {
    ctx.conn
        .prepare_cached(
            "UPDATE flow_steps SET state = 'completed', result = ?1, error = NULL, \
             finished_at = ?2 \
             WHERE flow_id = ?3 AND name = ?4 AND job_id = ?5 \
             AND state IN ('pending', 'active')",
        )
        .and_then(|mut stmt| stmt.execute(params![result, finished_at, flow_id, step, job_id]))
        .map_err(backend)?;
    Ok(())
}

/// What compensating a step needs: its job's and its compensation's specs, its result.
struct StepRow {
    job: Option<String>,
    compensate: Option<String>,
    result: Option<String>,
}

fn step_row(conn: &Connection, flow_id: Uuid, step: &str) -> StoreResult<StepRow> {
    type Columns = (Option<String>, Option<String>, Option<String>);
    let row: Option<Columns> = conn
        .prepare_cached(&format!(
            "SELECT s.job, s.compensate, \
                 {STEP_RESULT} \
             FROM flow_steps s LEFT JOIN jobs j ON j.id = s.job_id \
             WHERE s.flow_id = ?1 AND s.name = ?2"
        ))
        .and_then(|mut stmt| {
            stmt.query_row(params![flow_id.to_string(), step], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .optional()
        })
        .map_err(backend)?;
    let (job, compensate, result) =
        row.ok_or_else(|| StoreError::backend(format!("flow {flow_id} has no step {step:?}")))?;
    Ok(StepRow {
        job,
        compensate,
        result,
    })
}

fn start_step(ctx: &mut WriteCtx<'_>, graph: &FlowGraph, step: &str) -> StoreResult<()> {
    let flow = graph.id.to_string();
    // A job step becomes active by its job being inserted: its row is not written (see
    // STEP_STATE), which spares every step one write of its (wide) row. A wait step begins
    // waiting, its deadline counted from now.
    let spec: Option<(Option<String>, Option<String>, String)> = ctx
        .conn
        .prepare_cached(
            "SELECT job, job_id, after FROM flow_steps WHERE flow_id = ?1 AND name = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![flow, step], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .optional()
        })
        .map_err(backend)?;
    let (spec, job_id, after) =
        spec.ok_or_else(|| StoreError::backend(format!("flow {flow} has no step {step:?}")))?;
    let (Some(spec), Some(job_id)) = (spec, uuid_of(job_id)?) else {
        ctx.conn
            .prepare_cached(
                "UPDATE flow_steps SET state = 'waiting', \
                 wait_deadline = CASE WHEN wait_timeout_ms IS NOT NULL \
                     THEN ?1 + wait_timeout_ms END \
                 WHERE flow_id = ?2 AND name = ?3",
            )
            .and_then(|mut stmt| stmt.execute(params![millis(ctx.now), flow, step]))
            .map_err(backend)?;
        return Ok(());
    };
    let after: Vec<String> = from_json(&after, "after")?;
    // Only completed parents have a result to hand on (the graph knows which).
    let completed = |name: &String| {
        graph
            .steps
            .iter()
            .any(|s| &s.name == name && s.state == StepState::Completed)
    };
    let mut parents = BTreeMap::new();
    for parent in after.iter().filter(|p| completed(p)) {
        if let Some(result) = ctx.graphs.results.get(&(graph.id, parent.clone())) {
            let value = match result {
                Some(text) => from_json(text, "result")?,
                None => Value::Null,
            };
            parents.insert(parent.clone(), value);
            continue;
        }
        let result: Option<Option<String>> = ctx
            .conn
            .prepare_cached(&format!(
                "SELECT {STEP_RESULT} \
                 FROM flow_steps s LEFT JOIN jobs j ON j.id = s.job_id \
                 WHERE s.flow_id = ?1 AND s.name = ?2 AND ({STEP_STATE}) = 'completed'"
            ))
            .and_then(|mut stmt| {
                stmt.query_row(params![flow, parent], |row| row.get(0))
                    .optional()
            })
            .map_err(backend)?;
        if let Some(result) = result {
            let value = match result {
                Some(text) => from_json(&text, "result")?,
                None => Value::Null,
            };
            parents.insert(parent.clone(), value);
        }
    }
    let job: NewJob = from_json(&spec, "job")?;
    insert_flow_job(
        ctx,
        job,
        job_id,
        FlowLink {
            flow_id: graph.id,
            step: step.to_string(),
            parents,
        },
    )?;
    Ok(())
}

/// Inserts a flow's job under its reserved id. Queue depth limits do not apply: the flow was
/// accepted whole when it was created.
fn insert_flow_job(
    ctx: &mut WriteCtx<'_>,
    new: NewJob,
    id: Uuid,
    link: FlowLink,
) -> StoreResult<()> {
    let job = flow_job(ctx.now, new, id, link);
    if job.state == JobState::Available {
        ctx.wake = true;
    }
    let turn = crate::turns::of_new(ctx, &job)?;
    if jobs::insert_row(ctx, &job, turn)? {
        ctx.count_move(&job.queue, None, Some(job.state));
        // Counted as enqueued once the round commits (see `conveyor_core::FlowStarts`).
        if ctx.flow_starts_observed {
            ctx.flow_started.push(conveyor_core::Inserted::new(job));
        }
    }
    Ok(())
}

/// A flow's job as it is stored when its step starts.
pub(crate) fn flow_job(
    now: chrono::DateTime<chrono::Utc>,
    new: NewJob,
    id: Uuid,
    link: FlowLink,
) -> Job {
    let mut job = new.into_stored(id, now);
    job.flow = Some(link);
    job
}

/// Inserts a step's compensation job; its id (`None` when the step has no compensation).
fn compensate(ctx: &mut WriteCtx<'_>, flow_id: Uuid, step: &str) -> StoreResult<Option<Uuid>> {
    let row = step_row(ctx.conn, flow_id, step)?;
    let Some(spec) = row.compensate else {
        return Ok(None);
    };
    let compensate: NewJob = from_json(&spec, "compensate")?;
    let original: Option<NewJob> = match &row.job {
        Some(step_spec) => Some(from_json(step_spec, "job")?),
        None => None,
    };
    let result = match &row.result {
        Some(text) => from_json(text, "result")?,
        None => Value::Null,
    };
    let (job, link) = compensation_job(flow_id, step, compensate, original, result);
    let id = Uuid::now_v7();
    insert_flow_job(ctx, job, id, link)?;
    ctx.conn
        .prepare_cached(
            "UPDATE flow_steps SET compensation = 'running', compensation_job_id = ?1 \
             WHERE flow_id = ?2 AND name = ?3",
        )
        .and_then(|mut stmt| stmt.execute(params![id.to_string(), flow_id.to_string(), step]))
        .map_err(backend)?;
    Ok(Some(id))
}

pub(crate) fn cancel(ctx: &mut WriteCtx<'_>, id: Uuid) -> StoreResult<FlowView> {
    let graph = load_graph(ctx.conn, id, None)?.ok_or(StoreError::FlowNotFound(id))?;
    graph.check_cancel()?;
    handle(ctx, id, FlowEvent::Cancel)?;
    view(ctx.conn, id)?.ok_or(StoreError::FlowNotFound(id))
}

pub(crate) fn signal(
    ctx: &mut WriteCtx<'_>,
    id: Uuid,
    signal: &str,
    payload: &Value,
) -> StoreResult<SignalOutcome> {
    let graph = load_graph(ctx.conn, id, None)?.ok_or(StoreError::FlowNotFound(id))?;
    let (name, outcome) = graph.signal_target(signal)?;
    ctx.conn
        .prepare_cached(
            "UPDATE flow_steps SET result = ?1, signalled = 1 WHERE flow_id = ?2 AND name = ?3",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                json_text(payload, "payload").map_err(to_sql)?,
                id.to_string(),
                name
            ])
        })
        .map_err(backend)?;
    handle(ctx, id, FlowEvent::Signal { step: name })?;
    Ok(outcome)
}

pub(crate) fn expire_waits(ctx: &mut WriteCtx<'_>, limit: usize) -> StoreResult<u64> {
    let due: Vec<(String, String)> = ctx
        .conn
        .prepare_cached(
            "SELECT flow_id, name FROM flow_steps WHERE state = 'waiting' \
             AND wait_deadline IS NOT NULL AND wait_deadline <= ?1 \
             ORDER BY wait_deadline LIMIT ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![millis(ctx.now), limit as i64], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })?
            .collect()
        })
        .map_err(backend)?;
    let expired = due.len() as u64;
    for (flow, step) in due {
        if let Some(flow_id) = uuid_of(Some(flow))? {
            handle(ctx, flow_id, FlowEvent::WaitTimedOut { step })?;
        }
    }
    Ok(expired)
}

/// Deletes finished flows past their retention, with their steps (see `FlowStore::flows_prune`).
pub(crate) fn prune(
    ctx: &mut WriteCtx<'_>,
    params: &conveyor_core::PruneParams,
) -> StoreResult<u64> {
    let completed_before = clock::before(ctx.now, params.retention.completed);
    let failed_before = clock::before(ctx.now, params.retention.dead);
    let ids: Vec<String> = ctx
        .conn
        .prepare_cached(
            "DELETE FROM flows WHERE id IN (SELECT id FROM flows WHERE finished_at IS NOT NULL \
             AND ((state IN ('completed', 'compensated', 'cancelled') AND finished_at <= ?1) \
                  OR (state = 'failed' AND finished_at <= ?2)) \
             ORDER BY finished_at LIMIT ?3) RETURNING id",
        )
        .and_then(|mut stmt| {
            stmt.query_map(
                params![
                    millis(completed_before),
                    millis(failed_before),
                    params.limit as i64
                ],
                |row| row.get(0),
            )?
            .collect()
        })
        .map_err(backend)?;
    for id in &ids {
        ctx.conn
            .prepare_cached("DELETE FROM flow_steps WHERE flow_id = ?1")
            .and_then(|mut stmt| stmt.execute(params![id]))
            .map_err(backend)?;
        if let Some(id) = uuid_of(Some(id.clone()))? {
            ctx.graphs.touched.push(id);
            ctx.graphs.take(id);
        }
    }
    Ok(ids.len() as u64)
}

type ViewHead = (
    String,
    Option<String>,
    String,
    String,
    Option<String>,
    i64,
    Option<i64>,
    String,
);

fn head_view(head: ViewHead) -> StoreResult<FlowView> {
    let (id, name, state, on_failure, failed_step, created_at, finished_at, tags) = head;
    Ok(FlowView {
        id: uuid_of(Some(id))?.unwrap_or_default(),
        name,
        state: flow_state(&state)?,
        on_failure: policy_of(on_failure)?,
        failed_step,
        tags: from_json(&tags, "tags")?,
        created_at: from_millis(created_at),
        finished_at: finished_at.map(from_millis),
        steps: Vec::new(),
        step_counts: BTreeMap::new(),
    })
}

const HEAD_COLUMNS: &str =
    "id, name, state, on_failure, failed_step, created_at, finished_at, tags";

fn head_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<ViewHead> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
        row.get(7)?,
    ))
}

/// A flow with every step, its job's state, attempts and progress.
pub(crate) fn view(conn: &Connection, id: Uuid) -> StoreResult<Option<FlowView>> {
    let head: Option<ViewHead> = conn
        .prepare_cached(&format!("SELECT {HEAD_COLUMNS} FROM flows WHERE id = ?1"))
        .and_then(|mut stmt| stmt.query_row(params![id.to_string()], head_row).optional())
        .map_err(backend)?;
    let Some(head) = head else {
        return Ok(None);
    };
    let mut flow = head_view(head)?;
    type Row = (
        String,
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<i64>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<i64>,
        Option<i64>,
        Option<String>,
        Option<i64>,
        Option<String>,
    );
    let rows: Vec<Row> = conn
        .prepare_cached(&format!(
            "SELECT s.name, {STEP_STATE}, s.after, s.on_parent_failure, s.job_id, \
                 json_extract(s.job, '$.kind'), s.wait_signal, s.wait_timeout_ms, \
                 {STEP_RESULT}, \
                 CASE WHEN {STEP_COMPLETED_BY_JOB} THEN NULL ELSE s.error END, \
                 s.compensation, s.compensation_job_id, s.wait_deadline, \
                 CASE WHEN {STEP_COMPLETED_BY_JOB} THEN j.finished_at ELSE s.finished_at END, \
                 j.state, j.attempt, j.progress \
                 FROM flow_steps s LEFT JOIN jobs j ON j.id = s.job_id \
                 WHERE s.flow_id = ?1 ORDER BY s.position"
        ))
        .and_then(|mut stmt| {
            stmt.query_map(params![id.to_string()], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                    row.get(6)?,
                    row.get(7)?,
                    row.get(8)?,
                    row.get(9)?,
                    row.get(10)?,
                    row.get(11)?,
                    row.get(12)?,
                    row.get(13)?,
                    row.get(14)?,
                    row.get(15)?,
                    row.get(16)?,
                ))
            })?
            .collect()
        })
        .map_err(backend)?;
    for row in rows {
        let state = step_state(&row.1)?;
        *flow
            .step_counts
            .entry(state.as_str().to_string())
            .or_default() += 1;
        flow.steps.push(StepView {
            name: row.0,
            state,
            after: from_json(&row.2, "after")?,
            on_parent_failure: policy_of(row.3)?,
            job_id: uuid_of(row.4)?,
            kind: row.5,
            wait: row.6.map(|signal| conveyor_core::workflow::WaitSpec {
                signal,
                timeout_ms: row.7.map(|ms| ms.max(0) as u64),
            }),
            result: row.8.map(|t| from_json(&t, "result")).transpose()?,
            error: row
                .9
                .map(|t| from_json::<StepError>(&t, "error"))
                .transpose()?,
            compensation: row.10.as_deref().and_then(CompensationState::parse),
            compensation_job_id: uuid_of(row.11)?,
            wait_deadline: row.12.map(from_millis),
            finished_at: row.13.map(from_millis),
            job_state: row
                .14
                .map(|s| JobState::from_str(&s))
                .transpose()
                .map_err(|e| StoreError::backend(e.to_string()))?,
            attempts: row.15.unwrap_or(0).max(0) as u32,
            progress: row.16.map(|t| from_json(&t, "progress")).transpose()?,
        });
    }
    Ok(Some(flow))
}

pub(crate) fn list(conn: &Connection, params: &FlowListParams) -> StoreResult<Vec<FlowView>> {
    let mut sql = format!("SELECT {HEAD_COLUMNS} FROM flows WHERE 1 = 1");
    let mut args: Vec<SqlValue> = Vec::new();
    if let Some(state) = params.state {
        args.push(SqlValue::Text(state.as_str().to_string()));
        sql.push_str(&format!(" AND state = ?{}", args.len()));
    }
    if let Some(name) = &params.name {
        args.push(SqlValue::Text(name.clone()));
        sql.push_str(&format!(" AND name = ?{}", args.len()));
    }
    if let Some(after) = params.after {
        args.push(SqlValue::Text(after.to_string()));
        sql.push_str(&format!(" AND id < ?{}", args.len()));
    }
    args.push(SqlValue::Integer(params.limit.clamp(1, 1000) as i64));
    sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", args.len()));
    let heads: Vec<ViewHead> = conn
        .prepare(&sql)
        .and_then(|mut stmt| stmt.query_map(params_from_iter(args), head_row)?.collect())
        .map_err(backend)?;
    let mut flows = Vec::with_capacity(heads.len());
    for head in heads {
        let mut flow = head_view(head)?;
        let counts: Vec<(String, i64)> = conn
            .prepare_cached(&format!(
                "SELECT {STEP_STATE} AS step_state, COUNT(*) \
                     FROM flow_steps s LEFT JOIN jobs j ON j.id = s.job_id \
                     WHERE s.flow_id = ?1 GROUP BY step_state"
            ))
            .and_then(|mut stmt| {
                stmt.query_map(params![flow.id.to_string()], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })?
                .collect()
            })
            .map_err(backend)?;
        flow.step_counts = counts
            .into_iter()
            .map(|(s, n)| (s, n.max(0) as u64))
            .collect();
        flows.push(flow);
    }
    Ok(flows)
}
