//! Turns by key on the writer thread (`conveyor_core::limits::turns`; docs/plans/
//! flow-control-by-key.md, "Turns instead of a rotation"). An available job holding a
//! round-robin limit key carries its turn in `fair_turn`, and `jobs_fair_turn` keeps those jobs
//! in (priority, turn, key) order, so a claim over many keys reads one range, in about the order
//! the jobs were written, instead of seeking once per key.
//!
//! A job gets its turn when it becomes available: at insert, or, when it becomes available any
//! other way (due, released from its sequence, replayed), at the next keyed claim of its queue,
//! which turns such jobs first. A job holds no turn once claimed (the claim clears it, and so
//! do a replay and a sequence's release, which can find a job that was available before).
//! Turns count per queue and priority: each priority is its own line, so a late key joins the
//! first turn not yet started at its priority.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use conveyor_core::limits::named::{self as named, Admission, LimitSpec};
use conveyor_core::limits::turns::{self, KeyTurns};
use conveyor_core::{Job, JobState, StoreError, StoreResult};
use rusqlite::{params, OptionalExtension};
use uuid::Uuid;

use crate::errors::backend;
use crate::limits::KindFilter;
use crate::rows::COLUMNS;
use crate::writer::WriteCtx;

/// The turn `job`, about to be stored, gets: `None` unless it is available and holds a
/// round-robin key.
pub(crate) fn of_new(ctx: &WriteCtx<'_>, job: &Job) -> StoreResult<Option<i64>> {
    if job.state != JobState::Available {
        return Ok(None);
    }
    match named::fair_key(&job.limit_keys) {
        Some(key) => give(ctx, &job.queue, job.priority, key).map(Some),
        None => Ok(None),
    }
}

/// Gives the next turn of `key` in `queue` at `priority` and records what the key was given.
fn give(ctx: &WriteCtx<'_>, queue: &str, priority: i32, key: &str) -> StoreResult<i64> {
    let current = served(ctx, queue, priority)?;
    let place = (queue.to_string(), priority, key.to_string());
    let cached = ctx.turns_given.borrow().get(&place).copied();
    let before = match cached {
        Some(before) => Some(before),
        None => ctx
            .conn
            .prepare_cached(
                "SELECT next_turn, given FROM fair_turns \
                 WHERE queue = ?1 AND priority = ?2 AND key = ?3",
            )
            .and_then(|mut stmt| {
                stmt.query_row(params![queue, priority, key], |row| {
                    Ok(KeyTurns {
                        next: from_sql(row.get(0)?),
                        given: u32::try_from(row.get::<_, i64>(1)?).unwrap_or(0),
                    })
                })
                .optional()
            })
            .map_err(backend)?,
    };
    let weight = named::weight(specs(ctx)?, key);
    let (turn, after) = turns::next_turn(current, before, weight);
    ctx.turns_given.borrow_mut().insert(place, after);
    ctx.conn
        .prepare_cached(
            "INSERT INTO fair_turns (queue, priority, key, next_turn, given) \
             VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (queue, priority, key) \
             DO UPDATE SET next_turn = excluded.next_turn, given = excluded.given",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                queue,
                priority,
                key,
                to_sql(after.next),
                i64::from(after.given)
            ])
        })
        .map_err(backend)?;
    Ok(to_sql(turn))
}

/// The highest turn claimed in `queue` at `priority` (0 before any claim).
fn served(ctx: &WriteCtx<'_>, queue: &str, priority: i32) -> StoreResult<u64> {
    let line = (queue.to_string(), priority);
    if let Some(turn) = ctx.turns_served.borrow().get(&line) {
        return Ok(*turn);
    }
    let turn: Option<i64> = ctx
        .conn
        .prepare_cached("SELECT turn FROM fair_served WHERE queue = ?1 AND priority = ?2")
        .and_then(|mut stmt| {
            stmt.query_row(params![queue, priority], |row| row.get(0))
                .optional()
        })
        .map_err(backend)?;
    let turn = turn.map_or(0, from_sql);
    ctx.turns_served.borrow_mut().insert(line, turn);
    Ok(turn)
}

/// The named limits, read once per writer round (weights only shape turns, so a change made
/// earlier in the same round may be seen one round late).
fn specs<'a>(ctx: &'a WriteCtx<'_>) -> StoreResult<&'a BTreeMap<String, LimitSpec>> {
    if let Some(specs) = ctx.limit_specs.get() {
        return Ok(specs);
    }
    let specs = crate::limits::specs(ctx.conn)?;
    Ok(ctx.limit_specs.get_or_init(|| specs))
}

/// Gives turns to `queue`'s available keyed jobs that have none (they became available other
/// than by insert), in the order they came due.
fn give_waiting(ctx: &WriteCtx<'_>, queue: &str) -> StoreResult<()> {
    let waiting: Vec<(String, i32, String)> = ctx
        .conn
        .prepare_cached(
            "SELECT id, priority, fair_key FROM jobs WHERE state = 'available' AND queue = ?1 \
             AND fair_key IS NOT NULL AND fair_turn IS NULL ORDER BY run_at, id",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![queue], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })?
            .collect()
        })
        .map_err(backend)?;
    if waiting.is_empty() {
        return Ok(());
    }
    let mut set = ctx
        .conn
        .prepare_cached("UPDATE jobs SET fair_turn = ?2 WHERE id = ?1")
        .map_err(backend)?;
    for (id, priority, key) in waiting {
        let turn = give(ctx, queue, priority, &key)?;
        set.execute(params![id, turn]).map_err(backend)?;
    }
    Ok(())
}

