//! Settings per job kind (see `conveyor_core::kinds`).

use conveyor_core::kinds::KindSettings;
use conveyor_core::StoreResult;
use sqlx::types::Json;
use sqlx::{PgConnection, Row, SqlStr};

use crate::errors::{corrupt, db};
use crate::names::quoted;
use crate::ops::Ctx;
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
                "INSERT INTO {kinds} (kind, schema, version, updated_at) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (kind) DO UPDATE SET schema = EXCLUDED.schema, \
                 version = EXCLUDED.version, updated_at = EXCLUDED.updated_at"
            )),
            list: stmt(format!(
                "SELECT kind, schema, version, updated_at FROM {kinds} ORDER BY kind"
            )),
            delete: stmt(format!("DELETE FROM {kinds} WHERE kind = $1")),
        }
    }
}

pub(crate) async fn put(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    settings: KindSettings,
) -> StoreResult<KindSettings> {
    sqlx::query(ctx.sql.kinds.put.clone())
        .bind(&settings.kind)
        .bind(settings.schema.as_ref().map(Json))
        .bind(
            settings
                .version
                .map(|v| i32::try_from(v).unwrap_or(i32::MAX)),
        )
        .bind(ctx.now)
        .execute(conn)
        .await
        .map_err(db("set a kind's settings"))?;
    Ok(KindSettings {
        updated_at: ctx.now,
        ..settings
    })
}

pub(crate) async fn list(conn: &mut PgConnection, ctx: &Ctx<'_>) -> StoreResult<Vec<KindSettings>> {
    let rows = sqlx::query(ctx.sql.kinds.list.clone())
        .fetch_all(conn)
        .await
        .map_err(db("list kinds"))?;
    rows.iter()
        .map(|row| {
            let schema: Option<Json<serde_json::Value>> = row.try_get("schema").map_err(corrupt)?;
            let version: Option<i32> = row.try_get("version").map_err(corrupt)?;
            Ok(KindSettings {
                kind: row.try_get("kind").map_err(corrupt)?,
                schema: schema.map(|Json(v)| v),
                version: version.and_then(|v| u32::try_from(v).ok()),
                updated_at: row.try_get("updated_at").map_err(corrupt)?,
            })
        })
        .collect()
}

pub(crate) async fn delete(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    kind: &str,
) -> StoreResult<bool> {
    let done = sqlx::query(ctx.sql.kinds.delete.clone())
        .bind(kind)
        .execute(conn)
        .await
        .map_err(db("delete a kind's settings"))?;
    Ok(done.rows_affected() > 0)
}
