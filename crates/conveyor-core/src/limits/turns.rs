//! Turns by key: the order in which the keys of a keyed limit take their turns, given to each
//! job as a number when it becomes available, so that a store can keep its fair index in that
//! order and read a pass over many keys as one range instead of a seek per key
//! (docs/plans/flow-control-by-key.md, "Turns instead of a rotation").
//!
//! A key's jobs get consecutive turns in the order they become available, `weight` jobs per
//! turn. A key that arrives late, or comes back after running dry, joins the first turn not yet
//! started (the one after `served`, the highest turn claimed so far in the queue) instead of
//! starting from its own old numbers, which would put it ahead of every other key until it
//! caught up, or at the turn being served, which the keys served in it already had. Reading
//! the available jobs in (turn, key) order then serves each key once per turn, as a rotation
//! over the keys does, and a key with one job waits at most one turn.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};

use super::named::Admission;

/// What a key has been given: the turn its next job gets, and how many jobs already have that
/// turn (fewer than the key's weight).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyTurns {
    pub next: u64,
    pub given: u32,
}

impl KeyTurns {
    /// Whether the key's record says nothing that `served` does not: a key whose next turn
    /// has been served is given the one after `served` anyway, so its record can be dropped.
    pub fn stale(&self, served: u64) -> bool {
        self.next <= served
    }
}

/// The turn of a key's next job, and what the key has been given after it. `key` is the key's
/// record (`None` for a key never seen, or dropped as [`KeyTurns::stale`]), `served` the
/// highest turn claimed in its queue (0 before any), `weight` the key's jobs per turn (at
/// least one).
pub fn next_turn(served: u64, key: Option<KeyTurns>, weight: u32) -> (u64, KeyTurns) {
    let weight = weight.max(1);
    let key = match key {
        Some(key) if !key.stale(served) => key,
        // Joins the first turn not started, with none of it used.
        _ => KeyTurns {
            next: served.saturating_add(1),
            given: 0,
        },
    };
    let turn = key.next;
    let given = key.given.saturating_add(1);
    let after = if given >= weight {
        KeyTurns {
            next: turn.saturating_add(1),
            given: 0,
        }
    } else {
        KeyTurns { next: turn, given }
    };
    (turn, after)
}

/// The turn served in a queue after a claim: the highest of what it was and the turns of the
/// jobs just claimed. It only moves forward, so a late key never joins behind a turn already
/// started.
pub fn served(current: u64, claimed: impl IntoIterator<Item = u64>) -> u64 {
    claimed.into_iter().fold(current, u64::max)
}

/// How many jobs a claim passes over (their keys out of room) before it reads the range again
/// with those keys left out ([`Picking::reread`]), so a key with many jobs and little room
/// costs a bounded read.
pub const SKIPS_BEFORE_REREAD: usize = 32;

/// A claim's pick from the keyed jobs read in turn order: a job is taken when every key it
/// holds has room left under the claim's admission, counting the jobs taken before it. A key
/// found with no room at all counts once as held back (`Admission::budget`), as the
/// `conveyor_limit_throttled_total` metric says.
#[derive(Debug)]
pub struct Picking<'p, 'a> {
    admission: &'p Admission<'a>,
    quota: usize,
    taken: HashMap<String, u64>,
    /// Keys found with no room before this claim took any.
    passed: HashSet<String>,
    picked: usize,
    skipped: usize,
}

impl<'p, 'a> Picking<'p, 'a> {
    pub fn new(admission: &'p Admission<'a>, quota: usize) -> Self {
        Self {
            admission,
            quota,
            taken: HashMap::new(),
            passed: HashSet::new(),
            picked: 0,
            skipped: 0,
        }
    }

    /// Whether the pick has its quota.
    pub fn done(&self) -> bool {
        self.picked >= self.quota
    }

    /// Takes a job holding `keys` if they all have room, counting it against each.
    pub fn offer(&mut self, keys: &[String]) -> bool {
        let fits = keys
            .iter()
            .all(|key| self.taken.get(key).copied().unwrap_or(0) < self.admission.room(key));
        if !fits {
            self.skipped += 1;
            for key in keys {
                if self.admission.room(key) == 0 && self.passed.insert(key.clone()) {
                    self.admission.budget(key);
                }
            }
            return false;
        }
        for key in keys {
            *self.taken.entry(key.clone()).or_insert(0) += 1;
        }
        self.picked += 1;
        true
    }

