//! Limits shared by every store: how many of a queue's jobs a fetch may start, which
//! ones (tenants served round-robin, per-key limits), and how a fetch over several weighted
//! queues splits its capacity. The stores read the counts under their claim lock and claim
//! what these functions pick; nothing here does I/O.

pub mod named;
pub mod turns;

pub use named::{Admission, KeyExpr, LimitBook, LimitSpec, LimitUsage};

use chrono::{DateTime, Utc};
use rand::Rng;
use uuid::Uuid;

use crate::error::{StoreError, StoreResult};
use crate::job::QueueSettings;
use std::collections::BTreeMap;

/// Longest rate-limit period accepted (a queue's or a named limit's): a day. Start records are
/// kept this long at most.
pub const MAX_RATE_PERIOD_MS: u64 = 24 * 3600 * 1000;

/// Jobs without a tenant form one more group in the round-robin. They are looked for among
/// this many of the queue's first available jobs in claim order, which bounds the read when
/// a flood of tenanted jobs sits ahead of them (their turn comes as the flood drains).
pub const UNTENANTED_WINDOW: usize = 1024;

/// How many of a queue's jobs a fetch wanting `want` may start now: cut by the queue's free
/// concurrency (`running` jobs now) and its rate budget (`recent_starts` within the rate
/// limit's period).
pub fn queue_quota(
    settings: &QueueSettings,
    want: usize,
    running: u64,
    recent_starts: u64,
) -> usize {
    let mut quota = want as u64;
    if let Some(limit) = settings.concurrency_limit {
        quota = quota.min(limit.saturating_sub(running));
    }
    if let Some(rate) = settings.rate_limit {
        quota = quota.min(rate.count.saturating_sub(recent_starts));
    }
    usize::try_from(quota).unwrap_or(usize::MAX)
}

/// How many more jobs of one key (tenant) may start now under the per-key limits, given its
/// `running` jobs and its `recent_starts` within the per-key rate period.
pub fn key_budget(settings: &QueueSettings, running: u64, recent_starts: u64) -> usize {
    let mut budget = u64::MAX;
    if let Some(limit) = settings.per_key_concurrency_limit {
        budget = budget.min(limit.saturating_sub(running));
    }
    if let Some(rate) = settings.per_key_rate_limit {
        budget = budget.min(rate.count.saturating_sub(recent_starts));
    }
    usize::try_from(budget).unwrap_or(usize::MAX)
}

/// One group of a queue's available jobs: those sharing a round-robin key (a tenant, or the
/// first key of a keyed named limit), or (key `None`) those without one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub key: Option<String>,
    /// The group's first available jobs, in claim order (priority, then run_at, then age).
    pub jobs: Vec<Uuid>,
    /// How many of them may start (per-key limits); `usize::MAX` when unlimited.
    pub budget: usize,
    /// Picks per turn (a named limit's weight for the key; 1 otherwise).
    pub weight: u32,
}

/// What [`round_robin`] picked.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Picked {
    /// Job ids in the order they were picked.
    pub jobs: Vec<Uuid>,
    /// Index of the group that got the last pick: the next fetch starts after it, so the
    /// rotation carries on across fetches rather than restarting at the first tenant.
    pub last_group: Option<usize>,
}

/// Takes jobs from each group in turn, `weight` of them per turn (in the order given: the
/// stores rotate it to start after the group served last), skipping groups that are out of
/// jobs or budget, until `quota` jobs are picked or no group can give more. A tenant with one
/// job therefore waits at most one turn, however many jobs another tenant has queued.
pub fn round_robin(groups: &[Group], quota: usize) -> Picked {
    let mut picked = Picked::default();
    let mut taken = vec![0usize; groups.len()];
    while picked.jobs.len() < quota {
        let before = picked.jobs.len();
        for (index, group) in groups.iter().enumerate() {
            if picked.jobs.len() >= quota {
                break;
            }
            for _ in 0..group.weight.max(1) {
                let next = taken[index];
                if picked.jobs.len() >= quota || next >= group.jobs.len() || next >= group.budget {
                    break;
                }
                picked.jobs.push(group.jobs[next]);
                taken[index] += 1;
                picked.last_group = Some(index);
            }
        }
        if picked.jobs.len() == before {
            break;
        }
    }
    picked
}

