//! The store's side of `conveyor store copy` (see `conveyor_core::copy`): pages of rows as
//! stored, and rows inserted exactly as given (`INSERT OR IGNORE`: a key already held is left
//! alone). Flow steps are exported with the state their reads give them (see
//! `STEP_COMPLETED_BY_JOB` in `workflow`), so another store reads them alike.
//!
//! One cohesive thing (~800 lines): every table's export and import, kept together so a
//! column added to one side is seen missing from the other.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use conveyor_core::access::{ApiToken, AuditEntry, Role, StoredToken};
use conveyor_core::clock::{from_millis, to_millis};
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
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::backend;
use crate::workflow::{STEP_COMPLETED_BY_JOB, STEP_RESULT, STEP_STATE};
use crate::{ops, rows, SqliteStore};

fn limit_of(limit: usize) -> i64 {
    i64::try_from(limit).unwrap_or(i64::MAX)
}

fn unreadable(what: &str, e: impl std::fmt::Display) -> StoreError {
    StoreError::backend(format!("stored {what} is not readable: {e}"))
}

fn json_of<T: serde::de::DeserializeOwned>(text: &str, what: &str) -> StoreResult<T> {
    serde_json::from_str(text).map_err(|e| unreadable(what, e))
}

fn optional_json<T: serde::de::DeserializeOwned>(
    text: Option<String>,
    what: &str,
) -> StoreResult<Option<T>> {
    text.map(|text| json_of(&text, what)).transpose()
}

fn text_of<T: serde::Serialize>(value: &T, what: &str) -> StoreResult<String> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::backend(format!("cannot serialize {what}: {e}")))
}

fn uuid_of(text: Option<String>, what: &str) -> StoreResult<Option<Uuid>> {
    text.map(|text| Uuid::parse_str(&text).map_err(|e| unreadable(what, e)))
        .transpose()
}

/// A serde enum stored as its bare name (`"stop"`, not `"\"stop\""`).
fn policy_of<T: serde::de::DeserializeOwned>(text: String, what: &str) -> StoreResult<T> {
    serde_json::from_value(Value::String(text)).map_err(|e| unreadable(what, e))
}

fn policy_text<T: serde::Serialize>(policy: &T, what: &str) -> StoreResult<String> {
    match serde_json::to_value(policy) {
        Ok(Value::String(text)) => Ok(text),
        _ => Err(StoreError::backend(format!(
            "{what} did not serialize to a string"
        ))),
    }
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Runs `insert` (one row, `INSERT OR IGNORE`) and says whether it stored the row.
fn inserted(outcome: rusqlite::Result<usize>) -> StoreResult<bool> {
    outcome.map(|n| n > 0).map_err(backend)
}

type StepRow = (
    String,
    i64,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<i64>,
    bool,
    Option<String>,
    Option<String>,
    Option<i64>,
    Option<String>,
    Option<String>,
    Option<i64>,
);

fn steps_of(conn: &Connection, flow_id: &str) -> StoreResult<Vec<FlowStepRecord>> {
    let rows: Vec<StepRow> = conn
        .prepare_cached(&format!(
            "SELECT s.name, s.position, {STEP_STATE}, s.after, s.on_parent_failure, s.job_id, \
                 s.job, s.compensate, s.wait_signal, s.wait_timeout_ms, s.wait_deadline, \
                 s.signalled, {STEP_RESULT}, \
                 CASE WHEN {STEP_COMPLETED_BY_JOB} THEN NULL ELSE s.error END, \
                 s.completed_seq, s.compensation, s.compensation_job_id, \
                 CASE WHEN {STEP_COMPLETED_BY_JOB} THEN j.finished_at ELSE s.finished_at END \
             FROM flow_steps s LEFT JOIN jobs j ON j.id = s.job_id \
             WHERE s.flow_id = ?1 ORDER BY s.position"
        ))
        .and_then(|mut stmt| {
            stmt.query_map(params![flow_id], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                    row.get(6)?,
                    row.get(7)?,
                    row.get(8)?,
                    row.get(9)?,
                    row.get(10)?,
                    row.get(11)?,
                    row.get(12)?,
                    row.get(13)?,
                    row.get(14)?,
                    row.get(15)?,
                    row.get(16)?,
                    row.get(17)?,
                ))
            })?
            .collect()
        })
        .map_err(backend)?;
    rows.into_iter()
        .map(|row| {
            Ok(FlowStepRecord {
                name: row.0,
                position: i32::try_from(row.1).map_err(|e| unreadable("step position", e))?,
                state: StepState::from_str(&row.2).map_err(|e| unreadable("step state", e))?,
                after: json_of(&row.3, "step parents")?,
                on_parent_failure: policy_of(row.4, "step policy")?,
                job_id: uuid_of(row.5, "step job id")?,
                job: optional_json(row.6, "step job")?,
                compensate: optional_json(row.7, "step compensation")?,
                wait_signal: row.8,
                wait_timeout_ms: row.9.map(|ms| ms.max(0) as u64),
                wait_deadline: row.10.map(from_millis),
                signalled: row.11,
                result: optional_json(row.12, "step result")?,
                error: optional_json(row.13, "step error")?,
                completed_seq: row.14,
                compensation: row.15.as_deref().and_then(CompensationState::parse),
                compensation_job_id: uuid_of(row.16, "compensation job id")?,
                finished_at: row.17.map(from_millis),
            })
        })
        .collect()
}

