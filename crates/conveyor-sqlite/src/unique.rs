//! Unique jobs on the insert path (the rules are in `conveyor_core::unique`).
//!
//! Every insert runs on the single writer thread, so the lookup and the insert that follows it
//! are never interleaved with another producer's: concurrent unique enqueues yield one job
//! without any locking of their own. Jobs inserted earlier in the same batch are already in the
//! transaction, so the same lookup finds them too.

use chrono::{DateTime, Utc};
use conveyor_core::unique::unique_key;
use conveyor_core::{Job, JobState, NewJob, StoreResult, UniqueSpec};
use rusqlite::types::Null;
use rusqlite::{OptionalExtension, ToSql};
use std::collections::{HashMap, HashSet};

use crate::errors::backend;
use crate::rows::{self, millis, COLUMNS};
use crate::writer::WriteCtx;

/// The most states a spec can name (every state, once); the lookup binds one slot for each.
const STATE_SLOTS: usize = JobState::ALL.len();
// The lookup's SQL spells out slots ?2 to ?10: a new state must widen it.
const _: () = assert!(STATE_SLOTS == 9);

/// The latest job holding `key` in one of `spec`'s states, created within its window.
///
/// One statement text for every spec (the states go in fixed slots, unused ones NULL, which
/// matches nothing), so it stays in the statement cache; the range scan runs on `jobs_unique`.
pub(crate) fn existing(
    ctx: &WriteCtx<'_>,
    key: &str,
    spec: &UniqueSpec,
) -> StoreResult<Option<Job>> {
    let mut states = spec.states.clone();
    states.sort_unstable();
    states.dedup();
    let names: Vec<&'static str> = states.iter().map(|state| state.as_str()).collect();
    // No window: every creation time counts.
    let since = spec.window_start(ctx.now).map_or(i64::MIN, millis);
    let mut args: Vec<&dyn ToSql> = Vec::with_capacity(STATE_SLOTS + 2);
    args.push(&key);
    for slot in 0..STATE_SLOTS {
        args.push(names.get(slot).map_or(&Null as &dyn ToSql, |name| name));
    }
    args.push(&since);
    ctx.conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM jobs WHERE unique_key = ?1 \
             AND state IN (?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10) AND created_at > ?11 \
             ORDER BY created_at DESC, id DESC LIMIT 1"
        ))
        .and_then(|mut stmt| stmt.query_row(args.as_slice(), rows::job).optional())
        .map_err(backend)
}

/// The state a job enters when inserted at `now` (as `ops::insert_many` decides it).
fn initial_state(job: &NewJob, now: DateTime<Utc>) -> JobState {
    if job.run_at.is_some_and(|at| at > now) {
        JobState::Scheduled
    } else {
        JobState::Available
    }
}

/// The positions of the batch's jobs that `ops::insert_many` will answer with an existing job
/// (an idempotency or unique duplicate), found before anything is inserted: the depth limits
/// count only the jobs a batch adds. Walks the batch in order as the insert does, so a job
/// that is itself a duplicate (and so not inserted) makes no later job its duplicate.
/// `idempotent` says whether a stored job holds an idempotency key.
pub(crate) fn duplicates(
    ctx: &WriteCtx<'_>,
    jobs: &[NewJob],
    idempotent: impl Fn(&str) -> StoreResult<bool>,
) -> StoreResult<HashSet<usize>> {
    let mut duplicates = HashSet::new();
    let mut keys_added: HashSet<&str> = HashSet::new();
    // The initial state of each job the batch adds, by unique key.
    let mut unique_added: HashMap<String, Vec<JobState>> = HashMap::new();
    for (index, job) in jobs.iter().enumerate() {
        if let Some(key) = job.idempotency_key.as_deref() {
            if keys_added.contains(key) || idempotent(key)? {
                duplicates.insert(index);
                continue;
            }
        }
        let mut added_unique_key = None;
        if let Some(spec) = &job.unique {
            let key = unique_key(&job.kind, &job.queue, &job.payload, spec);
            // A job the batch adds was created now, so it is inside any window.
            let in_batch = unique_added
                .get(&key)
                .is_some_and(|states| states.iter().any(|state| spec.blocks_in(*state)));
            if in_batch || existing(ctx, &key, spec)?.is_some() {
                duplicates.insert(index);
                continue;
            }
            added_unique_key = Some(key);
        }
        if let Some(key) = job.idempotency_key.as_deref() {
            keys_added.insert(key);
        }
        if let Some(key) = added_unique_key {
            unique_added
                .entry(key)
                .or_default()
                .push(initial_state(job, ctx.now));
        }
    }
    Ok(duplicates)
}
