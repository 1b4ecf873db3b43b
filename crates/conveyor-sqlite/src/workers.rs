//! The worker registry and the stuck-job query (see `conveyor_core::workers` and
//! `conveyor_core::stuck`). Registry writes run on the writer thread like every other change.

use chrono::{DateTime, Utc};
use conveyor_core::clock::from_millis;
use conveyor_core::stuck::{self, KindDurations, RunningJob, StuckJob, StuckParams};
use conveyor_core::workers::{heartbeat_merge_sql, SqlDialect};
use conveyor_core::{
    ErrorRecord, RescueReport, StaleReport, StaleWorkerParams, StoreError, StoreResult,
    WorkerHeartbeat, WorkerInfo, WorkerState,
};
use rusqlite::types::Type;
use rusqlite::{params, params_from_iter, Connection, Row};
use std::str::FromStr;

use crate::errors::backend;
use crate::ops::record_failure;
use crate::rows::millis;
use crate::writer::WriteCtx;

/// What a heartbeat writes; the registry rows also carry `command`, which only
/// [`command`] changes.
const HEARTBEAT_COLUMNS: &str = "id, host, pid, queues, concurrency, busy, version, started_at, \
    last_seen_at, state, ended_at";
const WORKER_COLUMNS: &str = "id, host, pid, queues, concurrency, busy, version, started_at, \
    last_seen_at, state, ended_at, command";

/// `now - d` in stored milliseconds, or the epoch when that leaves the calendar.
fn before(now: DateTime<Utc>, d: std::time::Duration) -> i64 {
    millis(conveyor_core::clock::before(now, d))
}

fn conversion(
    column: usize,
    error: impl std::error::Error + Send + Sync + 'static,
) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(column, Type::Text, Box::new(error))
}

fn worker(row: &Row<'_>) -> rusqlite::Result<WorkerInfo> {
    let queues: String = row.get(3)?;
    let state: String = row.get(9)?;
    let count = |index: usize| -> rusqlite::Result<u32> {
        Ok(row.get::<_, i64>(index)?.clamp(0, i64::from(u32::MAX)) as u32)
    };
    Ok(WorkerInfo {
        id: row.get(0)?,
        host: row.get(1)?,
        pid: row
            .get::<_, Option<i64>>(2)?
            .and_then(|pid| u32::try_from(pid).ok()),
        queues: serde_json::from_str(&queues).map_err(|e| conversion(3, e))?,
        concurrency: count(4)?,
        busy: count(5)?,
        version: row.get(6)?,
        started_at: from_millis(row.get(7)?),
        last_seen_at: from_millis(row.get(8)?),
        state: WorkerState::from_str(&state).map_err(|e| conversion(9, e))?,
        ended_at: row.get::<_, Option<i64>>(10)?.map(from_millis),
        command: row
            .get::<_, Option<String>>(11)?
            .as_deref()
            .and_then(conveyor_core::WorkerCommand::parse),
    })
}

pub(crate) fn heartbeat(ctx: &mut WriteCtx<'_>, beat: WorkerHeartbeat) -> StoreResult<WorkerInfo> {
    let (state, ended_at) = if beat.stopping {
        (WorkerState::Stopped, Some(millis(ctx.now)))
    } else {
        (WorkerState::Alive, None)
    };
    let queues = serde_json::to_string(&beat.queues)
        .map_err(|e| StoreError::backend(format!("cannot serialize queues: {e}")))?;
    // The merge is core's rule (`HEARTBEAT_MERGE`), spelled in SQLite's dialect.
    let merge = heartbeat_merge_sql(
        "workers",
        SqlDialect {
            empty_list: "{} = '[]'",
            least: "MIN",
        },
    );
    ctx.conn
        .prepare_cached(&format!(
            "INSERT INTO workers ({HEARTBEAT_COLUMNS}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11) \
             ON CONFLICT (id) DO UPDATE SET {merge} \
             RETURNING {WORKER_COLUMNS}"
        ))
        .and_then(|mut stmt| {
            stmt.query_row(
                params![
                    beat.id,
                    beat.host,
                    beat.pid,
                    queues,
                    beat.concurrency,
                    beat.busy,
                    beat.version,
                    millis(beat.started_at),
                    millis(ctx.now),
                    state.as_str(),
                    ended_at,
                ],
                worker,
            )
        })
        .map_err(backend)
}

/// Sets (or clears) the command of worker `id`; `None` when it is not registered.
pub(crate) fn command(
    ctx: &mut WriteCtx<'_>,
    id: &str,
    command: Option<conveyor_core::WorkerCommand>,
) -> StoreResult<Option<WorkerInfo>> {
    use rusqlite::OptionalExtension;
    ctx.conn
        .prepare_cached(&format!(
            "UPDATE workers SET command = ?2 WHERE id = ?1 RETURNING {WORKER_COLUMNS}"
        ))
        .and_then(|mut stmt| {
            stmt.query_row(params![id, command.map(|c| c.as_str())], worker)
                .optional()
        })
        .map_err(backend)
}

pub(crate) fn list(conn: &Connection) -> StoreResult<Vec<WorkerInfo>> {
    conn.prepare_cached(&format!(
        "SELECT {WORKER_COLUMNS} FROM workers ORDER BY state <> 'alive', id"
    ))
    .and_then(|mut stmt| stmt.query_map([], worker)?.collect())
    .map_err(backend)
}

