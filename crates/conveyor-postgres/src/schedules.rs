//! Cron schedules: their definitions, state and runs (see `conveyor_core::schedule`).
//!
//! A firing locks the schedule's row (`FOR UPDATE`), checks the revision it was planned from,
//! enqueues the runs' jobs through the ordinary insert path and records the runs, all in the
//! caller's transaction: of two servers racing to fire one tick, the second waits for the
//! first's commit, then finds the revision moved on and records nothing.

use chrono::{DateTime, Utc};
use conveyor_core::schedule::{RunStatus, RECENT_RUNS, RUNS_KEPT};
use conveyor_core::{
    FireOutcome, FireRequest, JobState, OverlapPolicy, Schedule, ScheduleRun, ScheduleSpec,
    ScheduleView, StoreError, StoreResult,
};
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row, SqlSafeStr, SqlStr};
use std::str::FromStr;
use std::sync::Arc;
use uuid::Uuid;

use crate::ctx::Ctx;
use crate::errors::db;
use crate::names::quoted;
use crate::ops;

/// A statement text that clones without copying (as in `sql.rs`).
fn stmt(text: String) -> SqlStr {
    AssertSqlSafe(Arc::<str>::from(text)).into_sql_str()
}

/// The columns of a run joined with its job's state (`r` runs, `j` jobs).
const RUN_COLUMNS: &str = "r.schedule AS run_schedule, r.tick AS run_tick, \
    r.fired_at AS run_fired_at, r.status AS run_status, r.catch_up AS run_catch_up, \
    r.job_id AS run_job_id, r.detail AS run_detail, j.state AS run_job_state";

const SCHEDULE_COLUMNS: &str = "s.name, s.definition, s.revision, s.due_after, s.last_tick, \
    s.created_at, s.updated_at";

/// Every statement of this module, built once per store for its schema.
pub(crate) struct ScheduleSql {
    get: SqlStr,
    list: SqlStr,
    runs: SqlStr,
    insert: SqlStr,
    lock: SqlStr,
    update: SqlStr,
    delete: SqlStr,
    job_state: SqlStr,
    insert_run: SqlStr,
    fired: SqlStr,
    prune: SqlStr,
}

impl ScheduleSql {
    /// Statements for `schema`, which must already be validated.
    pub(crate) fn new(schema: &str) -> Self {
        let schedules = format!("{}.schedules", quoted(schema));
        let runs = format!("{}.schedule_runs", quoted(schema));
        let jobs = format!("{}.jobs", quoted(schema));
        Self {
            get: stmt(format!(
                "SELECT {SCHEDULE_COLUMNS} FROM {schedules} s WHERE s.name = $1"
            )),
            // Each schedule with its latest run, in one statement (the scheduler lists often).
            list: stmt(format!(
                "SELECT {SCHEDULE_COLUMNS}, last.* FROM {schedules} s \
                 LEFT JOIN LATERAL ( \
                     SELECT {RUN_COLUMNS} FROM {runs} r LEFT JOIN {jobs} j ON j.id = r.job_id \
                     WHERE r.schedule = s.name ORDER BY r.tick DESC LIMIT 1) last ON true \
                 ORDER BY s.name"
            )),
            runs: stmt(format!(
                "SELECT {RUN_COLUMNS} FROM {runs} r LEFT JOIN {jobs} j ON j.id = r.job_id \
                 WHERE r.schedule = $1 ORDER BY r.tick DESC LIMIT $2"
            )),
            // Nothing when the name exists: the caller then updates it under its row lock.
            insert: stmt(format!(
                "INSERT INTO {schedules} (name, definition, revision, due_after, created_at, \
                     updated_at) VALUES ($1, $2, 1, $3, $3, $3) \
                 ON CONFLICT (name) DO NOTHING RETURNING name"
            )),
            lock: stmt(format!(
                "SELECT definition, revision, due_after, last_job_id FROM {schedules} \
                 WHERE name = $1 FOR UPDATE"
            )),
            update: stmt(format!(
                "UPDATE {schedules} SET definition = $2, revision = revision + 1, \
                     due_after = $3, updated_at = $4 WHERE name = $1"
            )),
            // Runs go with it (ON DELETE CASCADE).
            delete: stmt(format!("DELETE FROM {schedules} WHERE name = $1")),
            job_state: stmt(format!("SELECT state FROM {jobs} WHERE id = $1")),
            insert_run: stmt(format!(
                "INSERT INTO {runs} (schedule, tick, fired_at, status, catch_up, job_id, detail) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)"
            )),
            fired: stmt(format!(
                "UPDATE {schedules} SET revision = revision + 1, due_after = $2, \
                     last_tick = COALESCE($3, last_tick), last_job_id = $4 WHERE name = $1"
            )),
            // Keeps the newest runs: a per-second schedule would otherwise grow without end.
            prune: stmt(format!(
                "DELETE FROM {runs} WHERE schedule = $1 AND tick <= ( \
                     SELECT tick FROM {runs} WHERE schedule = $1 \
                     ORDER BY tick DESC LIMIT 1 OFFSET $2)"
            )),
        }
    }
}

