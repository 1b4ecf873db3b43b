//! History: per-minute rollups per queue and kind, kept in the store.
//!
//! A process that writes job outcomes (the HTTP server for its workers, an in-process worker
//! through its [`crate::JobObserver`]) counts them in a `conveyor_engine::StatsRecorder` in memory, keyed by
//! the minute, queue and kind they happened in, and flushes the counts to the store every few
//! seconds with [`StatsStore::stats_merge`], which *adds* them to what is stored. Each event is
//! counted by exactly one process, so several servers on one PostgreSQL database add up to the
//! cluster's history, and a crash loses at most the last flush interval of counts (never a
//! job). Durations are kept as fixed-bucket histograms rather than percentiles, because
//! percentiles cannot be added and histograms can: p50/p95/p99 are estimated when read, over
//! whatever span and set of queues and kinds is asked for.
//!
//! The merging rule and the reading (steps, totals, per-kind summaries) live here, once; the
//! stores only keep rows.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use chrono::{DateTime, Datelike, TimeZone, Utc};
use serde::{Deserialize, Serialize};

use crate::{StoreResult, ValidationError};

/// Upper bounds (exclusive, milliseconds) of the duration histogram's buckets; one more bucket
/// holds everything from the last bound up. Roughly three per decade from 1 ms to an hour, as
/// background jobs range from sub-millisecond to long.
pub const BUCKET_BOUNDS_MS: &[u64] = &[
    1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 75, 100, 150, 200, 300, 500, 750, 1_000, 1_500, 2_000,
    3_000, 5_000, 7_500, 10_000, 15_000, 20_000, 30_000, 45_000, 60_000, 90_000, 120_000, 180_000,
    300_000, 600_000, 900_000, 1_800_000, 3_600_000,
];

/// Durations counted in fixed buckets ([`BUCKET_BOUNDS_MS`]), with their sum for the mean.
/// Two histograms add bucket by bucket.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Histogram {
    /// Counts per bucket; trailing empty buckets are left out.
    #[serde(default)]
    pub counts: Vec<u64>,
    #[serde(default)]
    pub sum_ms: f64,
}

impl Histogram {
    pub fn observe(&mut self, duration: Duration) {
        let ms = duration.as_secs_f64() * 1000.0;
        let bucket = BUCKET_BOUNDS_MS.partition_point(|&bound| (bound as f64) <= ms);
        if self.counts.len() <= bucket {
            self.counts.resize(bucket + 1, 0);
        }
        self.counts[bucket] += 1;
        self.sum_ms += ms;
    }

    pub fn merge(&mut self, other: &Histogram) {
        if self.counts.len() < other.counts.len() {
            self.counts.resize(other.counts.len(), 0);
        }
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine = mine.saturating_add(*theirs);
        }
        self.sum_ms += other.sum_ms;
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The `q` quantile (0..=1) in milliseconds, interpolated linearly inside its bucket;
    /// `None` when nothing was observed. The top bucket reports its lower bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut below = 0u64;
        for (bucket, &count) in self.counts.iter().enumerate() {
            if count == 0 {
                continue;
            }
            if (below + count) as f64 >= rank {
                // A bucket past the bounds this build knows (a newer writer) reads as the top.
                let lower = match bucket.checked_sub(1) {
                    None => 0.0,
                    Some(below) => BUCKET_BOUNDS_MS
                        .get(below)
                        .or(BUCKET_BOUNDS_MS.last())
                        .map_or(0.0, |&bound| bound as f64),
                };
                let Some(&upper) = BUCKET_BOUNDS_MS.get(bucket) else {
                    return Some(lower);
                };
                let within = ((rank - below as f64) / count as f64).clamp(0.0, 1.0);
                return Some(lower + within * (upper as f64 - lower));
            }
            below += count;
        }
        BUCKET_BOUNDS_MS.last().map(|&bound| bound as f64)
    }

    /// What the API shows: count, mean and p50/p95/p99 in milliseconds (`None` when empty).
    pub fn summary(&self) -> Option<Latency> {
        let count = self.count();
        let round = |ms: f64| (ms * 1000.0).round() / 1000.0;
        Some(Latency {
            count,
            mean_ms: round(self.sum_ms / count as f64),
            p50_ms: round(self.quantile(0.50)?),
            p95_ms: round(self.quantile(0.95)?),
            p99_ms: round(self.quantile(0.99)?),
        })
        .filter(|_| count > 0)
    }
}

