//! Unique jobs on the insert path (the rules are in `conveyor_core::unique`).
//!
//! `ops::insert_many` locks each unique key of a batch with a transaction-scoped advisory lock
//! (sorted together with the idempotency keys, so concurrent batches cannot deadlock) before
//! looking for a stored job holding it. A concurrent insert of the same key, on any node, waits
//! on the lock until the first commits and then finds its job: one job per key and state set.

use conveyor_core::{Job, NewJob, StoreResult};
use sqlx::{PgConnection, Row};
use std::collections::HashMap;

use crate::ctx::Ctx;
use crate::errors::{corrupt, db};
use crate::names::unique_lock_key;
use crate::rows;

/// Each job's unique key (`None` for jobs without a unique spec), in batch order.
pub(crate) fn keys(jobs: &[NewJob]) -> Vec<Option<String>> {
    jobs.iter().map(NewJob::unique_key).collect()
}

/// The advisory lock keys of the batch's unique keys (unsorted; the caller sorts them with the
/// idempotency keys' locks).
pub(crate) fn lock_keys<'a>(
    schema: &'a str,
    keys: &'a [Option<String>],
) -> impl Iterator<Item = i64> + 'a {
    keys.iter()
        .flatten()
        .map(move |key| unique_lock_key(schema, key))
}

/// For each unique job of the batch (by position), the latest stored job holding its key in
/// one of its spec's states and created within its window. One statement for the whole batch;
/// none when no job is unique. Must run after the keys are locked.
pub(crate) async fn stored_matches(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    jobs: &[NewJob],
    keys: &[Option<String>],
) -> StoreResult<HashMap<usize, Job>> {
    let mut positions = Vec::new();
    let mut lookup_keys = Vec::new();
    let mut lookup_states = Vec::new();
    let mut lookup_since = Vec::new();
    for (index, (job, key)) in jobs.iter().zip(keys).enumerate() {
        let (Some(spec), Some(key)) = (&job.unique, key) else {
            continue;
        };
        positions.push(index);
        lookup_keys.push(key.as_str());
        // States are fixed identifiers without commas, so a comma-separated list is safe; SQL
        // arrays of arrays would have to be rectangular.
        let states: Vec<&str> = spec.states.iter().map(|state| state.as_str()).collect();
        lookup_states.push(states.join(","));
        lookup_since.push(spec.window_start(ctx.now));
    }
    if positions.is_empty() {
        return Ok(HashMap::new());
    }
    let found = sqlx::query(ctx.sql.unique_matches.clone())
        .bind(&lookup_keys)
        .bind(&lookup_states)
        .bind(&lookup_since)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("find unique jobs"))?;
    let mut matches = HashMap::with_capacity(found.len());
    for row in &found {
        let pos: i64 = row.try_get("pos").map_err(|e| corrupt(e.to_string()))?;
        let index = usize::try_from(pos - 1)
            .ok()
            .and_then(|i| positions.get(i).copied())
            .ok_or_else(|| corrupt(format!("unique lookup returned position {pos}")))?;
        let job = rows::job(row)?;
        // A job waiting past its expiry will never run: it blocks nothing.
        if !job.is_past_expiry(ctx.now) {
            matches.insert(index, job);
        }
    }
    Ok(matches)
}
