//! Configuration the cluster shares: named JSON documents by collection (see
//! `conveyor_core::config`).

use chrono::{DateTime, Utc};
use conveyor_core::{ConfigEntry, StoreResult};
use serde_json::Value;
use sqlx::types::Json;
use sqlx::{PgConnection, Row, SqlStr};

use crate::errors::{corrupt, db};
use crate::names::quoted;
use crate::sql::stmt;

/// The statements of shared configuration for one schema.
pub(crate) struct ConfigSql {
    put: SqlStr,
    get: SqlStr,
    list: SqlStr,
    all: SqlStr,
    delete: SqlStr,
    import: SqlStr,
}

impl ConfigSql {
    pub(crate) fn new(schema: &str) -> Self {
        let config = format!("{}.config", quoted(schema));
        let columns = "collection, name, document, updated_at";
        Self {
            put: stmt(format!(
                "INSERT INTO {config} ({columns}) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (collection, name) DO UPDATE SET document = EXCLUDED.document, \
                 updated_at = EXCLUDED.updated_at"
            )),
            get: stmt(format!(
                "SELECT {columns} FROM {config} WHERE collection = $1 AND name = $2"
            )),
            list: stmt(format!(
                "SELECT {columns} FROM {config} WHERE collection = $1 ORDER BY name"
            )),
            all: stmt(format!(
                "SELECT {columns} FROM {config} ORDER BY collection, name"
            )),
            delete: stmt(format!(
                "DELETE FROM {config} WHERE collection = $1 AND name = $2"
            )),
            import: stmt(format!(
                "INSERT INTO {config} ({columns}) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING"
            )),
        }
    }
}

fn entry(row: &sqlx::postgres::PgRow) -> StoreResult<ConfigEntry> {
    let Json(document): Json<Value> = row.try_get("document").map_err(corrupt)?;
    Ok(ConfigEntry {
        collection: row.try_get("collection").map_err(corrupt)?,
        name: row.try_get("name").map_err(corrupt)?,
        document,
        updated_at: row.try_get("updated_at").map_err(corrupt)?,
    })
}

pub(crate) async fn put(
    conn: &mut PgConnection,
    sql: &ConfigSql,
    now: DateTime<Utc>,
    collection: &str,
    name: &str,
    document: Value,
) -> StoreResult<ConfigEntry> {
    sqlx::query(sql.put.clone())
        .bind(collection)
        .bind(name)
        .bind(Json(&document))
        .bind(now)
        .execute(conn)
        .await
        .map_err(db("store a configuration document"))?;
    Ok(ConfigEntry {
        collection: collection.to_string(),
        name: name.to_string(),
        document,
        updated_at: now,
    })
}

pub(crate) async fn get(
    conn: &mut PgConnection,
    sql: &ConfigSql,
    collection: &str,
    name: &str,
) -> StoreResult<Option<ConfigEntry>> {
    sqlx::query(sql.get.clone())
        .bind(collection)
        .bind(name)
        .fetch_optional(conn)
        .await
        .map_err(db("read a configuration document"))?
        .as_ref()
        .map(entry)
        .transpose()
}

pub(crate) async fn list(
    conn: &mut PgConnection,
    sql: &ConfigSql,
    collection: Option<&str>,
) -> StoreResult<Vec<ConfigEntry>> {
    let query = match collection {
        Some(collection) => sqlx::query(sql.list.clone()).bind(collection.to_string()),
        None => sqlx::query(sql.all.clone()),
    };
    query
        .fetch_all(conn)
        .await
        .map_err(db("list configuration documents"))?
        .iter()
        .map(entry)
        .collect()
}

pub(crate) async fn delete(
    conn: &mut PgConnection,
    sql: &ConfigSql,
    collection: &str,
    name: &str,
) -> StoreResult<bool> {
    let done = sqlx::query(sql.delete.clone())
        .bind(collection)
        .bind(name)
        .execute(conn)
        .await
        .map_err(db("delete a configuration document"))?;
    Ok(done.rows_affected() > 0)
}

/// Stores documents a copy brings, keeping their times; one already held is left alone.
pub(crate) async fn import(
    conn: &mut PgConnection,
    sql: &ConfigSql,
    entries: &[ConfigEntry],
) -> StoreResult<u64> {
    let mut stored = 0;
    for entry in entries {
        stored += sqlx::query(sql.import.clone())
            .bind(&entry.collection)
            .bind(&entry.name)
            .bind(Json(&entry.document))
            .bind(entry.updated_at)
            .execute(&mut *conn)
            .await
            .map_err(db("import a configuration document"))?
            .rows_affected();
    }
    Ok(stored)
}
