//! Circuit breakers per queue and per job kind: when too many of a scope's recent attempts
//! fail, no job of that scope is handed out for a while (its jobs stay queued and enqueues go
//! on), then a few probe jobs decide whether it closes again.
//!
//! The rules live here once; stores only keep each breaker's record ([`BreakerStore`]) and
//! change it conditionally on its version, so a transition made by one node is the one every
//! node sees. A `conveyor_engine::CircuitBreakers` in each fetching process (the server's fetch, a
//! `conveyor-worker` worker) gates its fetches and reports the attempts it sees finish:
//!
//! - **closed**: attempts are counted over a sliding window of `window_ms` (two fixed windows,
//!   the previous one weighted by how much of it still overlaps). At least `min_calls` with a
//!   failed share of at least `failure_ratio` opens it.
//! - **open**: fetches skip the scope until `open_ms` has passed, then it is half-open.
//! - **half-open**: at most `half_open_calls` probe jobs are handed out across the cluster;
//!   that many successes close it, one failure opens it again. Probes that never report (a
//!   worker died) are given up on after `window_ms` and new ones are handed out.
//!
//! Operators open and close a breaker by hand (open for a while or until closed), and a
//! handler's `retry_after` (a dependency's 429) pauses its kind until then when the kind's
//! breaker has `pause_on_retry_after`.
//!
//! Counting happens off the job path: outcomes are added up in memory and written by a
//! background task, one conditional update per breaker for everything that piled up since
//! the last write. Only scopes with a breaker (configured or not closed) are counted at all.

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{StoreResult, ValidationError};
use crate::valid::Valid;

/// What a breaker guards: one queue, or one job kind in every queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerScope {
    Queue,
    Kind,
}

impl BreakerScope {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerScope::Queue => "queue",
            BreakerScope::Kind => "kind",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "queue" => Some(BreakerScope::Queue),
            "kind" => Some(BreakerScope::Kind),
            _ => None,
        }
    }
}

/// A breaker's configuration, part of a queue's or a kind's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BreakerSettings {
    /// Opens when at least this share of the window's attempts failed (0 < r ≤ 1).
    pub failure_ratio: f64,
    /// ... and the window holds at least this many attempts.
    pub min_calls: u32,
    /// The sliding window attempts are counted over.
    pub window_ms: u64,
    /// How long it stays open before probing.
    pub open_ms: u64,
    /// Probe jobs handed out while half-open; that many successes close it.
    pub half_open_calls: u32,
    /// A failure with `retry_after` (a dependency's 429) opens the breaker until that time
    /// (only meaningful for a kind's breaker, where the dependency is the kind's).
    #[serde(default)]
    pub pause_on_retry_after: bool,
}

impl Default for BreakerSettings {
    fn default() -> Self {
        Self {
            failure_ratio: 0.5,
            min_calls: 10,
            window_ms: 60_000,
            open_ms: 30_000,
            half_open_calls: 1,
            pause_on_retry_after: false,
        }
    }
}

/// Longest window or open period a breaker takes: a week.
pub const MAX_BREAKER_MS: u64 = 7 * 24 * 3_600_000;
/// Shortest window or open period.
pub const MIN_BREAKER_MS: u64 = 100;
/// Most probes a half-open breaker hands out.
pub const MAX_HALF_OPEN_CALLS: u32 = 1_000;

