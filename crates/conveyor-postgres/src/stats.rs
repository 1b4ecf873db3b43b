//! History rollups (`conveyor_core::stats`): one row per minute, queue and kind. Counts are
//! added by `RollupCounts::merge` in Rust (one rule for both stores): each row is created if
//! missing, locked, merged and written back, in key order so two servers flushing at once
//! cannot deadlock.

use chrono::{DateTime, Utc};
use conveyor_core::stats::{minute_of, Histogram, Rollup, RollupCounts, StatsQuery};
use conveyor_core::StoreResult;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{PgConnection, Row, SqlStr};

use crate::errors::{corrupt, db};
use crate::names::quoted;
use crate::sql::stmt;

pub(crate) const COLUMNS: &str =
    "minute, queue, kind, enqueued, started, completed, failed, retried, dead, \
                       run_time, queue_wait";

/// The statements of the rollups for one schema.
pub(crate) struct StatsSql {
    ensure: SqlStr,
    lock: SqlStr,
    update: SqlStr,
    read: SqlStr,
    prune: SqlStr,
}

impl StatsSql {
    pub(crate) fn new(schema: &str) -> Self {
        let table = format!("{}.stats_minutes", quoted(schema));
        Self {
            ensure: stmt(format!(
                "INSERT INTO {table} (minute, queue, kind) VALUES ($1, $2, $3) \
                 ON CONFLICT DO NOTHING"
            )),
            lock: stmt(format!(
                "SELECT {COLUMNS} FROM {table} WHERE minute = $1 AND queue = $2 AND kind = $3 \
                 FOR UPDATE"
            )),
            update: stmt(format!(
                "UPDATE {table} SET enqueued = $4, started = $5, completed = $6, failed = $7, \
                 retried = $8, dead = $9, run_time = $10, queue_wait = $11 \
                 WHERE minute = $1 AND queue = $2 AND kind = $3"
            )),
            read: stmt(format!(
                "SELECT {COLUMNS} FROM {table} \
                 WHERE minute >= $1 AND minute < $2 AND ($3::text IS NULL OR queue = $3) \
                   AND ($4::text IS NULL OR kind = $4) \
                 ORDER BY minute, queue, kind"
            )),
            prune: stmt(format!("DELETE FROM {table} WHERE minute < $1")),
        }
    }
}

fn count(row: &PgRow, column: &str) -> StoreResult<u64> {
    Ok(row.try_get::<i64, _>(column).map_err(corrupt)?.max(0) as u64)
}

pub(crate) fn rollup_of(row: &PgRow) -> StoreResult<Rollup> {
    let histogram = |column: &str| -> StoreResult<Histogram> {
        let Json(histogram) = row.try_get::<Json<Histogram>, _>(column).map_err(corrupt)?;
        Ok(histogram)
    };
    Ok(Rollup {
        minute: row.try_get("minute").map_err(corrupt)?,
        queue: row.try_get("queue").map_err(corrupt)?,
        kind: row.try_get("kind").map_err(corrupt)?,
        counts: RollupCounts {
            enqueued: count(row, "enqueued")?,
            started: count(row, "started")?,
            completed: count(row, "completed")?,
            failed: count(row, "failed")?,
            retried: count(row, "retried")?,
            dead: count(row, "dead")?,
            run_time: histogram("run_time")?,
            queue_wait: histogram("queue_wait")?,
        },
    })
}

fn stored(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Adds `rollups` to their rows, inside the caller's transaction.
pub(crate) async fn merge(
    conn: &mut PgConnection,
    sql: &StatsSql,
    mut rollups: Vec<Rollup>,
) -> StoreResult<()> {
    for rollup in &mut rollups {
        rollup.minute = minute_of(rollup.minute);
    }
    rollups.sort_by(|a, b| (a.minute, &a.queue, &a.kind).cmp(&(b.minute, &b.queue, &b.kind)));
    for rollup in rollups {
        let key = (rollup.minute, &rollup.queue, &rollup.kind);
        sqlx::query(sql.ensure.clone())
            .bind(key.0)
            .bind(key.1)
            .bind(key.2)
            .execute(&mut *conn)
            .await
            .map_err(db("create a stats row"))?;
        let row = sqlx::query(sql.lock.clone())
            .bind(key.0)
            .bind(key.1)
            .bind(key.2)
            .fetch_one(&mut *conn)
            .await
            .map_err(db("lock a stats row"))?;
        let mut counts = rollup_of(&row)?.counts;
        counts.merge(&rollup.counts);
        sqlx::query(sql.update.clone())
            .bind(key.0)
            .bind(key.1)
            .bind(key.2)
            .bind(stored(counts.enqueued))
            .bind(stored(counts.started))
            .bind(stored(counts.completed))
            .bind(stored(counts.failed))
            .bind(stored(counts.retried))
            .bind(stored(counts.dead))
            .bind(Json(&counts.run_time))
            .bind(Json(&counts.queue_wait))
            .execute(&mut *conn)
            .await
            .map_err(db("update a stats row"))?;
    }
    Ok(())
}

pub(crate) async fn read(
    conn: &mut PgConnection,
    sql: &StatsSql,
    query: &StatsQuery,
) -> StoreResult<Vec<Rollup>> {
    let rows = sqlx::query(sql.read.clone())
        .bind(query.from)
        .bind(query.to)
        .bind(query.queue.as_deref())
        .bind(query.kind.as_deref())
        .fetch_all(conn)
        .await
        .map_err(db("read stats"))?;
    rows.iter().map(rollup_of).collect()
}

pub(crate) async fn prune(
    conn: &mut PgConnection,
    sql: &StatsSql,
    before: DateTime<Utc>,
) -> StoreResult<u64> {
    let done = sqlx::query(sql.prune.clone())
        .bind(before)
        .execute(conn)
        .await
        .map_err(db("prune stats"))?;
    Ok(done.rows_affected())
}
