//! Queue depths and settings.

use super::*;

/// Unfinished jobs in `queue` ([`JobState::UNFINISHED`], blocked ones included).
pub(super) fn queue_depth(ctx: &WriteCtx<'_>, queue: &str) -> StoreResult<u64> {
    ctx.queue_count(queue, &JobState::UNFINISHED)
}

pub(crate) fn queue_settings_put(
    ctx: &mut WriteCtx<'_>,
    queue: &str,
    settings: QueueSettings,
) -> StoreResult<QueueSettings> {
    let as_sql = |n: Option<u64>| n.map(|n| n.min(i64::MAX as u64) as i64);
    let rate_count = |rate: Option<RateLimit>| as_sql(rate.map(|r| r.count));
    let rate_period = |rate: Option<RateLimit>| as_sql(rate.map(|r| r.period_ms));
    let breaker = crate::rows::breaker_settings_text(settings.circuit_breaker.as_ref())?;
    let limits = crate::rows::names_text(&settings.limits)?;
    let sequence = crate::rows::sequence_spec_text(settings.sequence.as_ref())?;
    ctx.conn
        .prepare_cached(
            "INSERT INTO queue_settings (queue, paused, max_depth, max_depth_per_tenant, \
             concurrency_limit, per_key_concurrency_limit, rate_count, rate_period_ms, \
             per_key_rate_count, per_key_rate_period_ms, weight, completed_retention_secs, \
             dead_retention_secs, default_ttl_ms, circuit_breaker, limits, sequence) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
             ?17) \
             ON CONFLICT (queue) DO UPDATE SET \
             paused = excluded.paused, max_depth = excluded.max_depth, \
             max_depth_per_tenant = excluded.max_depth_per_tenant, \
             concurrency_limit = excluded.concurrency_limit, \
             per_key_concurrency_limit = excluded.per_key_concurrency_limit, \
             rate_count = excluded.rate_count, rate_period_ms = excluded.rate_period_ms, \
             per_key_rate_count = excluded.per_key_rate_count, \
             per_key_rate_period_ms = excluded.per_key_rate_period_ms, \
             weight = excluded.weight, \
             completed_retention_secs = excluded.completed_retention_secs, \
             dead_retention_secs = excluded.dead_retention_secs, \
             default_ttl_ms = excluded.default_ttl_ms, \
             circuit_breaker = excluded.circuit_breaker, limits = excluded.limits, \
             sequence = excluded.sequence",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                queue,
                settings.paused,
                as_sql(settings.max_depth),
                as_sql(settings.max_depth_per_tenant),
                as_sql(settings.concurrency_limit),
                as_sql(settings.per_key_concurrency_limit),
                rate_count(settings.rate_limit),
                rate_period(settings.rate_limit),
                rate_count(settings.per_key_rate_limit),
                rate_period(settings.per_key_rate_limit),
                settings.weight,
                as_sql(settings.completed_retention_secs),
                as_sql(settings.dead_retention_secs),
                as_sql(settings.default_ttl_ms),
                breaker,
                limits,
                sequence,
            ])
        })
        .map_err(backend)?;
    let was_paused = ctx.settings.get(queue).is_some_and(|s| s.paused);
    if was_paused && !settings.paused {
        // Resumed: its jobs are fetchable again.
        ctx.wake = true;
    }
    ctx.settings.insert(queue.to_string(), settings.clone());
    Ok(settings)
}
