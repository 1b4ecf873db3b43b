//! Time source for stores and maintenance. Injectable so tests can move time instead of sleeping.

use chrono::{DateTime, Duration, TimeZone, Utc};
use std::sync::Mutex;

/// Where "now" comes from. Stores read it once per operation.
pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> DateTime<Utc>;

    /// Whether this is the process's own wall clock ([`SystemClock`]). A store that several
    /// processes share replaces that clock with one they all agree on (PostgreSQL: the database
    /// server's), since each machine's wall clock is off by its own error; a clock given on
    /// purpose (a test's [`ManualClock`]) is kept.
    fn is_system(&self) -> bool {
        false
    }
}

/// The wall clock, truncated to milliseconds (the precision every store keeps).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        truncate_to_millis(Utc::now())
    }

    fn is_system(&self) -> bool {
        true
    }
}

/// Time since an arbitrary origin on a clock that no step of the wall clock moves (an operator's
/// `date -s`, NTP stepping, `faketime`) and that keeps counting while the machine is suspended:
/// Linux's `CLOCK_BOOTTIME`, elsewhere the monotonic clock behind [`std::time::Instant`] (which
/// stops during a suspend).
pub fn steady() -> std::time::Duration {
    #[cfg(target_os = "linux")]
    {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime only writes the timespec it is given, which lives on this stack.
        if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } == 0 {
            return std::time::Duration::new(now.tv_sec.max(0) as u64, now.tv_nsec.max(0) as u32);
        }
    }
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

/// A wall time read from elsewhere (the database server's clock) at a known [`steady`] instant,
/// carried forward on [`steady`]: this process's own wall clock, whatever its error or its steps,
/// never enters. Re-anchored with each new reading.
#[derive(Debug)]
pub struct AnchoredClock {
    anchor: Mutex<(DateTime<Utc>, std::time::Duration)>,
}

impl AnchoredClock {
    /// `at` was the time at [`steady`] instant `read_at`.
    pub fn new(at: DateTime<Utc>, read_at: std::time::Duration) -> Self {
        Self {
            anchor: Mutex::new((at, read_at)),
        }
    }

    /// A newer reading replaces the anchor.
    pub fn set(&self, at: DateTime<Utc>, read_at: std::time::Duration) {
        *self
            .anchor
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = (at, read_at);
    }
}

impl Clock for AnchoredClock {
    fn now(&self) -> DateTime<Utc> {
        let (at, read_at) = *self
            .anchor
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        truncate_to_millis(after(at, steady().saturating_sub(read_at)))
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

/// `at + by` for a duration given by a caller: a [`crate::ValidationError`] naming `field` when the
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

/// Steps of a wall clock: how far it jumped since the last look, beyond what the [`steady`]
/// clock says passed. A store whose deadlines are wall times (SQLite's leases) moves the
/// deadlines that stand for durations by the step, so a step neither expires live leases nor
/// keeps dead ones; wall times users gave (a `run_at`, a cron tick) stay where they were.
#[derive(Debug)]
pub struct WallSteps {
    last: Option<(DateTime<Utc>, std::time::Duration)>,
    threshold: Duration,
}

impl WallSteps {
    /// Differences up to `threshold` are taken as the two clocks' ordinary disagreement (NTP
    /// slewing, scheduling between the two readings), not a step.
    pub fn new(threshold: std::time::Duration) -> Self {
        Self {
            last: None,
            threshold: Duration::from_std(threshold).unwrap_or(Duration::MAX),
        }
    }

    /// Looks at the wall clock's `now`: the step since the last look, if it passes the threshold.
    pub fn look(&mut self, now: DateTime<Utc>) -> Option<Duration> {
        let steady_now = steady();
        let step = self.last.and_then(|(wall, steady_then)| {
            let passed = Duration::from_std(steady_now.saturating_sub(steady_then)).ok()?;
            let step = now.signed_duration_since(wall) - passed;
            (step.abs() > self.threshold).then_some(step)
        });
        self.last = Some((now, steady_now));
        step
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An anchored clock carries its reading forward on the steady clock, whatever this
    /// machine's wall clock says: anchored an hour ahead, it stays an hour ahead and moves on.
    #[test]
    fn an_anchored_clock_moves_on_from_its_reading_not_from_the_wall_clock() {
        let hour = Duration::hours(1);
        let clock = AnchoredClock::new(Utc::now() + hour, steady());
        let first = clock.now();
        assert!((first - Utc::now() - hour).num_milliseconds().abs() < 1_000);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let later = clock.now();
        assert!(
            later - first >= Duration::milliseconds(20),
            "{first} -> {later}"
        );
        clock.set(Utc::now() - hour, steady());
        assert!((clock.now() - Utc::now() + hour).num_milliseconds().abs() < 1_000);
        assert!(SystemClock.is_system() && !clock.is_system());
    }

    #[test]
    fn wall_steps_are_seen_beyond_the_threshold_and_only_once() {
        let mut steps = WallSteps::new(std::time::Duration::from_secs(1));
        let start = Utc::now();
        assert_eq!(
            steps.look(start),
            None,
            "nothing to compare the first look with"
        );
        assert_eq!(steps.look(start + Duration::milliseconds(300)), None);
        let step = steps
            .look(start + Duration::hours(1))
            .expect("an hour forward is a step");
        assert!(
            (step - Duration::hours(1)).num_milliseconds().abs() < 1_000,
            "{step}"
        );
        assert_eq!(steps.look(start + Duration::hours(1)), None, "seen once");
        let back = steps.look(start).expect("an hour back is a step");
        assert!(
            (back + Duration::hours(1)).num_milliseconds().abs() < 1_000,
            "{back}"
        );
    }
}
