//! Single jobs, beneath the operations (`ops`) and the nouns they call (`workflow`, `limits`):
//! read one, store one exactly as given, cancel one without telling its flow. An operation that
//! finishes a job tells its flow, and a flow's effects start and cancel its steps' jobs, so
//! these live below both rather than in either.

use conveyor_core::sequence::OnDead;
use conveyor_core::{Job, JobState, StoreResult};
use rusqlite::{params, OptionalExtension};
use uuid::Uuid;

use crate::errors::backend;
use crate::rows::{self, json_text, millis, COLUMNS};
use crate::writer::WriteCtx;

pub(crate) fn job_by_id(ctx: &WriteCtx<'_>, id: &str) -> StoreResult<Option<Job>> {
    ctx.conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"))
        .and_then(|mut stmt| stmt.query_row(params![id], rows::job).optional())
        .map_err(backend)
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
    crate::sequence::moved(ctx, &cancelled, before)?;
    Ok(Some(cancelled))
}

/// Stores `job` exactly as given, every column, with its turn by key (`turns::of_new`, which
/// the callers ask: turns sit above single jobs); false when its id already exists.
pub(crate) fn insert_row(ctx: &WriteCtx<'_>, job: &Job, turn: Option<i64>) -> StoreResult<bool> {
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
    let limit_keys = (!job.limit_keys.is_empty())
        .then(|| json_text(&job.limit_keys, "limit_keys"))
        .transpose()?;
    let sequence = job.sequence.as_ref();
    let payload = json_text(&job.payload, "payload")?;
    let tags = json_text(&job.tags, "tags")?;
    let errors = json_text(&job.errors, "errors")?;
    let changed = ctx
        .conn
        .prepare_cached(&format!(
            "INSERT INTO jobs ({COLUMNS}, fair_key, fair_turn) VALUES (?1, ?2, ?3, ?4, ?5, ?6, \
             ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, \
             ?24, ?25, ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34) \
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
                limit_keys,
                sequence.map(|s| s.key.as_str()),
                sequence.map(|s| i64::try_from(s.no).unwrap_or(i64::MAX)),
                sequence.is_some_and(|s| s.on_dead == OnDead::Skip),
                conveyor_core::limits::named::fair_key(&job.limit_keys),
                turn,
            ])
        })
        .map_err(backend)?;
    Ok(changed == 1)
}
