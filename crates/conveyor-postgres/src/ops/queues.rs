//! Queue settings: read, write, list.

use super::*;

pub(crate) async fn queue_settings_get(
    conn: &mut PgConnection,
    sql: &Sql,
    queue: &str,
) -> StoreResult<QueueSettings> {
    let row = sqlx::query(sql.settings_get.clone())
        .bind(queue)
        .fetch_optional(conn)
        .await
        .map_err(db("read queue settings"))?;
    row.as_ref()
        .map(settings_of)
        .transpose()
        .map(Option::unwrap_or_default)
}

/// Stores a queue's settings and returns them as stored. When the change resumes a paused
/// queue, its waiting fetchers in every process are notified; returns whether it did. Must run
/// inside a transaction, so that the wake-up is sent only if the change commits.
pub(crate) async fn queue_settings_put(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    queue: &str,
    settings: &QueueSettings,
) -> StoreResult<(QueueSettings, bool)> {
    let row = sqlx::query(ctx.sql.settings_put.clone())
        .bind(queue)
        .bind(settings.paused)
        .bind(settings.max_depth.map(stored_depth))
        .bind(settings.max_depth_per_tenant.map(stored_depth))
        .bind(ctx.now)
        .bind(settings.concurrency_limit.map(stored_depth))
        .bind(settings.per_key_concurrency_limit.map(stored_depth))
        .bind(settings.rate_limit.map(|r| stored_depth(r.count)))
        .bind(settings.rate_limit.map(|r| stored_depth(r.period_ms)))
        .bind(settings.per_key_rate_limit.map(|r| stored_depth(r.count)))
        .bind(
            settings
                .per_key_rate_limit
                .map(|r| stored_depth(r.period_ms)),
        )
        .bind(
            settings
                .weight
                .map(|w| i32::try_from(w).unwrap_or(i32::MAX)),
        )
        .bind(settings.completed_retention_secs.map(stored_depth))
        .bind(settings.dead_retention_secs.map(stored_depth))
        .bind(settings.default_ttl_ms.map(stored_depth))
        .bind(settings.circuit_breaker.map(sqlx::types::Json))
        .bind(&settings.limits)
        .bind(settings.sequence.as_ref().map(sqlx::types::Json))
        .fetch_one(&mut *conn)
        .await
        .map_err(db("store queue settings"))?;
    let stored = settings_of(&row)?;
    let was_paused: bool = row
        .try_get("was_paused")
        .map_err(|e| corrupt(e.to_string()))?;
    let resumed = was_paused && !stored.paused;
    if resumed {
        notify(conn, ctx.sql, &[queue.to_string()]).await?;
    }
    Ok((stored, resumed))
}

pub(crate) async fn queue_settings_list(
    conn: &mut PgConnection,
    sql: &Sql,
) -> StoreResult<Vec<NamedQueueSettings>> {
    let found = sqlx::query(sql.settings_list.clone())
        .fetch_all(conn)
        .await
        .map_err(db("list queue settings"))?;
    found
        .iter()
        .map(|row| {
            Ok(NamedQueueSettings {
                name: row.try_get("queue").map_err(|e| corrupt(e.to_string()))?,
                settings: settings_of(row)?,
            })
        })
        .collect()
}
