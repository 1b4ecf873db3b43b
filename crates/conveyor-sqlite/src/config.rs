//! Configuration the cluster shares: named JSON documents by collection (see
//! `conveyor_core::config`).

use conveyor_core::clock::from_millis;
use conveyor_core::{ConfigEntry, StoreError, StoreResult};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::Value;

use crate::errors::backend;
use crate::rows;
use crate::writer::WriteCtx;

/// Stores a document (new or replacing), stamped with the store's now.
pub(crate) fn put(
    ctx: &WriteCtx<'_>,
    collection: &str,
    name: &str,
    document: Value,
) -> StoreResult<ConfigEntry> {
    let text = serde_json::to_string(&document)
        .map_err(|e| StoreError::backend(format!("cannot serialize a document: {e}")))?;
    let at = rows::millis(ctx.now);
    ctx.conn
        .prepare_cached(
            "INSERT INTO config (collection, name, document, updated_at) VALUES (?1, ?2, ?3, ?4) \
             ON CONFLICT (collection, name) DO UPDATE SET document = excluded.document, \
             updated_at = excluded.updated_at",
        )
        .and_then(|mut stmt| stmt.execute(params![collection, name, text, at]))
        .map_err(backend)?;
    Ok(ConfigEntry {
        collection: collection.to_string(),
        name: name.to_string(),
        document,
        updated_at: from_millis(at),
    })
}

/// Deletes a document; whether there was one.
pub(crate) fn delete(ctx: &WriteCtx<'_>, collection: &str, name: &str) -> StoreResult<bool> {
    let deleted = ctx
        .conn
        .prepare_cached("DELETE FROM config WHERE collection = ?1 AND name = ?2")
        .and_then(|mut stmt| stmt.execute([collection, name]))
        .map_err(backend)?;
    Ok(deleted > 0)
}

fn entry(collection: &str, name: String, text: String, at: i64) -> StoreResult<ConfigEntry> {
    let document = serde_json::from_str(&text).map_err(|e| {
        StoreError::backend(format!(
            "the stored document {collection}/{name} is not JSON: {e}"
        ))
    })?;
    Ok(ConfigEntry {
        collection: collection.to_string(),
        name,
        document,
        updated_at: from_millis(at),
    })
}

/// One document.
pub(crate) fn get(
    conn: &Connection,
    collection: &str,
    name: &str,
) -> StoreResult<Option<ConfigEntry>> {
    let row: Option<(String, i64)> = conn
        .prepare_cached(
            "SELECT document, updated_at FROM config WHERE collection = ?1 AND name = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row([collection, name], |row| Ok((row.get(0)?, row.get(1)?)))
                .optional()
        })
        .map_err(backend)?;
    row.map(|(text, at)| entry(collection, name.to_string(), text, at))
        .transpose()
}

/// Every document of a collection, by name.
pub(crate) fn list(conn: &Connection, collection: &str) -> StoreResult<Vec<ConfigEntry>> {
    let rows: Vec<(String, String, i64)> = conn
        .prepare_cached(
            "SELECT name, document, updated_at FROM config WHERE collection = ?1 ORDER BY name",
        )
        .and_then(|mut stmt| {
            stmt.query_map([collection], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })?
            .collect()
        })
        .map_err(backend)?;
    rows.into_iter()
        .map(|(name, text, at)| entry(collection, name, text, at))
        .collect()
}

/// Every document of every collection (for a store copy).
pub(crate) fn all(conn: &Connection) -> StoreResult<Vec<ConfigEntry>> {
    let rows: Vec<(String, String, String, i64)> = conn
        .prepare_cached(
            "SELECT collection, name, document, updated_at FROM config ORDER BY collection, name",
        )
        .and_then(|mut stmt| {
            stmt.query_map([], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })?
            .collect()
        })
        .map_err(backend)?;
    rows.into_iter()
        .map(|(collection, name, text, at)| entry(&collection, name, text, at))
        .collect()
}

/// Stores documents a copy brings, keeping their times; one already held is left alone.
/// Returns how many were new.
pub(crate) fn import(ctx: &WriteCtx<'_>, entries: &[ConfigEntry]) -> StoreResult<u64> {
    let mut stored = 0;
    for entry in entries {
        let text = serde_json::to_string(&entry.document)
            .map_err(|e| StoreError::backend(format!("cannot serialize a document: {e}")))?;
        stored += ctx
            .conn
            .prepare_cached(
                "INSERT INTO config (collection, name, document, updated_at) \
                 VALUES (?1, ?2, ?3, ?4) ON CONFLICT DO NOTHING",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    entry.collection,
                    entry.name,
                    text,
                    rows::millis(entry.updated_at)
                ])
            })
            .map_err(backend)? as u64;
    }
    Ok(stored)
}
