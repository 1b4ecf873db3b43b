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
    let cancelled = ctx
        .conn
        .prepare_cached(&format!(
            "UPDATE jobs SET state = 'cancelled', finished_at = ?1, \
             lease_token = NULL, lease_expires_at = NULL WHERE id = ?2 RETURNING {COLUMNS}"
        ))
        .and_then(|mut stmt| stmt.query_row(params![millis(ctx.now), key], rows::job))
        .map_err(backend)?;
    ctx.count_move(&job.queue, Some(job.state), Some(JobState::Cancelled));
    Ok(cancelled)
}

pub(crate) fn dead_replay(ctx: &mut WriteCtx<'_>, selector: &ReplaySelector) -> StoreResult<u64> {
    let now = millis(ctx.now);
    let queues: Vec<String> = match &selector.ids {
        Some(ids) => {
            let mut stmt = ctx
                .conn
                .prepare_cached(
                    "UPDATE jobs SET state = 'available', attempt = 0, run_at = ?1, \
                     finished_at = NULL, result = NULL WHERE id = ?2 AND state = 'dead' \
                     RETURNING queue",
                )
                .map_err(backend)?;
            let mut queues = Vec::new();
            for id in ids {
                let queue: Option<String> = stmt
                    .query_row(params![now, id.to_string()], |row| row.get(0))
                    .optional()
                    .map_err(backend)?;
                queues.extend(queue);
            }
            queues
        }
        None => ctx
            .conn
            .prepare_cached(
                "UPDATE jobs SET state = 'available', attempt = 0, run_at = ?1, \
                 finished_at = NULL, result = NULL WHERE state = 'dead' \
                 AND (?2 IS NULL OR queue = ?2) AND (?3 IS NULL OR kind = ?3) RETURNING queue",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![now, selector.queue, selector.kind], |row| {
                    row.get(0)
                })?
                .collect()
            })
            .map_err(backend)?,
    };
    for queue in &queues {
        ctx.count_move(queue, Some(JobState::Dead), Some(JobState::Available));
    }
    let replayed = queues.len() as u64;
    if replayed > 0 {
        ctx.wake = true;
    }
    Ok(replayed)
}

pub(crate) fn dead_discard(ctx: &mut WriteCtx<'_>, id: Uuid) -> StoreResult<bool> {
    let queue: Option<String> = ctx
        .conn
        .prepare_cached("DELETE FROM jobs WHERE id = ?1 AND state = 'dead' RETURNING queue")
        .and_then(|mut stmt| {
            stmt.query_row(params![id.to_string()], |row| row.get(0))
                .optional()
        })
        .map_err(backend)?;
    if let Some(queue) = &queue {
        ctx.count_move(queue, Some(JobState::Dead), None);
    }
    Ok(queue.is_some())
}

pub(crate) fn import(ctx: &mut WriteCtx<'_>, jobs: Vec<Job>) -> StoreResult<u64> {
    let mut imported = 0;
    for job in jobs {
        let lease = job.lease.as_ref();
        let payload = json_text(&job.payload, "payload")?;
        let tags = json_text(&job.tags, "tags")?;
        let errors = json_text(&job.errors, "errors")?;
        let result = job
            .result
            .as_ref()
            .map(|r| json_text(r, "result"))
            .transpose()?;
        let changed = ctx
            .conn
            .prepare_cached(&format!(
                "INSERT INTO jobs ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
                 ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22) \
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
                ])
            })
            .map_err(backend)?;
        if changed == 1 {
            ctx.count_move(&job.queue, None, Some(job.state));
            if matches!(job.state, JobState::Available) {
                ctx.wake = true;
            }
            imported += 1;
        }
    }
    Ok(imported)
}
