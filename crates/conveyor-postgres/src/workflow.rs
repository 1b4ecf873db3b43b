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

use chrono::{DateTime, Utc};
use conveyor_core::workflow::{
    wait_deadline, CompensationState, CreatedFlow, Effect, FlowEvent, FlowGraph, FlowLink,
    FlowListParams, FlowState, FlowView, GraphStep, SignalOutcome, StepAction, StepError,
    StepState, StepView, ValidFlow, WaitSpec,
};
use conveyor_core::{Job, JobState, NewJob, StoreError, StoreResult, ValidationError};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, PgConnection, Row, SqlStr};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::db;
use crate::names::quoted;
use crate::ops::{self, Ctx};
use crate::sql::stmt;

/// The statements of workflows for one schema.
pub(crate) struct WorkflowSql {
    /// `"schema".flows` and `"schema".flow_steps`, for the list, whose text depends on its
    /// filters.
    flows: String,
    steps: String,
    lock_head: SqlStr,
    lock_many: SqlStr,
    try_lock: SqlStr,
    exists: SqlStr,
    graph_steps: SqlStr,
    insert_flow: SqlStr,
    flow_by_key: SqlStr,
    insert_steps: SqlStr,
    step_jobs: SqlStr,
    set_steps: SqlStr,
    start_rows: SqlStr,
    completed_results: SqlStr,
    activate: SqlStr,
    begin_waits: SqlStr,
    compensation_row: SqlStr,
    compensation_started: SqlStr,
    compensation_state: SqlStr,
    flow_state: SqlStr,
    signal: SqlStr,
    due_waits: SqlStr,
    prune: SqlStr,
    view_head: SqlStr,
    view_steps: SqlStr,
}

const HEAD_COLUMNS: &str =
    "id, name, state, on_failure, failed_step, tags, created_at, finished_at";

