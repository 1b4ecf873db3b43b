//! The history counter a process keeps (see [`conveyor_core::stats`]): outcomes counted in
//! memory by minute, queue and kind, flushed to the store every few seconds.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};

use conveyor_core::clock::Clock;
use conveyor_core::stats::*;
use conveyor_core::StoreResult;

/// Counts not yet in the store, by minute, queue and kind. Cheap to share; every method takes
/// one short lock.
pub struct StatsRecorder {
    clock: Arc<dyn Clock>,
    pending: Mutex<Pending>,
    enabled: std::sync::atomic::AtomicBool,
}

/// Counts by queue, then kind, then minute: nested so that an event finds its row by `&str`
/// without allocating (this is on the job path).
#[derive(Default)]
struct Pending {
    rows: usize,
    by_queue: HashMap<String, HashMap<String, BTreeMap<DateTime<Utc>, RollupCounts>>>,
}

impl Pending {
    /// The row of `minute`, `queue` and `kind`; `None` when the cap is reached and it is new.
    fn row(&mut self, minute: DateTime<Utc>, queue: &str, kind: &str) -> Option<&mut RollupCounts> {
        let full = self.rows >= MAX_PENDING_ROWS;
        if !self.by_queue.contains_key(queue) {
            if full {
                return None;
            }
            self.by_queue.insert(queue.to_string(), HashMap::new());
        }
        let kinds = self.by_queue.get_mut(queue)?;
        if !kinds.contains_key(kind) {
            if full {
                return None;
            }
            kinds.insert(kind.to_string(), BTreeMap::new());
        }
        let minutes = kinds.get_mut(kind)?;
        if !minutes.contains_key(&minute) {
            if full {
                return None;
            }
            self.rows += 1;
        }
        Some(minutes.entry(minute).or_default())
    }
}

impl std::fmt::Debug for StatsRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsRecorder").finish_non_exhaustive()
    }
}

/// The most distinct minute/queue/kind rows kept while the store cannot be written, so an
/// outage long enough to matter costs history (new rows are not counted) rather than memory.
const MAX_PENDING_ROWS: usize = 100_000;

impl StatsRecorder {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            pending: Mutex::default(),
            enabled: std::sync::atomic::AtomicBool::new(true),
        }
    }

    /// Stops (or resumes) counting: a process that keeps no history costs nothing for it.
    pub fn set_enabled(&self, enabled: bool) {
        self.enabled
            .store(enabled, std::sync::atomic::Ordering::Relaxed);
    }

    fn with(&self, queue: &str, kind: &str, change: impl FnOnce(&mut RollupCounts)) {
        if !self.enabled.load(std::sync::atomic::Ordering::Relaxed) {
            return;
        }
        let minute = minute_of(self.clock.now());
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(counts) = pending.row(minute, queue, kind) {
            change(counts);
        }
    }

    /// Counts a job stored by an enqueue.
    pub fn enqueued(&self, queue: &str, kind: &str) {
        self.with(queue, kind, |counts| counts.enqueued += 1);
    }

    /// Counts an attempt handed to a worker after waiting `wait` to start.
    pub fn started(&self, queue: &str, kind: &str, wait: Duration) {
        self.with(queue, kind, |counts| {
            counts.started += 1;
            counts.queue_wait.observe(wait);
        });
    }

    /// Counts an ended attempt (snoozes are not counted: the attempt did not end).
    pub fn finished(&self, event: &conveyor_core::AttemptEvent<'_>) {
        use conveyor_core::AttemptStatus;
        if event.status == AttemptStatus::Snoozed {
            return;
        }
        self.with(event.queue, event.kind, |counts| {
            match event.status {
                AttemptStatus::Completed => counts.completed += 1,
                AttemptStatus::Failed => {
                    counts.failed += 1;
                    counts.retried += 1;
                }
                AttemptStatus::Dead => {
                    counts.failed += 1;
                    counts.dead += 1;
                }
                AttemptStatus::Snoozed => {}
            }
            counts.run_time.observe(event.duration);
        });
    }

    /// Takes everything counted so far.
    pub fn take(&self) -> Vec<Rollup> {
        let pending = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|e| e.into_inner()));
        let mut rollups = Vec::with_capacity(pending.rows);
        for (queue, kinds) in pending.by_queue {
            for (kind, minutes) in kinds {
                for (minute, counts) in minutes {
                    rollups.push(Rollup {
                        minute,
                        queue: queue.clone(),
                        kind: kind.clone(),
                        counts,
                    });
                }
            }
        }
        rollups.sort_by(|a, b| (a.minute, &a.queue, &a.kind).cmp(&(b.minute, &b.queue, &b.kind)));
        rollups
    }

    /// Puts back rollups a flush could not write, to be tried with the next one.
    pub fn restore(&self, rollups: Vec<Rollup>) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        for rollup in rollups {
            if let Some(counts) = pending.row(rollup.minute, &rollup.queue, &rollup.kind) {
                counts.merge(&rollup.counts);
            }
        }
    }

    /// Writes everything counted so far to `store`; on failure keeps it for the next flush.
    pub async fn flush(&self, store: &dyn StatsStore) -> StoreResult<usize> {
        let rollups = self.take();
        let rows = rollups.len();
        if rows == 0 {
            return Ok(0);
        }
        match store.stats_merge(rollups.clone()).await {
            Ok(()) => Ok(rows),
            Err(error) => {
                self.restore(rollups);
                Err(error)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor_core::clock::ManualClock;
    use conveyor_core::{AttemptEvent, AttemptStatus};

    fn at(text: &str) -> DateTime<Utc> {
        text.parse().expect("time")
    }

    #[test]
    fn the_recorder_keys_by_minute_queue_and_kind_and_takes_once() {
        let clock = Arc::new(ManualClock::new(at("2026-12-01T10:00:30Z")));
        let recorder = StatsRecorder::new(clock.clone());
        recorder.enqueued("q", "k");
        recorder.started("q", "k", Duration::from_millis(40));
        recorder.finished(&AttemptEvent {
            queue: "q",
            kind: "k",
            status: AttemptStatus::Dead,
            duration: Duration::from_millis(5),
        });
        clock.advance(Duration::from_secs(40));
        recorder.finished(&AttemptEvent {
            queue: "q",
            kind: "k",
            status: AttemptStatus::Snoozed,
            duration: Duration::from_millis(5),
        });
        recorder.enqueued("q", "other");
        let rollups = recorder.take();
        assert_eq!(rollups.len(), 2);
        assert_eq!(rollups[0].minute, at("2026-12-01T10:00:00Z"));
        assert_eq!(
            (
                rollups[0].counts.failed,
                rollups[0].counts.dead,
                rollups[0].counts.retried
            ),
            (1, 1, 0)
        );
        assert_eq!(rollups[1].minute, at("2026-12-01T10:01:00Z"));
        assert_eq!(rollups[1].kind, "other");
        assert!(recorder.take().is_empty());
        recorder.restore(rollups.clone());
        assert_eq!(recorder.take(), rollups);
    }
}
