//! Queue settings: read, write, list.

use super::*;

pub(crate) fn settings_of(row: &PgRow) -> StoreResult<QueueSettings> {
    let read = |e: sqlx::Error| corrupt(e.to_string());
    let count = |column: &str| -> StoreResult<Option<u64>> {
        Ok(row
            .try_get::<Option<i64>, _>(column)
            .map_err(read)?
            .map(depth_of))
    };
    let rate = |count_column: &str, period_column: &str| -> StoreResult<Option<RateLimit>> {
        Ok(match (count(count_column)?, count(period_column)?) {
            (Some(count), Some(period_ms)) => Some(RateLimit { count, period_ms }),
            _ => None,
        })
    };
    let weight: Option<i32> = row.try_get("weight").map_err(read)?;
    Ok({
        let mut settings = QueueSettings::default();
        settings.paused = row.try_get("paused").map_err(read)?;
        settings.max_depth = count("max_depth")?;
        settings.max_depth_per_tenant = count("max_depth_per_tenant")?;
        settings.concurrency_limit = count("concurrency_limit")?;
        settings.per_key_concurrency_limit = count("per_key_concurrency_limit")?;
        settings.rate_limit = rate("rate_count", "rate_period_ms")?;
        settings.per_key_rate_limit = rate("per_key_rate_count", "per_key_rate_period_ms")?;
        settings.weight = weight.map(|w| u32::try_from(w).unwrap_or(1));
        settings.completed_retention_secs = count("completed_retention_secs")?;
        settings.dead_retention_secs = count("dead_retention_secs")?;
        settings.default_ttl_ms = count("default_ttl_ms")?;
        let breaker: Option<sqlx::types::Json<conveyor_core::BreakerSettings>> =
            row.try_get("circuit_breaker").map_err(read)?;
        settings.circuit_breaker = breaker.map(|sqlx::types::Json(b)| b);
        settings
    })
}

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

// ---------------------------------------------------------------------------------------------
// Fetch and leases
// ---------------------------------------------------------------------------------------------
