//! The store's side of `conveyor store copy` (see `conveyor_core::copy`): pages of rows as
//! stored, and rows inserted exactly as given (`ON CONFLICT DO NOTHING`: a key already held is
//! left alone), each page in one transaction.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use conveyor_core::access::{ApiToken, AuditEntry, Role, StoredToken};
use conveyor_core::copy::{
    CopyStore, FlowRecord, FlowStepRecord, RollupKey, RunKey, ScheduleRecord, ScheduleRunRecord,
};
use conveyor_core::kinds::KindSettings;
use conveyor_core::schedule::RunStatus;
use conveyor_core::stats::Rollup;
use conveyor_core::workflow::{CompensationState, FlowState, StepState};
use conveyor_core::{
    AuditAction, Job, JobStore, NamedQueueSettings, StoreError, StoreResult, StoredBreaker,
};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, Row};
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::{corrupt, db};
use crate::names::quoted;
use crate::sql::{stmt, COLUMNS};
use crate::{commit, kinds, ops, rows, PgStore};

fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

fn get<'r, T>(row: &'r PgRow, column: &str) -> StoreResult<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(column)
        .map_err(|e| corrupt(format!("column {column}: {e}")))
}

fn parsed<T: FromStr>(text: &str, what: &str) -> StoreResult<T>
where
    T::Err: std::fmt::Display,
{
    T::from_str(text).map_err(|e| corrupt(format!("{what}: {e}")))
}

/// A serde enum stored as its bare name (`stop`).
fn policy_of<T: serde::de::DeserializeOwned>(text: String, what: &str) -> StoreResult<T> {
    serde_json::from_value(Value::String(text)).map_err(|e| corrupt(format!("{what}: {e}")))
}

fn policy_text<T: serde::Serialize>(policy: &T, what: &str) -> StoreResult<String> {
    match serde_json::to_value(policy) {
        Ok(Value::String(text)) => Ok(text),
        _ => Err(StoreError::backend(format!(
            "{what} did not serialize to a string"
        ))),
    }
}

impl PgStore {
    fn table(&self, name: &str) -> String {
        format!("{}.{name}", quoted(&self.inner.schema))
    }