pub(crate) fn mark_stale(
    ctx: &mut WriteCtx<'_>,
    params: &StaleWorkerParams,
) -> StoreResult<StaleReport> {
    let now = millis(ctx.now);
    let mut workers: Vec<String> = ctx
        .conn
        .prepare_cached(
            "UPDATE workers SET state = 'dead', ended_at = ?1 \
             WHERE state = 'alive' AND last_seen_at <= ?2 RETURNING id",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![now, before(ctx.now, params.older_than)], |row| {
                row.get(0)
            })?
            .collect()
        })
        .map_err(backend)?;
    workers.sort();
    let mut rescued = RescueReport::default();
    for id in &workers {
        // `state = 'running'` lets SQLite read the `jobs_lease` partial index (running jobs
        // only, bounded by the workers' slots) rather than the table; no ORDER BY, which would
        // make it prefer the primary key's order and scan the table.
        let held: Vec<(String, u32, u32, Option<i64>)> = ctx
            .conn
            .prepare_cached(
                "SELECT id, attempt, max_attempts, started_at FROM jobs \
                 WHERE state = 'running' AND lease_worker = ?1",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![id], |row| {
                    Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
                })?
                .collect()
            })
            .map_err(backend)?;
        for (job_id, attempt, max_attempts, started_at) in held {
            let mut error = ErrorRecord::worker_lost(attempt, ctx.now, id);
            error.started_at = started_at.map(conveyor_core::clock::from_millis);
            let retry_at = Some(params.retry.next_run_at(ctx.now, attempt));
            let job = record_failure(ctx, &job_id, attempt, max_attempts, error, retry_at)?;
            rescued.add(&job);
        }
    }
    ctx.conn
        .prepare_cached("DELETE FROM workers WHERE state <> 'alive' AND ended_at <= ?1")
        .and_then(|mut stmt| stmt.execute(params![before(ctx.now, params.forget_after)]))
        .map_err(backend)?;
    Ok(StaleReport { workers, rescued })
}

pub(crate) fn stuck(
    conn: &Connection,
    now: DateTime<Utc>,
    params: &StuckParams,
) -> StoreResult<Vec<StuckJob>> {
    // Jobs younger than the shortest possible threshold cannot be stuck: most running jobs are
    // left out here, by the `jobs_lease` partial index's condition.
    let running: Vec<RunningJob> = conn
        .prepare_cached(
            "SELECT id, kind, queue, attempt, started_at, timeout_ms, lease_worker FROM jobs \
             WHERE state = 'running' AND started_at <= ?1 ORDER BY started_at LIMIT ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_map(
                params![
                    before(now, params.shortest_threshold()),
                    params.limit.min(i64::MAX as usize) as i64
                ],
                |row| {
                    let id: String = row.get(0)?;
                    Ok(RunningJob {
                        id: uuid::Uuid::parse_str(&id).map_err(|e| conversion(0, e))?,
                        kind: row.get(1)?,
                        queue: row.get(2)?,
                        attempt: row.get(3)?,
                        started_at: from_millis(row.get(4)?),
                        timeout_ms: row.get::<_, Option<i64>>(5)?.map(|ms| ms.max(0) as u64),
                        worker_id: row.get(6)?,
                    })
                },
            )?
            .collect()
        })
        .map_err(backend)?;
    if running.is_empty() {
        return Ok(Vec::new());
    }
    let mut kinds: Vec<String> = running.iter().map(|job| job.kind.clone()).collect();
    kinds.sort();
    kinds.dedup();
    let history = kind_durations(conn, now, params, &kinds)?;
    Ok(stuck::classify(running, &history, params, now))
}

/// p95 of the durations of `kinds`' jobs completed within the window, among the
/// `params.scan_limit` most recently created jobs (a backward range of the primary key: UUIDv7
/// ids are time-ordered, so the cost is bounded whatever the size of the table).
fn kind_durations(
    conn: &Connection,
    now: DateTime<Utc>,
    params: &StuckParams,
    kinds: &[String],
) -> StoreResult<Vec<KindDurations>> {
    let placeholders = (0..kinds.len())
        .map(|i| format!("?{}", i + 3))
        .collect::<Vec<_>>()
        .join(", ");
    // The rank of the p95 is `ceil(95 n / 100)`, the integer form of `stuck::p95_rank`.
    let sql = format!(
        "WITH recent AS ( \
             SELECT kind, finished_at - started_at AS d FROM ( \
                 SELECT kind, state, started_at, finished_at FROM jobs \
                 ORDER BY id DESC LIMIT ?1) \
             WHERE state = 'completed' AND finished_at >= ?2 AND started_at IS NOT NULL \
               AND kind IN ({placeholders})), \
         ranked AS ( \
             SELECT kind, d, ROW_NUMBER() OVER (PARTITION BY kind ORDER BY d) AS rank, \
                    COUNT(*) OVER (PARTITION BY kind) AS n FROM recent) \
         SELECT kind, n, d FROM ranked WHERE rank = (95 * n + 99) / 100"
    );
    let mut args: Vec<rusqlite::types::Value> = vec![
        rusqlite::types::Value::Integer(params.scan_limit.min(i64::MAX as usize) as i64),
        rusqlite::types::Value::Integer(before(now, params.window)),
    ];
    args.extend(kinds.iter().cloned().map(rusqlite::types::Value::Text));
    conn.prepare(&sql)
        .and_then(|mut stmt| {
            stmt.query_map(params_from_iter(args), |row| {
                Ok(KindDurations {
                    kind: row.get(0)?,
                    samples: row.get::<_, i64>(1)?.max(0) as u64,
                    p95_ms: row.get::<_, i64>(2)?.max(0) as u64,
                })
            })?
            .collect()
        })
        .map_err(backend)
}
