//! The scaling signal: how many workers a queue needs to work off its backlog within a target
//! time, for autoscalers (KEDA, an HPA on the `conveyor_queue_desired_workers` metric).
//!
//! `desired = ceil(backlog / (rate_per_worker × target_s))`, where the backlog is the queue's
//! available and running jobs, and the rate per worker is the queue's measured throughput (jobs
//! finishing per second, from successive readings of the store's counts) over the alive workers
//! serving it. Until a rate has been measured, a queue with a backlog asks for the workers it
//! has (at least one): the signal never scales to zero while work waits.

use std::collections::HashMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::job::QueueStats;
use crate::workers::{WorkerInfo, WorkerState};

/// The target when none is given: work off the backlog within a minute.
pub const DEFAULT_TARGET_SECS: f64 = 60.0;

/// Readings closer together than this do not update the measured rate (too noisy).
const MIN_SAMPLE_SECS: f64 = 1.0;

/// Weight of the newest reading in the measured rate (an exponentially weighted average).
const RATE_WEIGHT: f64 = 0.5;

/// One queue's scaling signal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScaleSignal {
    pub queue: String,
    /// Available and running jobs.
    pub backlog: u64,
    /// Jobs of the queue finishing per second (completed, dead or cancelled), as measured;
    /// `None` until two readings a second apart.
    pub finished_per_s: Option<f64>,
    /// Alive workers serving the queue.
    pub workers: u32,
    pub rate_per_worker: Option<f64>,
    pub target_s: f64,
    pub desired_workers: u32,
}

/// The worker count for `backlog` at `rate_per_worker` jobs/s each within `target_s`.
pub fn desired_workers(
    backlog: u64,
    rate_per_worker: Option<f64>,
    target_s: f64,
    workers: u32,
) -> u32 {
    if backlog == 0 {
        return 0;
    }
    match rate_per_worker {
        Some(rate) if rate > 0.0 && target_s > 0.0 => {
            let needed = (backlog as f64 / (rate * target_s)).ceil();
            if needed >= f64::from(u32::MAX) {
                u32::MAX
            } else {
                (needed as u32).max(1)
            }
        }
        // Nothing measured yet (or nothing finishing): keep what runs, at least one.
        _ => workers.max(1),
    }
}

/// Alive workers whose queues include `queue`.
pub fn workers_serving(workers: &[WorkerInfo], queue: &str) -> u32 {
    let serving = workers
        .iter()
        .filter(|w| w.state == WorkerState::Alive && w.queues.iter().any(|q| q == queue))
        .count();
    u32::try_from(serving).unwrap_or(u32::MAX)
}

#[derive(Debug, Clone, Copy)]
struct Reading {
    finished: u64,
    at: Instant,
    rate: Option<f64>,
}

/// Measures each queue's throughput from successive readings of its counts. Counts fall when
/// retention deletes finished jobs; such a reading only moves the baseline.
#[derive(Debug, Default)]
pub struct ThroughputMeter {
    readings: HashMap<String, Reading>,
}

impl ThroughputMeter {
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes a reading of every queue at `now`; returns each queue's measured rate.
    pub fn observe(&mut self, queues: &[QueueStats], now: Instant) {
        for stats in queues {
            let finished = stats
                .completed
                .saturating_add(stats.dead)
                .saturating_add(stats.cancelled);
            match self.readings.get_mut(&stats.name) {
                None => {
                    self.readings.insert(
                        stats.name.clone(),
                        Reading {
                            finished,
                            at: now,
                            rate: None,
                        },
                    );
                }
                Some(reading) => {
                    let elapsed = now.saturating_duration_since(reading.at).as_secs_f64();
                    if finished < reading.finished {
                        // Retention deleted finished jobs: start again from here.
                        reading.finished = finished;
                        reading.at = now;
                    } else if elapsed >= MIN_SAMPLE_SECS {
                        let sample = (finished - reading.finished) as f64 / elapsed;
                        reading.rate = Some(match reading.rate {
                            Some(rate) => RATE_WEIGHT * sample + (1.0 - RATE_WEIGHT) * rate,
                            None => sample,
                        });
                        reading.finished = finished;
                        reading.at = now;
                    }
                }
            }
        }
    }

