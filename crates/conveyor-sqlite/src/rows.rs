//! Mapping between rows and the model: jobs, queue settings, circuit breaker settings.

use conveyor_core::clock::{from_millis, to_millis};
use conveyor_core::sequence::JobSequence;
use conveyor_core::workflow::FlowLink;
use conveyor_core::{
    ErrorRecord, Job, JobState, Lease, NamedQueueSettings, QueueSettings, RateLimit, StoreError,
    StoreResult,
};
use rusqlite::types::Type;
use rusqlite::{Connection, Row};
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::backend;

pub(crate) const COLUMNS: &str = "id, kind, queue, payload, priority, run_at, attempt, \
    max_attempts, timeout_ms, idempotency_key, tags, tenant, state, errors, lease_worker, \
    lease_token, lease_expires_at, result, created_at, started_at, finished_at, unique_key, flow_id, flow_step, parents, progress, \
    expires_at, trace, limit_keys, sequence_key, sequence_no, sequence_skip_dead";

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
        limit_keys: optional_json(row, 28)?.unwrap_or_default(),
        sequence: sequence(row)?,
    })
}

/// Columns 29-31: the job's sequence and place in it, when it runs in one.
fn sequence(row: &Row<'_>) -> rusqlite::Result<Option<JobSequence>> {
    let Some(key) = row.get::<_, Option<String>>(29)? else {
        return Ok(None);
    };
    let no: i64 = row.get::<_, Option<i64>>(30)?.unwrap_or(0);
    Ok(Some(JobSequence::stored(key, no, row.get(31)?)))
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

/// Every queue's stored settings, by name.
pub(crate) fn queue_settings(conn: &Connection) -> StoreResult<Vec<NamedQueueSettings>> {
    let mut stmt = conn
        .prepare_cached(
            "SELECT queue, paused, max_depth, max_depth_per_tenant, concurrency_limit, \
             per_key_concurrency_limit, rate_count, rate_period_ms, per_key_rate_count, \
             per_key_rate_period_ms, weight, completed_retention_secs, dead_retention_secs, \
             default_ttl_ms, circuit_breaker, limits, sequence FROM queue_settings \
             ORDER BY queue",
        )
        .map_err(backend)?;
    let count = |row: &rusqlite::Row<'_>, index: usize| -> rusqlite::Result<Option<u64>> {
        Ok(row.get::<_, Option<i64>>(index)?.map(|n| n.max(0) as u64))
    };
    let rate = |row: &rusqlite::Row<'_>, index: usize| -> rusqlite::Result<Option<RateLimit>> {
        Ok(match (count(row, index)?, count(row, index + 1)?) {
            (Some(count), Some(period_ms)) => Some(RateLimit { count, period_ms }),
            _ => None,
        })
    };
    let rows = stmt
        .query_map([], |row| {
            Ok(NamedQueueSettings {
                name: row.get(0)?,
                settings: {
                    let mut settings = QueueSettings::default();
                    settings.paused = row.get(1)?;
                    settings.max_depth = count(row, 2)?;
                    settings.max_depth_per_tenant = count(row, 3)?;
                    settings.concurrency_limit = count(row, 4)?;
                    settings.per_key_concurrency_limit = count(row, 5)?;
                    settings.rate_limit = rate(row, 6)?;
                    settings.per_key_rate_limit = rate(row, 8)?;
                    settings.weight = count(row, 10)?.map(|w| w.min(u64::from(u32::MAX)) as u32);
                    settings.completed_retention_secs = count(row, 11)?;
                    settings.dead_retention_secs = count(row, 12)?;
                    settings.default_ttl_ms = count(row, 13)?;
                    settings.circuit_breaker = breaker_settings(row.get::<_, Option<String>>(14)?)?;
                    settings.limits = names(row.get::<_, Option<String>>(15)?)?;
                    settings.sequence = sequence_spec(row.get::<_, Option<String>>(16)?)?;
                    settings
                },
            })
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(backend)?;
    Ok(rows)
}

pub(crate) fn millis(at: chrono::DateTime<chrono::Utc>) -> i64 {
    to_millis(at)
}

/// A queue's or kind's named limits, stored as a JSON array (NULL: none).
pub(crate) fn names(text: Option<String>) -> rusqlite::Result<Vec<String>> {
    text.map(|text| serde_json::from_str(&text).map_err(|e| conversion(0, e)))
        .transpose()
        .map(Option::unwrap_or_default)
}

pub(crate) fn names_text(names: &[String]) -> StoreResult<Option<String>> {
    (!names.is_empty())
        .then(|| json_text(&names, "limits"))
        .transpose()
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

/// `value` as the JSON text a column stores; `field` names it in the error.
pub(crate) fn json_text<T: serde::Serialize>(value: &T, field: &str) -> StoreResult<String> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::backend(format!("cannot serialize {field}: {e}")))
}

/// A queue's or kind's sequence, stored as JSON text (NULL: none).
pub(crate) fn sequence_spec(
    text: Option<String>,
) -> rusqlite::Result<Option<conveyor_core::sequence::SequenceSpec>> {
    text.map(|text| serde_json::from_str(&text).map_err(|e| conversion(0, e)))
        .transpose()
}

pub(crate) fn sequence_spec_text(
    spec: Option<&conveyor_core::sequence::SequenceSpec>,
) -> StoreResult<Option<String>> {
    spec.map(|spec| json_text(spec, "sequence")).transpose()
}
