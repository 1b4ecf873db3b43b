//! Cron schedules: their definitions, state and runs (see `conveyor_core::schedule`).
//!
//! Changes run on the writer thread like every other write, so a firing's revision check, its
//! jobs and its run records commit together, and two firings of one schedule never interleave:
//! of two nodes (or tasks) racing to fire a tick, the second finds the revision moved on.

use chrono::{DateTime, Utc};
use conveyor_core::clock::{from_millis, to_millis};
use conveyor_core::schedule::{RunStatus, RECENT_RUNS, RUNS_KEPT};
use conveyor_core::{
    FireOutcome, FireRequest, JobState, OverlapPolicy, Schedule, ScheduleRun, ScheduleView,
    StoreError, StoreResult,
};
use rusqlite::{params, Connection, OptionalExtension, Row};
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::backend;
use crate::writer::WriteCtx;

const SCHEDULE_COLUMNS: &str =
    "name, definition, revision, due_after, last_tick, created_at, updated_at";

/// A `schedules` row, before its runs are read.
struct StoredSchedule {
    schedule: Schedule,
    revision: u64,
    due_after: DateTime<Utc>,
    last_tick: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

fn unreadable(name: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::backend(format!("unreadable stored schedule {name:?}: {e}"))
}

/// Reads a row selected with [`SCHEDULE_COLUMNS`]; the definition is parsed by the caller so
/// that a bad one is reported as such rather than as a SQL conversion error.
fn raw_row(row: &Row<'_>) -> rusqlite::Result<RawRow> {
    Ok((
        row.get(0)?,
        row.get(1)?,
        row.get(2)?,
        row.get(3)?,
        row.get(4)?,
        row.get(5)?,
        row.get(6)?,
    ))
}

type RawRow = (String, String, i64, i64, Option<i64>, i64, i64);

fn stored(raw: RawRow) -> StoreResult<StoredSchedule> {
    let (name, definition, revision, due_after, last_tick, created_at, updated_at) = raw;
    let schedule = Schedule::from_json(&name, &definition).map_err(|e| unreadable(&name, e))?;
    Ok(StoredSchedule {
        schedule,
        revision: revision.max(0) as u64,
        due_after: from_millis(due_after),
        last_tick: last_tick.map(from_millis),
        created_at: from_millis(created_at),
        updated_at: from_millis(updated_at),
    })
}

fn load(conn: &Connection, name: &str) -> StoreResult<Option<StoredSchedule>> {
    let raw = conn
        .prepare_cached(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules WHERE name = ?1"
        ))
        .and_then(|mut stmt| stmt.query_row(params![name], raw_row).optional())
        .map_err(backend)?;
    raw.map(stored).transpose()
}

fn run_row(row: &Row<'_>) -> rusqlite::Result<ScheduleRun> {
    let conversion = |column: usize, e: Box<dyn std::error::Error + Send + Sync>| {
        rusqlite::Error::FromSqlConversionFailure(column, rusqlite::types::Type::Text, e)
    };
    let status: String = row.get(3)?;
    let job_id: Option<String> = row.get(5)?;
    let job_state: Option<String> = row.get(7)?;
    Ok(ScheduleRun {
        schedule: row.get(0)?,
        tick: from_millis(row.get(1)?),
        fired_at: from_millis(row.get(2)?),
        status: RunStatus::from_str(&status).map_err(|e| conversion(3, Box::new(e)))?,
        catch_up: row.get(4)?,
        job_id: job_id
            .map(|id| Uuid::parse_str(&id))
            .transpose()
            .map_err(|e| conversion(5, Box::new(e)))?,
        detail: row.get(6)?,
        job_state: job_state
            .map(|state| JobState::from_str(&state))
            .transpose()
            .map_err(|e| conversion(7, Box::new(e)))?,
    })
}

/// A schedule's latest runs, newest first, with the current state of each run's job.
pub(crate) fn runs(conn: &Connection, name: &str, limit: usize) -> StoreResult<Vec<ScheduleRun>> {
    conn.prepare_cached(
        "SELECT r.schedule, r.tick, r.fired_at, r.status, r.catch_up, r.job_id, r.detail, j.state \
         FROM schedule_runs r LEFT JOIN jobs j ON j.id = r.job_id \
         WHERE r.schedule = ?1 ORDER BY r.tick DESC LIMIT ?2",
    )
    .and_then(|mut stmt| {
        stmt.query_map(params![name, limit.min(i64::MAX as usize) as i64], run_row)?
            .collect()
    })
    .map_err(backend)
}