impl BreakerSettings {
    /// Reads settings from JSON as sent by a client: every field optional (defaults as in
    /// [`BreakerSettings::default`]), unknown fields and bad values refused naming
    /// `{field}.{name}`.
    pub fn from_json(field: &str, value: &Value) -> Result<Self, ValidationError> {
        let Some(object) = value.as_object() else {
            return Err(ValidationError::new(
                field,
                "must be an object {\"failure_ratio\", \"min_calls\", \"window_ms\", \
                 \"open_ms\", \"half_open_calls\", \"pause_on_retry_after\"} (or null)",
            ));
        };
        const FIELDS: [&str; 6] = [
            "failure_ratio",
            "min_calls",
            "window_ms",
            "open_ms",
            "half_open_calls",
            "pause_on_retry_after",
        ];
        if let Some(unknown) = object.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(ValidationError::new(
                format!("{field}.{unknown}"),
                format!("unknown field; expected one of {}", FIELDS.join(", ")),
            ));
        }
        let mut settings = Self::default();
        let whole = |name: &str, low: u64, high: u64| -> Result<Option<u64>, ValidationError> {
            match object.get(name) {
                None => Ok(None),
                Some(value) => crate::wire::whole_number(value)
                    .and_then(|n| u64::try_from(n).ok())
                    .filter(|n| (low..=high).contains(n))
                    .map(Some)
                    .ok_or_else(|| {
                        ValidationError::new(
                            format!("{field}.{name}"),
                            format!("must be a whole number from {low} to {high}"),
                        )
                    }),
            }
        };
        if let Some(ratio) = object.get("failure_ratio") {
            settings.failure_ratio = ratio.as_f64().ok_or_else(|| {
                ValidationError::new(
                    format!("{field}.failure_ratio"),
                    "must be a number above 0 and at most 1",
                )
            })?;
        }
        if let Some(n) = whole("min_calls", 1, 1_000_000)? {
            settings.min_calls = n as u32;
        }
        if let Some(n) = whole("window_ms", MIN_BREAKER_MS, MAX_BREAKER_MS)? {
            settings.window_ms = n;
        }
        if let Some(n) = whole("open_ms", MIN_BREAKER_MS, MAX_BREAKER_MS)? {
            settings.open_ms = n;
        }
        if let Some(n) = whole("half_open_calls", 1, u64::from(MAX_HALF_OPEN_CALLS))? {
            settings.half_open_calls = n as u32;
        }
        if let Some(flag) = object.get("pause_on_retry_after") {
            settings.pause_on_retry_after = flag.as_bool().ok_or_else(|| {
                ValidationError::new(
                    format!("{field}.pause_on_retry_after"),
                    "must be true or false",
                )
            })?;
        }
        settings.validate(field)?;
        Ok(settings)
    }

    /// Checks every value, naming `{field}.{name}` for the first one out of range.
    pub fn validate(&self, field: &str) -> Result<(), ValidationError> {
        let bad =
            |name: &str, why: String| Err(ValidationError::new(format!("{field}.{name}"), why));
        if !(self.failure_ratio.is_finite()
            && self.failure_ratio > 0.0
            && self.failure_ratio <= 1.0)
        {
            return bad(
                "failure_ratio",
                "must be a number above 0 and at most 1".into(),
            );
        }
        if !(1..=1_000_000).contains(&self.min_calls) {
            return bad(
                "min_calls",
                "must be a whole number from 1 to 1000000".into(),
            );
        }
        for (name, value) in [("window_ms", self.window_ms), ("open_ms", self.open_ms)] {
            if !(MIN_BREAKER_MS..=MAX_BREAKER_MS).contains(&value) {
                return bad(
                    name,
                    format!("must be a whole number from {MIN_BREAKER_MS} to {MAX_BREAKER_MS}"),
                );
            }
        }
        if !(1..=MAX_HALF_OPEN_CALLS).contains(&self.half_open_calls) {
            return bad(
                "half_open_calls",
                format!("must be a whole number from 1 to {MAX_HALF_OPEN_CALLS}"),
            );
        }
        Ok(())
    }

    fn window(&self) -> chrono::Duration {
        millis(self.window_ms)
    }
}

fn millis(ms: u64) -> chrono::Duration {
    chrono::Duration::milliseconds(i64::try_from(ms).unwrap_or(i64::MAX))
}

/// Where a breaker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

impl BreakerState {
    pub fn as_str(self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }

    /// The value of the `conveyor_circuit_breaker_state` gauge: 0 closed, 1 half-open, 2 open.
    pub fn gauge(self) -> i64 {
        match self {
            BreakerState::Closed => 0,
            BreakerState::HalfOpen => 1,
            BreakerState::Open => 2,
        }
    }
}

