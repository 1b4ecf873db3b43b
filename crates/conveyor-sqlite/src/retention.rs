//! Retention: deleting finished jobs past their queue's (or the default) retention, in bounded
//! steps on the writer thread.

use conveyor_core::{uuid_v7_floor, JobState, PruneParams, PruneReport, StoreResult};
use rusqlite::params;
use std::str::FromStr;

use crate::errors::backend;
use crate::rows::millis;
use crate::writer::WriteCtx;

fn secs(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

/// Deletes up to `params.limit` expired finished jobs, oldest id first.
pub(crate) fn prune(ctx: &mut WriteCtx<'_>, params: &PruneParams) -> StoreResult<PruneReport> {
    let default_completed = secs(params.retention.completed);
    let default_dead = secs(params.retention.dead);
    // No job created after now minus the shortest retention in force can have expired, so the
    // scan (in id order, which is creation order for UUIDv7) stops there.
    let shortest = ctx
        .settings
        .values()
        .flat_map(|s| [s.completed_retention_secs, s.dead_retention_secs])
        .flatten()
        .map(|n| i64::try_from(n).unwrap_or(i64::MAX))
        .chain([default_completed, default_dead])
        .min()
        .unwrap_or(0);
    let bound = uuid_v7_floor(ctx.now - chrono::Duration::seconds(shortest));
    type Deleted = (
        String,
        String,
        String,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<i64>,
        Option<String>,
        bool,
    );
    let deleted: Vec<Deleted> = ctx
        .conn
        .prepare_cached(
            "DELETE FROM jobs WHERE id IN ( \
                 SELECT j.id FROM jobs j \
                 WHERE j.id < ?1 AND j.state IN ('completed', 'cancelled', 'dead', 'expired') \
                 AND j.finished_at < ?2 - 1000 * COALESCE( \
                     (SELECT CASE WHEN j.state IN ('dead', 'expired') THEN s.dead_retention_secs \
                             ELSE s.completed_retention_secs END \
                      FROM queue_settings s WHERE s.queue = j.queue), \
                     CASE WHEN j.state IN ('dead', 'expired') THEN ?3 ELSE ?4 END) \
                 ORDER BY j.id LIMIT ?5) \
             RETURNING queue, state, id, flow_id, flow_step, result, finished_at, \
                 sequence_key, sequence_skip_dead",
        )
        .and_then(|mut stmt| {
            stmt.query_map(
                params![
                    bound.to_string(),
                    millis(ctx.now),
                    default_dead,
                    default_completed,
                    params.limit as i64
                ],
                |row| Deleted::try_from(row),
            )?
            .collect()
        })
        .map_err(backend)?;
    let mut report = PruneReport::default();
    for (queue, state, id, flow_id, flow_step, result, finished_at, sequence_key, skip_dead) in
        deleted
    {
        let state = JobState::from_str(&state)?;
        // A flow step completed by this job may say so only through the job's row: the step's
        // row takes the deleted job's outcome in the same operation, so it never goes missing.
        if let (JobState::Completed, Some(flow_id), Some(step)) = (state, flow_id, flow_step) {
            crate::workflow::materialize_completed_step(
                ctx,
                &flow_id,
                &step,
                &id,
                result.as_deref(),
                finished_at,
            )?;
        }
        match state {
            JobState::Completed => report.completed += 1,
            JobState::Cancelled => report.cancelled += 1,
            _ => report.dead += 1,
        }
        ctx.count_move(&queue, Some(state), None);
        // A dead job past its retention stops holding its sequence.
        crate::sequence::deleted(ctx, sequence_key.as_deref(), skip_dead, state)?;
    }
    Ok(report)
}
