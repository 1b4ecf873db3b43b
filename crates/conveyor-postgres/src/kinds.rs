//! Settings per job kind (see `conveyor_core::kinds`).

use conveyor_core::kinds::KindSettings;
use conveyor_core::{BreakerScope, StoreResult, StoredBreaker};
use sqlx::types::Json;
use sqlx::{PgConnection, Row, SqlStr};

use crate::ctx::Ctx;
use crate::errors::{corrupt, db};
use crate::names::quoted;
use crate::sql::stmt;

/// The statements of kind settings for one schema.
pub(crate) struct KindsSql {
    put: SqlStr,
    list: SqlStr,
    delete: SqlStr,
}

impl KindsSql {
    pub(crate) fn new(schema: &str) -> Self {
        let kinds = format!("{}.kinds", quoted(schema));
        Self {
            put: stmt(format!(
                "INSERT INTO {kinds} (kind, schema, version, updated_at, circuit_breaker, limits, \
                 sequence, batch) VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
                 ON CONFLICT (kind) DO UPDATE SET schema = EXCLUDED.schema, \
                 version = EXCLUDED.version, updated_at = EXCLUDED.updated_at, \
                 circuit_breaker = EXCLUDED.circuit_breaker, limits = EXCLUDED.limits, \
                 sequence = EXCLUDED.sequence, batch = EXCLUDED.batch"
            )),
            list: stmt(format!(
                "SELECT kind, schema, version, updated_at, circuit_breaker, limits, sequence, \
                 batch FROM {kinds} ORDER BY kind"
            )),
            delete: stmt(format!("DELETE FROM {kinds} WHERE kind = $1")),
        }
    }
}

pub(crate) async fn put(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    sql: &KindsSql,
    settings: KindSettings,
) -> StoreResult<KindSettings> {
    sqlx::query(sql.put.clone())
        .bind(&settings.kind)
        .bind(settings.schema.as_ref().map(Json))
        .bind(
            settings
                .version
                .map(|v| i32::try_from(v).unwrap_or(i32::MAX)),
        )
        .bind(ctx.now)
        .bind(settings.circuit_breaker.map(Json))
        .bind(&settings.limits)
        .bind(settings.sequence.as_ref().map(Json))
        .bind(settings.batch.as_ref().map(Json))
        .execute(conn)
        .await
        .map_err(db("set a kind's settings"))?;
    Ok(KindSettings {
        updated_at: ctx.now,
        ..settings
    })
}

pub(crate) async fn list(
    conn: &mut PgConnection,
    sql: &KindsSql,
) -> StoreResult<Vec<KindSettings>> {
    let rows = sqlx::query(sql.list.clone())
        .fetch_all(conn)
        .await
        .map_err(db("list kinds"))?;
    rows.iter()
        .map(|row| {
            let schema: Option<Json<serde_json::Value>> = row.try_get("schema").map_err(corrupt)?;
            let version: Option<i32> = row.try_get("version").map_err(corrupt)?;
            let breaker: Option<Json<conveyor_core::BreakerSettings>> =
                row.try_get("circuit_breaker").map_err(corrupt)?;
            Ok(KindSettings {
                kind: row.try_get("kind").map_err(corrupt)?,
                schema: schema.map(|Json(v)| v),
                version: version.and_then(|v| u32::try_from(v).ok()),
                circuit_breaker: breaker.map(|Json(b)| b),
                limits: row.try_get("limits").map_err(corrupt)?,
                sequence: row
                    .try_get::<Option<Json<conveyor_core::sequence::SequenceSpec>>, _>("sequence")
                    .map_err(corrupt)?
                    .map(|Json(spec)| spec),
                batch: row
                    .try_get::<Option<Json<conveyor_core::batch::BatchSpec>>, _>("batch")
                    .map_err(corrupt)?
                    .map(|Json(spec)| spec),
                updated_at: row.try_get("updated_at").map_err(corrupt)?,
            })
        })
        .collect()
}

