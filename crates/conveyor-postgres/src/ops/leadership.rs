//! The maintenance leader's lease.

use super::*;

/// The one leadership role maintenance uses.
pub(super) const MAINTENANCE_ROLE: &str = "maintenance";

/// Takes or renews the maintenance leadership for `holder` until now + `ttl`.
pub(crate) async fn leader_try_acquire(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    holder: &str,
    ttl: std::time::Duration,
) -> StoreResult<bool> {
    // Configuration, not input: an absurd TTL saturates (as on SQLite) rather than fails.
    let expires_at = truncate_to_millis(conveyor_core::clock::after(ctx.now, ttl));
    let row = sqlx::query(ctx.sql.leader_acquire.clone())
        .bind(MAINTENANCE_ROLE)
        .bind(holder)
        .bind(expires_at)
        .bind(ctx.now)
        .fetch_optional(conn)
        .await
        .map_err(db("acquire leadership"))?;
    Ok(row.is_some())
}

/// Gives up the maintenance leadership if `holder` has it.
pub(crate) async fn leader_release(
    conn: &mut PgConnection,
    sql: &Sql,
    holder: &str,
) -> StoreResult<()> {
    sqlx::query(sql.leader_release.clone())
        .bind(MAINTENANCE_ROLE)
        .bind(holder)
        .execute(conn)
        .await
        .map_err(db("release leadership"))?;
    Ok(())
}