type FlowRow = (
    String,
    Option<String>,
    String,
    String,
    Option<String>,
    Option<String>,
    String,
    i64,
    Option<i64>,
);

fn export_flows(
    conn: &Connection,
    after: Option<Uuid>,
    limit: usize,
) -> StoreResult<Vec<FlowRecord>> {
    let rows: Vec<FlowRow> = conn
        .prepare_cached(
            "SELECT id, name, state, on_failure, failed_step, idempotency_key, tags, created_at, \
             finished_at FROM flows WHERE ?1 IS NULL OR id > ?1 ORDER BY id LIMIT ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_map(
                params![after.map(|id| id.to_string()), limit_of(limit)],
                |row| FlowRow::try_from(row),
            )?
            .collect()
        })
        .map_err(backend)?;
    rows.into_iter()
        .map(|row| {
            let steps = steps_of(conn, &row.0)?;
            Ok(FlowRecord {
                id: Uuid::parse_str(&row.0).map_err(|e| unreadable("flow id", e))?,
                name: row.1,
                state: FlowState::from_str(&row.2).map_err(|e| unreadable("flow state", e))?,
                on_failure: policy_of(row.3, "flow policy")?,
                failed_step: row.4,
                idempotency_key: row.5,
                tags: json_of(&row.6, "flow tags")?,
                created_at: from_millis(row.7),
                finished_at: row.8.map(from_millis),
                steps,
            })
        })
        .collect()
}

fn import_flow(conn: &Connection, flow: &FlowRecord) -> StoreResult<bool> {
    let id = flow.id.to_string();
    let stored = inserted(
        conn.prepare_cached(
            "INSERT OR IGNORE INTO flows (id, name, state, on_failure, failed_step, \
             idempotency_key, tags, created_at, finished_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                id,
                flow.name,
                flow.state.as_str(),
                policy_text(&flow.on_failure, "a flow policy")
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?,
                flow.failed_step,
                flow.idempotency_key,
                text_of(&flow.tags, "flow tags")
                    .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?,
                to_millis(flow.created_at),
                flow.finished_at.map(to_millis),
            ])
        }),
    )?;
    if !stored {
        return Ok(false);
    }
    for step in &flow.steps {
        let optional = |value: &Option<Value>, what: &str| {
            value.as_ref().map(|v| text_of(v, what)).transpose()
        };
        let (job, compensate, result, error) = (
            optional(&step.job, "a step job")?,
            optional(&step.compensate, "a step compensation")?,
            optional(&step.result, "a step result")?,
            optional(&step.error, "a step error")?,
        );
        let after = text_of(&step.after, "step parents")?;
        let policy = policy_text(&step.on_parent_failure, "a step policy")?;
        conn.prepare_cached(
            "INSERT OR IGNORE INTO flow_steps (flow_id, name, position, state, after, \
             on_parent_failure, job_id, job, compensate, wait_signal, wait_timeout_ms, \
             wait_deadline, signalled, result, error, completed_seq, compensation, \
             compensation_job_id, finished_at) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
             ?17, ?18, ?19)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                id,
                step.name,
                step.position,
                step.state.as_str(),
                after,
                policy,
                step.job_id.map(|id| id.to_string()),
                job,
                compensate,
                step.wait_signal,
                step.wait_timeout_ms.map(count),
                step.wait_deadline.map(to_millis),
                step.signalled,
                result,
                error,
                step.completed_seq,
                step.compensation.map(CompensationState::as_str),
                step.compensation_job_id.map(|id| id.to_string()),
                step.finished_at.map(to_millis),
            ])
        })
        .map_err(backend)?;
    }
    Ok(true)
}