fn view(
    conn: &Connection,
    stored: StoredSchedule,
    now: DateTime<Utc>,
    recent: usize,
) -> StoreResult<ScheduleView> {
    let recent_runs = runs(conn, stored.schedule.name(), recent.max(1))?;
    let last_run = recent_runs.first().cloned();
    Ok(ScheduleView {
        next_run_at: stored.schedule.next_run(stored.due_after, now),
        schedule: stored.schedule,
        revision: stored.revision,
        due_after: stored.due_after,
        last_tick: stored.last_tick,
        last_run,
        recent_runs: if recent > 0 { recent_runs } else { Vec::new() },
        created_at: stored.created_at,
        updated_at: stored.updated_at,
    })
}

pub(crate) fn get(
    conn: &Connection,
    name: &str,
    now: DateTime<Utc>,
) -> StoreResult<Option<ScheduleView>> {
    load(conn, name)?
        .map(|stored| view(conn, stored, now, RECENT_RUNS))
        .transpose()
}

pub(crate) fn list(conn: &Connection, now: DateTime<Utc>) -> StoreResult<Vec<ScheduleView>> {
    let raws: Vec<RawRow> = conn
        .prepare_cached(&format!(
            "SELECT {SCHEDULE_COLUMNS} FROM schedules ORDER BY name"
        ))
        .and_then(|mut stmt| stmt.query_map([], raw_row)?.collect())
        .map_err(backend)?;
    raws.into_iter()
        .map(|raw| view(conn, stored(raw)?, now, 0))
        .collect()
}

pub(crate) fn put(ctx: &mut WriteCtx<'_>, schedule: Schedule) -> StoreResult<ScheduleView> {
    let now = to_millis(ctx.now);
    let existing: Option<(String, i64)> = ctx
        .conn
        .prepare_cached("SELECT definition, due_after FROM schedules WHERE name = ?1")
        .and_then(|mut stmt| {
            stmt.query_row(params![schedule.name()], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()
        })
        .map_err(backend)?;
    match existing {
        None => {
            ctx.conn
                .prepare_cached(
                    "INSERT INTO schedules (name, definition, revision, due_after, created_at, \
                     updated_at) VALUES (?1, ?2, 1, ?3, ?3, ?3)",
                )
                .and_then(|mut stmt| {
                    stmt.execute(params![schedule.name(), schedule.to_json(), now])
                })
                .map_err(backend)?;
        }
        Some((definition, due_after)) => {
            // A definition this version cannot read is replaced as if its ticks changed.
            let previous = Schedule::from_json(schedule.name(), &definition).ok();
            if previous.as_ref() != Some(&schedule) {
                let same_ticks = previous.is_some_and(|p| p.same_ticks(&schedule));
                // New ticks count from now: an earlier expression's due ticks must not fire.
                let due_after = if same_ticks {
                    due_after
                } else {
                    due_after.max(now)
                };
                ctx.conn
                    .prepare_cached(
                        "UPDATE schedules SET definition = ?2, revision = revision + 1, \
                         due_after = ?3, updated_at = ?4 WHERE name = ?1",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(params![schedule.name(), schedule.to_json(), due_after, now])
                    })
                    .map_err(backend)?;
            }
        }
    }
    let stored = load(ctx.conn, schedule.name())?
        .ok_or_else(|| StoreError::backend("schedule vanished while being stored"))?;
    view(ctx.conn, stored, ctx.now, RECENT_RUNS)
}

pub(crate) fn delete(ctx: &mut WriteCtx<'_>, name: &str) -> StoreResult<bool> {
    ctx.conn
        .prepare_cached("DELETE FROM schedule_runs WHERE schedule = ?1")
        .and_then(|mut stmt| stmt.execute(params![name]))
        .map_err(backend)?;
    let deleted = ctx
        .conn
        .prepare_cached("DELETE FROM schedules WHERE name = ?1")
        .and_then(|mut stmt| stmt.execute(params![name]))
        .map_err(backend)?;
    Ok(deleted == 1)
}

/// The state of job `id`, `None` when it no longer exists.
fn job_state(conn: &Connection, id: Uuid) -> StoreResult<Option<JobState>> {
    let state: Option<String> = conn
        .prepare_cached("SELECT state FROM jobs WHERE id = ?1")
        .and_then(|mut stmt| {
            stmt.query_row(params![id.to_string()], |row| row.get(0))
                .optional()
        })
        .map_err(backend)?;
    state
        .map(|s| JobState::from_str(&s).map_err(|e| StoreError::backend(e.to_string())))
        .transpose()
}