/// A duration distribution as the API shows it (estimated from a [`Histogram`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub mean_ms: f64,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub p99_ms: f64,
}

/// What happened to one queue's jobs of one kind in some span of time.
///
/// `failed` counts every failed attempt a worker reported; of those, `retried` were scheduled
/// again and `dead` went to the dead-letter queue. Rescues of expired leases and of workers
/// marked dead are not attempts a worker reported and are not counted here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RollupCounts {
    /// Jobs stored by an enqueue (duplicates answered from an idempotency key are not).
    pub enqueued: u64,
    /// Attempts handed to a worker.
    pub started: u64,
    pub completed: u64,
    pub failed: u64,
    pub retried: u64,
    pub dead: u64,
    /// From an attempt's start to its completion or failure.
    pub run_time: Histogram,
    /// From a job becoming startable (its run_at, or its enqueue when later) to its start.
    pub queue_wait: Histogram,
}

impl RollupCounts {
    pub fn merge(&mut self, other: &RollupCounts) {
        self.enqueued = self.enqueued.saturating_add(other.enqueued);
        self.started = self.started.saturating_add(other.started);
        self.completed = self.completed.saturating_add(other.completed);
        self.failed = self.failed.saturating_add(other.failed);
        self.retried = self.retried.saturating_add(other.retried);
        self.dead = self.dead.saturating_add(other.dead);
        self.run_time.merge(&other.run_time);
        self.queue_wait.merge(&other.queue_wait);
    }

    pub fn is_empty(&self) -> bool {
        *self == RollupCounts::default()
    }
}

/// One minute of one queue's jobs of one kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rollup {
    /// The minute's start (seconds and below are zero).
    pub minute: DateTime<Utc>,
    pub queue: String,
    pub kind: String,
    pub counts: RollupCounts,
}

/// Checks what a store is asked to merge: every queue and kind a valid name.
pub fn validate_rollups(rollups: &[Rollup]) -> Result<(), ValidationError> {
    rollups.iter().try_for_each(|rollup| {
        crate::fields::name("queue", &rollup.queue)?;
        crate::fields::name("kind", &rollup.kind)
    })
}

/// The start of the minute `at` falls in.
pub fn minute_of(at: DateTime<Utc>) -> DateTime<Utc> {
    let seconds = at.timestamp().div_euclid(60) * 60;
    Utc.timestamp_opt(seconds, 0).single().unwrap_or(at)
}

/// Which stored rollups to read: minutes in `from..to`, of one queue and/or kind or all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsQuery {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub queue: Option<String>,
    pub kind: Option<String>,
}

/// Where the rollups are kept.
#[async_trait]
pub trait StatsStore: Send + Sync {
    /// Adds each rollup to the stored one of its minute, queue and kind (counts and histogram
    /// buckets add; see [`RollupCounts::merge`]), creating it when there is none. All of them
    /// or none.
    async fn stats_merge(&self, rollups: Vec<Rollup>) -> StoreResult<()>;

    /// The stored rollups whose minute is in `query.from..query.to`, filtered by queue and
    /// kind when given, ordered by minute, queue and kind.
    async fn stats_read(&self, query: StatsQuery) -> StoreResult<Vec<Rollup>>;

    /// Deletes the rollups of minutes that ended more than `older_than` before the store's
    /// now; returns how many.
    async fn stats_prune(&self, older_than: Duration) -> StoreResult<u64>;
}

/// The most points one answer may have, so a fine step over a long span is refused instead of
/// building a huge answer.
pub const MAX_POINTS: i64 = 10_080;

/// A validated request for history: span, step and filters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatsRequest {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    /// Whole minutes, at least one.
    pub step: Duration,
    pub queue: Option<String>,
    pub kind: Option<String>,
}