type ScheduleRow = (
    String,
    String,
    i64,
    i64,
    Option<i64>,
    Option<String>,
    i64,
    i64,
);

fn export_schedules(conn: &Connection) -> StoreResult<Vec<ScheduleRecord>> {
    let rows: Vec<ScheduleRow> = conn
        .prepare_cached(
            "SELECT name, definition, revision, due_after, last_tick, last_job_id, created_at, \
             updated_at FROM schedules ORDER BY name",
        )
        .and_then(|mut stmt| {
            stmt.query_map([], |row| ScheduleRow::try_from(row))?
                .collect()
        })
        .map_err(backend)?;
    rows.into_iter()
        .map(|row| {
            Ok(ScheduleRecord {
                definition: json_of(&row.1, "schedule definition")?,
                name: row.0,
                revision: row.2.max(0) as u64,
                due_after: from_millis(row.3),
                last_tick: row.4.map(from_millis),
                last_job_id: uuid_of(row.5, "schedule job id")?,
                created_at: from_millis(row.6),
                updated_at: from_millis(row.7),
            })
        })
        .collect()
}

type RunRow = (
    String,
    i64,
    i64,
    String,
    bool,
    Option<String>,
    Option<String>,
);

fn export_runs(
    conn: &Connection,
    after: Option<RunKey>,
    limit: usize,
) -> StoreResult<Vec<ScheduleRunRecord>> {
    let (name, tick) = after.map_or((None, None), |(name, tick)| {
        (Some(name), Some(to_millis(tick)))
    });
    let rows: Vec<RunRow> = conn
        .prepare_cached(
            "SELECT schedule, tick, fired_at, status, catch_up, job_id, detail \
             FROM schedule_runs WHERE ?1 IS NULL OR (schedule, tick) > (?1, ?2) \
             ORDER BY schedule, tick LIMIT ?3",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![name, tick, limit_of(limit)], |row| {
                RunRow::try_from(row)
            })?
            .collect()
        })
        .map_err(backend)?;
    rows.into_iter()
        .map(|row| {
            Ok(ScheduleRunRecord {
                schedule: row.0,
                tick: from_millis(row.1),
                fired_at: from_millis(row.2),
                status: RunStatus::from_str(&row.3).map_err(|e| unreadable("run status", e))?,
                catch_up: row.4,
                job_id: uuid_of(row.5, "run job id")?,
                detail: row.6,
            })
        })
        .collect()
}

type TokenRow = (String, String, String, String, i64, Option<i64>);

fn export_tokens(conn: &Connection) -> StoreResult<Vec<StoredToken>> {
    let rows: Vec<TokenRow> = conn
        .prepare_cached(
            "SELECT id, name, role, secret_hash, created_at, revoked_at FROM api_tokens \
             ORDER BY created_at, id",
        )
        .and_then(|mut stmt| stmt.query_map([], |row| TokenRow::try_from(row))?.collect())
        .map_err(backend)?;
    rows.into_iter()
        .map(|row| {
            Ok(StoredToken {
                token: ApiToken {
                    id: Uuid::parse_str(&row.0).map_err(|e| unreadable("token id", e))?,
                    name: row.1,
                    role: Role::from_str(&row.2).map_err(|e| unreadable("token role", e))?,
                    created_at: from_millis(row.4),
                    revoked_at: row.5.map(from_millis),
                },
                secret_hash: row.3,
            })
        })
        .collect()
}

