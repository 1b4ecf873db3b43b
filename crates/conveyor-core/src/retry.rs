//! Exponential backoff with jitter and a cap.

use chrono::{DateTime, Utc};
use rand::Rng;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// `delay(attempt) = min(base * factor^(attempt-1), max)`, then scaled by a random factor in
/// `[1 - jitter, 1 + jitter]` so that jobs failing together do not retry in lockstep.
///
/// Defaults: base 1 s, factor 2, cap 1 h, jitter ±20 %. With the default 25 attempts a job keeps
/// retrying for roughly 20 hours before it reaches the dead-letter queue.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RetryPolicy {
    pub base_ms: u64,
    pub factor: f64,
    pub max_ms: u64,
    /// Fraction of the delay, 0.0..=1.0.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            base_ms: 1_000,
            factor: 2.0,
            max_ms: 3_600_000,
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// A policy without randomness: for tests and for users who need predictable schedules.
    pub fn fixed_exponential(base: Duration, max: Duration) -> Self {
        Self {
            base_ms: base.as_millis() as u64,
            factor: 2.0,
            max_ms: max.as_millis() as u64,
            jitter: 0.0,
        }
    }

    /// The delay before the next attempt, after `attempt` attempts have failed (1-based).
    pub fn delay(&self, attempt: u32) -> Duration {
        let exponent = attempt.saturating_sub(1).min(64) as i32;
        let raw = self.base_ms as f64 * self.factor.max(1.0).powi(exponent);
        let capped = raw.min(self.max_ms as f64);
        let jitter = self.jitter.clamp(0.0, 1.0);
        let scaled = if jitter > 0.0 {
            capped * rand::rng().random_range((1.0 - jitter)..=(1.0 + jitter))
        } else {
            capped
        };
        Duration::from_millis(scaled.max(0.0) as u64)
    }

    pub fn next_run_at(&self, now: DateTime<Utc>, attempt: u32) -> DateTime<Utc> {
        crate::clock::after(now, self.delay(attempt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_exponentially_and_stops_at_the_cap() {
        let policy =
            RetryPolicy::fixed_exponential(Duration::from_secs(1), Duration::from_secs(10));
        assert_eq!(policy.delay(1), Duration::from_secs(1));
        assert_eq!(policy.delay(2), Duration::from_secs(2));
        assert_eq!(policy.delay(4), Duration::from_secs(8));
        assert_eq!(policy.delay(5), Duration::from_secs(10));
        assert_eq!(policy.delay(60), Duration::from_secs(10));
    }

    #[test]
    fn jitter_stays_within_its_band_and_varies() {
        let policy = RetryPolicy::default();
        let delays: Vec<u128> = (0..200).map(|_| policy.delay(3).as_millis()).collect();
        assert!(
            delays.iter().all(|d| (3_200..=4_800).contains(d)),
            "{delays:?}"
        );
        assert!(
            delays.iter().any(|d| *d != delays[0]),
            "jitter produced no variation"
        );
    }
}