impl StatsRequest {
    /// Checks the span and the step. `step` defaults to the smallest whole number of minutes
    /// that keeps the answer within about 120 points, and is at most the span. `from` is
    /// aligned down to a multiple of the step (since the epoch, so points stay put from one
    /// request to the next) and `to` up to a whole minute; the last point may so cover less
    /// than a step (the one in progress).
    pub fn new(
        from: DateTime<Utc>,
        to: DateTime<Utc>,
        step: Option<Duration>,
        queue: Option<String>,
        kind: Option<String>,
    ) -> Result<Self, ValidationError> {
        if from >= to {
            return Err(ValidationError::new("from", "must be before `to`"));
        }
        // Nothing is counted before the Unix epoch, and a span aligned down from before it
        // can fall before year 1, which RFC 3339 cannot write; the last minute is rounded up,
        // so the end stays a day short of year 10000 for the same reason.
        if from < DateTime::<Utc>::UNIX_EPOCH {
            return Err(ValidationError::new(
                "from",
                "must be on or after 1970-01-01T00:00:00Z",
            ));
        }
        if to.year() > 9999 || (to.year() == 9999 && to.ordinal() >= 365) {
            return Err(ValidationError::new(
                "to",
                "must be before 9999-12-31T00:00:00Z",
            ));
        }
        for (field, name) in [("queue", &queue), ("kind", &kind)] {
            if let Some(name) = name {
                crate::fields::name(field, name)?;
            }
        }
        let to = {
            let floor = minute_of(to);
            if floor == to {
                to
            } else {
                floor + chrono::Duration::minutes(1)
            }
        };
        let minutes = (to - minute_of(from)).num_minutes().max(1);
        let step = match step {
            Some(step) => {
                if step.as_secs() == 0 || step.as_secs() % 60 != 0 || step.subsec_nanos() != 0 {
                    return Err(ValidationError::new(
                        "step",
                        "must be a whole number of minutes, e.g. 60, 300s, 5m or 1h",
                    ));
                }
                // Wider than the span is one point: the span.
                step.min(Duration::from_secs(60 * minutes as u64))
            }
            None => Duration::from_secs(60 * ((minutes + 119) / 120).max(1) as u64),
        };
        let step_s = step.as_secs() as i64;
        let from = Utc
            .timestamp_opt(from.timestamp().div_euclid(step_s) * step_s, 0)
            .single()
            .unwrap_or_else(|| minute_of(from));
        let minutes = (to - from).num_minutes().max(1);
        let step_minutes = step_s / 60;
        if (minutes + step_minutes - 1) / step_minutes > MAX_POINTS {
            return Err(ValidationError::new(
                "step",
                format!("gives more than {MAX_POINTS} points over this span; use a longer step"),
            ));
        }
        Ok(Self {
            from,
            to,
            step,
            queue,
            kind,
        })
    }

    pub fn query(&self) -> StatsQuery {
        StatsQuery {
            from: self.from,
            to: self.to,
            queue: self.queue.clone(),
            kind: self.kind.clone(),
        }
    }
}

/// Counts and estimated durations of one step, or of a whole span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsPoint {
    /// The step's start (absent from totals).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub at: Option<DateTime<Utc>>,
    pub enqueued: u64,
    pub started: u64,
    pub completed: u64,
    pub failed: u64,
    pub retried: u64,
    pub dead: u64,
    /// `failed / (completed + failed)`, `None` when nothing ended.
    pub failure_rate: Option<f64>,
    pub run_time: Option<Latency>,
    pub queue_wait: Option<Latency>,
}

impl StatsPoint {
    fn of(at: Option<DateTime<Utc>>, counts: &RollupCounts) -> Self {
        let ended = counts.completed + counts.failed;
        Self {
            at,
            enqueued: counts.enqueued,
            started: counts.started,
            completed: counts.completed,
            failed: counts.failed,
            retried: counts.retried,
            dead: counts.dead,
            failure_rate: (ended > 0)
                .then(|| ((counts.failed as f64 / ended as f64) * 10_000.0).round() / 10_000.0),
            run_time: counts.run_time.summary(),
            queue_wait: counts.queue_wait.summary(),
        }
    }
}

/// One queue's jobs of one kind over the whole span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindSummary {
    pub queue: String,
    pub kind: String,
    /// Completed attempts per minute over the span.
    pub throughput_per_min: f64,
    #[serde(flatten)]
    pub totals: StatsPoint,
}

/// The answer to a [`StatsRequest`]: a point per step (every step, empty ones with zeros),
/// totals over the span, and a summary per queue and kind.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    pub from: DateTime<Utc>,
    pub to: DateTime<Utc>,
    pub step_s: u64,
    pub queue: Option<String>,
    pub kind: Option<String>,
    pub series: Vec<StatsPoint>,
    pub totals: StatsPoint,
    pub kinds: Vec<KindSummary>,
}