type AuditRow = (
    i64,
    i64,
    String,
    Option<String>,
    String,
    Option<String>,
    String,
    i64,
    Option<String>,
);

fn export_audit(
    conn: &Connection,
    after: Option<i64>,
    limit: usize,
) -> StoreResult<Vec<AuditEntry>> {
    let rows: Vec<AuditRow> = conn
        .prepare_cached(
            "SELECT id, at, actor, actor_token_id, action, target, job_ids, job_count, detail \
             FROM audit_log WHERE id > ?1 ORDER BY id LIMIT ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![after.unwrap_or(i64::MIN), limit_of(limit)], |row| {
                AuditRow::try_from(row)
            })?
            .collect()
        })
        .map_err(backend)?;
    rows.into_iter()
        .map(|row| {
            Ok(AuditEntry {
                id: row.0,
                at: from_millis(row.1),
                actor: row.2,
                actor_token_id: uuid_of(row.3, "audit token id")?,
                action: AuditAction::from_str(&row.4).map_err(|e| unreadable("audit action", e))?,
                target: row.5,
                job_ids: json_of(&row.6, "audit job ids")?,
                job_count: row.7.max(0) as u64,
                detail: row.8,
            })
        })
        .collect()
}

fn export_rollups(
    conn: &Connection,
    after: Option<RollupKey>,
    limit: usize,
) -> StoreResult<Vec<Rollup>> {
    let (minute, queue, kind) = match after {
        Some((minute, queue, kind)) => (Some(to_millis(minute)), Some(queue), Some(kind)),
        None => (None, None, None),
    };
    conn.prepare_cached(&format!(
        "SELECT {} FROM stats_minutes WHERE ?1 IS NULL OR (minute, queue, kind) > (?1, ?2, ?3) \
         ORDER BY minute, queue, kind LIMIT ?4",
        crate::stats::COLUMNS
    ))
    .and_then(|mut stmt| {
        stmt.query_map(
            params![minute, queue, kind, limit_of(limit)],
            crate::stats::rollup_of,
        )?
        .collect()
    })
    .map_err(backend)
}

fn import_rollup(conn: &Connection, rollup: &Rollup) -> StoreResult<bool> {
    let counts = &rollup.counts;
    let run_time = text_of(&counts.run_time, "a histogram")?;
    let queue_wait = text_of(&counts.queue_wait, "a histogram")?;
    inserted(
        conn.prepare_cached(&format!(
            "INSERT OR IGNORE INTO stats_minutes ({}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
            crate::stats::COLUMNS
        ))
        .and_then(|mut stmt| {
            stmt.execute(params![
                to_millis(rollup.minute),
                rollup.queue,
                rollup.kind,
                count(counts.enqueued),
                count(counts.started),
                count(counts.completed),
                count(counts.failed),
                count(counts.retried),
                count(counts.dead),
                run_time,
                queue_wait,
            ])
        }),
    )
}

fn millis_opt(at: Option<DateTime<Utc>>) -> Option<i64> {
    at.map(to_millis)
}

#[async_trait]
impl CopyStore for SqliteStore {
    async fn export_queue_settings(&self) -> StoreResult<Vec<NamedQueueSettings>> {
        self.read(|conn, _| rows::queue_settings(conn)).await
    }

    async fn import_queue_settings(&self, records: Vec<NamedQueueSettings>) -> StoreResult<u64> {
        self.write(move |ctx| {
            let mut stored = 0;
            for named in records {
                let exists = ctx
                    .conn
                    .prepare_cached("SELECT 1 FROM queue_settings WHERE queue = ?1")
                    .and_then(|mut stmt| stmt.query_row(params![named.name], |_| Ok(())).optional())
                    .map_err(backend)?
                    .is_some();
                if !exists {
                    // The same write as `queue_settings_put`, which keeps the writer's copy.
                    ops::queue_settings_put(ctx, &named.name, named.settings)?;
                    stored += 1;
                }
            }
            Ok(stored)
        })
        .await
    }

    async fn export_config(&self) -> StoreResult<Vec<conveyor_core::ConfigEntry>> {
        self.read(|conn, _| crate::config::all(conn)).await
    }

