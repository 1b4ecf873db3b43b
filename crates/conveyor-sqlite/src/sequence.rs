//! Sequences (`conveyor_core::sequence`) on the writer thread: numbering a job as it enters its
//! sequence (blocked when a job of the key holds the sequence or waits in it), and releasing
//! the next blocked job when one stops holding it. The writer runs one operation at a time, so
//! neither needs a lock. Below the operations, beside `jobs`, which both call.

use conveyor_core::sequence::{self, OnDead};
use conveyor_core::{Job, JobState, StoreResult};
use rusqlite::{params, OptionalExtension};

use crate::errors::backend;
use crate::rows::millis;
use crate::writer::WriteCtx;

/// The partial index's own condition (`jobs_sequence_open`), repeated so SQLite uses it.
const OPEN: &str = "state IN ('blocked', 'scheduled', 'available', 'running', 'retryable', 'dead')";

/// Numbers `job` (about to be inserted) in its sequence, and blocks it behind the jobs of its
/// key that have not finished. Nothing for a job without a sequence.
pub(crate) fn enter(ctx: &WriteCtx<'_>, job: &mut Job) -> StoreResult<()> {
    let Some(place) = job.sequence.as_mut() else {
        return Ok(());
    };
    let (last, waits): (Option<i64>, bool) = ctx
        .conn
        .prepare_cached(&format!(
            "SELECT (SELECT MAX(sequence_no) FROM jobs WHERE sequence_key = ?1), \
             EXISTS (SELECT 1 FROM jobs WHERE sequence_key = ?1 AND {OPEN} AND {})",
            sequence::waits_sql("")
        ))
        .and_then(|mut stmt| {
            stmt.query_row(params![place.key], |row| Ok((row.get(0)?, row.get(1)?)))
        })
        .map_err(backend)?;
    place.no = last.map_or(1, |last| last.max(0) as u64 + 1);
    if waits {
        job.state = JobState::Blocked;
    }
    Ok(())
}

/// After `job` moved from `from` to its current state (or was deleted, `gone`): releases the
/// next job of its sequence when it held the sequence and no longer does.
pub(crate) fn moved(ctx: &mut WriteCtx<'_>, job: &Job, from: JobState) -> StoreResult<()> {
    let Some(place) = &job.sequence else {
        return Ok(());
    };
    if sequence::holds(from, place.on_dead) && !sequence::holds(job.state, place.on_dead) {
        release(ctx, &place.key)?;
    }
    Ok(())
}

/// Like [`moved`] for a job known only by its sequence columns, deleted while in `from`.
pub(crate) fn deleted(
    ctx: &mut WriteCtx<'_>,
    key: Option<&str>,
    skip_dead: bool,
    from: JobState,
) -> StoreResult<()> {
    let on_dead = if skip_dead {
        OnDead::Skip
    } else {
        OnDead::Block
    };
    match key {
        Some(key) if sequence::holds(from, on_dead) => release(ctx, key),
        _ => Ok(()),
    }
}

/// Puts a job just made available (a replay) back behind its sequence: blocked, for
/// [`release`] to decide when it runs.
pub(crate) fn requeue(ctx: &mut WriteCtx<'_>, queue: &str, id: &str) -> StoreResult<()> {
    let changed = ctx
        .conn
        .prepare_cached("UPDATE jobs SET state = 'blocked' WHERE id = ?1 AND state = 'available'")
        .and_then(|mut stmt| stmt.execute(params![id]))
        .map_err(backend)?;
    if changed == 1 {
        ctx.count_move(queue, Some(JobState::Available), Some(JobState::Blocked));
    }
    Ok(())
}

/// Releases the lowest-numbered blocked job of `key` unless a job of the key still holds the
/// sequence.
pub(crate) fn release(ctx: &mut WriteCtx<'_>, key: &str) -> StoreResult<()> {
    let now = millis(ctx.now);
    let released: Option<(String, String)> = ctx
        .conn
        .prepare_cached(&format!(
            "UPDATE jobs SET state = {}, fair_turn = NULL \
             WHERE id = ( \
                 SELECT id FROM jobs WHERE sequence_key = ?1 AND {OPEN} \
                 AND state = 'blocked' ORDER BY sequence_no LIMIT 1) \
             AND state = 'blocked' \
             AND NOT EXISTS (SELECT 1 FROM jobs WHERE sequence_key = ?1 AND {OPEN} AND {}) \
             RETURNING queue, state",
            sequence::released_state_sql("?2"),
            sequence::holds_sql("")
        ))
        .and_then(|mut stmt| {
            stmt.query_row(params![key, now], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(backend)?;
    if let Some((queue, state)) = released {
        let state: JobState = state.parse()?;
        ctx.count_move(&queue, Some(JobState::Blocked), Some(state));
        if state == JobState::Available {
            ctx.wake = true;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::OPEN;

    #[test]
    fn the_open_condition_lists_cores_open_states_as_the_index_does() {
        let states: Vec<String> = conveyor_core::sequence::OPEN_STATES
            .iter()
            .map(|state| format!("'{}'", state.as_str()))
            .collect();
        let condition = format!("state IN ({})", states.join(", "));
        assert_eq!(OPEN, condition);
        let schema = include_str!("schema.sql")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(
            schema.contains(&condition),
            "jobs_sequence_open holds the same states"
        );
    }
}
