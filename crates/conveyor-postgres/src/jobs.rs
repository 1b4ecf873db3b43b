//! Storing jobs exactly as given, every column: what an import (`ops::import`) and a flow
//! starting its steps (`workflow`) both write. Below both, since the operations tell flows when
//! their jobs finish and the flows start jobs.

use conveyor_core::clock::truncate_to_millis;
use conveyor_core::sequence::OnDead;
use conveyor_core::{Job, JobState, StoreResult, ValidationError};
use sqlx::types::Json;
use sqlx::{PgConnection, Row};
use std::collections::BTreeSet;
use uuid::Uuid;

use crate::errors::{corrupt, db};
use crate::sql::Sql;

/// `value` for an `integer` column; too large for one, it is refused naming `field`.
pub(crate) fn to_i32(value: u32, field: &'static str) -> StoreResult<i32> {
    i32::try_from(value).map_err(|_| ValidationError::new(field, "too large").into())
}

/// Stores jobs exactly as given (times at the store's millisecond precision), every column,
/// skipping ids that already exist. Returns the ids of the jobs stored, and the queues of those
/// available, for the caller to wake.
pub(crate) async fn store_exactly(
    conn: &mut PgConnection,
    sql: &Sql,
    jobs: &[Job],
) -> StoreResult<(Vec<Uuid>, Vec<String>)> {
    if jobs.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    if jobs.iter().any(|job| job.sequence.is_some()) {
        sqlx::query(sql.sequence_release_arm.clone())
            .execute(&mut *conn)
            .await
            .map_err(db("arm the sequence release"))?;
    }
    let ms = truncate_to_millis;
    fn lease(job: &Job) -> Option<&conveyor_core::Lease> {
        job.lease.as_ref()
    }
    let found = sqlx::query(sql.import.clone())
        .bind(jobs.iter().map(|j| j.id).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.kind.as_str()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.queue.as_str()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| Json(&j.payload)).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.priority).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| ms(j.run_at)).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| to_i32(j.attempt, "attempt"))
                .collect::<StoreResult<Vec<_>>>()?,
        )
        .bind(
            jobs.iter()
                .map(|j| to_i32(j.max_attempts, "max_attempts"))
                .collect::<StoreResult<Vec<_>>>()?,
        )
        .bind(
            jobs.iter()
                .map(|j| j.timeout_ms.map(|t| i64::try_from(t).unwrap_or(i64::MAX)))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.idempotency_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(jobs.iter().map(|j| Json(&j.tags)).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.tenant.as_deref()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.state.as_str()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| Json(&j.errors)).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| lease(j).map(|l| l.worker_id.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| lease(j).map(|l| l.token))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| lease(j).map(|l| ms(l.expires_at)))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.result.as_ref().map(Json))
                .collect::<Vec<_>>(),
        )
        .bind(jobs.iter().map(|j| ms(j.created_at)).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| j.started_at.map(ms))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.finished_at.map(ms))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.unique_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.flow.as_ref().map(|f| f.flow_id))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.flow.as_ref().map(|f| f.step.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.flow.as_ref().map(|f| Json(&f.parents)))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.progress.as_ref().map(Json))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.expires_at.map(ms))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.trace.as_ref().map(Json))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| (!j.limit_keys.is_empty()).then_some(Json(&j.limit_keys)))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| conveyor_core::limits::named::fair_key(&j.limit_keys))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.sequence.as_ref().map(|s| s.key.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| {
                    j.sequence
                        .as_ref()
                        .map(|s| i64::try_from(s.no).unwrap_or(i64::MAX))
                })
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| {
                    j.sequence
                        .as_ref()
                        .is_some_and(|s| s.on_dead == OnDead::Skip)
                })
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(db("import jobs"))?;
    let mut woken = BTreeSet::new();
    let mut stored = Vec::with_capacity(found.len());
    for row in &found {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        stored.push(row.try_get::<Uuid, _>("id").map_err(read)?);
        let state: String = row.try_get("state").map_err(read)?;
        if state == JobState::Available.as_str() {
            woken.insert(row.try_get::<String, _>("queue").map_err(read)?);
        }
    }
    Ok((stored, woken.into_iter().collect()))
}