    async fn import_config(&self, records: Vec<conveyor_core::ConfigEntry>) -> StoreResult<u64> {
        self.write(move |ctx| crate::config::import(ctx, &records))
            .await
    }

    async fn export_kinds(&self) -> StoreResult<Vec<KindSettings>> {
        self.read(|conn, _| crate::kinds::list(conn)).await
    }

    async fn import_kinds(&self, records: Vec<KindSettings>) -> StoreResult<u64> {
        self.write(move |ctx| {
            let mut stored = 0;
            for kind in &records {
                let schema = kind
                    .schema
                    .as_ref()
                    .map(|s| text_of(s, "a schema"))
                    .transpose()?;
                let breaker = rows::breaker_settings_text(kind.circuit_breaker.as_ref())?;
                let limits = rows::names_text(&kind.limits)?;
                let sequence = rows::sequence_spec_text(kind.sequence.as_ref())?;
                let batch = kind
                    .batch
                    .as_ref()
                    .map(|spec| rows::json_text(spec, "batch"))
                    .transpose()?;
                if inserted(
                    ctx.conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO kinds (kind, schema, version, updated_at, \
                             circuit_breaker, limits, sequence, batch) \
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        )
                        .and_then(|mut stmt| {
                            stmt.execute(params![
                                kind.kind,
                                schema,
                                kind.version,
                                to_millis(kind.updated_at),
                                breaker,
                                limits,
                                sequence,
                                batch
                            ])
                        }),
                )? {
                    stored += 1;
                }
            }
            Ok(stored)
        })
        .await
    }

    async fn export_breakers(&self) -> StoreResult<Vec<StoredBreaker>> {
        self.read(|conn, _| crate::kinds::breakers_list(conn, None))
            .await
    }

    async fn import_breakers(&self, records: Vec<StoredBreaker>) -> StoreResult<u64> {
        self.write(move |ctx| {
            let mut stored = 0;
            for breaker in &records {
                let record = text_of(&breaker.record, "a breaker")?;
                if inserted(
                    ctx.conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO circuit_breakers (scope, name, version, record) \
                             VALUES (?1, ?2, ?3, ?4)",
                        )
                        .and_then(|mut stmt| {
                            stmt.execute(params![
                                breaker.scope.as_str(),
                                breaker.name,
                                count(breaker.version),
                                record
                            ])
                        }),
                )? {
                    stored += 1;
                }
            }
            Ok(stored)
        })
        .await
    }

    async fn export_tokens(&self) -> StoreResult<Vec<StoredToken>> {
        self.read(|conn, _| export_tokens(conn)).await
    }

    async fn import_tokens(&self, records: Vec<StoredToken>) -> StoreResult<u64> {
        self.write(move |ctx| {
            let mut stored = 0;
            for stored_token in &records {
                let token = &stored_token.token;
                if inserted(
                    ctx.conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO api_tokens (id, name, role, secret_hash, \
                             created_at, revoked_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        )
                        .and_then(|mut stmt| {
                            stmt.execute(params![
                                token.id.to_string(),
                                token.name,
                                token.role.as_str(),
                                stored_token.secret_hash,
                                to_millis(token.created_at),
                                millis_opt(token.revoked_at),
                            ])
                        }),
                )? {
                    stored += 1;
                }
            }
            Ok(stored)
        })
        .await
    }

    async fn export_schedules(&self) -> StoreResult<Vec<ScheduleRecord>> {
        self.read(|conn, _| export_schedules(conn)).await
    }

    async fn import_schedules(&self, records: Vec<ScheduleRecord>) -> StoreResult<u64> {
        self.write(move |ctx| {
            let mut stored = 0;
            for schedule in &records {
                let definition = text_of(&schedule.definition, "a schedule")?;
                if inserted(
                    ctx.conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO schedules (name, definition, revision, \
                             due_after, last_tick, last_job_id, created_at, updated_at) \
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                        )
                        .and_then(|mut stmt| {
                            stmt.execute(params![
                                schedule.name,
                                definition,
                                count(schedule.revision),
                                to_millis(schedule.due_after),
                                millis_opt(schedule.last_tick),
                                schedule.last_job_id.map(|id| id.to_string()),
                                to_millis(schedule.created_at),
                                to_millis(schedule.updated_at),
                            ])
                        }),
                )? {
                    stored += 1;
                }
            }
            Ok(stored)
        })
        .await
    }

    async fn export_schedule_runs(
        &self,
        after: Option<RunKey>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRunRecord>> {
        self.read(move |conn, _| export_runs(conn, after, limit))
            .await
    }

    async fn import_schedule_runs(&self, records: Vec<ScheduleRunRecord>) -> StoreResult<u64> {
        self.write(move |ctx| {
            let mut stored = 0;
            for run in &records {
                if inserted(
                    ctx.conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO schedule_runs (schedule, tick, fired_at, \
                             status, catch_up, job_id, detail) \
                             SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7 \
                             WHERE EXISTS (SELECT 1 FROM schedules WHERE name = ?1)",
                        )
                        .and_then(|mut stmt| {
                            stmt.execute(params![
                                run.schedule,
                                to_millis(run.tick),
                                to_millis(run.fired_at),
                                run.status.as_str(),
                                run.catch_up,
                                run.job_id.map(|id| id.to_string()),
                                run.detail,
                            ])
                        }),
                )? {
                    stored += 1;
                }
            }
            Ok(stored)
        })
        .await
    }

    async fn export_flows(
        &self,
        after: Option<Uuid>,
        limit: usize,
    ) -> StoreResult<Vec<FlowRecord>> {
        self.read(move |conn, _| export_flows(conn, after, limit))
            .await
    }

    async fn import_flows(&self, records: Vec<FlowRecord>) -> StoreResult<u64> {
        self.write(move |ctx| {
            let mut stored = 0;
            for flow in &records {
                if import_flow(ctx.conn, flow)? {
                    stored += 1;
                }
            }
            Ok(stored)
        })
        .await
    }

    async fn export_jobs(&self, after: Option<Uuid>, limit: usize) -> StoreResult<Vec<Job>> {
        self.read(move |conn, _| {
            conn.prepare_cached(&format!(
                "SELECT {} FROM jobs WHERE ?1 IS NULL OR id > ?1 ORDER BY id LIMIT ?2",
                rows::COLUMNS
            ))
            .and_then(|mut stmt| {
                stmt.query_map(
                    params![after.map(|id| id.to_string()), limit_of(limit)],
                    rows::job,
                )?
                .collect()
            })
            .map_err(backend)
        })
        .await
    }

    async fn import_jobs(&self, records: Vec<Job>) -> StoreResult<u64> {
        JobStore::jobs_import(self, records).await
    }

    async fn export_audit(&self, after: Option<i64>, limit: usize) -> StoreResult<Vec<AuditEntry>> {
        self.read(move |conn, _| export_audit(conn, after, limit))
            .await
    }

    async fn import_audit(&self, records: Vec<AuditEntry>) -> StoreResult<u64> {
        self.write(move |ctx| {
            let mut stored = 0;
            for entry in &records {
                let job_ids = text_of(&entry.job_ids, "audit job ids")?;
                if inserted(
                    ctx.conn
                        .prepare_cached(
                            "INSERT OR IGNORE INTO audit_log (id, at, actor, actor_token_id, \
                             action, target, job_ids, job_count, detail) \
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                        )
                        .and_then(|mut stmt| {
                            stmt.execute(params![
                                entry.id,
                                to_millis(entry.at),
                                entry.actor,
                                entry.actor_token_id.map(|id| id.to_string()),
                                entry.action.as_str(),
                                entry.target,
                                job_ids,
                                count(entry.job_count),
                                entry.detail,
                            ])
                        }),
                )? {
                    stored += 1;
                }
            }
            Ok(stored)
        })
        .await
    }

    async fn export_rollups(
        &self,
        after: Option<RollupKey>,
        limit: usize,
    ) -> StoreResult<Vec<Rollup>> {
        self.read(move |conn, _| export_rollups(conn, after, limit))
            .await
    }

    async fn import_rollups(&self, records: Vec<Rollup>) -> StoreResult<u64> {
        self.write(move |ctx| {
            let mut stored = 0;
            for rollup in &records {
                if import_rollup(ctx.conn, rollup)? {
                    stored += 1;
                }
            }
            Ok(stored)
        })
        .await
    }
}
