//! The worker registry and the stuck-job query (see `conveyor_core::workers` and
//! `conveyor_core::stuck`). Every statement is built once per store for its schema, as in
//! `sql.rs`; every value is a bind parameter.

use conveyor_core::stuck::{self, KindDurations, RunningJob, StuckJob, StuckParams};
use conveyor_core::workers::{heartbeat_merge_sql, SqlDialect};
use conveyor_core::{
    ErrorRecord, RescueReport, StaleReport, StaleWorkerParams, StoreResult, WorkerHeartbeat,
    WorkerInfo, WorkerState,
};
use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row, SqlStr};
use std::str::FromStr;
use uuid::Uuid;

use crate::ctx::Ctx;
use crate::errors::{corrupt, db};
use crate::names::quoted;
use crate::ops::rescue_row;
use crate::rows::limit;
use crate::sql::stmt;

/// What a heartbeat writes; the registry rows also carry `command`, which only
/// [`command`] changes.
const HEARTBEAT_COLUMNS: &str = "id, host, pid, queues, concurrency, busy, version, started_at, \
    last_seen_at, state, ended_at";
const WORKER_COLUMNS: &str = "id, host, pid, queues, concurrency, busy, version, started_at, \
    last_seen_at, state, ended_at, command";

pub(crate) struct WorkerSql {
    heartbeat: SqlStr,
    command: SqlStr,
    list: SqlStr,
    mark_dead: SqlStr,
    held_by: SqlStr,
    forget: SqlStr,
    running_since: SqlStr,
    kind_durations: SqlStr,
}

impl WorkerSql {
    /// Statements for `schema`, which must already be validated.
    pub(crate) fn new(schema: &str) -> Self {
        let workers = format!("{}.workers", quoted(schema));
        let jobs = format!("{}.jobs", quoted(schema));
        // The merge is core's rule (`HEARTBEAT_MERGE`), spelled in PostgreSQL's dialect.
        let merge = heartbeat_merge_sql(
            "w",
            SqlDialect {
                empty_list: "cardinality({}) = 0",
                least: "LEAST",
            },
        );
        Self {
            heartbeat: stmt(format!(
                "INSERT INTO {workers} AS w ({HEARTBEAT_COLUMNS}) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) \
                 ON CONFLICT (id) DO UPDATE SET {merge} \
                 RETURNING {WORKER_COLUMNS}"
            )),
            command: stmt(format!(
                "UPDATE {workers} SET command = $2 WHERE id = $1 RETURNING {WORKER_COLUMNS}"
            )),
            list: stmt(format!(
                "SELECT {WORKER_COLUMNS} FROM {workers} ORDER BY state <> 'alive', id"
            )),
            mark_dead: stmt(format!(
                "UPDATE {workers} SET state = 'dead', ended_at = $1 \
                 WHERE state = 'alive' AND last_seen_at <= $2 RETURNING id"
            )),
            // Locked rows are skipped: a job being settled right now (perhaps inside a
            // handler's own transaction) is left to the ordinary rescue when its lease expires,
            // rather than making maintenance wait on an application's transaction.
            held_by: stmt(format!(
                "SELECT id, attempt, max_attempts, lease_worker, lease_token, flow_id, expires_at, \
                     started_at \
                 FROM {jobs} WHERE state = 'running' AND lease_worker = ANY($1) \
                 FOR UPDATE SKIP LOCKED"
            )),
            forget: stmt(format!(
                "DELETE FROM {workers} WHERE state <> 'alive' AND ended_at <= $1"
            )),
            // Jobs younger than the shortest possible threshold cannot be stuck; `jobs_lease`
            // holds only running jobs.
            running_since: stmt(format!(
                "SELECT id, kind, queue, attempt, started_at, timeout_ms, lease_worker \
                 FROM {jobs} WHERE state = 'running' AND started_at <= $1 \
                 ORDER BY started_at LIMIT $2"
            )),
            // The p95 (nearest rank, `ceil(95 n / 100)`, as `stuck::p95_rank`) of each kind's
            // durations among jobs completed within the window, read from the `$1` most
            // recently created jobs: a backward scan of the primary key (UUIDv7 ids are
            // time-ordered), so the cost is bounded whatever the size of the table.
            kind_durations: stmt(format!(
                "WITH recent AS ( \
                     SELECT kind, \
                         (EXTRACT(EPOCH FROM (finished_at - started_at)) * 1000)::bigint AS d \
                     FROM (SELECT kind, state, started_at, finished_at FROM {jobs} \
                           ORDER BY id DESC LIMIT $1) AS newest \
                     WHERE state = 'completed' AND finished_at >= $2 \
                       AND started_at IS NOT NULL AND kind = ANY($3)), \
                 ranked AS ( \
                     SELECT kind, d, \
                         row_number() OVER (PARTITION BY kind ORDER BY d) AS rank, \
                         count(*) OVER (PARTITION BY kind) AS n \
                     FROM recent) \
                 SELECT kind, n, d FROM ranked WHERE rank = (95 * n + 99) / 100"
            )),
        }
    }
}

use conveyor_core::clock::before;

fn column<'r, T>(row: &'r PgRow, name: &str) -> StoreResult<T>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get(name)
        .map_err(|e| corrupt(format!("column {name}: {e}")))
}

fn slots(row: &PgRow, name: &str) -> StoreResult<u32> {
    let value: i32 = column(row, name)?;
    Ok(value.max(0) as u32)
}

