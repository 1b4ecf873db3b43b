//! The maintenance leader's lease.

use super::*;

/// The one leadership role maintenance uses.
pub(super) const MAINTENANCE_ROLE: &str = "maintenance";

pub(crate) fn leader_try_acquire(
    ctx: &mut WriteCtx<'_>,
    holder: &str,
    ttl: std::time::Duration,
) -> StoreResult<bool> {
    let expires = millis(clock::after(ctx.now, ttl));
    // Take the role if it is free, expired, or already ours; otherwise leave it.
    let current: String = ctx
        .conn
        .prepare_cached(
            "INSERT INTO leadership (name, holder, expires_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
             expires_at = excluded.expires_at \
             WHERE leadership.holder = excluded.holder OR leadership.expires_at <= ?4 \
             RETURNING holder",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![MAINTENANCE_ROLE, holder, expires, millis(ctx.now)],
                |row| row.get(0),
            )
            .optional()
        })
        .map_err(backend)?
        .unwrap_or_default();
    Ok(current == holder)
}

pub(crate) fn leader_release(ctx: &mut WriteCtx<'_>, holder: &str) -> StoreResult<()> {
    ctx.conn
        .prepare_cached("DELETE FROM leadership WHERE name = ?1 AND holder = ?2")
        .and_then(|mut stmt| stmt.execute(params![MAINTENANCE_ROLE, holder]))
        .map_err(backend)?;
    Ok(())
}
