//! The SQLite store's schema and its upgrades. `schema.sql` creates every table and index with
//! `IF NOT EXISTS`, so applying it brings any older database up to date, except for columns
//! added to tables that already exist, which are added here first.

use conveyor_core::{StoreError, StoreResult};
use rusqlite::Connection;

use crate::errors::backend;

/// The schema version this code writes (`PRAGMA user_version`).
pub(crate) const SCHEMA_VERSION: i64 = 22;
const SCHEMA: &str = include_str!("schema.sql");

/// Adds each of `columns` that `table` lacks; nothing when the table does not exist yet (the
/// schema then creates it whole).
fn add_missing_columns(
    conn: &Connection,
    table: &str,
    columns: &[(&str, &str)],
) -> StoreResult<()> {
    let existing: Vec<String> = conn
        .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
        .and_then(|mut stmt| {
            stmt.query_map([], |row| row.get(0))?
                .collect::<Result<Vec<String>, _>>()
        })
        .map_err(backend)?;
    if existing.is_empty() {
        return Ok(());
    }
    for (column, sql_type) in columns {
        if !existing.iter().any(|name| name == column) {
            conn.execute_batch(&format!(
                "ALTER TABLE {table} ADD COLUMN {column} {sql_type}"
            ))
            .map_err(backend)?;
        }
    }
    Ok(())
}

/// Brings the database at `conn` to [`SCHEMA_VERSION`] (`PRAGMA user_version`): columns older
/// versions lack are added, then the schema (every statement `IF NOT EXISTS`) is applied in one
/// transaction. A database from a newer Conveyor is refused.
pub(crate) fn migrate(conn: &Connection) -> StoreResult<()> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(backend)?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::backend(format!(
            "database schema version {version} is newer than this Conveyor understands \
             ({SCHEMA_VERSION}); upgrade Conveyor"
        )));
    }
    if (1..SCHEMA_VERSION).contains(&version) {
        // Columns added to tables that an older version created: IF NOT EXISTS in the schema
        // cannot add columns, so older databases get them here.
        add_missing_columns(
            conn,
            "queue_settings",
            &[
                ("concurrency_limit", "INTEGER"),
                ("per_key_concurrency_limit", "INTEGER"),
                ("rate_count", "INTEGER"),
                ("rate_period_ms", "INTEGER"),
                ("per_key_rate_count", "INTEGER"),
                ("per_key_rate_period_ms", "INTEGER"),
                ("weight", "INTEGER"),
                ("completed_retention_secs", "INTEGER"),
                ("dead_retention_secs", "INTEGER"),
            ],
        )?;
        // Version 6: unique jobs.
        add_missing_columns(conn, "jobs", &[("unique_key", "TEXT")])?;
        // Version 11: workflows and progress.
        add_missing_columns(
            conn,
            "jobs",
            &[
                ("flow_id", "TEXT"),
                ("flow_step", "TEXT"),
                ("parents", "TEXT"),
                ("progress", "TEXT"),
            ],
        )?;
        // Version 13: expiry and trace context.
        add_missing_columns(
            conn,
            "jobs",
            &[("expires_at", "INTEGER"), ("trace", "TEXT")],
        )?;
        add_missing_columns(conn, "queue_settings", &[("default_ttl_ms", "INTEGER")])?;
        // Version 14: circuit breakers.
        add_missing_columns(conn, "queue_settings", &[("circuit_breaker", "TEXT")])?;
        add_missing_columns(conn, "kinds", &[("circuit_breaker", "TEXT")])?;
        // Version 15: operators' commands to workers (the history's table is new).
        add_missing_columns(conn, "workers", &[("command", "TEXT")])?;
        // Version 18: named limits.
        add_missing_columns(
            conn,
            "jobs",
            &[("limit_keys", "TEXT"), ("fair_key", "TEXT")],
        )?;
        add_missing_columns(conn, "queue_settings", &[("limits", "TEXT")])?;
        add_missing_columns(conn, "kinds", &[("limits", "TEXT")])?;
        // Version 19: sequences, debounce and throttle.
        add_missing_columns(
            conn,
            "jobs",
            &[
                ("sequence_key", "TEXT"),
                ("sequence_no", "INTEGER"),
                ("sequence_skip_dead", "INTEGER NOT NULL DEFAULT 0"),
                ("fold_key", "TEXT"),
                ("fold_until", "INTEGER"),
            ],
        )?;
        add_missing_columns(conn, "queue_settings", &[("sequence", "TEXT")])?;
        add_missing_columns(conn, "kinds", &[("sequence", "TEXT")])?;
        // Version 20: batches.
        add_missing_columns(conn, "kinds", &[("batch", "TEXT")])?;
        // Version 22: turns by key.
        add_missing_columns(conn, "jobs", &[("fair_turn", "INTEGER")])?;
    }
    if version < SCHEMA_VERSION {
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;"
        ))
        .map_err(backend)?;
    }
    // Touch the table so a file that is not a Conveyor database fails here, at start.
    conn.query_row("SELECT COUNT(*) FROM jobs WHERE id = ''", [], |row| {
        row.get::<_, i64>(0)
    })
    .map_err(backend)?;
    Ok(())
}