/// How many jobs to read per group so that `groups` groups can fill `quota` in one round-robin
/// pass: an even share, at least one.
pub fn per_group_reads(quota: usize, groups: usize) -> usize {
    quota.div_ceil(groups.max(1)).max(1)
}

/// How long a producer refused for a full queue is told to wait before trying again.
pub const QUEUE_FULL_RETRY_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// What a batch adds to one depth-limited queue or tenant, and its limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DepthDemand {
    pub adding: u64,
    pub limit: u64,
}

/// What a batch adds to each depth-limited queue (tenant `None`) and each tenant of a queue with
/// a per-tenant limit. `jobs` are the batch's new jobs (duplicates add nothing: leave them out)
/// as (queue, tenant); `limits` gives a queue's `(max_depth, max_depth_per_tenant)`. Ordered by
/// queue, the whole queue before its tenants, so the refusal reported is the same whatever order
/// the batch came in.
pub fn depth_demand<'a>(
    jobs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    limits: impl Fn(&str) -> Option<(Option<u64>, Option<u64>)>,
) -> BTreeMap<(&'a str, Option<&'a str>), DepthDemand> {
    let mut demand: BTreeMap<(&'a str, Option<&'a str>), DepthDemand> = BTreeMap::new();
    for (queue, tenant) in jobs {
        let Some((max_depth, per_tenant)) = limits(queue) else {
            continue;
        };
        let mut add = |key, limit| {
            demand
                .entry(key)
                .or_insert(DepthDemand { adding: 0, limit })
                .adding += 1;
        };
        if let Some(limit) = max_depth {
            add((queue, None), limit);
        }
        if let (Some(limit), Some(tenant)) = (per_tenant, tenant) {
            add((queue, Some(tenant)), limit);
        }
    }
    demand
}

/// Refuses with `QueueFull` for the first entry of `demand` (in its order) that its current
/// `depth` (unfinished jobs of the queue, or of the tenant in it) would take past its limit.
pub fn depth_verdict<'a>(
    demand: &BTreeMap<(&'a str, Option<&'a str>), DepthDemand>,
    mut depth: impl FnMut(&'a str, Option<&'a str>) -> StoreResult<u64>,
) -> StoreResult<()> {
    for (&(queue, tenant), wanted) in demand {
        let depth = depth(queue, tenant)?;
        if depth.saturating_add(wanted.adding) > wanted.limit {
            return Err(StoreError::QueueFull {
                queue: queue.to_string(),
                tenant: tenant.map(str::to_string),
                depth,
                limit: wanted.limit,
                retry_after: QUEUE_FULL_RETRY_AFTER,
            });
        }
    }
    Ok(())
}

/// Total ids read for one fetch's tenant groups before reads per group are cut to an even share
/// of the quota.
pub const GROUP_READ_BUDGET: usize = 4096;

/// How many jobs to read per group for a round-robin pass over `groups` groups filling `quota`:
/// the whole quota from each while that stays within `GROUP_READ_BUDGET`, else an even share.
pub fn group_reads(quota: usize, groups: usize) -> usize {
    if groups.saturating_mul(quota) <= GROUP_READ_BUDGET {
        quota
    } else {
        per_group_reads(quota, groups)
    }
}

/// The weights of a fetch's queues when they call for weighted sharing: more than one queue and
/// at least one with a weight (the others count 1). `None`: claim in plain claim order.
pub fn fetch_weights(weights: impl IntoIterator<Item = Option<u32>>) -> Option<Vec<u32>> {
    let weights: Vec<Option<u32>> = weights.into_iter().collect();
    (weights.len() > 1 && weights.iter().any(Option::is_some))
        .then(|| weights.iter().map(|w| w.unwrap_or(1)).collect())
}

