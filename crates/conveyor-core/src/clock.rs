//! Time source for stores and maintenance. Injectable so tests can move time instead of sleeping.

use chrono::{DateTime, Duration, TimeZone, Utc};
use std::sync::Mutex;

/// Where "now" comes from. Stores read it once per operation.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;
}

/// The wall clock, truncated to milliseconds (the precision every store keeps).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        truncate_to_millis(Utc::now())
    }
}

/// `at + by`, or the latest time chrono can represent when that is beyond it. Durations come
/// from users (leases, windows, delays, TTLs) and can be absurdly large; plain `+` panics on
/// overflow, which on a store's writer thread would take every later write with it.
pub fn after(at: DateTime<Utc>, by: std::time::Duration) -> DateTime<Utc> {
    Duration::from_std(by)
        .ok()
        .and_then(|by| at.checked_add_signed(by))
        .unwrap_or(DateTime::<Utc>::MAX_UTC)
}

/// `at + by` for a duration given by a caller: a [`ValidationError`] naming `field` when the
/// sum is beyond the calendar, so an absurd lease or delay is refused instead of stored.
pub fn checked_after(
    at: DateTime<Utc>,
    by: std::time::Duration,
    field: &str,
) -> Result<DateTime<Utc>, crate::ValidationError> {
    Duration::from_std(by)
        .ok()
        .and_then(|by| at.checked_add_signed(by))
        .ok_or_else(|| crate::ValidationError::new(field, "is too long"))
}

/// `at - by`, or the Unix epoch when that is before it (nothing Conveyor stores is older).
pub fn before(at: DateTime<Utc>, by: std::time::Duration) -> DateTime<Utc> {
    Duration::from_std(by)
        .ok()
        .and_then(|by| at.checked_sub_signed(by))
        .filter(|t| *t >= DateTime::<Utc>::UNIX_EPOCH)
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

/// A clock that only moves when told to: for tests of leases, delays and backoff.
#[derive(Debug)]
pub struct ManualClock {
    now: Mutex<DateTime<Utc>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> Self {
        Self {
            now: Mutex::new(truncate_to_millis(start)),
        }
    }

    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: std::time::Duration) {
        let step = Duration::from_std(by).unwrap_or(Duration::MAX);
        let mut now = self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *now = now
            .checked_add_signed(step)
            .unwrap_or(DateTime::<Utc>::MAX_UTC);
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new(SystemClock.now())
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self
            .now
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Milliseconds since the Unix epoch: how stores persist timestamps.
pub fn to_millis(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

/// Inverse of [`to_millis`]; out-of-range values clamp to the epoch rather than panic.
pub fn from_millis(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or(DateTime::<Utc>::UNIX_EPOCH)
}

pub fn truncate_to_millis(at: DateTime<Utc>) -> DateTime<Utc> {
    from_millis(to_millis(at))
}