/// A breaker's state as stored: the stores keep it as one document and never look inside.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakerRecord {
    pub state: BreakerState,
    /// Start of the current counting window.
    pub window_started_at: DateTime<Utc>,
    /// Attempts and failures in the current window, and in the one before it.
    pub calls: u64,
    pub failures: u64,
    pub previous_calls: u64,
    pub previous_failures: u64,
    /// When it last opened.
    pub opened_at: Option<DateTime<Utc>>,
    /// While open: when it starts probing (`None`: only when closed by hand).
    pub open_until: Option<DateTime<Utc>>,
    /// While half-open: since when the current round of probes runs.
    pub half_open_since: Option<DateTime<Utc>>,
    pub probes_started: u32,
    pub probe_successes: u32,
    /// Why it last changed state, for people.
    pub reason: Option<String>,
    /// Opened by an operator (or a retry-after), not by the failure ratio.
    pub manual: bool,
    /// When it last changed state.
    pub changed_at: DateTime<Utc>,
}

/// A state change, reported to the audit log, logs and alerts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: BreakerState,
    pub to: BreakerState,
}

impl BreakerRecord {
    pub fn closed(now: DateTime<Utc>) -> Self {
        Self {
            state: BreakerState::Closed,
            window_started_at: now,
            calls: 0,
            failures: 0,
            previous_calls: 0,
            previous_failures: 0,
            opened_at: None,
            open_until: None,
            half_open_since: None,
            probes_started: 0,
            probe_successes: 0,
            reason: None,
            manual: false,
            changed_at: now,
        }
    }

    fn enter(&mut self, to: BreakerState, now: DateTime<Utc>, reason: String) -> Transition {
        let from = self.state;
        self.state = to;
        self.changed_at = now;
        self.reason = Some(reason);
        self.probes_started = 0;
        self.probe_successes = 0;
        self.half_open_since = (to == BreakerState::HalfOpen).then_some(now);
        if to == BreakerState::Open {
            self.opened_at = Some(now);
        }
        if to != BreakerState::Open {
            self.open_until = None;
            self.manual = false;
        }
        if to == BreakerState::Closed {
            // A fresh start: what failed before it opened no longer says anything.
            self.window_started_at = now;
            self.calls = 0;
            self.failures = 0;
            self.previous_calls = 0;
            self.previous_failures = 0;
        }
        Transition { from, to }
    }

    /// Moves the counting window forward to the one holding `now`.
    fn roll(&mut self, window: chrono::Duration, now: DateTime<Utc>) {
        let elapsed = now - self.window_started_at;
        if elapsed < window || window <= chrono::Duration::zero() {
            return;
        }
        let windows = elapsed.num_milliseconds() / window.num_milliseconds().max(1);
        if windows == 1 {
            self.previous_calls = self.calls;
            self.previous_failures = self.failures;
        } else {
            self.previous_calls = 0;
            self.previous_failures = 0;
        }
        self.calls = 0;
        self.failures = 0;
        self.window_started_at +=
            chrono::Duration::milliseconds(window.num_milliseconds().saturating_mul(windows));
    }

    /// Attempts and failures in the sliding window ending at `now`: the current window plus
    /// the share of the previous one that still falls inside it.
    pub fn estimate(&self, settings: &BreakerSettings, now: DateTime<Utc>) -> (f64, f64) {
        let window = settings.window_ms.max(1) as f64;
        let into = (now - self.window_started_at).num_milliseconds().max(0) as f64;
        let weight = (1.0 - into / window).clamp(0.0, 1.0);
        (
            self.calls as f64 + self.previous_calls as f64 * weight,
            self.failures as f64 + self.previous_failures as f64 * weight,
        )
    }

