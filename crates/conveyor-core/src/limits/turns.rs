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
