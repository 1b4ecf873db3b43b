//! Settings per job kind and the circuit breakers' records (see `conveyor_core::kinds` and
//! `conveyor_core::breaker`).

use conveyor_core::clock::from_millis;
use conveyor_core::kinds::KindSettings;
use conveyor_core::{StoreError, StoreResult, StoredBreaker};
use rusqlite::{params, Connection};

use crate::errors::backend;
use crate::rows;
use crate::writer::WriteCtx;

/// Stores a kind's settings (new or replacing), stamped with the store's now.
pub(crate) fn put(ctx: &WriteCtx<'_>, settings: KindSettings) -> StoreResult<KindSettings> {
    let schema = settings
        .schema
        .as_ref()
        .map(|schema| {
            serde_json::to_string(schema)
                .map_err(|e| StoreError::backend(format!("cannot serialize schema: {e}")))
        })
        .transpose()?;
    let breaker = rows::breaker_settings_text(settings.circuit_breaker.as_ref())?;
    let limits = rows::names_text(&settings.limits)?;
    let sequence = rows::sequence_spec_text(settings.sequence.as_ref())?;
    let batch = settings
        .batch
        .as_ref()
        .map(|spec| rows::json_text(spec, "batch"))
        .transpose()?;
    ctx.conn
        .prepare_cached(
            "INSERT INTO kinds (kind, schema, version, updated_at, circuit_breaker, limits, \
             sequence, batch) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8) \
             ON CONFLICT (kind) DO UPDATE SET \
             schema = excluded.schema, version = excluded.version, \
             updated_at = excluded.updated_at, \
             circuit_breaker = excluded.circuit_breaker, limits = excluded.limits, \
             sequence = excluded.sequence, batch = excluded.batch",
        )
        .and_then(|mut stmt| {
            stmt.execute(rusqlite::params![
                settings.kind,
                schema,
                settings.version,
                rows::millis(ctx.now),
                breaker,
                limits,
                sequence,
                batch
            ])
        })
        .map_err(backend)?;
    Ok(KindSettings {
        updated_at: conveyor_core::clock::from_millis(rows::millis(ctx.now)),
        ..settings
    })
}

/// Forgets a kind's settings; whether there were any.
pub(crate) fn delete(ctx: &WriteCtx<'_>, kind: &str) -> StoreResult<bool> {
    let deleted = ctx
        .conn
        .prepare_cached("DELETE FROM kinds WHERE kind = ?1")
        .and_then(|mut stmt| stmt.execute([&kind]))
        .map_err(backend)?;
    Ok(deleted > 0)
}

/// Every kind's settings, by name.
pub(crate) fn list(conn: &Connection) -> StoreResult<Vec<conveyor_core::kinds::KindSettings>> {
    type Row = (
        String,
        Option<String>,
        Option<i64>,
        i64,
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
    let rows: Vec<Row> = conn
        .prepare_cached(
            "SELECT kind, schema, version, updated_at, circuit_breaker, limits, sequence, batch \
             FROM kinds ORDER BY kind",
        )
        .and_then(|mut stmt| {
            stmt.query_map([], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                    row.get(5)?,
                    row.get(6)?,
                    row.get(7)?,
                ))
            })?
            .collect()
        })
        .map_err(backend)?;
    rows.into_iter()
        .map(
            |(kind, schema, version, updated_at, breaker, limits, sequence, batch)| {
                let schema = schema
                    .map(|text| {
                        serde_json::from_str(&text).map_err(|e| {
                            conveyor_core::StoreError::backend(format!(
                                "stored schema of kind {kind:?}: {e}"
                            ))
                        })
                    })
                    .transpose()?;
                let batch = batch
                    .map(|text| serde_json::from_str(&text))
                    .transpose()
                    .map_err(|e| {
                        conveyor_core::StoreError::backend(format!(
                            "stored batch of kind {kind:?}: {e}"
                        ))
                    })?;
                Ok(conveyor_core::kinds::KindSettings {
                    kind,
                    schema,
                    version: version.and_then(|v| u32::try_from(v).ok()),
                    circuit_breaker: crate::rows::breaker_settings(breaker).map_err(backend)?,
                    limits: crate::rows::names(limits).map_err(backend)?,
                    sequence: crate::rows::sequence_spec(sequence).map_err(backend)?,
                    batch,
                    updated_at: from_millis(updated_at),
                })
            },
        )
        .collect()
}

/// Stored circuit breakers, all or the one of `only`.
pub(crate) fn breakers_list(
    conn: &Connection,
    only: Option<(conveyor_core::BreakerScope, &str)>,
) -> StoreResult<Vec<conveyor_core::StoredBreaker>> {
    let (scope, name) = only.map_or((None, None), |(scope, name)| {
        (Some(scope.as_str()), Some(name.to_string()))
    });
    let rows: Vec<(String, String, i64, String)> = conn
        .prepare_cached(
            "SELECT scope, name, version, record FROM circuit_breakers \
             WHERE (?1 IS NULL OR (scope = ?1 AND name = ?2)) ORDER BY scope, name",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![scope, name], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })?
            .collect()
        })
        .map_err(backend)?;
    rows.into_iter()
        .filter_map(|(scope, name, version, record)| {
            // A scope this build does not know is skipped, not an error.
            let scope = conveyor_core::BreakerScope::parse(&scope)?;
            Some(
                serde_json::from_str(&record)
                    .map(|record| conveyor_core::StoredBreaker {
                        scope,
                        name,
                        version: version.max(0) as u64,
                        record,
                    })
                    .map_err(|e| {
                        conveyor_core::StoreError::backend(format!("stored breaker: {e}"))
                    }),
            )
        })
        .collect()
}

/// Writes a breaker's record if its version is still the one read (0: not stored yet).
pub(crate) fn breaker_write(ctx: &WriteCtx<'_>, breaker: &StoredBreaker) -> StoreResult<bool> {
    let record = serde_json::to_string(&breaker.record)
        .map_err(|e| StoreError::backend(format!("cannot serialize a breaker: {e}")))?;
    let scope = breaker.scope.as_str();
    let name = breaker.name.clone();
    let version = i64::try_from(breaker.version)
        .map_err(|_| StoreError::backend("breaker version out of range"))?;
    let written = if version == 0 {
        ctx.conn
            .prepare_cached(
                "INSERT INTO circuit_breakers (scope, name, version, record) \
                 VALUES (?1, ?2, 1, ?3) ON CONFLICT (scope, name) DO NOTHING",
            )
            .and_then(|mut stmt| stmt.execute(rusqlite::params![scope, name, record]))
    } else {
        ctx.conn
            .prepare_cached(
                "UPDATE circuit_breakers SET version = version + 1, record = ?3 \
                 WHERE scope = ?1 AND name = ?2 AND version = ?4",
            )
            .and_then(|mut stmt| stmt.execute(rusqlite::params![scope, name, record, version]))
    }
    .map_err(backend)?;
    Ok(written == 1)
}