    /// Counts finished attempts; may open (too many failures), re-open (a probe failed) or
    /// close (enough probes succeeded) the breaker.
    pub fn record(
        &mut self,
        settings: Option<&BreakerSettings>,
        now: DateTime<Utc>,
        successes: u64,
        failures: u64,
    ) -> Option<Transition> {
        match self.state {
            BreakerState::Closed => {
                let settings = settings?;
                self.roll(settings.window(), now);
                self.calls += successes + failures;
                self.failures += failures;
                let (calls, failed) = self.estimate(settings, now);
                if failures > 0
                    && calls >= f64::from(settings.min_calls)
                    && failed / calls >= settings.failure_ratio
                {
                    let reason = format!(
                        "{:.0}% of {:.0} attempts failed in the last {} ms (threshold {:.0}%)",
                        100.0 * failed / calls,
                        calls,
                        settings.window_ms,
                        100.0 * settings.failure_ratio
                    );
                    let transition = self.enter(BreakerState::Open, now, reason);
                    self.open_until = Some(now + millis(settings.open_ms));
                    return Some(transition);
                }
                None
            }
            // Attempts started before it opened may still finish; they change nothing.
            BreakerState::Open => None,
            BreakerState::HalfOpen => {
                if failures > 0 {
                    let open_ms =
                        settings.map_or(BreakerSettings::default().open_ms, |s| s.open_ms);
                    let transition = self.enter(
                        BreakerState::Open,
                        now,
                        "a probe attempt failed".to_string(),
                    );
                    self.open_until = Some(now + millis(open_ms));
                    return Some(transition);
                }
                self.probe_successes = self.probe_successes.saturating_add(successes as u32);
                let needed = settings.map_or(1, |s| s.half_open_calls);
                if self.probe_successes >= needed {
                    let reason = format!("{} probe attempt(s) succeeded", self.probe_successes);
                    return Some(self.enter(BreakerState::Closed, now, reason));
                }
                None
            }
        }
    }

    /// Time-driven changes: an open breaker whose time is up starts probing (or closes, with no
    /// breaker configured any more); a half-open one whose probes never reported hands out
    /// new ones.
    pub fn tick(
        &mut self,
        settings: Option<&BreakerSettings>,
        now: DateTime<Utc>,
    ) -> Option<Transition> {
        match self.state {
            BreakerState::Open => {
                let until = self.open_until?;
                if now < until {
                    return None;
                }
                Some(match settings {
                    Some(_) => self.enter(
                        BreakerState::HalfOpen,
                        now,
                        "open time is up; probing".to_string(),
                    ),
                    None => self.enter(
                        BreakerState::Closed,
                        now,
                        "open time is up (no breaker configured)".to_string(),
                    ),
                })
            }
            BreakerState::HalfOpen => {
                let Some(settings) = settings else {
                    return Some(self.enter(
                        BreakerState::Closed,
                        now,
                        "breaker removed".to_string(),
                    ));
                };
                let since = self.half_open_since.unwrap_or(self.changed_at);
                if self.probes_started > 0 && now - since >= settings.window() {
                    self.probes_started = self.probe_successes;
                    self.half_open_since = Some(now);
                }
                None
            }
            BreakerState::Closed => None,
        }
    }

    /// Whether [`BreakerRecord::tick`] would change anything at `now`.
    pub fn due(&self, settings: Option<&BreakerSettings>, now: DateTime<Utc>) -> bool {
        let mut copy = self.clone();
        copy.tick(settings, now).is_some() || copy != *self
    }

    /// Takes up to `want` probe permits while half-open; returns how many it got.
    pub fn take_probes(&mut self, settings: Option<&BreakerSettings>, want: u32) -> u32 {
        if self.state != BreakerState::HalfOpen {
            return 0;
        }
        let allowed = settings.map_or(1, |s| s.half_open_calls);
        let granted = allowed.saturating_sub(self.probes_started).min(want);
        self.probes_started += granted;
        granted
    }

    /// Gives back permits a probe fetch did not use.
    pub fn return_probes(&mut self, unused: u32) {
        if self.state == BreakerState::HalfOpen {
            self.probes_started = self.probes_started.saturating_sub(unused);
        }
    }

    /// Opened by an operator, until `until` (then it probes, or closes without a breaker
    /// configured) or, with `None`, until closed by hand.
    pub fn open_by_hand(
        &mut self,
        now: DateTime<Utc>,
        until: Option<DateTime<Utc>>,
        reason: String,
    ) -> Option<Transition> {
        let transition = self.enter(BreakerState::Open, now, reason);
        self.open_until = until;
        self.manual = true;
        (transition.from != transition.to).then_some(transition)
    }