fn worker(row: &PgRow) -> StoreResult<WorkerInfo> {
    let state: String = column(row, "state")?;
    Ok(WorkerInfo {
        id: column(row, "id")?,
        host: column(row, "host")?,
        pid: column::<Option<i64>>(row, "pid")?.and_then(|pid| u32::try_from(pid).ok()),
        queues: column(row, "queues")?,
        concurrency: slots(row, "concurrency")?,
        busy: slots(row, "busy")?,
        version: column(row, "version")?,
        started_at: column(row, "started_at")?,
        last_seen_at: column(row, "last_seen_at")?,
        state: WorkerState::from_str(&state).map_err(corrupt)?,
        ended_at: column(row, "ended_at")?,
        command: column::<Option<String>>(row, "command")?
            .as_deref()
            .and_then(conveyor_core::WorkerCommand::parse),
    })
}

fn as_i32(n: u32) -> i32 {
    i32::try_from(n).unwrap_or(i32::MAX)
}

pub(crate) async fn heartbeat(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    sql: &WorkerSql,
    beat: &WorkerHeartbeat,
) -> StoreResult<WorkerInfo> {
    let (state, ended_at) = if beat.stopping {
        (WorkerState::Stopped, Some(ctx.now))
    } else {
        (WorkerState::Alive, None)
    };
    let row = sqlx::query(sql.heartbeat.clone())
        .bind(&beat.id)
        .bind(&beat.host)
        .bind(beat.pid.map(i64::from))
        .bind(&beat.queues)
        .bind(as_i32(beat.concurrency))
        .bind(as_i32(beat.busy))
        .bind(&beat.version)
        .bind(conveyor_core::clock::truncate_to_millis(beat.started_at))
        .bind(ctx.now)
        .bind(state.as_str())
        .bind(ended_at)
        .fetch_one(conn)
        .await
        .map_err(db("record worker heartbeat"))?;
    worker(&row)
}

/// Sets (or clears) the command of worker `id`; `None` when it is not registered.
pub(crate) async fn command(
    conn: &mut PgConnection,
    sql: &WorkerSql,
    id: &str,
    command: Option<conveyor_core::WorkerCommand>,
) -> StoreResult<Option<WorkerInfo>> {
    let row = sqlx::query(sql.command.clone())
        .bind(id)
        .bind(command.map(|c| c.as_str()))
        .fetch_optional(conn)
        .await
        .map_err(db("record a worker command"))?;
    row.as_ref().map(worker).transpose()
}

pub(crate) async fn list(conn: &mut PgConnection, sql: &WorkerSql) -> StoreResult<Vec<WorkerInfo>> {
    let rows = sqlx::query(sql.list.clone())
        .fetch_all(conn)
        .await
        .map_err(db("list workers"))?;
    rows.iter().map(worker).collect()
}

/// Marks stale workers dead and rescues their jobs. Must run inside a transaction: the dead
/// marks and the rescues commit together.
pub(crate) async fn mark_stale(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    sql: &WorkerSql,
    params: &StaleWorkerParams,
) -> StoreResult<StaleReport> {
    let mut workers: Vec<String> = sqlx::query_scalar(sql.mark_dead.clone())
        .bind(ctx.now)
        .bind(before(ctx.now, params.older_than))
        .fetch_all(&mut *conn)
        .await
        .map_err(db("mark stale workers"))?;
    workers.sort();
    let mut rescued = RescueReport::default();
    if !workers.is_empty() {
        let held = sqlx::query(sql.held_by.clone())
            .bind(&workers)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("find jobs of dead workers"))?;
        for row in &held {
            let job = rescue_row(&mut *conn, ctx, row, &params.retry, |attempt, worker| {
                ErrorRecord::worker_lost(attempt, ctx.now, worker.unwrap_or_default())
            })
            .await?;
            if let Some(job) = job {
                rescued.add(&job);
            }
        }
    }
    sqlx::query(sql.forget.clone())
        .bind(before(ctx.now, params.forget_after))
        .execute(conn)
        .await
        .map_err(db("forget ended workers"))?;
    Ok(StaleReport { workers, rescued })
}

pub(crate) async fn stuck(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    sql: &WorkerSql,
    params: &StuckParams,
) -> StoreResult<Vec<StuckJob>> {
    let rows = sqlx::query(sql.running_since.clone())
        .bind(before(ctx.now, params.shortest_threshold()))
        .bind(limit(params.limit))
        .fetch_all(&mut *conn)
        .await
        .map_err(db("find long-running jobs"))?;
    let running = rows
        .iter()
        .map(|row| {
            Ok(RunningJob {
                id: column::<Uuid>(row, "id")?,
                kind: column(row, "kind")?,
                queue: column(row, "queue")?,
                attempt: column::<i32>(row, "attempt")?.max(0) as u32,
                started_at: column(row, "started_at")?,
                timeout_ms: column::<Option<i64>>(row, "timeout_ms")?.map(|ms| ms.max(0) as u64),
                worker_id: column(row, "lease_worker")?,
            })
        })
        .collect::<StoreResult<Vec<RunningJob>>>()?;
    if running.is_empty() {
        return Ok(Vec::new());
    }
    let mut kinds: Vec<String> = running.iter().map(|job| job.kind.clone()).collect();
    kinds.sort();
    kinds.dedup();
    let rows = sqlx::query(sql.kind_durations.clone())
        .bind(limit(params.scan_limit))
        .bind(before(ctx.now, params.window))
        .bind(&kinds)
        .fetch_all(conn)
        .await
        .map_err(db("read recent durations"))?;
    let history = rows
        .iter()
        .map(|row| {
            Ok(KindDurations {
                kind: column(row, "kind")?,
                samples: column::<i64>(row, "n")?.max(0) as u64,
                p95_ms: column::<i64>(row, "d")?.max(0) as u64,
            })
        })
        .collect::<StoreResult<Vec<KindDurations>>>()?;
    Ok(stuck::classify(running, &history, params, ctx.now))
}