impl StatsReport {
    /// Adds up `rollups` (as [`StatsStore::stats_read`] returns them for `request.query()`).
    pub fn build(request: &StatsRequest, rollups: &[Rollup]) -> Self {
        let step_s = request.step.as_secs().max(60) as i64;
        let start = request.from.timestamp();
        let steps = ((request.to.timestamp() - start) + step_s - 1) / step_s;
        let mut series = vec![RollupCounts::default(); steps.max(0) as usize];
        let mut totals = RollupCounts::default();
        let mut kinds: BTreeMap<(&str, &str), RollupCounts> = BTreeMap::new();
        for rollup in rollups {
            let offset = rollup.minute.timestamp() - start;
            if offset < 0 || rollup.minute >= request.to {
                continue;
            }
            if let Some(slot) = series.get_mut((offset / step_s) as usize) {
                slot.merge(&rollup.counts);
            }
            totals.merge(&rollup.counts);
            kinds
                .entry((&rollup.queue, &rollup.kind))
                .or_default()
                .merge(&rollup.counts);
        }
        let minutes = ((request.to - request.from).num_seconds() as f64 / 60.0).max(1.0);
        Self {
            from: request.from,
            to: request.to,
            step_s: step_s as u64,
            queue: request.queue.clone(),
            kind: request.kind.clone(),
            series: series
                .iter()
                .enumerate()
                .map(|(i, counts)| {
                    let at = Utc
                        .timestamp_opt(start + i as i64 * step_s, 0)
                        .single()
                        .unwrap_or(request.from);
                    StatsPoint::of(Some(at), counts)
                })
                .collect(),
            totals: StatsPoint::of(None, &totals),
            kinds: kinds
                .into_iter()
                .map(|((queue, kind), counts)| KindSummary {
                    queue: queue.to_string(),
                    kind: kind.to_string(),
                    throughput_per_min: ((counts.completed as f64 / minutes) * 1000.0).round()
                        / 1000.0,
                    totals: StatsPoint::of(None, &counts),
                })
                .collect(),
        }
    }
}