    /// Closed by an operator: counting starts afresh.
    pub fn close_by_hand(&mut self, now: DateTime<Utc>, reason: String) -> Option<Transition> {
        let transition = self.enter(BreakerState::Closed, now, reason);
        (transition.from != transition.to).then_some(transition)
    }

    /// A dependency asked to be left alone until `until`: opens (or keeps open) the breaker
    /// at least that long. A breaker opened by hand without an end stays as it is.
    pub fn pause_until(
        &mut self,
        now: DateTime<Utc>,
        until: DateTime<Utc>,
        reason: String,
    ) -> Option<Transition> {
        if until <= now {
            return None;
        }
        if self.state == BreakerState::Open {
            match self.open_until {
                None => return None,
                Some(current) if current >= until => return None,
                Some(_) => {
                    self.open_until = Some(until);
                    self.reason = Some(reason);
                    return None;
                }
            }
        }
        let transition = self.enter(BreakerState::Open, now, reason);
        self.open_until = Some(until);
        self.manual = true;
        Some(transition)
    }
}

/// A breaker as the store keeps it: its scope and name, the version its conditional writes
/// check, and its record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredBreaker {
    pub scope: BreakerScope,
    pub name: String,
    /// Incremented by every write; 0 for one not stored yet.
    pub version: u64,
    pub record: BreakerRecord,
}

/// Where breakers' records are kept, cluster-wide.
#[async_trait]
pub trait BreakerStore: Send + Sync {
    /// Every stored breaker, by scope (`kind` before `queue`) and name.
    async fn breakers_list(&self) -> StoreResult<Vec<StoredBreaker>>;

    /// One breaker, `None` when none is stored.
    async fn breaker_get(
        &self,
        scope: BreakerScope,
        name: &str,
    ) -> StoreResult<Option<StoredBreaker>>;

    /// Writes `breaker.record` if the stored version is still `breaker.version` (0: only if
    /// none is stored), storing version + 1. False when another write came first.
    ///
    /// Checks the name ([`Valid::breaker`]) first.
    async fn breaker_write(&self, breaker: &StoredBreaker) -> StoreResult<bool> {
        self.breaker_write_valid(Valid::breaker(breaker.clone())?)
            .await
    }

    /// Writes a breaker's record (see [`BreakerStore::breaker_write`]).
    async fn breaker_write_valid(&self, breaker: Valid<StoredBreaker>) -> StoreResult<bool>;
}

/// What the API shows of one breaker: its settings (if configured) and its state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakerView {
    pub scope: BreakerScope,
    pub name: String,
    pub state: BreakerState,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub settings: Option<BreakerSettings>,
    /// Attempts and failures in the current sliding window (estimated, see the module docs).
    pub calls: u64,
    pub failures: u64,
    pub opened_at: Option<DateTime<Utc>>,
    pub open_until: Option<DateTime<Utc>>,
    pub probes_started: u32,
    pub probe_successes: u32,
    pub reason: Option<String>,
    pub manual: bool,
    pub changed_at: Option<DateTime<Utc>>,
}

impl BreakerView {
    pub fn of(
        scope: BreakerScope,
        name: &str,
        settings: Option<BreakerSettings>,
        record: Option<&BreakerRecord>,
        now: DateTime<Utc>,
    ) -> Self {
        let (calls, failures) = match (record, &settings) {
            (Some(record), Some(settings)) => {
                let mut rolled = record.clone();
                rolled.roll(settings.window(), now);
                let (calls, failures) = rolled.estimate(settings, now);
                (calls.round() as u64, failures.round() as u64)
            }
            _ => (0, 0),
        };
        Self {
            scope,
            name: name.to_string(),
            state: record.map_or(BreakerState::Closed, |r| r.state),
            settings,
            calls,
            failures,
            opened_at: record.and_then(|r| r.opened_at),
            open_until: record.and_then(|r| r.open_until),
            probes_started: record.map_or(0, |r| r.probes_started),
            probe_successes: record.map_or(0, |r| r.probe_successes),
            reason: record.and_then(|r| r.reason.clone()),
            manual: record.is_some_and(|r| r.manual),
            changed_at: record.map(|r| r.changed_at),
        }
    }
}
#[cfg(test)]
mod tests;
