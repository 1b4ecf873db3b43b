//! Mapping between rows and the model: jobs and queue settings.

use chrono::{DateTime, Utc};
use conveyor_core::sequence::JobSequence;
use conveyor_core::workflow::FlowLink;
use conveyor_core::{
    ErrorRecord, Job, JobState, Lease, Progress, QueueSettings, RateLimit, StoreResult,
};
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
        limit_keys: column::<Option<Json<Vec<String>>>>(row, "limit_keys")?
            .map(|Json(keys)| keys)
            .unwrap_or_default(),
        sequence: sequence(row)?,
    })
}

/// The job's sequence and place in it, when it runs in one (`sequence_key` set).
fn sequence(row: &PgRow) -> StoreResult<Option<JobSequence>> {
    let Some(key) = column::<Option<String>>(row, "sequence_key")? else {
        return Ok(None);
    };
    let no = column::<Option<i64>>(row, "sequence_no")?.unwrap_or(0);
    Ok(Some(JobSequence::stored(
        key,
        no,
        column(row, "sequence_skip_dead")?,
    )))
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

/// A row with the columns of [`crate::sql::SETTINGS_COLUMNS`] as a queue's settings.
pub(crate) fn settings_of(row: &PgRow) -> StoreResult<QueueSettings> {
    let read = |e: sqlx::Error| corrupt(e.to_string());
    let count = |column: &str| -> StoreResult<Option<u64>> {
        Ok(row
            .try_get::<Option<i64>, _>(column)
            .map_err(read)?
            .map(count_of))
    };
    let rate = |count_column: &str, period_column: &str| -> StoreResult<Option<RateLimit>> {
        Ok(match (count(count_column)?, count(period_column)?) {
            (Some(count), Some(period_ms)) => Some(RateLimit { count, period_ms }),
            _ => None,
        })
    };
    let weight: Option<i32> = row.try_get("weight").map_err(read)?;
    Ok({
        let mut settings = QueueSettings::default();
        settings.paused = row.try_get("paused").map_err(read)?;
        settings.max_depth = count("max_depth")?;
        settings.max_depth_per_tenant = count("max_depth_per_tenant")?;
        settings.concurrency_limit = count("concurrency_limit")?;
        settings.per_key_concurrency_limit = count("per_key_concurrency_limit")?;
        settings.rate_limit = rate("rate_count", "rate_period_ms")?;
        settings.per_key_rate_limit = rate("per_key_rate_count", "per_key_rate_period_ms")?;
        settings.weight = weight.map(|w| u32::try_from(w).unwrap_or(1));
        settings.completed_retention_secs = count("completed_retention_secs")?;
        settings.dead_retention_secs = count("dead_retention_secs")?;
        settings.default_ttl_ms = count("default_ttl_ms")?;
        let breaker: Option<Json<conveyor_core::BreakerSettings>> =
            row.try_get("circuit_breaker").map_err(read)?;
        settings.circuit_breaker = breaker.map(|Json(b)| b);
        settings.limits = row.try_get("limits").map_err(read)?;
        let sequence: Option<Json<conveyor_core::sequence::SequenceSpec>> =
            row.try_get("sequence").map_err(read)?;
        settings.sequence = sequence.map(|Json(spec)| spec);
        settings
    })
}

/// A count or limit read from the database (never negative: the columns are checked).
pub(crate) fn count_of(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A row count as bound to a statement (`bigint`).
pub(crate) fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}