/// Parses a step or span: whole seconds (`300`), or a number with `s`, `m`, `h` or `d`.
pub fn parse_duration(field: &str, text: &str) -> Result<Duration, ValidationError> {
    let text = text.trim();
    let (digits, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => 0,
    };
    digits
        .parse::<u64>()
        .ok()
        .filter(|_| scale > 0)
        .and_then(|n| n.checked_mul(scale))
        .map(Duration::from_secs)
        .ok_or_else(|| {
            ValidationError::new(
                field,
                format!("{text:?} is not a duration: use seconds or a number with s, m, h or d (e.g. 5m)"),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(text)
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn histograms_add_bucket_by_bucket_and_estimate_quantiles_inside_buckets() {
        let mut fast = Histogram::default();
        for _ in 0..90 {
            fast.observe(Duration::from_millis(12));
        }
        let mut slow = Histogram::default();
        for _ in 0..10 {
            slow.observe(Duration::from_millis(2_500));
        }
        fast.merge(&slow);
        assert_eq!(fast.count(), 100);
        let p50 = fast.quantile(0.5).unwrap();
        assert!((10.0..15.0).contains(&p50), "p50 {p50}");
        let p95 = fast.quantile(0.95).unwrap();
        assert!((2_000.0..3_000.0).contains(&p95), "p95 {p95}");
        let summary = fast.summary().unwrap();
        assert_eq!(summary.count, 100);
        assert!((summary.mean_ms - (90.0 * 12.0 + 10.0 * 2_500.0) / 100.0).abs() < 1e-6);
        assert_eq!(Histogram::default().summary(), None);
    }

    #[test]
    fn durations_past_the_last_bound_land_in_the_top_bucket() {
        let mut histogram = Histogram::default();
        histogram.observe(Duration::from_secs(7_200));
        assert_eq!(histogram.counts.len(), BUCKET_BOUNDS_MS.len() + 1);
        assert_eq!(histogram.quantile(0.99), Some(3_600_000.0));
    }

    #[test]
    fn reports_fill_every_step_and_sum_by_kind() {
        let request = StatsRequest::new(
            at("2026-12-01T10:00:20Z"),
            at("2026-12-01T10:09:10Z"),
            Some(Duration::from_secs(300)),
            None,
            None,
        )
        .unwrap();
        assert_eq!(request.from, at("2026-12-01T10:00:00Z"));
        assert_eq!(request.to, at("2026-12-01T10:10:00Z"));
        let row = |minute: &str, kind: &str, completed: u64, failed: u64| Rollup {
            minute: at(minute),
            queue: "q".into(),
            kind: kind.into(),
            counts: RollupCounts {
                completed,
                failed,
                ..RollupCounts::default()
            },
        };
        let report = StatsReport::build(
            &request,
            &[
                row("2026-12-01T10:01:00Z", "a", 3, 1),
                row("2026-12-01T10:04:00Z", "b", 6, 0),
                row("2026-12-01T10:07:00Z", "a", 1, 1),
            ],
        );
        assert_eq!(report.series.len(), 2);
        assert_eq!(report.series[0].completed, 9);
        assert_eq!(report.series[1].at, Some(at("2026-12-01T10:05:00Z")));
        assert_eq!(report.totals.failure_rate, Some(0.1667));
        assert_eq!(report.kinds.len(), 2);
        assert_eq!(report.kinds[0].kind, "a");
        assert_eq!(report.kinds[0].totals.completed, 4);
        assert!((report.kinds[0].throughput_per_min - 0.4).abs() < 1e-9);
    }

    #[test]
    fn requests_refuse_backwards_spans_odd_steps_and_too_many_points() {
        let from = at("2026-12-01T10:00:00Z");
        let to = at("2026-12-02T10:00:00Z");
        let field = |r: Result<StatsRequest, ValidationError>| r.unwrap_err().field;
        assert_eq!(field(StatsRequest::new(to, from, None, None, None)), "from");
        assert_eq!(
            field(StatsRequest::new(
                from,
                to,
                Some(Duration::from_secs(90)),
                None,
                None
            )),
            "step"
        );
        let year = at("2027-11-01T10:00:00Z");
        assert_eq!(
            field(StatsRequest::new(
                from,
                year,
                Some(Duration::from_secs(60)),
                None,
                None
            )),
            "step"
        );
        assert_eq!(
            field(StatsRequest::new(
                from,
                to,
                None,
                Some("bad name!".into()),
                None
            )),
            "queue"
        );
        // Spans that no RFC 3339 time could start or end once aligned (found by the contract
        // run: from=0003-01-01 answered points in year -4).
        assert_eq!(
            field(StatsRequest::new(
                at("0003-01-01T00:20:14.2Z"),
                to,
                None,
                None,
                None
            )),
            "from"
        );
        assert_eq!(
            field(StatsRequest::new(
                from,
                at("9999-12-31T23:59:30Z"),
                None,
                None,
                None
            )),
            "to"
        );
        let since_epoch = StatsRequest::new(at("1970-01-01T00:00:00Z"), to, None, None, None)
            .expect("a span from the epoch");
        assert!(since_epoch.from >= DateTime::<Utc>::UNIX_EPOCH);
        let default = StatsRequest::new(from, to, None, None, None).unwrap();
        assert_eq!(default.step, Duration::from_secs(720));
        // A step wider than the span is the span; points are aligned to the step.
        let huge = StatsRequest::new(
            from,
            to,
            Some(Duration::from_secs(9_223_372_036_854_775_800)),
            None,
            None,
        )
        .unwrap();
        assert_eq!(huge.step, Duration::from_secs(24 * 3600));
        let aligned = StatsRequest::new(
            at("2026-12-01T10:07:30Z"),
            at("2026-12-01T10:20:00Z"),
            Some(Duration::from_secs(300)),
            None,
            None,
        )
        .unwrap();
        assert_eq!(aligned.from, at("2026-12-01T10:05:00Z"));
        // A stored histogram with more buckets than this build knows does not panic.
        let wide = Histogram {
            counts: vec![1; BUCKET_BOUNDS_MS.len() + 5],
            sum_ms: 1.0,
        };
        assert!(wide.summary().is_some());
        assert_eq!(
            parse_duration("step", "5m").unwrap(),
            Duration::from_secs(300)
        );
        assert_eq!(
            parse_duration("step", "300").unwrap(),
            Duration::from_secs(300)
        );
        assert_eq!(parse_duration("step", "1w").unwrap_err().field, "step");
    }
}