impl WorkflowSql {
    /// Statements for `schema`, which must already be validated.
    pub(crate) fn new(schema: &str) -> Self {
        let flows = format!("{}.flows", quoted(schema));
        let steps = format!("{}.flow_steps", quoted(schema));
        let jobs = format!("{}.jobs", quoted(schema));
        Self {
            // The head of the graph, locked: the first statement of every flow event.
            lock_head: stmt(format!(
                "SELECT state, on_failure, failed_step FROM {flows} WHERE id = $1 FOR UPDATE"
            )),
            // Rows are locked as the sort hands them over: in id order, so two transactions
            // locking overlapping sets of flows cannot deadlock.
            lock_many: stmt(format!(
                "SELECT id FROM {flows} WHERE id = ANY($1) ORDER BY id FOR UPDATE"
            )),
            try_lock: stmt(format!(
                "SELECT id FROM {flows} WHERE id = $1 FOR UPDATE SKIP LOCKED"
            )),
            exists: stmt(format!(
                "SELECT EXISTS (SELECT 1 FROM {flows} WHERE id = $1)"
            )),
            graph_steps: stmt(format!(
                "SELECT name, state, after, on_parent_failure, job_id, wait_signal, signalled, \
                     compensate IS NOT NULL AS has_compensate, compensation, \
                     compensation_job_id, completed_seq \
                 FROM {steps} WHERE flow_id = $1 ORDER BY position"
            )),
            // A concurrent create with the same key waits here until the first commits, then
            // inserts nothing and returns no row.
            insert_flow: stmt(format!(
                "INSERT INTO {flows} (id, name, state, on_failure, idempotency_key, tags, \
                     created_at) \
                 VALUES ($1, $2, 'running', $3, $4, $5, $6) \
                 ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING \
                 RETURNING id"
            )),
            flow_by_key: stmt(format!("SELECT id FROM {flows} WHERE idempotency_key = $1")),
            // Each step's parents travel as one JSON array (an SQL array of arrays must be
            // rectangular), unpacked in order.
            insert_steps: stmt(format!(
                "INSERT INTO {steps} (flow_id, name, position, state, after, on_parent_failure, \
                     job_id, job, compensate, wait_signal, wait_timeout_ms) \
                 SELECT $1, n.name, n.position, 'pending', \
                     ARRAY(SELECT a.name FROM jsonb_array_elements_text(n.after) \
                           WITH ORDINALITY AS a(name, pos) ORDER BY a.pos), \
                     n.on_parent_failure, n.job_id, n.job, n.compensate, n.wait_signal, \
                     n.wait_timeout_ms \
                 FROM unnest($2::text[], $3::int4[], $4::jsonb[], $5::text[], $6::uuid[], \
                             $7::jsonb[], $8::jsonb[], $9::text[], $10::int8[]) \
                     AS n(name, position, after, on_parent_failure, job_id, job, compensate, \
                          wait_signal, wait_timeout_ms)"
            )),
            step_jobs: stmt(format!(
                "SELECT name, job_id FROM {steps} WHERE flow_id = $1 AND job_id IS NOT NULL"
            )),
            // A job step takes its job's result when it completes, and its job's last error
            // when it fails without an error of the policy's own (a wait's timeout, a skip).
            set_steps: stmt(format!(
                "UPDATE {steps} s SET state = u.state, finished_at = u.finished_at, \
                     completed_seq = CASE WHEN u.state = 'completed' THEN u.seq \
                         ELSE s.completed_seq END, \
                     result = CASE WHEN u.state = 'completed' AND s.job_id IS NOT NULL \
                         THEN (SELECT j.result FROM {jobs} j WHERE j.id = s.job_id) \
                         ELSE s.result END, \
                     error = CASE WHEN u.state IN ('active', 'completed') THEN NULL \
                         WHEN u.error IS NOT NULL THEN u.error \
                         WHEN u.state = 'failed' AND s.job_id IS NOT NULL \
                         THEN (SELECT j.errors -> -1 FROM {jobs} j WHERE j.id = s.job_id) \
                         ELSE s.error END \
                 FROM unnest($2::text[], $3::text[], $4::timestamptz[], $5::int8[], \
                             $6::jsonb[]) AS u(name, state, finished_at, seq, error) \
                 WHERE s.flow_id = $1 AND s.name = u.name"
            )),
            start_rows: stmt(format!(
                "SELECT name, job, job_id, after, wait_timeout_ms FROM {steps} \
                 WHERE flow_id = $1 AND name = ANY($2)"
            )),
            completed_results: stmt(format!(
                "SELECT name, result FROM {steps} \
                 WHERE flow_id = $1 AND name = ANY($2) AND state = 'completed'"
            )),
            activate: stmt(format!(
                "UPDATE {steps} SET state = 'active' WHERE flow_id = $1 AND name = ANY($2)"
            )),
            begin_waits: stmt(format!(
                "UPDATE {steps} s SET state = 'waiting', wait_deadline = w.deadline \
                 FROM unnest($2::text[], $3::timestamptz[]) AS w(name, deadline) \
                 WHERE s.flow_id = $1 AND s.name = w.name"
            )),
            compensation_row: stmt(format!(
                "SELECT job, compensate, result FROM {steps} WHERE flow_id = $1 AND name = $2"
            )),
            compensation_started: stmt(format!(
                "UPDATE {steps} SET compensation = 'running', compensation_job_id = $1 \
                 WHERE flow_id = $2 AND name = $3"
            )),
            compensation_state: stmt(format!(
                "UPDATE {steps} SET compensation = $1 WHERE flow_id = $2 AND name = $3"
            )),
            flow_state: stmt(format!(
                "UPDATE {flows} SET state = $1, failed_step = $2, finished_at = $3 WHERE id = $4"
            )),
            signal: stmt(format!(
                "UPDATE {steps} SET result = $1, signalled = true \
                 WHERE flow_id = $2 AND name = $3"
            )),
            due_waits: stmt(format!(
                "SELECT flow_id, name FROM {steps} \
                 WHERE state = 'waiting' AND wait_deadline IS NOT NULL AND wait_deadline <= $1 \
                 ORDER BY wait_deadline LIMIT $2"
            )),
            // Steps go with their flow (ON DELETE CASCADE); a flow another transaction holds is
            // left for the next pass.
            prune: stmt(format!(
                "DELETE FROM {flows} WHERE id IN (SELECT id FROM {flows} \
                 WHERE finished_at IS NOT NULL \
                 AND ((state IN ('completed', 'compensated', 'cancelled') AND finished_at <= $1) \
                      OR (state = 'failed' AND finished_at <= $2)) \
                 ORDER BY finished_at LIMIT $3 FOR UPDATE SKIP LOCKED)"
            )),
            view_head: stmt(format!("SELECT {HEAD_COLUMNS} FROM {flows} WHERE id = $1")),
            view_steps: stmt(format!(
                "SELECT s.name, s.state, s.after, s.on_parent_failure, s.job_id, \
                     s.job ->> 'kind' AS kind, s.wait_signal, s.wait_timeout_ms, s.result, \
                     s.error, s.compensation, s.compensation_job_id, s.wait_deadline, \
                     s.finished_at, j.state AS job_state, j.attempt, j.progress \
                 FROM {steps} s LEFT JOIN {jobs} j ON j.id = s.job_id \
                 WHERE s.flow_id = $1 ORDER BY s.position"
            )),
            flows,
            steps,
        }
    }
}

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

