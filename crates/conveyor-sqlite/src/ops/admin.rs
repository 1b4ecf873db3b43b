//! Operator actions on jobs: cancel, dead-letter replay and discard, import from another store.

use super::*;

pub(crate) fn cancel(ctx: &mut WriteCtx<'_>, id: Uuid) -> StoreResult<Job> {
    let key = id.to_string();
    let job = job_by_id(ctx, &key)?.ok_or(StoreError::NotFound(id))?;
    if job.state.is_finished() {
        return Err(StoreError::Conflict {
            id,
            state: job.state,
            action: "cancel",
        });
    }
    let cancelled = cancel_unhooked(ctx, id)?.ok_or(StoreError::NotFound(id))?;
    workflow::job_finished(ctx, &cancelled)?;
    Ok(cancelled)
}

/// A replayed job's queue, id, flow and sequence.
type Replayed = (String, String, Option<String>, Option<String>);

fn replayed_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Replayed> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
}

/// Replays dead jobs (by ids or by queue/kind) and expired ones (by ids only: the dead-letter
/// views and filters are about dead jobs). An expired job loses its expiry: replaying it is
/// asking for it to run.
pub(crate) fn dead_replay(ctx: &mut WriteCtx<'_>, selector: &ReplaySelector) -> StoreResult<u64> {
    let now = millis(ctx.now);
    // Marked on the failure that ended the last run, as the history's JSON writes times.
    let replayed_at = ctx.now.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true);
    // Each job with the state it was replayed from, so its count moves from that state.
    let mut found: Vec<(JobState, Replayed)> = Vec::new();
    match &selector.ids {
        Some(ids) => {
            let mut stmt = ctx
                .conn
                .prepare_cached(
                    "UPDATE jobs SET state = 'available', attempt = 0, run_at = ?1, fair_turn = NULL, \
                     finished_at = NULL, result = NULL, expires_at = NULL, \
                     errors = CASE WHEN json_array_length(errors) > 0 \
                         THEN json_set(errors, '$[#-1].replayed_at', ?4) ELSE errors END \
                     WHERE id = ?2 AND state = ?3 RETURNING queue, id, flow_id, sequence_key",
                )
                .map_err(backend)?;
            for id in ids {
                for from in [JobState::Dead, JobState::Expired] {
                    let replayed: Option<Replayed> = stmt
                        .query_row(
                            params![now, id.to_string(), from.as_str(), replayed_at],
                            replayed_row,
                        )
                        .optional()
                        .map_err(backend)?;
                    found.extend(replayed.map(|row| (from, row)));
                }
            }
        }
        None => {
            let rows: Vec<Replayed> = ctx
                .conn
                .prepare_cached(
                    "UPDATE jobs SET state = 'available', attempt = 0, run_at = ?1, fair_turn = NULL, \
                     finished_at = NULL, result = NULL, \
                     errors = CASE WHEN json_array_length(errors) > 0 \
                         THEN json_set(errors, '$[#-1].replayed_at', ?4) ELSE errors END \
                     WHERE state = 'dead' \
                     AND (?2 IS NULL OR queue = ?2) AND (?3 IS NULL OR kind = ?3) \
                     RETURNING queue, id, flow_id, sequence_key",
                )
                .and_then(|mut stmt| {
                    stmt.query_map(
                        params![now, selector.queue, selector.kind, replayed_at],
                        replayed_row,
                    )?
                    .collect()
                })
                .map_err(backend)?;
            found.extend(rows.into_iter().map(|row| (JobState::Dead, row)));
        }
    }
    let mut sequences = std::collections::BTreeSet::new();
    for (from, (queue, id, flow_id, sequence_key)) in &found {
        ctx.count_move(queue, Some(*from), Some(JobState::Available));
        if let Some(key) = sequence_key {
            sequence::requeue(ctx, queue, id)?;
            sequences.insert(key.clone());
        }
        // A replayed step resumes its flow when the flow stopped at it.
        if let Some(flow_id) = flow_id {
            let flow_id = Uuid::parse_str(flow_id)
                .map_err(|e| StoreError::backend(format!("stored flow id: {e}")))?;
            let job_id = Uuid::parse_str(id)
                .map_err(|e| StoreError::backend(format!("stored job id: {e}")))?;
            workflow::handle(ctx, flow_id, FlowEvent::JobReplayed { job_id })?;
        }
    }
    // Back in its sequence, a replayed job runs when no job of the key holds it, before the
    // blocked ones (it has the lowest number).
    for key in &sequences {
        sequence::release(ctx, key)?;
    }
    let replayed = found.len() as u64;
    if replayed > 0 {
        ctx.wake = true;
    }
    Ok(replayed)
}

/// Deletes a dead or expired job.
pub(crate) fn dead_discard(ctx: &mut WriteCtx<'_>, id: Uuid) -> StoreResult<bool> {
    type Deleted = (String, String, Option<String>, bool);
    let deleted: Option<Deleted> = ctx
        .conn
        .prepare_cached(
            "DELETE FROM jobs WHERE id = ?1 AND state IN ('dead', 'expired') \
             RETURNING queue, state, sequence_key, sequence_skip_dead",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![id.to_string()], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()
        })
        .map_err(backend)?;
    if let Some((queue, state, sequence_key, skip_dead)) = &deleted {
        let state = state.parse::<JobState>()?;
        ctx.count_move(queue, Some(state), None);
        // A dead job that held its sequence lets the next one run once discarded.
        sequence::deleted(ctx, sequence_key.as_deref(), *skip_dead, state)?;
    }
    Ok(deleted.is_some())
}

pub(crate) fn import(ctx: &mut WriteCtx<'_>, jobs: Vec<Job>) -> StoreResult<u64> {
    let mut imported = 0;
    for job in jobs {
        let turn = crate::turns::of_new(ctx, &job)?;
        if insert_row(ctx, &job, turn)? {
            ctx.count_move(&job.queue, None, Some(job.state));
            if matches!(job.state, JobState::Available) {
                ctx.wake = true;
            }
            imported += 1;
        }
    }
    Ok(imported)
}
