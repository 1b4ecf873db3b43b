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

/// Cancels an unfinished job without telling its flow (the flow itself is cancelling it);
/// `None` when the job is missing or finished.
pub(crate) fn cancel_unhooked(ctx: &mut WriteCtx<'_>, id: Uuid) -> StoreResult<Option<Job>> {
    let key = id.to_string();
    let before = match job_by_id(ctx, &key)? {
        Some(job) if !job.state.is_finished() => job.state,
        _ => return Ok(None),
    };
    let cancelled = ctx
        .conn
        .prepare_cached(&format!(
            "UPDATE jobs SET state = 'cancelled', finished_at = ?1, \
             lease_token = NULL, lease_expires_at = NULL WHERE id = ?2 RETURNING {COLUMNS}"
        ))
        .and_then(|mut stmt| stmt.query_row(params![millis(ctx.now), key], rows::job))
        .map_err(backend)?;
    ctx.count_move(&cancelled.queue, Some(before), Some(JobState::Cancelled));
    Ok(Some(cancelled))
}

/// A replayed job's queue, id and flow.
type Replayed = (String, String, Option<String>);

fn replayed_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Replayed> {
    Ok((row.get(0)?, row.get(1)?, row.get(2)?))
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
                    "UPDATE jobs SET state = 'available', attempt = 0, run_at = ?1, \
                     finished_at = NULL, result = NULL, expires_at = NULL, \
                     errors = CASE WHEN json_array_length(errors) > 0 \
                         THEN json_set(errors, '$[#-1].replayed_at', ?4) ELSE errors END \
                     WHERE id = ?2 AND state = ?3 RETURNING queue, id, flow_id",
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
                    "UPDATE jobs SET state = 'available', attempt = 0, run_at = ?1, \
                     finished_at = NULL, result = NULL, \
                     errors = CASE WHEN json_array_length(errors) > 0 \
                         THEN json_set(errors, '$[#-1].replayed_at', ?4) ELSE errors END \
                     WHERE state = 'dead' \
                     AND (?2 IS NULL OR queue = ?2) AND (?3 IS NULL OR kind = ?3) \
                     RETURNING queue, id, flow_id",
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
    for (from, (queue, id, flow_id)) in &found {
        ctx.count_move(queue, Some(*from), Some(JobState::Available));
        // A replayed step resumes its flow when the flow stopped at it.
        if let Some(flow_id) = flow_id {
            let flow_id = Uuid::parse_str(flow_id)
                .map_err(|e| StoreError::backend(format!("stored flow id: {e}")))?;
            let job_id = Uuid::parse_str(id)
                .map_err(|e| StoreError::backend(format!("stored job id: {e}")))?;
            workflow::handle(ctx, flow_id, FlowEvent::JobReplayed { job_id })?;
        }
    }
    let replayed = found.len() as u64;
    if replayed > 0 {
        ctx.wake = true;
    }
    Ok(replayed)
}

/// Deletes a dead or expired job.
pub(crate) fn dead_discard(ctx: &mut WriteCtx<'_>, id: Uuid) -> StoreResult<bool> {
    let deleted: Option<(String, String)> = ctx
        .conn
        .prepare_cached(
            "DELETE FROM jobs WHERE id = ?1 AND state IN ('dead', 'expired') \
             RETURNING queue, state",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![id.to_string()], |row| {
                Ok((row.get(0)?, row.get(1)?))
            })
            .optional()
        })
        .map_err(backend)?;
    if let Some((queue, state)) = &deleted {
        ctx.count_move(queue, Some(state.parse::<JobState>()?), None);
    }
    Ok(deleted.is_some())
}

pub(crate) fn import(ctx: &mut WriteCtx<'_>, jobs: Vec<Job>) -> StoreResult<u64> {
    let mut imported = 0;
    for job in jobs {
        if insert_row(ctx, &job)? {
            ctx.count_move(&job.queue, None, Some(job.state));
            if matches!(job.state, JobState::Available) {
                ctx.wake = true;
            }
            imported += 1;
        }
    }
    Ok(imported)
}

/// Stores `job` exactly as given, every column; false when its id already exists.
pub(crate) fn insert_row(ctx: &WriteCtx<'_>, job: &Job) -> StoreResult<bool> {
    let lease = job.lease.as_ref();
    let result = job
        .result
        .as_ref()
        .map(|r| json_text(r, "result"))
        .transpose()?;
    let parents = (job.flow.as_ref())
        .map(|f| json_text(&f.parents, "parents"))
        .transpose()?;
    let progress = (job.progress.as_ref())
        .map(|p| json_text(p, "progress"))
        .transpose()?;
    let trace = (job.trace.as_ref())
        .map(|t| json_text(t, "trace"))
        .transpose()?;
    let payload = json_text(&job.payload, "payload")?;
    let tags = json_text(&job.tags, "tags")?;
    let errors = json_text(&job.errors, "errors")?;
    let changed = ctx
        .conn
        .prepare_cached(&format!(
            "INSERT INTO jobs ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
             ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, \
             ?27, ?28) \
             ON CONFLICT (id) DO NOTHING"
        ))
        .and_then(|mut stmt| {
            stmt.execute(rusqlite::params![
                job.id.to_string(),
                job.kind,
                job.queue,
                payload,
                job.priority,
                millis(job.run_at),
                job.attempt,
                job.max_attempts,
                job.timeout_ms.map(|ms| ms.min(i64::MAX as u64) as i64),
                job.idempotency_key,
                tags,
                job.tenant,
                job.state.as_str(),
                errors,
                lease.map(|l| l.worker_id.clone()),
                lease.map(|l| l.token.to_string()),
                lease.map(|l| millis(l.expires_at)),
                result,
                millis(job.created_at),
                job.started_at.map(millis),
                job.finished_at.map(millis),
                job.unique_key,
                job.flow.as_ref().map(|f| f.flow_id.to_string()),
                job.flow.as_ref().map(|f| f.step.clone()),
                parents,
                progress,
                job.expires_at.map(millis),
                trace,
            ])
        })
        .map_err(backend)?;
    Ok(changed == 1)
}