fn unreadable(what: impl std::fmt::Display) -> StoreError {
    StoreError::backend(format!("postgres: unreadable schedule row: {what}"))
}

fn column<'r, T>(row: &'r PgRow, name: &str) -> StoreResult<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(name)
        .map_err(|e| unreadable(format!("column {name}: {e}")))
}

/// The run in the `run_*` columns of `row`, `None` when they are NULL (no run).
fn run_of(row: &PgRow) -> StoreResult<Option<ScheduleRun>> {
    let Some(schedule) = column::<Option<String>>(row, "run_schedule")? else {
        return Ok(None);
    };
    let status: String = column(row, "run_status")?;
    let job_state: Option<String> = column(row, "run_job_state")?;
    Ok(Some(ScheduleRun {
        schedule,
        tick: column(row, "run_tick")?,
        fired_at: column(row, "run_fired_at")?,
        status: RunStatus::from_str(&status).map_err(unreadable)?,
        catch_up: column(row, "run_catch_up")?,
        job_id: column(row, "run_job_id")?,
        job_state: job_state
            .map(|state| JobState::from_str(&state))
            .transpose()
            .map_err(unreadable)?,
        detail: column(row, "run_detail")?,
    }))
}

/// A row selected with [`SCHEDULE_COLUMNS`] as a view, without runs.
fn view_of(row: &PgRow, now: DateTime<Utc>) -> StoreResult<ScheduleView> {
    let name: String = column(row, "name")?;
    let Json(spec) = column::<Json<ScheduleSpec>>(row, "definition")?;
    let schedule = Schedule::from_spec(name.as_str(), spec)
        .map_err(|e| unreadable(format!("schedule {name:?}: {e}")))?;
    let revision: i64 = column(row, "revision")?;
    let due_after: DateTime<Utc> = column(row, "due_after")?;
    Ok(ScheduleView {
        next_run_at: schedule.next_run(due_after, now),
        schedule,
        revision: revision.max(0) as u64,
        due_after,
        last_tick: column(row, "last_tick")?,
        last_run: None,
        recent_runs: Vec::new(),
        created_at: column(row, "created_at")?,
        updated_at: column(row, "updated_at")?,
    })
}

pub(crate) async fn runs(
    conn: &mut PgConnection,
    sql: &ScheduleSql,
    name: &str,
    limit: usize,
) -> StoreResult<Vec<ScheduleRun>> {
    let rows = sqlx::query(sql.runs.clone())
        .bind(name)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(conn)
        .await
        .map_err(db("read schedule runs"))?;
    rows.iter()
        .map(|row| run_of(row)?.ok_or_else(|| unreadable("a run without a schedule")))
        .collect()
}

pub(crate) async fn get(
    conn: &mut PgConnection,
    sql: &ScheduleSql,
    name: &str,
    now: DateTime<Utc>,
) -> StoreResult<Option<ScheduleView>> {
    let row = sqlx::query(sql.get.clone())
        .bind(name)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("read schedule"))?;
    let Some(row) = row else {
        return Ok(None);
    };
    let mut view = view_of(&row, now)?;
    view.recent_runs = runs(conn, sql, name, RECENT_RUNS).await?;
    view.last_run = view.recent_runs.first().cloned();
    Ok(Some(view))
}

pub(crate) async fn list(
    conn: &mut PgConnection,
    sql: &ScheduleSql,
    now: DateTime<Utc>,
) -> StoreResult<Vec<ScheduleView>> {
    let rows = sqlx::query(sql.list.clone())
        .fetch_all(conn)
        .await
        .map_err(db("list schedules"))?;
    rows.iter()
        .map(|row| {
            let mut view = view_of(row, now)?;
            view.last_run = run_of(row)?;
            Ok(view)
        })
        .collect()
}

/// Creates or updates `schedule` inside the caller's transaction.
pub(crate) async fn put(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    sql: &ScheduleSql,
    schedule: &Schedule,
) -> StoreResult<()> {
    let created = sqlx::query(sql.insert.clone())
        .bind(schedule.name())
        .bind(Json(schedule.spec()))
        .bind(ctx.now)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("insert schedule"))?;
    if created.is_some() {
        return Ok(());
    }
    // It exists (a concurrent insert of the same name has committed by now: ON CONFLICT waited
    // for it). Lock it, so a concurrent firing or update is ordered before or after this one.
    let row = sqlx::query(sql.lock.clone())
        .bind(schedule.name())
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("lock schedule"))?
        .ok_or_else(|| {
            StoreError::backend(format!(
                "postgres: schedule {:?} was deleted while being updated; retry",
                schedule.name()
            ))
        })?;
    let Json(spec) = column::<Json<ScheduleSpec>>(&row, "definition")?;
    // A definition this version cannot read is replaced as if its ticks changed.
    let previous = Schedule::from_spec(schedule.name(), spec).ok();
    if previous.as_ref() == Some(schedule) {
        return Ok(());
    }
    let due_after: DateTime<Utc> = column(&row, "due_after")?;
    // New ticks count from now: an earlier expression's due ticks must not fire.
    let due_after = if previous.is_some_and(|p| p.same_ticks(schedule)) {
        due_after
    } else {
        due_after.max(ctx.now)
    };
    sqlx::query(sql.update.clone())
        .bind(schedule.name())
        .bind(Json(schedule.spec()))
        .bind(due_after)
        .bind(ctx.now)
        .execute(conn)
        .await
        .map_err(db("update schedule"))?;
    Ok(())
}

