//! The one place a finished attempt is told, for every process that writes outcomes (the
//! server for its HTTP workers, a Rust worker for itself): to the observer (metrics and the
//! history behind them) and, completed or failed, to its queue's and kind's circuit breakers
//! (nothing when neither has one). A snooze is no outcome for a breaker.

use std::sync::Arc;

use chrono::{DateTime, Utc};
use conveyor_core::{AttemptEvent, AttemptStatus, JobObserver};

use crate::breakers::{CircuitBreakers, Outcome};

/// Tells `observer` and `breakers` that an attempt ended as `event` says. `retry_at`: when a
/// failure asked to be retried at a given time (a dependency's retry-after), which may pause
/// its kind (see `conveyor_core::breaker`).
pub fn attempt_finished(
    observer: Option<&dyn JobObserver>,
    breakers: &Arc<CircuitBreakers>,
    event: &AttemptEvent<'_>,
    retry_at: Option<DateTime<Utc>>,
) {
    if let Some(observer) = observer {
        observer.attempt_finished(event);
    }
    let succeeded = match event.status {
        AttemptStatus::Completed => true,
        AttemptStatus::Failed | AttemptStatus::Dead => false,
        AttemptStatus::Snoozed => return,
    };
    breakers.record(Outcome {
        queue: event.queue,
        kind: event.kind,
        succeeded,
        retry_at,
    });
}
