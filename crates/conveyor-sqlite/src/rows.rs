//! Mapping between `jobs` rows and [`Job`].

use conveyor_core::clock::{from_millis, to_millis};
use conveyor_core::workflow::FlowLink;
use conveyor_core::{ErrorRecord, Job, JobState, Lease, StoreError};
use rusqlite::types::Type;
use rusqlite::Row;
use std::str::FromStr;
use uuid::Uuid;

pub(crate) const COLUMNS: &str = "id, kind, queue, payload, priority, run_at, attempt, \
    max_attempts, timeout_ms, idempotency_key, tags, tenant, state, errors, lease_worker, \
    lease_token, lease_expires_at, result, created_at, started_at, finished_at, unique_key, flow_id, flow_step, parents, progress, \
    expires_at, trace";

fn conversion(
    column: usize,
    error: impl std::error::Error + Send + Sync + 'static,
) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, Type::Text, Box::new(error))
}

fn json<T: serde::de::DeserializeOwned>(row: &Row<'_>, column: usize) -> rusqlite::Result<T> {
    let text: String = row.get(column)?;
    serde_json::from_str(&text).map_err(|e| conversion(column, e))
}

fn uuid(row: &Row<'_>, column: usize) -> rusqlite::Result<Uuid> {
    let text: String = row.get(column)?;
    Uuid::parse_str(&text).map_err(|e| conversion(column, e))
}

pub(crate) fn job(row: &Row<'_>) -> rusqlite::Result<Job> {
    let state_text: String = row.get(12)?;
    let state = JobState::from_str(&state_text).map_err(|e| conversion(12, e))?;
    let lease_token: Option<String> = row.get(15)?;
    let lease = match (
        row.get::<_, Option<String>>(14)?,
        lease_token,
        row.get::<_, Option<i64>>(16)?,
    ) {
        (Some(worker_id), Some(token), Some(expires)) => Some(Lease {
            worker_id,
            token: Uuid::parse_str(&token).map_err(|e| conversion(15, e))?,
            expires_at: from_millis(expires),
        }),
        _ => None,
    };
    let result = match row.get::<_, Option<String>>(17)? {
        Some(text) => Some(serde_json::from_str(&text).map_err(|e| conversion(17, e))?),
        None => None,
    };
    Ok(Job {
        id: uuid(row, 0)?,
        kind: row.get(1)?,
        queue: row.get(2)?,
        payload: json(row, 3)?,
        priority: row.get(4)?,
        run_at: from_millis(row.get(5)?),
        attempt: row.get(6)?,
        max_attempts: row.get(7)?,
        timeout_ms: row.get::<_, Option<i64>>(8)?.map(|ms| ms.max(0) as u64),
        idempotency_key: row.get(9)?,
        tags: json(row, 10)?,
        tenant: row.get(11)?,
        state,
        errors: json::<Vec<ErrorRecord>>(row, 13)?,
        lease,
        result,
        created_at: from_millis(row.get(18)?),
        started_at: row.get::<_, Option<i64>>(19)?.map(from_millis),
        finished_at: row.get::<_, Option<i64>>(20)?.map(from_millis),
        unique_key: row.get(21)?,
        flow: flow_link(row)?,
        progress: optional_json(row, 25)?,
        expires_at: row.get::<_, Option<i64>>(26)?.map(from_millis),
        trace: optional_json(row, 27)?,
    })
}

fn optional_json<T: serde::de::DeserializeOwned>(
    row: &Row<'_>,
    column: usize,
) -> rusqlite::Result<Option<T>> {
    match row.get::<_, Option<String>>(column)? {
        Some(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| conversion(column, e)),
        None => Ok(None),
    }
}

/// Columns 22-24: the job's flow, step and parents' results, when it belongs to a flow.
fn flow_link(row: &Row<'_>) -> rusqlite::Result<Option<FlowLink>> {
    let Some(flow_id) = row.get::<_, Option<String>>(22)? else {
        return Ok(None);
    };
    Ok(Some(FlowLink {
        flow_id: Uuid::parse_str(&flow_id).map_err(|e| conversion(22, e))?,
        step: row.get::<_, Option<String>>(23)?.unwrap_or_default(),
        parents: optional_json(row, 24)?.unwrap_or_default(),
    }))
}

pub(crate) fn millis(at: chrono::DateTime<chrono::Utc>) -> i64 {
    to_millis(at)
}

/// A queue's or kind's circuit breaker settings, stored as JSON text.
pub(crate) fn breaker_settings(
    text: Option<String>,
) -> rusqlite::Result<Option<conveyor_core::BreakerSettings>> {
    text.map(|text| serde_json::from_str(&text).map_err(|e| conversion(0, e)))
        .transpose()
}

pub(crate) fn breaker_settings_text(
    settings: Option<&conveyor_core::BreakerSettings>,
) -> conveyor_core::StoreResult<Option<String>> {
    settings
        .map(|settings| {
            serde_json::to_string(settings).map_err(|e| {
                StoreError::backend(format!("cannot serialize circuit breaker settings: {e}"))
            })
        })
        .transpose()
}
