//! Stuck jobs: running jobs that have run much longer than is usual for their kind.
//!
//! Each store finds the candidates and its kinds' recent durations in SQL (see
//! [`crate::WorkerStore::jobs_stuck`]); the rule that turns them into a verdict lives here, so every
//! store flags exactly the same jobs:
//!
//! 1. *History*: with at least [`StuckParams::min_samples`] recent completions of the kind, the
//!    threshold is `factor x p95` of their durations.
//! 2. *Timeout*: otherwise, when the job has a `timeout_ms`, `factor x timeout`. (A worker kills
//!    a job at its timeout, so one running three times longer means its worker is not.)
//! 3. *Default*: otherwise [`StuckParams::default_threshold`] (10 minutes).
//!
//! No threshold is below [`StuckParams::min_threshold`] (1 s), so a kind that usually takes
//! 5 ms is not flagged after 16 ms.
//!
//! The p95 is the nearest-rank one: the duration at rank `ceil(0.95 n)` of the `n` samples in
//! ascending order, which both stores compute with the same integer arithmetic.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::time::Duration;
use uuid::Uuid;

/// How [`crate::WorkerStore::jobs_stuck`] decides.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct StuckParams {
    /// A job is stuck past this multiple of its kind's p95 duration (or of its timeout).
    pub factor: f64,
    /// The threshold for jobs of kinds without enough history and without a timeout.
    pub default_threshold: Duration,
    /// No threshold is shorter than this.
    pub min_threshold: Duration,
    /// Completions that finished longer ago than this are not history any more.
    pub window: Duration,
    /// Fewer recent completions than this is no history.
    pub min_samples: u32,
    /// At most this many of the most recently created jobs are read for history, so the cost
    /// of the query is bounded however large the table is. A kind with no completion among
    /// them has no history (its jobs fall back to the timeout or the default).
    pub scan_limit: usize,
    /// At most this many running jobs are examined (the longest-running first).
    pub limit: usize,
}

impl Default for StuckParams {
    fn default() -> Self {
        Self {
            factor: 3.0,
            default_threshold: Duration::from_secs(600),
            min_threshold: Duration::from_secs(1),
            window: Duration::from_secs(3600),
            min_samples: 5,
            scan_limit: 50_000,
            limit: 10_000,
        }
    }
}

impl StuckParams {
    /// The shortest threshold any job can get: running jobs younger than this are not even
    /// candidates, which keeps the stores' candidate query small.
    pub fn shortest_threshold(&self) -> Duration {
        self.min_threshold.min(self.default_threshold)
    }
}

/// A running job as the stores read it for the stuck check (no payload).
#[derive(Debug, Clone, PartialEq)]
pub struct RunningJob {
    pub id: Uuid,
    pub kind: String,
    pub queue: String,
    pub attempt: u32,
    pub started_at: DateTime<Utc>,
    pub timeout_ms: Option<u64>,
    pub worker_id: Option<String>,
}

/// A kind's recent completed durations, as the stores compute them in SQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KindDurations {
    pub kind: String,
    pub samples: u64,
    /// Nearest-rank 95th percentile, in milliseconds.
    pub p95_ms: u64,
}

/// What a stuck job's threshold was derived from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StuckBasis {
    History,
    Timeout,
    Default,
}

/// A running job past its threshold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StuckJob {
    pub id: Uuid,
    pub kind: String,
    pub queue: String,
    pub attempt: u32,
    pub worker_id: Option<String>,
    pub started_at: DateTime<Utc>,
    pub running_ms: u64,
    pub threshold_ms: u64,
    pub basis: StuckBasis,
    /// The kind's p95 duration when the threshold came from history.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub typical_ms: Option<u64>,
}

/// Nearest-rank position (1-based) of the 95th percentile among `n` sorted samples.
pub fn p95_rank(n: u64) -> u64 {
    (95 * n).div_ceil(100).max(1)
}

fn ms(d: Duration) -> u64 {
    d.as_millis().min(u128::from(u64::MAX)) as u64
}

fn scaled(base_ms: u64, factor: f64) -> u64 {
    let value = base_ms as f64 * factor.max(0.0);
    if value >= u64::MAX as f64 {
        u64::MAX
    } else {
        value.ceil() as u64
    }
}