/// Runs `work` in a savepoint of its own, so that a refused insert leaves nothing behind while
/// the rest of the firing goes on; the round's count changes and wake-up are restored with it.
fn in_savepoint<T>(
    ctx: &mut WriteCtx<'_>,
    work: impl FnOnce(&mut WriteCtx<'_>) -> StoreResult<T>,
) -> StoreResult<T> {
    ctx.conn
        .execute_batch("SAVEPOINT schedule_job")
        .map_err(backend)?;
    let (wake, counts) = (ctx.wake, ctx.counts.len());
    let outcome = work(ctx);
    let end = if outcome.is_ok() {
        ctx.conn.execute_batch("RELEASE schedule_job")
    } else {
        ctx.wake = wake;
        ctx.counts.truncate(counts);
        ctx.conn
            .execute_batch("ROLLBACK TO schedule_job; RELEASE schedule_job")
    };
    end.map_err(backend)?;
    outcome
}

pub(crate) fn fire(ctx: &mut WriteCtx<'_>, request: FireRequest) -> StoreResult<FireOutcome> {
    let row: Option<(String, i64, i64, Option<String>)> = ctx
        .conn
        .prepare_cached(
            "SELECT definition, revision, due_after, last_job_id FROM schedules WHERE name = ?1",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![request.name], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()
        })
        .map_err(backend)?;
    let Some((definition, revision, due_after, last_job_id)) = row else {
        return Ok(FireOutcome::Conflict);
    };
    // The writer runs one operation at a time, so this check and the updates below are atomic.
    if revision.max(0) as u64 != request.revision {
        return Ok(FireOutcome::Conflict);
    }
    request.check(from_millis(due_after))?;
    let schedule = Schedule::from_json(&request.name, &definition)
        .map_err(|e| unreadable(&request.name, e))?;
    let mut last_job = last_job_id.and_then(|id| Uuid::parse_str(&id).ok());
    let mut runs = Vec::with_capacity(request.ticks.len());
    for tick in &request.ticks {
        let mut run = ScheduleRun::pending(&request.name, tick, ctx.now);
        let previous = match (schedule.overlap(), last_job) {
            (OverlapPolicy::Skip, Some(id)) => Some((id, job_state(ctx.conn, id)?)),
            _ => None,
        };
        if !run.skipped_for_overlap(previous) {
            let job = request.stamp.apply(schedule.job_for(tick.at));
            match in_savepoint(ctx, |ctx| crate::ops::insert_many(ctx, vec![job])) {
                Ok(inserted) => {
                    let inserted = inserted.into_iter().next().ok_or_else(|| {
                        StoreError::backend("insert returned no job for a schedule run")
                    })?;
                    last_job = Some(run.enqueued(&inserted));
                }
                Err(refused @ (StoreError::QueueFull { .. } | StoreError::Invalid(_))) => {
                    run.refused(&refused);
                }
                Err(other) => return Err(other),
            }
        }
        ctx.conn
            .prepare_cached(
                "INSERT INTO schedule_runs (schedule, tick, fired_at, status, catch_up, job_id, \
                 detail) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    run.schedule,
                    to_millis(run.tick),
                    to_millis(run.fired_at),
                    run.status.as_str(),
                    run.catch_up,
                    run.job_id.map(|id| id.to_string()),
                    run.detail,
                ])
            })
            .map_err(backend)?;
        runs.push(run);
    }
    ctx.conn
        .prepare_cached(
            "UPDATE schedules SET revision = revision + 1, due_after = ?2, \
             last_tick = COALESCE(?3, last_tick), last_job_id = ?4 WHERE name = ?1",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                request.name,
                to_millis(request.due_after),
                runs.last().map(|run| to_millis(run.tick)),
                last_job.map(|id| id.to_string()),
            ])
        })
        .map_err(backend)?;
    if !runs.is_empty() {
        // Keep the newest runs only: a per-second schedule would otherwise grow without end.
        ctx.conn
            .prepare_cached(
                "DELETE FROM schedule_runs WHERE schedule = ?1 AND tick <= ( \
                     SELECT tick FROM schedule_runs WHERE schedule = ?1 \
                     ORDER BY tick DESC LIMIT 1 OFFSET ?2)",
            )
            .and_then(|mut stmt| stmt.execute(params![request.name, RUNS_KEPT as i64]))
            .map_err(backend)?;
    }
    Ok(FireOutcome::Fired(runs))
}
