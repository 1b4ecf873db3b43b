//! Inserting jobs: idempotency and unique keys, debounce and throttle, queue-depth limits.

use super::*;
use conveyor_core::debounce::{self, Verdict};

/// An existing job that an insert with `key` must return instead of creating a new one.
pub(super) fn idempotent_match(ctx: &WriteCtx<'_>, key: &str) -> StoreResult<Option<Job>> {
    // The newest job that still holds the key: an older job made unfinished again (a replayed
    // dead job) holds it even when a newer one with the key has finished.
    let window_start = clock::before(ctx.now, ctx.options.completed_idempotency_window);
    let latest = ctx
        .conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM jobs WHERE idempotency_key = ?1 \
             AND (state NOT IN ('completed', 'dead', 'cancelled', 'expired') \
                  OR (state = 'completed' AND finished_at > ?2)) \
             ORDER BY created_at DESC, id DESC LIMIT 1"
        ))
        .and_then(|mut stmt| {
            stmt.query_row(params![key, millis(window_start)], rows::job)
                .optional()
        })
        .map_err(backend)?;
    let window = ctx.options.completed_idempotency_window;
    Ok(latest.filter(|job| job.holds_idempotency_key(ctx.now, window)))
}

pub(crate) fn insert_many(ctx: &mut WriteCtx<'_>, jobs: Vec<NewJob>) -> StoreResult<Vec<Inserted>> {
    check_depth_limits(ctx, &jobs)?;
    let mut inserted = Vec::with_capacity(jobs.len());
    for mut new in jobs {
        if new.expires_at.is_none() {
            new.expires_at = (ctx.settings.get(&new.queue))
                .and_then(|settings| settings.default_expiry(ctx.now, new.run_at));
        }
        if let Some(key) = &new.idempotency_key {
            if let Some(existing) = idempotent_match(ctx, key)? {
                inserted.push(Inserted::duplicate_of(existing));
                continue;
            }
        }
        // Checked after the idempotency key, which keeps precedence.
        let unique_key = new.unique_key();
        if let (Some(spec), Some(key)) = (&new.unique, &unique_key) {
            // A job waiting past its expiry will never run: it blocks nothing.
            let existing = unique::existing(ctx, key, spec)?
                .filter(|existing| !existing.is_past_expiry(ctx.now));
            if let Some(existing) = existing {
                inserted.push(Inserted::duplicate_of(existing));
                continue;
            }
        }
        // A debounced or throttled enqueue may fold into the key's standing job instead.
        let mut fold_until = None;
        let fold = new.fold_key.clone();
        if let Some(fold) = &fold {
            let standing = crate::fold::standing(ctx, &fold.key)?;
            match debounce::verdict(fold.rule, standing, ctx.now) {
                Verdict::Replace { id, run_at } => {
                    if let Some(job) = crate::fold::replace(ctx, id, &new.payload, run_at)? {
                        inserted.push(Inserted::folded_into(job));
                        continue;
                    }
                    // No longer waiting (the writer's own round changed it): a new job.
                    new.run_at = Some(run_at);
                }
                Verdict::Drop { id, until } => {
                    if let Some(job) = crate::fold::extend(ctx, id, until)? {
                        inserted.push(Inserted::folded_into(job));
                        continue;
                    }
                }
                Verdict::Insert { run_at, until } => {
                    if run_at.is_some() {
                        new.run_at = run_at;
                    }
                    fold_until = until;
                }
            }
        }
        let mut job = new.into_stored(Uuid::now_v7(), ctx.now);
        sequence::enter(ctx, &mut job)?;
        if job.state == JobState::Available {
            ctx.wake = true;
        }
        let turn = crate::turns::of_new(ctx, &job)?;
        insert_row(ctx, &job, turn)?;
        if let Some(fold) = &fold {
            crate::fold::mark(ctx, job.id, &fold.key, fold_until)?;
        }
        ctx.count_move(&job.queue, None, Some(job.state));
        inserted.push(Inserted::new(job));
    }
    Ok(inserted)
}

/// A tenant's unfinished jobs in a queue ([`JobState::UNFINISHED`]), counted in
/// `jobs_tenant_queued`, whose condition the statement repeats so SQLite uses it (a test keeps
/// both lists equal to the states').
const TENANT_DEPTH: &str = "SELECT COUNT(*) FROM jobs WHERE queue = ?1 AND tenant = ?2 \
     AND tenant IS NOT NULL \
     AND state IN ('scheduled', 'available', 'running', 'retryable', 'blocked')";

/// Refuses the whole batch when it would take a queue, or a tenant's share of one, past its
/// configured maximum depth. Queues without limits cost one in-memory lookup.
pub(super) fn check_depth_limits(ctx: &WriteCtx<'_>, jobs: &[NewJob]) -> StoreResult<()> {
    let depth_limited = |queue: &str| {
        ctx.settings
            .get(queue)
            .is_some_and(|s| s.max_depth.is_some() || s.max_depth_per_tenant.is_some())
    };
    if !jobs.iter().any(|job| depth_limited(&job.queue)) {
        return Ok(());
    }
    // A duplicate adds nothing: it returns the existing job, so it never counts.
    let duplicates = unique::duplicates(ctx, jobs, |key| {
        idempotent_match(ctx, key).map(|found| found.is_some())
    })?;
    let limits = |queue: &str| {
        ctx.settings
            .get(queue)
            .map(|s| (s.max_depth, s.max_depth_per_tenant))
    };
    let counted = jobs
        .iter()
        .enumerate()
        .filter(|(index, _)| !duplicates.contains(index))
        .map(|(_, job)| (job.queue.as_str(), job.tenant.as_deref()));
    let demand = conveyor_core::limits::depth_demand(counted, limits);
    conveyor_core::limits::depth_verdict(&demand, |queue, tenant| match tenant {
        None => queue_depth(ctx, queue),
        Some(tenant) => {
            let depth: i64 = ctx
                .conn
                .prepare_cached(TENANT_DEPTH)
                .and_then(|mut stmt| stmt.query_row(params![queue, tenant], |row| row.get(0)))
                .map_err(backend)?;
            Ok(depth.max(0) as u64)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The states named in the `state IN (...)` list that follows `after` in `text`.
    fn states_after(text: &str, after: &str) -> Vec<String> {
        let from = text.find(after).expect("the statement or index") + after.len();
        let list = &text[from..];
        let list = &list[list.find("state IN (").expect("a state list") + 10..];
        list[..list.find(')').expect("the list's end")]
            .split(',')
            .map(|state| state.trim().trim_matches('\'').to_string())
            .collect()
    }

    #[test]
    fn a_tenants_depth_counts_every_unfinished_state_from_its_index() {
        let mut unfinished: Vec<String> = JobState::UNFINISHED
            .iter()
            .map(|state| state.as_str().to_string())
            .collect();
        unfinished.sort();
        let mut counted = states_after(TENANT_DEPTH, "SELECT");
        counted.sort();
        let schema = include_str!("../schema.sql");
        let mut indexed = states_after(schema, "CREATE INDEX IF NOT EXISTS jobs_tenant_queued");
        indexed.sort();
        assert_eq!(counted, unfinished);
        assert_eq!(indexed, unfinished);
    }
}