pub(crate) async fn delete(
    conn: &mut PgConnection,
    sql: &KindsSql,
    kind: &str,
) -> StoreResult<bool> {
    let done = sqlx::query(sql.delete.clone())
        .bind(kind)
        .execute(conn)
        .await
        .map_err(db("delete a kind's settings"))?;
    Ok(done.rows_affected() > 0)
}

/// The statements of circuit breakers' states for one schema.
pub(crate) struct BreakersSql {
    list: SqlStr,
    get: SqlStr,
    insert: SqlStr,
    update: SqlStr,
}

impl BreakersSql {
    pub(crate) fn new(schema: &str) -> Self {
        let breakers = format!("{}.circuit_breakers", quoted(schema));
        Self {
            list: stmt(format!(
                "SELECT scope, name, version, record FROM {breakers} ORDER BY scope, name"
            )),
            get: stmt(format!(
                "SELECT scope, name, version, record FROM {breakers} \
                 WHERE scope = $1 AND name = $2"
            )),
            insert: stmt(format!(
                "INSERT INTO {breakers} (scope, name, version, record) VALUES ($1, $2, 1, $3) \
                 ON CONFLICT (scope, name) DO NOTHING"
            )),
            update: stmt(format!(
                "UPDATE {breakers} SET version = version + 1, record = $3 \
                 WHERE scope = $1 AND name = $2 AND version = $4"
            )),
        }
    }
}

fn breaker_of(row: &sqlx::postgres::PgRow) -> StoreResult<Option<StoredBreaker>> {
    let scope: String = row.try_get("scope").map_err(corrupt)?;
    let version: i64 = row.try_get("version").map_err(corrupt)?;
    let Json(record): Json<conveyor_core::breaker::BreakerRecord> =
        row.try_get("record").map_err(corrupt)?;
    // A scope this build does not know is skipped, not an error.
    Ok(BreakerScope::parse(&scope).map(|scope| StoredBreaker {
        scope,
        name: row.try_get("name").unwrap_or_default(),
        version: version.max(0) as u64,
        record,
    }))
}

pub(crate) async fn breakers_list(
    conn: &mut PgConnection,
    sql: &BreakersSql,
) -> StoreResult<Vec<StoredBreaker>> {
    let rows = sqlx::query(sql.list.clone())
        .fetch_all(conn)
        .await
        .map_err(db("list circuit breakers"))?;
    Ok(rows
        .iter()
        .map(breaker_of)
        .collect::<StoreResult<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect())
}

pub(crate) async fn breaker_get(
    conn: &mut PgConnection,
    sql: &BreakersSql,
    scope: BreakerScope,
    name: &str,
) -> StoreResult<Option<StoredBreaker>> {
    let row = sqlx::query(sql.get.clone())
        .bind(scope.as_str())
        .bind(name)
        .fetch_optional(conn)
        .await
        .map_err(db("read a circuit breaker"))?;
    Ok(row.as_ref().map(breaker_of).transpose()?.flatten())
}

pub(crate) async fn breaker_write(
    conn: &mut PgConnection,
    sql: &BreakersSql,
    breaker: &StoredBreaker,
) -> StoreResult<bool> {
    let version = i64::try_from(breaker.version)
        .map_err(|_| conveyor_core::StoreError::backend("breaker version out of range"))?;
    let done = if version == 0 {
        sqlx::query(sql.insert.clone())
            .bind(breaker.scope.as_str())
            .bind(&breaker.name)
            .bind(Json(&breaker.record))
            .execute(conn)
            .await
    } else {
        sqlx::query(sql.update.clone())
            .bind(breaker.scope.as_str())
            .bind(&breaker.name)
            .bind(Json(&breaker.record))
            .bind(version)
            .execute(conn)
            .await
    }
    .map_err(db("write a circuit breaker"))?;
    Ok(done.rows_affected() == 1)
}
