//! Read-only queries, run on pooled connections.

use chrono::{DateTime, Utc};
use conveyor_core::clock::from_millis;
use conveyor_core::{Job, JobListParams, JobState, QueueStats, StoreResult};
use rusqlite::types::Value as SqlValue;
use rusqlite::{params, params_from_iter, Connection, OptionalExtension};
use std::collections::BTreeMap;
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::backend;
use crate::rows::{self, millis, COLUMNS};

pub(crate) fn job_get(conn: &Connection, id: Uuid) -> StoreResult<Option<Job>> {
    conn.prepare_cached(&format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"))
        .and_then(|mut stmt| {
            stmt.query_row(params![id.to_string()], rows::job)
                .optional()
        })
        .map_err(backend)
}

pub(crate) fn jobs_list(conn: &Connection, params: &JobListParams) -> StoreResult<Vec<Job>> {
    let mut sql = format!("SELECT {COLUMNS} FROM jobs WHERE 1 = 1");
    let mut args: Vec<SqlValue> = Vec::new();
    if let Some(queue) = &params.queue {
        args.push(SqlValue::Text(queue.clone()));
        sql.push_str(&format!(" AND queue = ?{}", args.len()));
    }
    if let Some(state) = params.state {
        args.push(SqlValue::Text(state.as_str().to_string()));
        sql.push_str(&format!(" AND state = ?{}", args.len()));
    }
    if let Some(kind) = &params.kind {
        args.push(SqlValue::Text(kind.clone()));
        sql.push_str(&format!(" AND kind = ?{}", args.len()));
    }
    if let Some(after) = params.after {
        args.push(SqlValue::Text(after.to_string()));
        sql.push_str(&format!(" AND id < ?{}", args.len()));
    }
    if let Some(prefix) = &params.id_prefix {
        // Ids are stored as lowercase text: a range on the primary key, not a scan.
        args.push(SqlValue::Text(prefix.clone()));
        sql.push_str(&format!(" AND id >= ?{}", args.len()));
        args.push(SqlValue::Text(format!("{prefix}\u{10FFFF}")));
        sql.push_str(&format!(" AND id < ?{}", args.len()));
    }
    if let Some(tag) = &params.tag {
        args.push(SqlValue::Text(tag.clone()));
        sql.push_str(&format!(
            " AND EXISTS (SELECT 1 FROM json_each(jobs.tags) WHERE value = ?{})",
            args.len()
        ));
    }
    if let Some(tenant) = &params.tenant {
        args.push(SqlValue::Text(tenant.clone()));
        sql.push_str(&format!(" AND tenant = ?{}", args.len()));
    }
    if let Some(sequence) = &params.sequence {
        args.push(SqlValue::Text(sequence.clone()));
        sql.push_str(&format!(" AND sequence_key = ?{}", args.len()));
    }
    if let Some(at) = params.created_after {
        args.push(SqlValue::Integer(millis(at)));
        sql.push_str(&format!(" AND created_at >= ?{}", args.len()));
    }
    if let Some(at) = params.created_before {
        args.push(SqlValue::Integer(millis(at)));
        sql.push_str(&format!(" AND created_at < ?{}", args.len()));
    }
    for (keys, value) in params.payload_leaves() {
        // Both sides through json_extract, so a JSON string, number, boolean, null or array
        // compares as the same SQL value it is stored as.
        // Each key quoted. SQLite reads escapes in a quoted path label (a label holding a
        // backslash is decoded as JSON text), so a backslash is doubled before a quote is
        // escaped: the key `a\b` is the label `"a\\b"`, not `a` + backspace.
        let path = keys.iter().fold("$".to_string(), |path, key| {
            format!(
                "{path}.\"{}\"",
                key.replace('\\', "\\\\").replace('"', "\\\"")
            )
        });
        args.push(SqlValue::Text(path));
        let path_arg = args.len();
        args.push(SqlValue::Text(value.to_string()));
        sql.push_str(&format!(
            " AND json_type(payload, ?{path_arg}) IS NOT NULL \
             AND json_extract(payload, ?{path_arg}) IS json_extract(?{}, '$')",
            args.len()
        ));
    }
    args.push(SqlValue::Integer(params.limit as i64));
    sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", args.len()));
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    let jobs = stmt
        .query_map(params_from_iter(args), rows::job)
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(backend)?;
    Ok(jobs)
}

pub(crate) fn queues_stats(conn: &Connection, now: DateTime<Utc>) -> StoreResult<Vec<QueueStats>> {
    let mut by_queue: BTreeMap<String, QueueStats> = BTreeMap::new();
    let mut stmt = conn
        .prepare_cached("SELECT queue, state, n FROM queue_state_counts WHERE n > 0")
        .map_err(backend)?;
    let counts = stmt
        .query_map([], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?,
                row.get::<_, i64>(2)?,
            ))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(backend)?;
    for (queue, state, count) in counts {
        let stats = by_queue.entry(queue.clone()).or_insert_with(|| QueueStats {
            name: queue,
            ..QueueStats::default()
        });
        if let Ok(state) = JobState::from_str(&state) {
            stats.add(state, count.max(0) as u64);
        }
    }
    let mut stmt = conn
        .prepare_cached(
            "SELECT queue, MIN(run_at) FROM jobs WHERE state = 'available' GROUP BY queue",
        )
        .map_err(backend)?;
    let oldest = stmt
        .query_map([], |row| {
            Ok((row.get::<_, String>(0)?, row.get::<_, i64>(1)?))
        })
        .and_then(|rows| rows.collect::<Result<Vec<_>, _>>())
        .map_err(backend)?;
    for (queue, run_at) in oldest {
        if let Some(stats) = by_queue.get_mut(&queue) {
            stats.oldest_available_age_ms = (millis(now) - run_at).max(0) as u64;
        }
    }
    for named in rows::queue_settings(conn)? {
        if named.settings.paused {
            by_queue
                .entry(named.name.clone())
                .or_insert_with(|| QueueStats {
                    name: named.name,
                    ..QueueStats::default()
                })
                .paused = true;
        }
    }
    Ok(by_queue.into_values().collect())
}

/// The first `limit` available jobs of `kind` in `queue` in claim order (a range of the
/// claim index `jobs_fetch`, other kinds skipped).
pub(crate) fn available_of_kind(
    conn: &Connection,
    queue: &str,
    kind: &str,
    limit: usize,
) -> StoreResult<Vec<Job>> {
    conn.prepare_cached(&format!(
        "SELECT {COLUMNS} FROM jobs WHERE state = 'available' AND queue = ?1 AND kind = ?2 \
         ORDER BY priority DESC, run_at, id LIMIT ?3"
    ))
    .and_then(|mut stmt| {
        stmt.query_map(params![queue, kind, limit as i64], rows::job)?
            .collect::<Result<Vec<Job>, _>>()
    })
    .map_err(backend)
}

pub(crate) fn next_due(conn: &Connection, queues: &[String]) -> StoreResult<Option<DateTime<Utc>>> {
    if queues.is_empty() {
        return Ok(None);
    }
    let placeholders = (1..=queues.len())
        .map(|i| format!("?{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "SELECT run_at FROM jobs WHERE state IN ('scheduled', 'retryable') \
         AND queue IN ({placeholders}) ORDER BY run_at LIMIT 1"
    );
    let mut stmt = conn.prepare_cached(&sql).map_err(backend)?;
    let run_at: Option<i64> = stmt
        .query_row(params_from_iter(queues.iter()), |row| row.get(0))
        .optional()
        .map_err(backend)?;
    Ok(run_at.map(from_millis))
}