/// Up to `quota` of `queue`'s available keyed jobs in turn order, passing over jobs whose keys
/// have no room under `admission` ([`turns::Picking`]), with the queue's jobs without a key
/// taking their turn among them ([`turns::with_unkeyed`]). Each keyed candidate's turn is kept
/// in `ctx.turns_read` for [`serve`].
pub(crate) fn candidates(
    ctx: &mut WriteCtx<'_>,
    queue: &str,
    quota: usize,
    filter: &KindFilter,
    admission: &Admission<'_>,
) -> StoreResult<Vec<Job>> {
    give_waiting(ctx, queue)?;
    // Keys without room are found as the range is read (and counted as held back), then left
    // out of a read again.
    let mut full: BTreeSet<String> = BTreeSet::new();
    let mut picking = turns::Picking::new(admission, quota);
    let mut keyed: Vec<(Job, (i32, u64))> = Vec::new();
    let mut read: HashSet<Uuid> = HashSet::new();
    let conn = ctx.conn;
    let kind = filter.sql(4);
    let mut stmt = conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS}, fair_turn FROM jobs WHERE state = 'available' AND queue = ?1 \
             AND fair_key IS NOT NULL AND fair_turn IS NOT NULL AND {kind} \
             AND fair_key NOT IN (SELECT value FROM json_each(?2)) \
             AND (?3 = 0 OR NOT EXISTS (SELECT 1 FROM json_each(jobs.limit_keys) k \
                 WHERE k.value IN (SELECT value FROM json_each(?2)))) \
             ORDER BY priority DESC, fair_turn, fair_key, id"
        ))
        .map_err(backend)?;
    'reads: while !picking.done() {
        let full_json = serde_json::to_string(&full)
            .map_err(|e| StoreError::backend(format!("cannot serialize limit keys: {e}")))?;
        let mut rows = stmt
            .query(params![
                queue,
                full_json,
                !full.is_empty(),
                filter.only,
                filter.excluded
            ])
            .map_err(backend)?;
        while !picking.done() {
            let Some(row) = rows.next().map_err(backend)? else {
                break 'reads;
            };
            let job = crate::rows::job(row).map_err(backend)?;
            if read.contains(&job.id) {
                continue; // Picked before a re-read.
            }
            if !picking.offer(&job.limit_keys) {
                if picking.reread(&mut full) {
                    continue 'reads;
                }
                continue;
            }
            // The turn is the last column, after the job's own.
            let last = row.as_ref().column_count().saturating_sub(1);
            let turn: i64 = row.get(last).map_err(backend)?;
            read.insert(job.id);
            let place = (job.priority, from_sql(turn));
            keyed.push((job, place));
        }
    }
    drop(stmt);
    let places: Vec<(i32, u64)> = keyed.iter().map(|(_, place)| *place).collect();
    let share = turns::unkeyed_share(&places, quota);
    let unkeyed = if share == 0 {
        Vec::new()
    } else {
        crate::limits::unkeyed(ctx, queue, share, filter)?
    };
    for (job, (_, turn)) in &keyed {
        ctx.turns_read.insert(job.id, *turn);
    }
    Ok(turns::with_unkeyed(keyed, unkeyed, quota))
}

/// After a claim: the turn served in each queue and priority moves up to the highest turn
/// claimed there ([`turns::served`]), and keys whose next turn it reached are forgotten
/// ([`KeyTurns::stale`]: they would be given the turn after it anyway).
pub(crate) fn serve(ctx: &mut WriteCtx<'_>, claimed: &[Job]) -> StoreResult<()> {
    if ctx.turns_read.is_empty() {
        return Ok(());
    }
    let mut highest: BTreeMap<(&str, i32), u64> = BTreeMap::new();
    for job in claimed {
        if let Some(turn) = ctx.turns_read.get(&job.id) {
            let entry = highest.entry((&job.queue, job.priority)).or_insert(0);
            *entry = (*entry).max(*turn);
        }
    }
    for ((queue, priority), turn) in highest {
        let current = served(ctx, queue, priority)?;
        let now_served = turns::served(current, [turn]);
        if now_served == current {
            continue;
        }
        ctx.turns_served
            .borrow_mut()
            .insert((queue.to_string(), priority), now_served);
        ctx.conn
            .prepare_cached(
                "INSERT INTO fair_served (queue, priority, turn) VALUES (?1, ?2, ?3) \
                 ON CONFLICT (queue, priority) DO UPDATE SET turn = excluded.turn",
            )
            .and_then(|mut stmt| stmt.execute(params![queue, priority, to_sql(now_served)]))
            .map_err(backend)?;
        ctx.conn
            .prepare_cached(
                "DELETE FROM fair_turns WHERE queue = ?1 AND priority = ?2 AND next_turn <= ?3",
            )
            .and_then(|mut stmt| stmt.execute(params![queue, priority, to_sql(now_served)]))
            .map_err(backend)?;
    }
    ctx.turns_read.clear();
    Ok(())
}

/// Turns are stored as SQLite integers; one beyond `i64::MAX` (never reached: a turn grows by
/// one per job) is kept at the largest.
fn to_sql(turn: u64) -> i64 {
    i64::try_from(turn).unwrap_or(i64::MAX)
}

fn from_sql(turn: i64) -> u64 {
    u64::try_from(turn).unwrap_or(0)
}