/// The asks of a fetch over weighted queues, in order: first each queue its share
/// ([`weighted_split`]), then, queue by queue, whatever is still missing from the queues that
/// filled their share (one that gave less has nothing more). A store asks
/// [`WeightedFetch::next_ask`] which queue to read and how many jobs to ask for, claims them,
/// and reports with [`WeightedFetch::record`].
#[derive(Debug)]
pub struct WeightedFetch {
    max: usize,
    shares: Vec<usize>,
    drained: Vec<bool>,
    claimed: usize,
    /// The queue asked next; past the last one in the first pass, the second pass begins.
    cursor: usize,
    second_pass: bool,
    /// The ask waiting for its `record`.
    pending: Option<(usize, usize)>,
}

impl WeightedFetch {
    pub fn new(weights: &[u32], max: usize, rng: &mut impl Rng) -> Self {
        Self {
            max,
            shares: weighted_split(weights, max, rng),
            drained: vec![false; weights.len()],
            claimed: 0,
            cursor: 0,
            second_pass: false,
            pending: None,
        }
    }

    /// The next queue (its index among the weights) and how many jobs to ask it for; `None` once
    /// the fetch is full or every queue was asked what it could give.
    pub fn next_ask(&mut self) -> Option<(usize, usize)> {
        loop {
            if !self.second_pass {
                match self.shares.get(self.cursor) {
                    Some(&share) => {
                        self.cursor += 1;
                        if share > 0 {
                            self.pending = Some((self.cursor - 1, share));
                            return self.pending;
                        }
                        continue;
                    }
                    None => {
                        self.second_pass = true;
                        self.cursor = 0;
                    }
                }
            }
            let left = self.max.saturating_sub(self.claimed);
            if left == 0 || self.cursor >= self.drained.len() {
                return None;
            }
            let queue = self.cursor;
            self.cursor += 1;
            if !self.drained[queue] {
                self.pending = Some((queue, left));
                return self.pending;
            }
        }
    }

    /// What the last ask found (`candidates`) and claimed of them (`claimed`).
    pub fn record(&mut self, candidates: usize, claimed: usize) {
        if let Some((queue, asked)) = self.pending.take() {
            if !self.second_pass {
                self.drained[queue] = candidates < asked;
            }
            self.claimed += claimed;
        }
    }
}

/// Splits a fetch of `max` jobs over queues with the given weights (0 is treated as 1): each
/// gets its whole-number share, and the remainder goes by weighted random draws, so even a
/// fetch of one job serves each queue in proportion to its weight over time.
pub fn weighted_split(weights: &[u32], max: usize, rng: &mut impl Rng) -> Vec<usize> {
    if weights.is_empty() {
        return Vec::new();
    }
    let weights: Vec<u64> = weights.iter().map(|w| u64::from((*w).max(1))).collect();
    let total: u64 = weights.iter().sum();
    let mut shares: Vec<usize> = weights
        .iter()
        .map(|w| usize::try_from(max as u64 * w / total).unwrap_or(0))
        .collect();
    let mut left = max.saturating_sub(shares.iter().sum());
    while left > 0 {
        let mut draw = rng.random_range(0..total);
        for (index, weight) in weights.iter().enumerate() {
            if draw < *weight {
                shares[index] += 1;
                break;
            }
            draw -= weight;
        }
        left -= 1;
    }
    shares
}