    async fn fetch_rows(
        &self,
        text: String,
        bind: impl FnOnce(
            sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
        )
            -> sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> StoreResult<Vec<PgRow>> {
        let mut conn = self.conn().await?;
        bind(sqlx::query(stmt(text)))
            .fetch_all(&mut *conn)
            .await
            .map_err(db("export rows"))
    }
}

/// Runs one `INSERT ... ON CONFLICT DO NOTHING`; whether it stored the row.
async fn inserted(
    conn: &mut PgConnection,
    query: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> StoreResult<bool> {
    Ok(query
        .execute(conn)
        .await
        .map_err(db("import rows"))?
        .rows_affected()
        > 0)
}

fn step_of(row: &PgRow) -> StoreResult<FlowStepRecord> {
    let state: String = get(row, "state")?;
    let compensation: Option<String> = get(row, "compensation")?;
    let json = |column: &str| -> StoreResult<Option<Value>> {
        Ok(get::<Option<Json<Value>>>(row, column)?.map(|Json(v)| v))
    };
    Ok(FlowStepRecord {
        name: get(row, "name")?,
        position: get(row, "position")?,
        state: parsed::<StepState>(&state, "step state")?,
        after: get(row, "after")?,
        on_parent_failure: policy_of(get(row, "on_parent_failure")?, "step policy")?,
        job_id: get(row, "job_id")?,
        job: json("job")?,
        compensate: json("compensate")?,
        wait_signal: get(row, "wait_signal")?,
        wait_timeout_ms: get::<Option<i64>>(row, "wait_timeout_ms")?.map(|ms| ms.max(0) as u64),
        wait_deadline: get(row, "wait_deadline")?,
        signalled: get(row, "signalled")?,
        result: json("result")?,
        error: json("error")?,
        completed_seq: get(row, "completed_seq")?,
        compensation: compensation.as_deref().and_then(CompensationState::parse),
        compensation_job_id: get(row, "compensation_job_id")?,
        finished_at: get(row, "finished_at")?,
    })
}

fn flow_of(row: &PgRow, steps: Vec<FlowStepRecord>) -> StoreResult<FlowRecord> {
    let state: String = get(row, "state")?;
    Ok(FlowRecord {
        id: get(row, "id")?,
        name: get(row, "name")?,
        state: parsed::<FlowState>(&state, "flow state")?,
        on_failure: policy_of(get(row, "on_failure")?, "flow policy")?,
        failed_step: get(row, "failed_step")?,
        idempotency_key: get(row, "idempotency_key")?,
        tags: get(row, "tags")?,
        created_at: get(row, "created_at")?,
        finished_at: get(row, "finished_at")?,
        steps,
    })
}

const STEP_COLUMNS: &str = "flow_id, name, position, state, after, on_parent_failure, job_id, \
    job, compensate, wait_signal, wait_timeout_ms, wait_deadline, signalled, result, error, \
    completed_seq, compensation, compensation_job_id, finished_at";

#[async_trait]
impl CopyStore for PgStore {
    async fn export_queue_settings(&self) -> StoreResult<Vec<NamedQueueSettings>> {
        ops::queue_settings_list(&mut *self.conn().await?, &self.inner.sql).await
    }

    async fn import_queue_settings(&self, records: Vec<NamedQueueSettings>) -> StoreResult<u64> {
        let exists = stmt(format!(
            "SELECT 1 FROM {} WHERE queue = $1",
            self.table("queue_settings")
        ));
        let mut tx = self.begin().await?;
        let mut stored = 0;
        let mut resumed = false;
        for named in &records {
            let found = sqlx::query(exists.clone())
                .bind(&named.name)
                .fetch_optional(&mut *tx)
                .await
                .map_err(db("read queue settings"))?;
            if found.is_none() {
                // The same write as `queue_settings_put`.
                let (_, woke) =
                    ops::queue_settings_put(&mut tx, &self.ctx(), &named.name, &named.settings)
                        .await?;
                resumed |= woke;
                stored += 1;
            }
        }
        commit(tx).await?;
        self.wake_local(resumed);
        Ok(stored)
    }

    async fn export_config(&self) -> StoreResult<Vec<conveyor_core::ConfigEntry>> {
        crate::config::list(&mut *self.conn().await?, &self.inner.config_sql, None).await
    }

    async fn import_config(&self, records: Vec<conveyor_core::ConfigEntry>) -> StoreResult<u64> {
        let mut tx = self.begin().await?;
        let stored = crate::config::import(&mut tx, &self.inner.config_sql, &records).await?;
        commit(tx).await?;
        Ok(stored)
    }

    async fn export_kinds(&self) -> StoreResult<Vec<KindSettings>> {
        kinds::list(&mut *self.conn().await?, &self.inner.kind_sql).await
    }

    async fn import_kinds(&self, records: Vec<KindSettings>) -> StoreResult<u64> {
        let text = stmt(format!(
            "INSERT INTO {} (kind, schema, version, updated_at, circuit_breaker, limits, \
             sequence, batch) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING",
            self.table("kinds")
        ));
        let mut tx = self.begin().await?;
        let mut stored = 0;
        for kind in &records {
            let query = sqlx::query(text.clone())
                .bind(&kind.kind)
                .bind(kind.schema.as_ref().map(Json))
                .bind(kind.version.map(|v| i32::try_from(v).unwrap_or(i32::MAX)))
                .bind(kind.updated_at)
                .bind(kind.circuit_breaker.as_ref().map(Json))
                .bind(&kind.limits)
                .bind(kind.sequence.as_ref().map(Json))
                .bind(kind.batch.as_ref().map(Json));
            stored += u64::from(inserted(&mut tx, query).await?);
        }
        commit(tx).await?;
        Ok(stored)
    }

    async fn export_breakers(&self) -> StoreResult<Vec<StoredBreaker>> {
        kinds::breakers_list(&mut *self.conn().await?, &self.inner.breaker_sql).await
    }

    async fn import_breakers(&self, records: Vec<StoredBreaker>) -> StoreResult<u64> {
        let text = stmt(format!(
            "INSERT INTO {} (scope, name, version, record) VALUES ($1, $2, $3, $4) \
             ON CONFLICT DO NOTHING",
            self.table("circuit_breakers")
        ));
        let mut tx = self.begin().await?;
        let mut stored = 0;
        for breaker in &records {
            let query = sqlx::query(text.clone())
                .bind(breaker.scope.as_str())
                .bind(&breaker.name)
                .bind(count(breaker.version).max(1))
                .bind(Json(&breaker.record));
            stored += u64::from(inserted(&mut tx, query).await?);
        }
        commit(tx).await?;
        Ok(stored)
    }

    async fn export_tokens(&self) -> StoreResult<Vec<StoredToken>> {
        let rows = self
            .fetch_rows(
                format!(
                    "SELECT id, name, role, secret_hash, created_at, revoked_at FROM {} \
                     ORDER BY created_at, id",
                    self.table("api_tokens")
                ),
                |q| q,
            )
            .await?;
        rows.iter()
            .map(|row| {
                let role: String = get(row, "role")?;
                Ok(StoredToken {
                    token: ApiToken {
                        id: get(row, "id")?,
                        name: get(row, "name")?,
                        role: parsed::<Role>(&role, "token role")?,
                        created_at: get(row, "created_at")?,
                        revoked_at: get(row, "revoked_at")?,
                    },
                    secret_hash: get(row, "secret_hash")?,
                })
            })
            .collect()
    }

    async fn import_tokens(&self, records: Vec<StoredToken>) -> StoreResult<u64> {
        let text = stmt(format!(
            "INSERT INTO {} (id, name, role, secret_hash, created_at, revoked_at) \
             VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
            self.table("api_tokens")
        ));
        let mut tx = self.begin().await?;
        let mut stored = 0;
        for record in &records {
            let token = &record.token;
            let query = sqlx::query(text.clone())
                .bind(token.id)
                .bind(&token.name)
                .bind(token.role.as_str())
                .bind(&record.secret_hash)
                .bind(token.created_at)
                .bind(token.revoked_at);
            stored += u64::from(inserted(&mut tx, query).await?);
        }
        commit(tx).await?;
        Ok(stored)
    }

    async fn export_schedules(&self) -> StoreResult<Vec<ScheduleRecord>> {
        let rows = self
            .fetch_rows(
                format!(
                    "SELECT name, definition, revision, due_after, last_tick, last_job_id, \
                     created_at, updated_at FROM {} ORDER BY name",
                    self.table("schedules")
                ),
                |q| q,
            )
            .await?;
        rows.iter()
            .map(|row| {
                let Json(definition) = get::<Json<Value>>(row, "definition")?;
                Ok(ScheduleRecord {
                    name: get(row, "name")?,
                    definition,
                    revision: get::<i64>(row, "revision")?.max(0) as u64,
                    due_after: get(row, "due_after")?,
                    last_tick: get(row, "last_tick")?,
                    last_job_id: get(row, "last_job_id")?,
                    created_at: get(row, "created_at")?,
                    updated_at: get(row, "updated_at")?,
                })
            })
            .collect()
    }

    async fn import_schedules(&self, records: Vec<ScheduleRecord>) -> StoreResult<u64> {
        let text = stmt(format!(
            "INSERT INTO {} (name, definition, revision, due_after, last_tick, last_job_id, \
             created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT DO NOTHING",
            self.table("schedules")
        ));
        let mut tx = self.begin().await?;
        let mut stored = 0;
        for schedule in &records {
            let query = sqlx::query(text.clone())
                .bind(&schedule.name)
                .bind(Json(&schedule.definition))
                .bind(count(schedule.revision).max(1))
                .bind(schedule.due_after)
                .bind(schedule.last_tick)
                .bind(schedule.last_job_id)
                .bind(schedule.created_at)
                .bind(schedule.updated_at);
            stored += u64::from(inserted(&mut tx, query).await?);
        }
        commit(tx).await?;
        Ok(stored)
    }

    async fn export_schedule_runs(
        &self,
        after: Option<RunKey>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRunRecord>> {
        let (name, tick) = after.map_or((None, None), |(name, tick)| (Some(name), Some(tick)));
        let rows = self
            .fetch_rows(
                format!(
                    "SELECT schedule, tick, fired_at, status, catch_up, job_id, detail FROM {} \
                     WHERE $1::text IS NULL OR (schedule, tick) > ($1, $2::timestamptz) \
                     ORDER BY schedule, tick LIMIT $3",
                    self.table("schedule_runs")
                ),
                |q| q.bind(name).bind(tick).bind(limit_of(limit)),
            )
            .await?;
        rows.iter()
            .map(|row| {
                let status: String = get(row, "status")?;
                Ok(ScheduleRunRecord {
                    schedule: get(row, "schedule")?,
                    tick: get(row, "tick")?,
                    fired_at: get(row, "fired_at")?,
                    status: parsed::<RunStatus>(&status, "run status")?,
                    catch_up: get(row, "catch_up")?,
                    job_id: get(row, "job_id")?,
                    detail: get(row, "detail")?,
                })
            })
            .collect()
    }

    async fn import_schedule_runs(&self, records: Vec<ScheduleRunRecord>) -> StoreResult<u64> {
        let text = stmt(format!(
            "INSERT INTO {runs} (schedule, tick, fired_at, status, catch_up, job_id, detail) \
             SELECT $1, $2, $3, $4, $5, $6, $7 \
             WHERE EXISTS (SELECT 1 FROM {schedules} WHERE name = $1) \
             ON CONFLICT DO NOTHING",
            runs = self.table("schedule_runs"),
            schedules = self.table("schedules")
        ));
        let mut tx = self.begin().await?;
        let mut stored = 0;
        for run in &records {
            let query = sqlx::query(text.clone())
                .bind(&run.schedule)
                .bind(run.tick)
                .bind(run.fired_at)
                .bind(run.status.as_str())
                .bind(run.catch_up)
                .bind(run.job_id)
                .bind(&run.detail);
            stored += u64::from(inserted(&mut tx, query).await?);
        }
        commit(tx).await?;
        Ok(stored)
    }

    async fn export_flows(
        &self,
        after: Option<Uuid>,
        limit: usize,
    ) -> StoreResult<Vec<FlowRecord>> {
        let flows = self
            .fetch_rows(
                format!(
                    "SELECT id, name, state, on_failure, failed_step, idempotency_key, tags, \
                     created_at, finished_at FROM {} WHERE $1::uuid IS NULL OR id > $1 \
                     ORDER BY id LIMIT $2",
                    self.table("flows")
                ),
                |q| q.bind(after).bind(limit_of(limit)),
            )
            .await?;
        let ids = flows
            .iter()
            .map(|row| get::<Uuid>(row, "id"))
            .collect::<StoreResult<Vec<_>>>()?;
        let steps = self
            .fetch_rows(
                format!(
                    "SELECT {STEP_COLUMNS} FROM {} WHERE flow_id = ANY($1) \
                     ORDER BY flow_id, position",
                    self.table("flow_steps")
                ),
                |q| q.bind(ids),
            )
            .await?;
        let mut by_flow: std::collections::HashMap<Uuid, Vec<FlowStepRecord>> =
            std::collections::HashMap::new();
        for row in &steps {
            by_flow
                .entry(get(row, "flow_id")?)
                .or_default()
                .push(step_of(row)?);
        }
        flows
            .iter()
            .map(|row| {
                let id: Uuid = get(row, "id")?;
                flow_of(row, by_flow.remove(&id).unwrap_or_default())
            })
            .collect()
    }

    async fn import_flows(&self, records: Vec<FlowRecord>) -> StoreResult<u64> {
        let flow_text = stmt(format!(
            "INSERT INTO {} (id, name, state, on_failure, failed_step, idempotency_key, tags, \
             created_at, finished_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT DO NOTHING",
            self.table("flows")
        ));
        let step_text = stmt(format!(
            "INSERT INTO {} ({STEP_COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, \
             $11, $12, $13, $14, $15, $16, $17, $18, $19) ON CONFLICT DO NOTHING",
            self.table("flow_steps")
        ));
        let mut tx = self.begin().await?;
        let mut stored = 0;
        for flow in &records {
            let query = sqlx::query(flow_text.clone())
                .bind(flow.id)
                .bind(&flow.name)
                .bind(flow.state.as_str())
                .bind(policy_text(&flow.on_failure, "a flow policy")?)
                .bind(&flow.failed_step)
                .bind(&flow.idempotency_key)
                .bind(&flow.tags)
                .bind(flow.created_at)
                .bind(flow.finished_at);
            if !inserted(&mut tx, query).await? {
                continue;
            }
            stored += 1;
            for step in &flow.steps {
                let query = sqlx::query(step_text.clone())
                    .bind(flow.id)
                    .bind(&step.name)
                    .bind(step.position)
                    .bind(step.state.as_str())
                    .bind(&step.after)
                    .bind(policy_text(&step.on_parent_failure, "a step policy")?)
                    .bind(step.job_id)
                    .bind(step.job.as_ref().map(Json))
                    .bind(step.compensate.as_ref().map(Json))
                    .bind(&step.wait_signal)
                    .bind(step.wait_timeout_ms.map(count))
                    .bind(step.wait_deadline)
                    .bind(step.signalled)
                    .bind(step.result.as_ref().map(Json))
                    .bind(step.error.as_ref().map(Json))
                    .bind(step.completed_seq)
                    .bind(step.compensation.map(CompensationState::as_str))
                    .bind(step.compensation_job_id)
                    .bind(step.finished_at);
                inserted(&mut tx, query).await?;
            }
        }
        commit(tx).await?;
        Ok(stored)
    }

    async fn export_jobs(&self, after: Option<Uuid>, limit: usize) -> StoreResult<Vec<Job>> {
        let rows = self
            .fetch_rows(
                format!(
                    "SELECT {COLUMNS} FROM {} WHERE $1::uuid IS NULL OR id > $1 \
                     ORDER BY id LIMIT $2",
                    self.table("jobs")
                ),
                |q| q.bind(after).bind(limit_of(limit)),
            )
            .await?;
        rows::jobs(&rows)
    }

    async fn import_jobs(&self, records: Vec<Job>) -> StoreResult<u64> {
        JobStore::jobs_import(self, records).await
    }

    async fn export_audit(&self, after: Option<i64>, limit: usize) -> StoreResult<Vec<AuditEntry>> {
        let rows = self
            .fetch_rows(
                format!(
                    "SELECT id, at, actor, actor_token_id, action, target, job_ids, job_count, \
                     detail FROM {} WHERE id > $1 ORDER BY id LIMIT $2",
                    self.table("audit_log")
                ),
                |q| q.bind(after.unwrap_or(i64::MIN)).bind(limit_of(limit)),
            )
            .await?;
        rows.iter()
            .map(|row| {
                let action: String = get(row, "action")?;
                Ok(AuditEntry {
                    id: get(row, "id")?,
                    at: get(row, "at")?,
                    actor: get(row, "actor")?,
                    actor_token_id: get(row, "actor_token_id")?,
                    action: parsed::<AuditAction>(&action, "audit action")?,
                    target: get(row, "target")?,
                    job_ids: get(row, "job_ids")?,
                    job_count: get::<i64>(row, "job_count")?.max(0) as u64,
                    detail: get(row, "detail")?,
                })
            })
            .collect()
    }

    async fn import_audit(&self, records: Vec<AuditEntry>) -> StoreResult<u64> {
        let table = self.table("audit_log");
        let text = stmt(format!(
            "INSERT INTO {table} (id, at, actor, actor_token_id, action, target, job_ids, \
             job_count, detail) OVERRIDING SYSTEM VALUE \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT DO NOTHING"
        ));
        // Later appends are numbered after every imported entry.
        let advance = stmt(format!(
            "SELECT setval(q.s, GREATEST((SELECT COALESCE(MAX(id), 1) FROM {table}), \
                 COALESCE(pg_sequence_last_value(q.s), 1))) \
             FROM (SELECT pg_get_serial_sequence($1, 'id')::regclass AS s) q"
        ));
        let mut tx = self.begin().await?;
        let mut stored = 0;
        for entry in &records {
            let query = sqlx::query(text.clone())
                .bind(entry.id)
                .bind(entry.at)
                .bind(&entry.actor)
                .bind(entry.actor_token_id)
                .bind(entry.action.as_str())
                .bind(&entry.target)
                .bind(&entry.job_ids)
                .bind(count(entry.job_count))
                .bind(&entry.detail);
            stored += u64::from(inserted(&mut tx, query).await?);
        }
        sqlx::query(advance)
            .bind(&table)
            .fetch_one(&mut *tx)
            .await
            .map_err(db("advance the audit log's ids"))?;
        commit(tx).await?;
        Ok(stored)
    }

    async fn export_rollups(
        &self,
        after: Option<RollupKey>,
        limit: usize,
    ) -> StoreResult<Vec<Rollup>> {
        let (minute, queue, kind): (Option<DateTime<Utc>>, Option<String>, Option<String>) =
            match after {
                Some((minute, queue, kind)) => (Some(minute), Some(queue), Some(kind)),
                None => (None, None, None),
            };
        let rows = self
            .fetch_rows(
                format!(
                    "SELECT {} FROM {} WHERE $1::timestamptz IS NULL \
                     OR (minute, queue, kind) > ($1, $2::text, $3::text) \
                     ORDER BY minute, queue, kind LIMIT $4",
                    crate::stats::COLUMNS,
                    self.table("stats_minutes")
                ),
                |q| q.bind(minute).bind(queue).bind(kind).bind(limit_of(limit)),
            )
            .await?;
        rows.iter().map(crate::stats::rollup_of).collect()
    }

    async fn import_rollups(&self, records: Vec<Rollup>) -> StoreResult<u64> {
        let text = stmt(format!(
            "INSERT INTO {} ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
             ON CONFLICT DO NOTHING",
            self.table("stats_minutes"),
            crate::stats::COLUMNS
        ));
        let mut tx = self.begin().await?;
        let mut stored = 0;
        for rollup in &records {
            let counts = &rollup.counts;
            let query = sqlx::query(text.clone())
                .bind(rollup.minute)
                .bind(&rollup.queue)
                .bind(&rollup.kind)
                .bind(count(counts.enqueued))
                .bind(count(counts.started))
                .bind(count(counts.completed))
                .bind(count(counts.failed))
                .bind(count(counts.retried))
                .bind(count(counts.dead))
                .bind(Json(&counts.run_time))
                .bind(Json(&counts.queue_wait));
            stored += u64::from(inserted(&mut tx, query).await?);
        }
        commit(tx).await?;
        Ok(stored)
    }
}
