//! Mapping between `jobs` rows and [`Job`].

use chrono::{DateTime, Utc};
use conveyor_core::workflow::FlowLink;
use conveyor_core::{ErrorRecord, Job, JobState, Lease, Progress, StoreResult};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::Row;
use std::collections::BTreeMap;
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::corrupt;

/// Reads column `name`, naming it in the error.
fn column<'r, T>(row: &'r PgRow, name: &str) -> StoreResult<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(name)
        .map_err(|e| corrupt(format!("column {name}: {e}")))
}

/// A non-negative integer column as `u32` (attempt counters).
fn count(row: &PgRow, name: &str) -> StoreResult<u32> {
    let value: i32 = column(row, name)?;
    u32::try_from(value).map_err(|_| corrupt(format!("column {name} is negative ({value})")))
}

/// A row selected with [`crate::sql::COLUMNS`] as a [`Job`].
pub(crate) fn job(row: &PgRow) -> StoreResult<Job> {
    let state: String = column(row, "state")?;
    let state = JobState::from_str(&state).map_err(corrupt)?;
    // A lease exists only while all three are set: finishing a job clears the token and expiry
    // but keeps the last worker's name, as the SQLite store does.
    let lease = match (
        column::<Option<String>>(row, "lease_worker")?,
        column::<Option<Uuid>>(row, "lease_token")?,
        column::<Option<DateTime<Utc>>>(row, "lease_expires_at")?,
    ) {
        (Some(worker_id), Some(token), Some(expires_at)) => Some(Lease {
            worker_id,
            token,
            expires_at,
        }),
        _ => None,
    };
    let Json(payload) = column::<Json<Value>>(row, "payload")?;
    let Json(errors) = column::<Json<Vec<ErrorRecord>>>(row, "errors")?;
    Ok(Job {
        id: column(row, "id")?,
        kind: column(row, "kind")?,
        queue: column(row, "queue")?,
        payload,
        priority: column(row, "priority")?,
        run_at: column(row, "run_at")?,
        attempt: count(row, "attempt")?,
        max_attempts: count(row, "max_attempts")?,
        timeout_ms: column::<Option<i64>>(row, "timeout_ms")?.map(|ms| ms.max(0) as u64),
        idempotency_key: column(row, "idempotency_key")?,
        tags: column(row, "tags")?,
        tenant: column(row, "tenant")?,
        state,
        errors,
        lease,
        result: column::<Option<Json<Value>>>(row, "result")?.map(|Json(value)| value),
        created_at: column(row, "created_at")?,
        started_at: column(row, "started_at")?,
        finished_at: column(row, "finished_at")?,
        unique_key: column(row, "unique_key")?,
        flow: flow_link(row)?,
        progress: column::<Option<Json<Progress>>>(row, "progress")?.map(|Json(p)| p),
        expires_at: column::<Option<DateTime<Utc>>>(row, "expires_at")?,
        trace: column::<Option<Json<conveyor_core::trace::TraceContext>>>(row, "trace")?
            .map(|Json(t)| t),
    })
}

/// The job's flow, step and parents' results, when it belongs to a flow (`flow_id` set).
fn flow_link(row: &PgRow) -> StoreResult<Option<FlowLink>> {
    let Some(flow_id) = column::<Option<Uuid>>(row, "flow_id")? else {
        return Ok(None);
    };
    let step: Option<String> = column(row, "flow_step")?;
    let parents = column::<Option<Json<BTreeMap<String, Value>>>>(row, "parents")?;
    Ok(Some(FlowLink {
        flow_id,
        step: step.ok_or_else(|| corrupt("a job of a flow without flow_step"))?,
        parents: parents.map(|Json(p)| p).unwrap_or_default(),
    }))
}

/// Every row as a job.
pub(crate) fn jobs(rows: &[PgRow]) -> StoreResult<Vec<Job>> {
    rows.iter().map(job).collect()
}