/// The flow's graph as the policy sees it, its row locked until the transaction ends; `None`
/// when there is no such flow.
async fn load_graph(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flow_id: Uuid,
) -> StoreResult<Option<FlowGraph>> {
    let sql = &ctx.sql.workflow;
    let Some(head) = sqlx::query(sql.lock_head.clone())
        .bind(flow_id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("lock flow"))?
    else {
        return Ok(None);
    };
    let rows = sqlx::query(sql.graph_steps.clone())
        .bind(flow_id)
        .fetch_all(conn)
        .await
        .map_err(db("load flow steps"))?;
    let mut steps = Vec::with_capacity(rows.len());
    for row in &rows {
        let compensation: Option<String> = column(row, "compensation")?;
        steps.push(GraphStep {
            name: column(row, "name")?,
            state: step_state(&column::<String>(row, "state")?)?,
            after: column(row, "after")?,
            on_parent_failure: policy_of(column(row, "on_parent_failure")?)?,
            job_id: column(row, "job_id")?,
            wait_signal: column(row, "wait_signal")?,
            signalled: column(row, "signalled")?,
            has_compensate: column(row, "has_compensate")?,
            compensation: compensation
                .map(|text| {
                    CompensationState::parse(&text)
                        .ok_or_else(|| unreadable(format!("compensation {text:?}")))
                })
                .transpose()?,
            compensation_job_id: column(row, "compensation_job_id")?,
            completed_seq: column(row, "completed_seq")?,
        });
    }
    Ok(Some(FlowGraph::new(
        flow_id,
        flow_state(&column::<String>(&head, "state")?)?,
        policy_of(column(&head, "on_failure")?)?,
        column(&head, "failed_step")?,
        steps,
    )))
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
    let Some(mut graph) = load_graph(&mut *conn, ctx, flow_id).await? else {
        return Ok(false);
    };
    let effects = graph.apply(event);
    let changed = !effects.is_empty();
    write_effects(conn, ctx, &graph, effects).await?;
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

/// A step's new state, as an `Effect::StepState` gives it.
type StepChange = (String, StepState, Option<StepError>);

/// Writes the effects in order. Consecutive step changes are written by one statement, and so
/// are consecutive starts (a fan-out starts all its members at once, a cancel cancels every
/// step), which keeps a flow of a thousand steps to a few round trips per event.
async fn write_effects(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    graph: &FlowGraph,
    effects: Vec<Effect>,
) -> StoreResult<()> {
    let sql = &ctx.sql.workflow;
    let mut effects = effects.into_iter().peekable();
    while let Some(effect) = effects.next() {
        match effect {
            Effect::StepState { step, state, error } => {
                let mut changes: Vec<StepChange> = vec![(step, state, error)];
                // A step changed twice in one run is written in two statements, in order.
                while let Some(Effect::StepState { step, state, error }) = effects.next_if(|e| {
                    matches!(e, Effect::StepState { step, .. }
                        if !changes.iter().any(|(name, _, _)| name == step))
                }) {
                    changes.push((step, state, error));
                }
                set_steps(conn, ctx, graph, changes).await?;
            }
            Effect::Start { step } => {
                let mut starting = vec![step];
                while let Some(Effect::Start { step }) =
                    effects.next_if(|e| matches!(e, Effect::Start { .. }))
                {
                    starting.push(step);
                }
                start_steps(conn, ctx, graph.id, &starting).await?;
            }
            // The flow is cancelling its own step: the hook must not hear of it again.
            Effect::CancelJob { job_id } => {
                sqlx::query(ctx.sql.cancel_unhooked.clone())
                    .bind(ctx.now)
                    .bind(job_id)
                    .execute(&mut *conn)
                    .await
                    .map_err(db("cancel a flow's job"))?;
            }
            Effect::Compensate { step } => compensate(conn, ctx, graph.id, &step).await?,
            Effect::CompensationState { step, state } => {
                sqlx::query(sql.compensation_state.clone())
                    .bind(state.as_str())
                    .bind(graph.id)
                    .bind(&step)
                    .execute(&mut *conn)
                    .await
                    .map_err(db("record a compensation"))?;
            }
            Effect::FlowState { state, failed_step } => {
                let finished = state.is_finished().then_some(ctx.now);
                sqlx::query(sql.flow_state.clone())
                    .bind(state.as_str())
                    .bind(failed_step.as_deref())
                    .bind(finished)
                    .bind(graph.id)
                    .execute(&mut *conn)
                    .await
                    .map_err(db("record a flow's state"))?;
            }
        }
    }
    Ok(())
}

async fn set_steps(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    graph: &FlowGraph,
    changes: Vec<StepChange>,
) -> StoreResult<()> {
    let mut names = Vec::with_capacity(changes.len());
    let mut states = Vec::with_capacity(changes.len());
    let mut finished = Vec::with_capacity(changes.len());
    let mut seqs = Vec::with_capacity(changes.len());
    let mut errors = Vec::with_capacity(changes.len());
    for (step, state, error) in changes {
        // The order of completion the policy gave the step (read only when it completed).
        seqs.push(
            graph
                .steps
                .iter()
                .find(|s| s.name == step)
                .and_then(|s| s.completed_seq),
        );
        names.push(step);
        states.push(state.as_str());
        finished.push(state.is_finished().then_some(ctx.now));
        errors.push(error.map(Json));
    }
    sqlx::query(ctx.sql.workflow.set_steps.clone())
        .bind(graph.id)
        .bind(&names)
        .bind(&states)
        .bind(&finished)
        .bind(&seqs)
        .bind(&errors)
        .execute(conn)
        .await
        .map_err(db("record flow steps' states"))?;
    Ok(())
}

/// Starts steps whose parents allow it: inserts each job step's job (under its reserved id,
/// with its completed parents' results) and makes each wait step wait.
async fn start_steps(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flow_id: Uuid,
    starting: &[String],
) -> StoreResult<()> {
    let sql = &ctx.sql.workflow;
    let rows = sqlx::query(sql.start_rows.clone())
        .bind(flow_id)
        .bind(starting)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read starting flow steps"))?;
    struct Starting {
        job: Option<NewJob>,
        job_id: Option<Uuid>,
        after: Vec<String>,
        wait_timeout_ms: Option<i64>,
    }
    let mut by_name: HashMap<String, Starting> = HashMap::with_capacity(rows.len());
    for row in &rows {
        let job: Option<Json<NewJob>> = column(row, "job")?;
        by_name.insert(
            column(row, "name")?,
            Starting {
                job: job.map(|Json(job)| job),
                job_id: column(row, "job_id")?,
                after: column(row, "after")?,
                wait_timeout_ms: column(row, "wait_timeout_ms")?,
            },
        );
    }
    // Every parent's result in one read (a fan-in's callback has many parents).
    let parents: HashSet<&str> = by_name
        .values()
        .filter(|s| s.job.is_some())
        .flat_map(|s| s.after.iter().map(String::as_str))
        .collect();
    let mut results: HashMap<String, Value> = HashMap::new();
    if !parents.is_empty() {
        let parents: Vec<&str> = parents.into_iter().collect();
        let rows = sqlx::query(sql.completed_results.clone())
            .bind(flow_id)
            .bind(&parents)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("read flow steps' results"))?;
        for row in &rows {
            let result: Option<Json<Value>> = column(row, "result")?;
            // A completed parent without a result is handed on as null.
            results.insert(
                column(row, "name")?,
                result.map_or(Value::Null, |Json(v)| v),
            );
        }
    }
    let mut jobs = Vec::new();
    let mut activated = Vec::new();
    let mut waiting = Vec::new();
    let mut deadlines = Vec::new();
    for name in starting {
        let step = by_name
            .remove(name)
            .ok_or_else(|| unreadable(format!("flow {flow_id} has no step {name:?}")))?;
        match (step.job, step.job_id) {
            (Some(job), Some(job_id)) => {
                // Only completed parents have a result; a failed one the step runs despite
                // (`continue`) is absent.
                let parents = step
                    .after
                    .iter()
                    .filter_map(|p| results.get(p).map(|r| (p.clone(), r.clone())))
                    .collect();
                let link = FlowLink {
                    flow_id,
                    step: name.clone(),
                    parents,
                };
                jobs.push(flow_job(ctx.now, job, job_id, link));
                activated.push(name.as_str());
            }
            _ => {
                waiting.push(name.as_str());
                deadlines.push(deadline(ctx.now, step.wait_timeout_ms));
            }
        }
    }
    if !jobs.is_empty() {
        // Queue depth limits do not apply: the flow was accepted whole when it was created.
        ops::import(&mut *conn, ctx.sql, &jobs).await?;
        sqlx::query(sql.activate.clone())
            .bind(flow_id)
            .bind(&activated)
            .execute(&mut *conn)
            .await
            .map_err(db("activate flow steps"))?;
    }
    if !waiting.is_empty() {
        sqlx::query(sql.begin_waits.clone())
            .bind(flow_id)
            .bind(&waiting)
            .bind(&deadlines)
            .execute(conn)
            .await
            .map_err(db("begin flow waits"))?;
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
    let Some(Json(mut job)) = column::<Option<Json<NewJob>>>(&row, "compensate")? else {
        return Ok(());
    };
    if job.payload.is_null() {
        if let Some(Json(original)) = column::<Option<Json<NewJob>>>(&row, "job")? {
            job.payload = original.payload;
        }
    }
    let result = column::<Option<Json<Value>>>(&row, "result")?.map_or(Value::Null, |Json(v)| v);
    let id = Uuid::now_v7();
    let link = FlowLink {
        flow_id,
        step: step.to_string(),
        parents: BTreeMap::from([(step.to_string(), result)]),
    };
    ops::import(&mut *conn, ctx.sql, &[flow_job(ctx.now, job, id, link)]).await?;
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
    write_effects(&mut *conn, ctx, &graph, effects).await?;
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
    write_effects(conn, ctx, &graph, effects).await?;
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
    // All of them up front, in id order: handling them one by one in deadline order would
    // lock them in an order another transaction might reverse.
    lock_flows(&mut *conn, ctx, due.iter().map(|(id, _)| *id).collect()).await?;
    let mut expired = 0;
    for (flow_id, step) in due {
        if handle(&mut *conn, ctx, flow_id, FlowEvent::WaitTimedOut { step }).await? {
            expired += 1;
        }
    }
    Ok(expired)
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
            compensation: compensation
                .map(|text| {
                    CompensationState::parse(&text)
                        .ok_or_else(|| unreadable(format!("compensation {text:?}")))
                })
                .transpose()?,
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