pub(crate) async fn delete(
    conn: &mut PgConnection,
    sql: &ScheduleSql,
    name: &str,
) -> StoreResult<bool> {
    let deleted = sqlx::query(sql.delete.clone())
        .bind(name)
        .execute(conn)
        .await
        .map_err(db("delete schedule"))?;
    Ok(deleted.rows_affected() == 1)
}

/// The state of job `id`, `None` when it no longer exists.
async fn job_state(
    conn: &mut PgConnection,
    sql: &ScheduleSql,
    id: Uuid,
) -> StoreResult<Option<JobState>> {
    let state: Option<String> = sqlx::query_scalar(sql.job_state.clone())
        .bind(id)
        .fetch_optional(conn)
        .await
        .map_err(db("read a schedule run's job"))?;
    state
        .map(|s| JobState::from_str(&s).map_err(unreadable))
        .transpose()
}

/// What a firing did; `made_available` says whether waiting fetchers should be woken.
pub(crate) struct Fired {
    pub outcome: FireOutcome,
    pub made_available: bool,
}

/// Fires `request` inside the caller's transaction (see the module documentation).
pub(crate) async fn fire(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    sql: &ScheduleSql,
    request: &FireRequest,
) -> StoreResult<Fired> {
    let conflict = Fired {
        outcome: FireOutcome::Conflict,
        made_available: false,
    };
    let row = sqlx::query(sql.lock.clone())
        .bind(&request.name)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("lock schedule"))?;
    let Some(row) = row else {
        return Ok(conflict);
    };
    let revision: i64 = column(&row, "revision")?;
    if revision.max(0) as u64 != request.revision {
        return Ok(conflict);
    }
    let due_after: DateTime<Utc> = column(&row, "due_after")?;
    request.check(due_after)?;
    let Json(spec) = column::<Json<ScheduleSpec>>(&row, "definition")?;
    let schedule = Schedule::from_spec(request.name.as_str(), spec)
        .map_err(|e| unreadable(format!("schedule {:?}: {e}", request.name)))?;
    let mut last_job: Option<Uuid> = column(&row, "last_job_id")?;
    let mut made_available = false;
    let mut runs = Vec::with_capacity(request.ticks.len());
    for tick in &request.ticks {
        let mut run = ScheduleRun::pending(&request.name, tick, ctx.now);
        let previous = match (schedule.overlap(), last_job) {
            (OverlapPolicy::Skip, Some(id)) => Some((id, job_state(&mut *conn, sql, id).await?)),
            _ => None,
        };
        if !run.skipped_for_overlap(previous) {
            // A savepoint of its own: a refused job (a full queue) must not abort the firing.
            let mut savepoint = conn.begin().await.map_err(db("begin schedule job"))?;
            // No turn reserved inside the firing's transaction: the next keyed claim gives it.
            let inserted = ops::insert_many(
                &mut savepoint,
                ctx,
                vec![request.stamp.apply(schedule.job_for(tick.at))],
                &mut crate::limits::Reserved::default(),
            )
            .await;
            match inserted {
                Ok(insertion) => {
                    savepoint
                        .commit()
                        .await
                        .map_err(db("release schedule job"))?;
                    made_available |= insertion.made_available;
                    let inserted = insertion.inserted.into_iter().next().ok_or_else(|| {
                        StoreError::backend("postgres: insert returned no job for a schedule run")
                    })?;
                    last_job = Some(run.enqueued(&inserted));
                }
                Err(refused @ (StoreError::QueueFull { .. } | StoreError::Invalid(_))) => {
                    savepoint
                        .rollback()
                        .await
                        .map_err(db("roll back schedule job"))?;
                    run.refused(&refused);
                }
                Err(other) => return Err(other),
            }
        }
        sqlx::query(sql.insert_run.clone())
            .bind(&run.schedule)
            .bind(run.tick)
            .bind(run.fired_at)
            .bind(run.status.as_str())
            .bind(run.catch_up)
            .bind(run.job_id)
            .bind(&run.detail)
            .execute(&mut *conn)
            .await
            .map_err(db("record schedule run"))?;
        runs.push(run);
    }
    sqlx::query(sql.fired.clone())
        .bind(&request.name)
        .bind(request.due_after)
        .bind(runs.last().map(|run| run.tick))
        .bind(last_job)
        .execute(&mut *conn)
        .await
        .map_err(db("update fired schedule"))?;
    if !runs.is_empty() {
        sqlx::query(sql.prune.clone())
            .bind(&request.name)
            .bind(RUNS_KEPT as i64)
            .execute(&mut *conn)
            .await
            .map_err(db("prune schedule runs"))?;
    }
    Ok(Fired {
        outcome: FireOutcome::Fired(runs),
        made_available,
    })
}