/// Orders tenants for a round-robin pass: those after `cursor` (the tenant served last) first,
/// then the rest from the start. `after` holds tenants greater than the cursor in ascending
/// order and `from_start` tenants from the smallest on; duplicates between them are dropped.
/// The group without a tenant, when present, takes its turn after the last tenant.
/// `start_from_first` is true when no tenant was served last (no fetch yet, or the group
/// without a tenant went last): the pass then starts at the first tenant.
/// One round-robin pass over a queue's tenant groups: the [`rotation`], cut to `quota` groups
/// (each gets at least one job per pass, so more cannot be served), and how many jobs to read
/// for each ([`group_reads`]). `cursor` is the group served last: `None` before the first
/// fetch, `Some(None)` for the group without a tenant.
pub fn tenant_pass(
    after: Vec<String>,
    from_start: Vec<String>,
    untenanted: bool,
    cursor: Option<Option<&str>>,
    quota: usize,
    reads: Reads,
) -> (Vec<Option<String>>, usize) {
    let mut order = rotation(
        after,
        from_start,
        untenanted,
        !matches!(cursor, Some(Some(_))),
    );
    order.truncate(quota);
    let reads = match reads {
        Reads::Share => per_group_reads(quota, order.len()),
        Reads::Full => group_reads(quota, order.len()),
    };
    (order, reads)
}

/// Whether a pass (a [`tenant_pass`] order made as if jobs without a group were waiting)
/// reaches the group without one. That group takes its turn after the last key, so a pass over
/// many keys seldom does: the stores read its window of the queue (up to
/// [`UNTENANTED_WINDOW`] rows, most of a keyed fetch's reads when every job has a key) only
/// then, and make the pass again without it when the window holds none.
pub fn ungrouped_turn(order: &[Option<String>]) -> bool {
    order.iter().any(Option::is_none)
}

/// How many jobs a round-robin pass reads per group. A pass first reads an even share of the
/// quota from each group: with many keys each gives one or two, and reading the whole quota
/// from every one (a read per key of jobs never taken) was most of a fetch's cost. Only when
/// that pass comes out short while a group gave all it was asked for ([`read_more`]) is it
/// read again with the whole quota per group, as a pass over few groups needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    Share,
    Full,
}

/// How many jobs to read from a group of `weight` when a pass reads `reads` per group: a
/// weighted group takes `weight` picks a turn, so it is read as many times over (never more
/// than the quota).
pub fn weighted_reads(reads: usize, weight: u32, quota: usize) -> usize {
    reads
        .saturating_mul(usize::try_from(weight.max(1)).unwrap_or(usize::MAX))
        .min(quota)
}

/// Whether a pass read with [`Reads::Share`] (`share` jobs per group, times its weight) should
/// be read again in full: it picked fewer than `quota` while some group gave all it was asked
/// for and may start more.
pub fn read_more(groups: &[Group], picked: &Picked, quota: usize, share: usize) -> bool {
    picked.jobs.len() < quota
        && share < quota
        && groups.iter().any(|group| {
            group.jobs.len() >= weighted_reads(share, group.weight, quota)
                && group.budget > group.jobs.len()
        })
}

pub fn rotation(
    after: Vec<String>,
    from_start: Vec<String>,
    untenanted: bool,
    start_from_first: bool,
) -> Vec<Option<String>> {
    let mut order: Vec<Option<String>> = Vec::with_capacity(after.len() + from_start.len() + 1);
    let wrap = |order: &mut Vec<Option<String>>, from_start: Vec<String>| {
        for tenant in from_start {
            if !order.iter().any(|t| t.as_deref() == Some(tenant.as_str())) {
                order.push(Some(tenant));
            }
        }
    };
    if start_from_first {
        wrap(&mut order, from_start);
        if untenanted {
            order.push(None);
        }
    } else {
        order.extend(after.into_iter().map(Some));
        if untenanted {
            order.push(None);
        }
        wrap(&mut order, from_start);
    }
    order
}