/// The stuck ones among `running`, longest-running first.
pub fn classify(
    running: Vec<RunningJob>,
    history: &[KindDurations],
    params: &StuckParams,
    now: DateTime<Utc>,
) -> Vec<StuckJob> {
    let by_kind: HashMap<&str, &KindDurations> =
        history.iter().map(|k| (k.kind.as_str(), k)).collect();
    let mut stuck: Vec<StuckJob> = running
        .into_iter()
        .filter_map(|job| {
            let known = by_kind
                .get(job.kind.as_str())
                .filter(|k| k.samples >= u64::from(params.min_samples));
            let (threshold_ms, basis, typical_ms) = match (known, job.timeout_ms) {
                (Some(k), _) => (
                    scaled(k.p95_ms, params.factor),
                    StuckBasis::History,
                    Some(k.p95_ms),
                ),
                (None, Some(timeout)) => {
                    (scaled(timeout, params.factor), StuckBasis::Timeout, None)
                }
                (None, None) => (ms(params.default_threshold), StuckBasis::Default, None),
            };
            let threshold_ms = threshold_ms.max(ms(params.min_threshold));
            let running_ms = (now - job.started_at).num_milliseconds().max(0) as u64;
            (running_ms > threshold_ms).then_some(StuckJob {
                id: job.id,
                kind: job.kind,
                queue: job.queue,
                attempt: job.attempt,
                worker_id: job.worker_id,
                started_at: job.started_at,
                running_ms,
                threshold_ms,
                basis,
                typical_ms,
            })
        })
        .collect();
    stuck.sort_by(|a, b| b.running_ms.cmp(&a.running_ms).then(a.id.cmp(&b.id)));
    stuck
}

#[cfg(test)]
mod tests {
    use super::*;

    fn running(kind: &str, started_secs_ago: i64, timeout_ms: Option<u64>) -> RunningJob {
        RunningJob {
            id: Uuid::now_v7(),
            kind: kind.into(),
            queue: "default".into(),
            attempt: 1,
            started_at: now() - chrono::Duration::seconds(started_secs_ago),
            timeout_ms,
            worker_id: Some("w".into()),
        }
    }

    fn now() -> DateTime<Utc> {
        DateTime::<Utc>::from_timestamp(1_800_000_000, 0).unwrap()
    }

    #[test]
    fn p95_rank_is_nearest_rank() {
        assert_eq!(p95_rank(1), 1);
        assert_eq!(p95_rank(5), 5);
        assert_eq!(p95_rank(20), 19);
        assert_eq!(p95_rank(100), 95);
        assert_eq!(p95_rank(101), 96);
    }

    #[test]
    fn history_then_timeout_then_default() {
        let params = StuckParams::default();
        let history = vec![
            KindDurations {
                kind: "quick".into(),
                samples: 10,
                p95_ms: 2_000,
            },
            KindDurations {
                kind: "rare".into(),
                samples: 2,
                p95_ms: 10,
            },
        ];
        let jobs = vec![
            running("quick", 7, None),          // 7 s > 3 x 2 s: stuck by history
            running("quick", 5, None),          // 5 s < 6 s
            running("rare", 100, Some(30_000)), // too few samples: timeout, 100 s > 90 s
            running("rare", 80, Some(30_000)),  // 80 s < 90 s
            running("unknown", 601, None),      // default 600 s
            running("unknown", 599, None),
        ];
        let stuck = classify(jobs, &history, &params, now());
        let seen: Vec<(&str, StuckBasis, u64)> = stuck
            .iter()
            .map(|s| (s.kind.as_str(), s.basis, s.threshold_ms))
            .collect();
        assert_eq!(
            seen,
            vec![
                ("unknown", StuckBasis::Default, 600_000),
                ("rare", StuckBasis::Timeout, 90_000),
                ("quick", StuckBasis::History, 6_000),
            ]
        );
        assert_eq!(stuck[2].typical_ms, Some(2_000));
        assert_eq!(stuck[2].running_ms, 7_000);
    }

    #[test]
    fn history_threshold_has_a_floor() {
        let params = StuckParams::default();
        let history = vec![KindDurations {
            kind: "tiny".into(),
            samples: 50,
            p95_ms: 5,
        }];
        let mut young = running("tiny", 0, None);
        young.started_at = now() - chrono::Duration::milliseconds(900);
        assert!(classify(vec![young], &history, &params, now()).is_empty());
        let mut short_timeout = running("other", 0, Some(10));
        short_timeout.started_at = now() - chrono::Duration::milliseconds(900);
        assert!(
            classify(vec![short_timeout], &history, &params, now()).is_empty(),
            "3 x 10 ms is floored at 1 s too"
        );
        let old = running("tiny", 2, None);
        assert_eq!(
            classify(vec![old], &history, &params, now())[0].threshold_ms,
            1_000
        );
    }
}
