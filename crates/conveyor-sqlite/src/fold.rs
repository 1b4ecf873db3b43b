//! Debounce and throttle (`conveyor_core::debounce`) on the writer thread: the key's latest
//! job, and folding an enqueue into it. The writer runs one operation at a time, so the lookup
//! and the fold that follows are never interleaved with another enqueue of the key (nor with a
//! claim of the job folded into). Below the operations, beside `jobs`.

use chrono::{DateTime, Utc};
use conveyor_core::debounce::Standing;
use conveyor_core::{Job, JobState, StoreError, StoreResult};
use rusqlite::{params, OptionalExtension};
use serde_json::Value;
use uuid::Uuid;

use crate::errors::backend;
use crate::rows::{self, json_text, millis, COLUMNS};
use crate::writer::WriteCtx;

/// The latest job stored with fold key `key`.
pub(crate) fn standing(ctx: &WriteCtx<'_>, key: &str) -> StoreResult<Option<Standing>> {
    let found: Option<(String, String, i64, Option<i64>)> = ctx
        .conn
        .prepare_cached(
            "SELECT id, state, created_at, fold_until FROM jobs WHERE fold_key = ?1 \
             ORDER BY created_at DESC, id DESC LIMIT 1",
        )
        .and_then(|mut stmt| {
            stmt.query_row(params![key], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })
            .optional()
        })
        .map_err(backend)?;
    found
        .map(|(id, state, created_at, until)| {
            Ok(Standing {
                id: Uuid::parse_str(&id)
                    .map_err(|e| StoreError::backend(format!("stored job id: {e}")))?,
                state: state.parse::<JobState>()?,
                created_at: conveyor_core::clock::from_millis(created_at),
                until: until.map(conveyor_core::clock::from_millis),
            })
        })
        .transpose()
}

/// Records a new job's fold key, and until when it drops later enqueues of the key.
pub(crate) fn mark(
    ctx: &WriteCtx<'_>,
    id: Uuid,
    key: &str,
    until: Option<DateTime<Utc>>,
) -> StoreResult<()> {
    ctx.conn
        .prepare_cached("UPDATE jobs SET fold_key = ?1, fold_until = ?2 WHERE id = ?3")
        .and_then(|mut stmt| stmt.execute(params![key, until.map(millis), id.to_string()]))
        .map_err(backend)?;
    Ok(())
}

/// The standing job (trailing debounce) takes `payload` and runs at `run_at`; `None` when it
/// is no longer waiting.
pub(crate) fn replace(
    ctx: &WriteCtx<'_>,
    id: Uuid,
    payload: &Value,
    run_at: DateTime<Utc>,
) -> StoreResult<Option<Job>> {
    let payload = json_text(payload, "payload")?;
    ctx.conn
        .prepare_cached(&format!(
            "UPDATE jobs SET payload = ?1, run_at = ?2 WHERE id = ?3 AND state = 'scheduled' \
             RETURNING {COLUMNS}"
        ))
        .and_then(|mut stmt| {
            stmt.query_row(params![payload, millis(run_at), id.to_string()], rows::job)
                .optional()
        })
        .map_err(backend)
}

/// The standing job (leading debounce, throttle), its window moved to `until` when given.
pub(crate) fn extend(
    ctx: &WriteCtx<'_>,
    id: Uuid,
    until: Option<DateTime<Utc>>,
) -> StoreResult<Option<Job>> {
    if let Some(until) = until {
        ctx.conn
            .prepare_cached("UPDATE jobs SET fold_until = ?1 WHERE id = ?2")
            .and_then(|mut stmt| stmt.execute(params![millis(until), id.to_string()]))
            .map_err(backend)?;
    }
    crate::jobs::job_by_id(ctx, &id.to_string())
}