/// Merges per-queue candidate lists into the first `max` by priority (higher first), then
/// run_at, then id, keeping each list's own order: a limited list is in round-robin
/// order, which the merge must not undo. `key` gives (priority, run_at, id) of a candidate.
pub fn merge_in_claim_order<T>(
    lists: Vec<Vec<T>>,
    max: usize,
    key: impl Fn(&T) -> (i32, DateTime<Utc>, Uuid),
) -> Vec<T> {
    let mut lists: Vec<std::collections::VecDeque<T>> = lists.into_iter().map(Into::into).collect();
    let mut merged = Vec::with_capacity(max);
    while merged.len() < max {
        let best = lists
            .iter()
            .enumerate()
            .filter_map(|(index, list)| list.front().map(|item| (index, key(item))))
            .min_by(|(_, a), (_, b)| b.0.cmp(&a.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)))
            .map(|(index, _)| index);
        let Some(item) = best.and_then(|index| lists[index].pop_front()) else {
            break;
        };
        merged.push(item);
    }
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::RateLimit;
    use rand::SeedableRng;

    fn ids(n: usize) -> Vec<Uuid> {
        (0..n).map(|_| Uuid::new_v4()).collect()
    }

    #[test]
    fn quota_is_cut_by_concurrency_and_rate() {
        let mut settings = QueueSettings::default();
        assert_eq!(queue_quota(&settings, 10, 50, 50), 10);
        settings.concurrency_limit = Some(3);
        assert_eq!(queue_quota(&settings, 10, 1, 0), 2);
        assert_eq!(queue_quota(&settings, 10, 5, 0), 0);
        settings.rate_limit = Some(RateLimit {
            count: 20,
            period_ms: 1000,
        });
        settings.concurrency_limit = None;
        assert_eq!(queue_quota(&settings, 100, 0, 15), 5);
        assert_eq!(queue_quota(&settings, 100, 0, 25), 0);
    }

    #[test]
    fn key_budget_takes_the_tighter_limit() {
        let mut settings = QueueSettings::default();
        assert_eq!(key_budget(&settings, 9, 9), usize::MAX);
        settings.per_key_concurrency_limit = Some(2);
        settings.per_key_rate_limit = Some(RateLimit {
            count: 5,
            period_ms: 1000,
        });
        assert_eq!(key_budget(&settings, 1, 0), 1);
        assert_eq!(key_budget(&settings, 0, 4), 1);
        assert_eq!(key_budget(&settings, 0, 7), 0);
    }

    #[test]
    fn round_robin_serves_a_small_tenant_in_the_first_turn() {
        let flood = ids(100);
        let single = ids(1);
        let groups = vec![
            Group {
                key: Some("a".into()),
                jobs: flood.clone(),
                budget: usize::MAX,
                weight: 1,
            },
            Group {
                key: Some("b".into()),
                jobs: single.clone(),
                budget: usize::MAX,
                weight: 1,
            },
        ];
        let picked = round_robin(&groups, 4);
        assert_eq!(picked.jobs, vec![flood[0], single[0], flood[1], flood[2]]);
        assert_eq!(picked.last_group, Some(0));
    }

    #[test]
    fn round_robin_honours_budgets_and_stops_when_nothing_is_left() {
        let a = ids(5);
        let b = ids(5);
        let groups = vec![
            Group {
                key: Some("a".into()),
                jobs: a.clone(),
                budget: 1,
                weight: 1,
            },
            Group {
                key: Some("b".into()),
                jobs: b.clone(),
                budget: 2,
                weight: 1,
            },
        ];
        let picked = round_robin(&groups, 10);
        assert_eq!(picked.jobs, vec![a[0], b[0], b[1]]);
        assert_eq!(picked.last_group, Some(1));
        assert_eq!(round_robin(&[], 5), Picked::default());
    }

    #[test]
    fn round_robin_gives_a_weighted_key_its_weight_per_turn() {
        let (a, b) = (ids(40), ids(40));
        let group = |key: &str, jobs: &[Uuid], weight| Group {
            key: Some(key.into()),
            jobs: jobs.to_vec(),
            budget: usize::MAX,
            weight,
        };
        let picked = round_robin(&[group("a", &a, 3), group("b", &b, 1)], 40);
        let from_a = picked.jobs.iter().filter(|id| a.contains(id)).count();
        assert_eq!(from_a, 30, "3 of every 4 picks");
        assert_eq!(&picked.jobs[..5], &[a[0], a[1], a[2], b[0], a[3]]);
    }

    #[test]
    fn weighted_split_shares_in_proportion() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        assert_eq!(weighted_split(&[3, 1], 8, &mut rng), vec![6, 2]);
        // Single-job fetches: over many, each queue gets its share.
        let mut counts = [0usize; 2];
        for _ in 0..4000 {
            let split = weighted_split(&[3, 1], 1, &mut rng);
            assert_eq!(split.iter().sum::<usize>(), 1);
            counts[0] += split[0];
            counts[1] += split[1];
        }
        assert!((2800..3200).contains(&counts[0]), "{counts:?}");
        assert!(weighted_split(&[], 3, &mut rng).is_empty());
        assert_eq!(
            weighted_split(&[0, 0], 2, &mut rng).iter().sum::<usize>(),
            2
        );
    }

    #[test]
    fn rotation_starts_after_the_cursor_and_wraps() {
        let order = rotation(
            vec!["c".into(), "d".into()],
            vec!["a".into(), "b".into(), "c".into()],
            true,
            false,
        );
        let names: Vec<Option<&str>> = order.iter().map(|t| t.as_deref()).collect();
        assert_eq!(
            names,
            vec![Some("c"), Some("d"), None, Some("a"), Some("b")]
        );
        let order = rotation(Vec::new(), vec!["a".into()], true, true);
        assert_eq!(order, vec![Some("a".to_string()), None]);
    }

    #[test]
    fn merge_keeps_list_order_and_prefers_priority() {
        let t = DateTime::<Utc>::UNIX_EPOCH;
        let a = ids(3);
        let b = ids(1);
        // List one is round-robin ordered (not sorted); list two has a higher priority job.
        let one = vec![(0, a[0]), (0, a[1]), (0, a[2])];
        let two = vec![(5, b[0])];
        let merged = merge_in_claim_order(vec![one, two], 3, |(p, id)| (*p, t, *id));
        assert_eq!(merged, vec![(5, b[0]), (0, a[0]), (0, a[1])]);
    }

    #[test]
    fn a_tenant_pass_serves_at_most_quota_groups_from_after_the_cursor() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let (order, reads) = tenant_pass(
            names(&["c", "d"]),
            names(&["a", "b"]),
            true,
            Some(Some("b")),
            3,
            Reads::Full,
        );
        assert_eq!(order, vec![Some("c".into()), Some("d".into()), None]);
        assert_eq!(reads, 3);
        // No fetch yet: from the first tenant.
        let (order, reads) = tenant_pass(
            Vec::new(),
            names(&["a", "b"]),
            false,
            None,
            10,
            Reads::Share,
        );
        assert_eq!(order, vec![Some("a".into()), Some("b".into())]);
        assert_eq!(reads, 5, "an even share of the quota");
    }

    #[test]
    fn a_short_pass_over_even_shares_is_read_again_in_full() {
        let group = |key: &str, jobs: usize, budget: usize| Group {
            key: Some(key.into()),
            jobs: ids(jobs),
            budget,
            weight: 1,
        };
        // Two keys, a quota of 10, five read from each: one had only two.
        let groups = vec![group("a", 5, usize::MAX), group("b", 2, usize::MAX)];
        let picked = round_robin(&groups, 10);
        assert_eq!(picked.jobs.len(), 7);
        assert!(read_more(&groups, &picked, 10, 5), "a may hold more");
        // The same, but a may start no more than it gave.
        let groups = vec![group("a", 5, 5), group("b", 2, usize::MAX)];
        assert!(!read_more(&groups, &round_robin(&groups, 10), 10, 5));
        // Full: nothing to read again.
        let groups = vec![group("a", 5, usize::MAX), group("b", 5, usize::MAX)];
        assert!(!read_more(&groups, &round_robin(&groups, 10), 10, 5));
    }

    #[test]
    fn depth_limits_refuse_the_first_full_queue_or_tenant_in_a_fixed_order() {
        let limits = |queue: &str| match queue {
            "a" => Some((Some(3), Some(1))),
            "b" => Some((Some(10), None)),
            _ => None,
        };
        let batch = [
            ("b", None),
            ("a", Some("t2")),
            ("a", Some("t1")),
            ("c", None),
            ("a", Some("t1")),
        ];
        let demand = depth_demand(batch, limits);
        let keys: Vec<_> = demand.keys().copied().collect();
        assert_eq!(
            keys,
            vec![
                ("a", None),
                ("a", Some("t1")),
                ("a", Some("t2")),
                ("b", None)
            ]
        );
        assert_eq!(
            demand[&("a", None)],
            DepthDemand {
                adding: 3,
                limit: 3
            }
        );
        // The queue has room; tenant t1 (2 new, limit 1) is the first refusal, whichever the
        // batch order, and t2 is never counted.
        let mut asked = Vec::new();
        let verdict = depth_verdict(&demand, |queue, tenant| {
            asked.push((queue, tenant));
            Ok(0)
        });
        match verdict {
            Err(StoreError::QueueFull {
                queue,
                tenant,
                depth,
                limit,
                ..
            }) => {
                assert_eq!(
                    (queue.as_str(), tenant.as_deref(), depth, limit),
                    ("a", Some("t1"), 0, 1)
                );
            }
            other => panic!("expected QueueFull, got {other:?}"),
        }
        assert_eq!(asked, vec![("a", None), ("a", Some("t1"))]);
        // Room everywhere.
        let demand = depth_demand([("a", None), ("b", None)], limits);
        assert!(depth_verdict(&demand, |_, _| Ok(2)).is_ok());
    }

    #[test]
    fn group_reads_take_the_whole_quota_within_the_budget() {
        assert_eq!(group_reads(100, 40), 100);
        assert_eq!(group_reads(100, 41), 3);
        assert_eq!(group_reads(5000, 1), 5000, "one group: no cut");
        assert_eq!(group_reads(5000, 2), 2500);
    }

    #[test]
    fn weights_apply_only_to_several_queues_with_one_weighted() {
        assert_eq!(fetch_weights([Some(3)].into_iter()), None);
        assert_eq!(fetch_weights([None, None].into_iter()), None);
        assert_eq!(fetch_weights([Some(3), None].into_iter()), Some(vec![3, 1]));
    }

    /// Runs a weighted fetch against queues holding `available` jobs each.
    fn run_weighted(
        weights: &[u32],
        max: usize,
        available: &[usize],
    ) -> (Vec<(usize, usize)>, Vec<usize>) {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut plan = WeightedFetch::new(weights, max, &mut rng);
        let mut left = available.to_vec();
        let mut asks = Vec::new();
        let mut got = vec![0; available.len()];
        while let Some((queue, ask)) = plan.next_ask() {
            asks.push((queue, ask));
            let found = ask.min(left[queue]);
            left[queue] -= found;
            got[queue] += found;
            plan.record(found, found);
        }
        (asks, got)
    }

    #[test]
    fn a_weighted_fetch_gives_each_queue_its_share_then_fills_from_the_others() {
        // Plenty everywhere: the shares alone fill it, 3:1.
        let (asks, got) = run_weighted(&[3, 1], 100, &[1000, 1000]);
        assert_eq!(asks, vec![(0, 75), (1, 25)]);
        assert_eq!(got, vec![75, 25]);
        // The heavy queue runs short: the light one gives what is missing.
        let (asks, got) = run_weighted(&[3, 1], 100, &[10, 1000]);
        assert_eq!(asks, vec![(0, 75), (1, 25), (1, 65)]);
        assert_eq!(got, vec![10, 90]);
        // Both short: each asked once more only if it filled its share.
        let (_, got) = run_weighted(&[1, 1], 100, &[10, 20]);
        assert_eq!(got, vec![10, 20]);
        // Nothing anywhere: one ask each, no second pass.
        let (asks, _) = run_weighted(&[1, 1, 1], 9, &[0, 0, 0]);
        assert_eq!(asks.len(), 3);
    }

    #[test]
    fn per_group_reads_is_an_even_share() {
        assert_eq!(per_group_reads(100, 2), 50);
        assert_eq!(per_group_reads(3, 10), 1);
        assert_eq!(per_group_reads(5, 0), 5);
    }
}