    /// After [`SKIPS_BEFORE_REREAD`] jobs passed over since the last read: the keys this pick
    /// used up or found without room that `full` (the keys the read leaves out) lacks, added
    /// to it, so the caller reads again; `false` when there are none (read on).
    pub fn reread(&mut self, full: &mut BTreeSet<String>) -> bool {
        if self.skipped < SKIPS_BEFORE_REREAD {
            return false;
        }
        self.skipped = 0;
        let before = full.len();
        let admission = self.admission;
        full.extend(
            (self.taken.iter())
                .filter(|(key, taken)| **taken >= admission.room(key))
                .map(|(key, _)| key.clone())
                .chain(self.passed.iter().cloned()),
        );
        full.len() > before
    }
}

/// How many jobs without a key a keyed claim reads: one for each turn its keyed candidates
/// finish (the turn those jobs take among the keys, at its end), or the whole quota when the
/// keyed ones fall short. `turns` are the keyed candidates' (priority, turn), in pick order.
/// A claim within one turn reads none: over many keys most claims are.
pub fn unkeyed_share(turns: &[(i32, u64)], quota: usize) -> usize {
    if turns.len() < quota {
        return quota;
    }
    turns.iter().collect::<HashSet<_>>().len().saturating_sub(1)
}

/// The keyed candidates (`keyed`, each with its (priority, turn), in turn order) with the jobs
/// without a key between their turns, one at the end of each turn, cut to `quota`; when the
/// keyed ones fall short of the quota, the unkeyed ones fill it.
pub fn with_unkeyed<T>(keyed: Vec<(T, (i32, u64))>, unkeyed: Vec<T>, quota: usize) -> Vec<T> {
    let short = keyed.len() < quota;
    let mut unkeyed = unkeyed.into_iter();
    let mut merged = Vec::with_capacity(quota);
    let mut previous = None;
    for (job, turn) in keyed {
        if previous.is_some_and(|previous| previous != turn) {
            merged.extend(unkeyed.next());
        }
        if merged.len() >= quota {
            break;
        }
        merged.push(job);
        previous = Some(turn);
    }
    if short {
        merged.extend(unkeyed.take(quota.saturating_sub(merged.len())));
    }
    merged.truncate(quota);
    merged
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Gives turns to `jobs` (their keys, in the order they become available) and returns the
    /// keys in (turn, key, arrival) order: the order a pass reads them in.
    fn order(jobs: &[&'static str], served: u64, weights: &[(&str, u32)]) -> Vec<&'static str> {
        let weights: BTreeMap<&str, u32> = weights.iter().copied().collect();
        let mut keys: BTreeMap<&str, KeyTurns> = BTreeMap::new();
        let mut turned: Vec<(u64, &str, usize)> = Vec::new();
        for (arrival, key) in jobs.iter().enumerate() {
            let weight = weights.get(key).copied().unwrap_or(1);
            let (turn, after) = next_turn(served, keys.get(key).copied(), weight);
            keys.insert(key, after);
            turned.push((turn, key, arrival));
        }
        turned.sort();
        turned.into_iter().map(|(_, key, _)| key).collect()
    }

    #[test]
    fn keys_take_one_job_each_per_turn() {
        let jobs = ["a", "a", "a", "a", "b", "c", "c"];
        assert_eq!(order(&jobs, 0, &[]), ["a", "b", "c", "a", "c", "a", "a"]);
    }

    #[test]
    fn a_weighted_key_takes_its_weight_per_turn() {
        let jobs = ["a", "a", "a", "a", "a", "a", "b", "b", "b"];
        assert_eq!(
            order(&jobs, 0, &[("a", 3)]),
            ["a", "a", "a", "b", "a", "a", "a", "b", "b"]
        );
    }

    #[test]
    fn a_flood_does_not_delay_a_key_with_one_job_beyond_one_turn() {
        let mut jobs = vec!["flood"; 10_000];
        jobs.push("one");
        let served = order(&jobs, 0, &[]);
        let position = served.iter().position(|key| *key == "one");
        assert_eq!(position, Some(1), "second, right after the flood's first");
    }

    #[test]
    fn a_late_key_joins_the_first_turn_not_started() {
        // "a" was given turns 1..=100 earlier; turns up to 40 have been claimed.
        let mut a = None;
        for _ in 0..100 {
            a = Some(next_turn(0, a, 1).1);
        }
        let (late, _) = next_turn(40, None, 1);
        assert_eq!(
            late, 41,
            "not 1, ahead of every waiting key, nor 40, which the others had"
        );
        let (back, after) = next_turn(40, a, 1);
        assert_eq!((back, after.next), (101, 102), "a key keeps its own line");
    }

    #[test]
    fn a_key_back_after_running_dry_starts_after_the_turn_served() {
        let old = KeyTurns { next: 5, given: 0 };
        assert!(old.stale(40));
        assert!(old.stale(5));
        assert!(!old.stale(4));
        assert_eq!(next_turn(40, Some(old), 1).0, 41);
    }

    #[test]
    fn the_turn_served_only_moves_forward() {
        assert_eq!(served(10, [3, 12, 7]), 12);
        assert_eq!(served(10, [3, 7]), 10);
        assert_eq!(served(10, []), 10);
    }

    #[test]
    fn jobs_without_a_key_take_a_turn_at_the_end_of_each() {
        let keyed = vec![("a", (0, 1)), ("b", (0, 1)), ("a", (0, 2)), ("b", (0, 2))];
        let turns = [(0, 1), (0, 1), (0, 2), (0, 2)];
        assert_eq!(
            unkeyed_share(&turns, 4),
            1,
            "the first turn ends, the second may not"
        );
        assert_eq!(unkeyed_share(&turns[..2], 2), 0, "within one turn: none");
        let merged = with_unkeyed(keyed.clone(), vec!["-"], 4);
        assert_eq!(merged, ["a", "b", "-", "a"], "cut to the quota");
        let merged = with_unkeyed(keyed, vec!["-", "-", "-"], 10);
        assert_eq!(
            merged,
            ["a", "b", "-", "a", "b", "-", "-"],
            "short: the rest"
        );
        assert_eq!(unkeyed_share(&[], 5), 5);
        assert_eq!(with_unkeyed(Vec::new(), vec!["-"; 9], 5).len(), 5);
    }

    #[test]
    fn a_pick_takes_what_has_room_and_rereads_without_used_up_keys() {
        use crate::limits::named::{LimitSpec, LimitUsage};
        use std::collections::BTreeMap;
        let mut spec: LimitSpec =
            serde_json::from_value(serde_json::json!({"concurrency": 2})).expect("spec");
        spec.name = "c".into();
        let specs = BTreeMap::from([("c".to_string(), spec)]);
        let usage = LimitUsage::default();
        let admission = Admission::new(&specs, &usage);
        let mut picking = Picking::new(&admission, 5);
        let a = vec!["c:a".to_string()];
        let b = vec!["c:b".to_string()];
        assert!(picking.offer(&a) && picking.offer(&a));
        assert!(!picking.offer(&a), "room for two");
        assert!(picking.offer(&b));
        let mut full = BTreeSet::new();
        assert!(!picking.reread(&mut full), "not after one skip");
        for _ in 1..SKIPS_BEFORE_REREAD {
            picking.offer(&a);
        }
        assert!(picking.reread(&mut full));
        assert_eq!(full.into_iter().collect::<Vec<_>>(), ["c:a"]);
        assert!(picking.offer(&b), "b has room for a second");
        assert!(!picking.offer(&b));
        assert!(!picking.done(), "three of five");
    }

    #[test]
    fn turns_saturate_instead_of_wrapping() {
        let full = KeyTurns {
            next: u64::MAX,
            given: 0,
        };
        let (turn, after) = next_turn(0, Some(full), 1);
        assert_eq!((turn, after.next), (u64::MAX, u64::MAX));
        assert_eq!(next_turn(u64::MAX, None, 1).0, u64::MAX);
        assert_eq!(next_turn(0, None, 0).1.next, 2, "a weight of 0 counts as 1");
    }
}