    /// The measured rate of `queue`, if any.
    pub fn rate(&self, queue: &str) -> Option<f64> {
        self.readings.get(queue).and_then(|r| r.rate)
    }

    /// The signal for one queue from the latest reading.
    pub fn signal(&self, stats: &QueueStats, workers: &[WorkerInfo], target_s: f64) -> ScaleSignal {
        let backlog = stats.available.saturating_add(stats.running);
        let finished_per_s = self.rate(&stats.name);
        let serving = workers_serving(workers, &stats.name);
        // Workers outside the registry (an embedded one that does not heartbeat) still finish
        // jobs: the rate then counts as one worker's.
        let rate_per_worker = finished_per_s.map(|rate| rate / f64::from(serving.max(1)));
        ScaleSignal {
            queue: stats.name.clone(),
            backlog,
            finished_per_s,
            workers: serving,
            rate_per_worker,
            target_s,
            desired_workers: desired_workers(backlog, rate_per_worker, target_s, serving),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn stats(name: &str, available: u64, running: u64, completed: u64) -> QueueStats {
        QueueStats {
            name: name.to_string(),
            available,
            running,
            completed,
            ..QueueStats::default()
        }
    }

    #[test]
    fn the_backlog_is_split_by_what_one_worker_does_within_the_target() {
        // 1,200 waiting, 10 jobs/s per worker, within 60 s: 2 workers.
        assert_eq!(desired_workers(1200, Some(10.0), 60.0, 5), 2);
        assert_eq!(desired_workers(1201, Some(10.0), 60.0, 5), 3);
        // Within 10 s: 12.
        assert_eq!(desired_workers(1200, Some(10.0), 10.0, 5), 12);
        // A tiny backlog still gets one worker; none gets none.
        assert_eq!(desired_workers(1, Some(100.0), 60.0, 5), 1);
        assert_eq!(desired_workers(0, Some(100.0), 60.0, 5), 0);
        // Nothing measured: keep what runs, at least one.
        assert_eq!(desired_workers(50, None, 60.0, 3), 3);
        assert_eq!(desired_workers(50, None, 60.0, 0), 1);
        assert_eq!(desired_workers(50, Some(0.0), 60.0, 0), 1);
        assert_eq!(desired_workers(u64::MAX, Some(1e-9), 1.0, 0), u32::MAX);
    }

    #[test]
    fn the_rate_is_measured_between_readings_and_survives_retention() {
        let mut meter = ThroughputMeter::new();
        let start = Instant::now();
        meter.observe(&[stats("mail", 500, 10, 0)], start);
        assert_eq!(meter.rate("mail"), None, "one reading measures nothing");
        meter.observe(
            &[stats("mail", 400, 10, 100)],
            start + Duration::from_millis(300),
        );
        assert_eq!(meter.rate("mail"), None, "too close to the last reading");
        meter.observe(
            &[stats("mail", 300, 10, 200)],
            start + Duration::from_secs(10),
        );
        assert_eq!(meter.rate("mail"), Some(20.0));
        // Retention deleted finished jobs: the baseline moves, the rate stays.
        meter.observe(
            &[stats("mail", 300, 10, 50)],
            start + Duration::from_secs(12),
        );
        assert_eq!(meter.rate("mail"), Some(20.0));
        meter.observe(
            &[stats("mail", 300, 10, 150)],
            start + Duration::from_secs(22),
        );
        assert_eq!(
            meter.rate("mail"),
            Some(15.0),
            "averaged with the last rate"
        );
        let signal = meter.signal(&stats("mail", 890, 10, 150), &[], 60.0);
        assert_eq!(signal.backlog, 900);
        assert_eq!(signal.desired_workers, 1, "900 / (15 x 60) = 1");
        let signal = meter.signal(&stats("mail", 2690, 10, 150), &[], 60.0);
        assert_eq!(signal.desired_workers, 3);
    }
}
