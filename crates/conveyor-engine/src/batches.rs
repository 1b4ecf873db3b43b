//! Batch fetches (see [`conveyor_core::batch`]): a plain fetch never claims a batch kind's
//! jobs, and a batch fetch claims the first ready group of one kind, one queue and one key.
//!
//! A batch is claimed through the ordinary fetch narrowed to its queue and kind, so limits,
//! breakers, expiry and fairness hold for its jobs as for any. With a key, the claim takes jobs
//! in claim order up to the group's last, and gives back (released, the attempt not counted)
//! those of other keys claimed with them.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};

use conveyor_core::batch::{readiness, BatchSpec, Pick, MAX_BATCH_SIZE};
use conveyor_core::job::Job;
use conveyor_core::store::{FetchParams, Store, StoreResult};
use conveyor_core::validate::Valid;

use crate::breakers::CircuitBreakers;

/// Most jobs a keyed batch's claim takes to reach its group's jobs (the rest go back).
const MAX_KEYED_CLAIM: usize = 4 * MAX_BATCH_SIZE as usize;

/// Most ready groups one look tries to claim (the first ones may be held by limits).
const MAX_GROUPS_TRIED: usize = 8;

/// Most (kind, queue) pairs one look reads: a fetch may name 256 of each.
const MAX_GROUPS_READ: usize = 256;

/// What one look of a fetch found (a plain fetch fills in `jobs` only).
#[derive(Debug, Default)]
pub struct Look {
    /// The jobs claimed: for a batch fetch one batch, empty when no group was ready (or
    /// another fetch took it first).
    pub jobs: Vec<Job>,
    /// When the earliest waiting group that was not ready becomes ready.
    pub ready_at: Option<DateTime<Utc>>,
    /// Jobs of other keys claimed on the way to a keyed batch and given back. Giving back
    /// wakes waiting fetches, this one too: the long-poll listens afresh after such a look,
    /// so it does not look again for its own wake-up.
    pub gave_back: usize,
}

/// A plain fetch, narrowed so that it claims no job of a batch kind.
pub fn without_batch_kinds(
    params: Valid<FetchParams>,
    batches: &BTreeMap<String, BatchSpec>,
) -> Valid<FetchParams> {
    if batches.is_empty() {
        return params;
    }
    params.narrowed(|plain| plain.excluded_kinds.extend(batches.keys().cloned()))
}

/// Claims one batch: among the kinds `params` names (every batch kind when it names none) and
/// its queues, the ready group whose oldest job has waited longest. A kind the fetch names
/// that is not a batch kind goes out as soon as any job waits, up to the fetch's `max`.
pub async fn claim_batch(
    store: &dyn Store,
    breakers: Option<&CircuitBreakers>,
    batches: &BTreeMap<String, BatchSpec>,
    params: &Valid<FetchParams>,
) -> StoreResult<Look> {
    let most = u32::try_from(params.max)
        .unwrap_or(MAX_BATCH_SIZE)
        .clamp(1, MAX_BATCH_SIZE);
    let kinds: Vec<(String, BatchSpec)> = match &params.kinds {
        Some(kinds) => kinds
            .iter()
            .map(|kind| {
                let spec = batches
                    .get(kind)
                    .cloned()
                    .unwrap_or_else(|| BatchSpec::of(most));
                (kind.clone(), spec)
            })
            .collect(),
        None => batches
            .iter()
            .filter(|(kind, _)| !params.excluded_kinds.contains(kind))
            .map(|(kind, spec)| (kind.clone(), spec.clone()))
            .collect(),
    };
    let now = store.clock().now();
    let mut look = Look::default();
    // Every ready group: (group, its queue, its kind's place in `kinds`).
    let mut ready: Vec<(Pick, &str, usize)> = Vec::new();
    // Collected first: the reads below await, and a borrowing iterator held across them
    // would not be `Send`.
    let mut pairs: Vec<(usize, &str, &BatchSpec, &str)> = Vec::new();
    for (place, (kind, spec)) in kinds.iter().enumerate() {
        for queue in &params.queues {
            pairs.push((place, kind.as_str(), spec, queue.as_str()));
        }
    }
    pairs.truncate(MAX_GROUPS_READ);
    for (place, kind, spec, queue) in pairs {
        let waiting = store
            .jobs_available_of_kind(queue, kind, spec.peek())
            .await?;
        let found = readiness(spec, &waiting, now);
        if let Some(at) = found.not_before {
            look.ready_at = Some(look.ready_at.map_or(at, |was| was.min(at)));
        }
        ready.extend(found.ready.into_iter().map(|pick| (pick, queue, place)));
    }
    // The group whose oldest job has waited longest goes first. When a limit or a breaker
    // holds its jobs back, the next one is tried, so one held group does not hold every other.
    ready.sort_by_key(|(pick, ..)| pick.oldest);
    for (pick, queue, place) in ready.into_iter().take(MAX_GROUPS_TRIED) {
        let (kind, spec) = &kinds[place];
        let size = spec.max_size.min(most) as usize;
        let claim = match spec.key {
            None => size,
            Some(_) => pick.claim.clamp(size, MAX_KEYED_CLAIM),
        };
        let narrowed = params.clone().narrowed(|batch| {
            batch.queues = vec![queue.to_string()];
            batch.kinds = Some(vec![kind.clone()]);
            batch.max = claim;
        });
        if narrowed.claims_nothing() {
            continue;
        }
        let claimed = match breakers {
            Some(breakers) => breakers.fetch(narrowed).await?,
            None => store.jobs_fetch_valid(narrowed).await?,
        };
        let (mut batch, mut others): (Vec<Job>, Vec<Job>) = match spec.key_expr() {
            None => (claimed, Vec::new()),
            Some(key) => claimed
                .into_iter()
                .partition(|job| key.value_of_stored(job) == pick.key),
        };
        if batch.len() > size {
            others.extend(batch.split_off(size));
        }
        if !others.is_empty() {
            look.gave_back += others.len();
            let leases = others.iter().filter_map(Job::lease_ref).collect();
            // The batch is claimed: it goes out even if giving the others back fails (their
            // leases then expire and they are rescued).
            if let Err(error) = store.jobs_release_many(leases).await {
                tracing::warn!(%error, jobs = others.len(),
                    "jobs of other keys claimed for a batch could not be given back");
            }
        }
        if !batch.is_empty() {
            look.jobs = batch;
            return Ok(look);
        }
    }
    Ok(look)
}
