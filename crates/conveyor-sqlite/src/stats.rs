//! History rollups (`conveyor_core::stats`): one row per minute, queue and kind. The counts are
//! added in Rust by `RollupCounts::merge` so both stores share one rule; here they are only
//! read, merged and written back inside the writer's transaction.

use chrono::{DateTime, Utc};
use conveyor_core::clock::{from_millis, to_millis};
use conveyor_core::stats::{Histogram, Rollup, RollupCounts, StatsQuery};
use conveyor_core::{StoreError, StoreResult};
use rusqlite::{Connection, OptionalExtension};

use crate::errors::backend;

pub(crate) const COLUMNS: &str =
    "minute, queue, kind, enqueued, started, completed, failed, retried, dead, \
                       run_time, queue_wait";

fn histogram_text(histogram: &Histogram) -> StoreResult<String> {
    serde_json::to_string(histogram)
        .map_err(|e| StoreError::backend(format!("cannot serialize a histogram: {e}")))
}

fn histogram_of(text: &str) -> rusqlite::Result<Histogram> {
    serde_json::from_str(text).map_err(|e| {
        rusqlite::Error::FromSqlConversionFailure(0, rusqlite::types::Type::Text, Box::new(e))
    })
}

fn count(row: &rusqlite::Row<'_>, index: usize) -> rusqlite::Result<u64> {
    Ok(row.get::<_, i64>(index)?.max(0) as u64)
}

pub(crate) fn rollup_of(row: &rusqlite::Row<'_>) -> rusqlite::Result<Rollup> {
    Ok(Rollup {
        minute: from_millis(row.get(0)?),
        queue: row.get(1)?,
        kind: row.get(2)?,
        counts: RollupCounts {
            enqueued: count(row, 3)?,
            started: count(row, 4)?,
            completed: count(row, 5)?,
            failed: count(row, 6)?,
            retried: count(row, 7)?,
            dead: count(row, 8)?,
            run_time: histogram_of(&row.get::<_, String>(9)?)?,
            queue_wait: histogram_of(&row.get::<_, String>(10)?)?,
        },
    })
}

fn stored(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Adds each rollup to its stored row (inside the caller's write transaction).
pub(crate) fn merge(conn: &Connection, rollups: Vec<Rollup>) -> StoreResult<()> {
    for rollup in rollups {
        let minute = to_millis(conveyor_core::stats::minute_of(rollup.minute));
        let existing = conn
            .prepare_cached(&format!(
                "SELECT {COLUMNS} FROM stats_minutes WHERE minute = ?1 AND queue = ?2 AND kind = ?3"
            ))
            .and_then(|mut stmt| {
                stmt.query_row(
                    rusqlite::params![minute, rollup.queue, rollup.kind],
                    rollup_of,
                )
                .optional()
            })
            .map_err(backend)?;
        let mut counts = existing.map(|row| row.counts).unwrap_or_default();
        counts.merge(&rollup.counts);
        let (run_time, queue_wait) = (
            histogram_text(&counts.run_time)?,
            histogram_text(&counts.queue_wait)?,
        );
        conn.prepare_cached(&format!(
            "INSERT OR REPLACE INTO stats_minutes ({COLUMNS}) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)"
        ))
        .and_then(|mut stmt| {
            stmt.execute(rusqlite::params![
                minute,
                rollup.queue,
                rollup.kind,
                stored(counts.enqueued),
                stored(counts.started),
                stored(counts.completed),
                stored(counts.failed),
                stored(counts.retried),
                stored(counts.dead),
                run_time,
                queue_wait,
            ])
        })
        .map_err(backend)?;
    }
    Ok(())
}

pub(crate) fn read(conn: &Connection, query: &StatsQuery) -> StoreResult<Vec<Rollup>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM stats_minutes \
         WHERE minute >= ?1 AND minute < ?2 AND (?3 IS NULL OR queue = ?3) \
           AND (?4 IS NULL OR kind = ?4) \
         ORDER BY minute, queue, kind"
    ))
    .and_then(|mut stmt| {
        stmt.query_map(
            rusqlite::params![
                to_millis(query.from),
                to_millis(query.to),
                query.queue,
                query.kind
            ],
            rollup_of,
        )?
        .collect()
    })
    .map_err(backend)
}

pub(crate) fn prune(conn: &Connection, before: DateTime<Utc>) -> StoreResult<u64> {
    conn.prepare_cached("DELETE FROM stats_minutes WHERE minute < ?1")
        .and_then(|mut stmt| stmt.execute([to_millis(before)]))
        .map(|n| n as u64)
        .map_err(backend)
}
