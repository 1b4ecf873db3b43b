//! The rescuer: running jobs whose worker stopped heartbeating.

use conveyor_core::{
    error_class, JobState, LeaseOutcome, RescueParams, RescueReport, DEFAULT_QUEUE,
};
use std::collections::HashSet;
use std::time::Duration;
use uuid::Uuid;

use crate::kit::{
    backoff, complete, fetch, fetch_none, fetch_one, get, insert, lease_of, millis, new_job, secs,
    span, Harness, LEASE,
};

async fn rescue(h: &Harness, limit: usize, base: Duration) -> RescueReport {
    h.store
        .jobs_rescue_expired(RescueParams {
            limit,
            retry: backoff(base),
        })
        .await
        .expect("rescue should succeed")
}

/// A running job whose lease ran out goes `retryable` with run_at = now + delay(attempt), its
/// lease dropped and a `lease_expired` error recorded; it then runs again as the next attempt.
pub async fn rescue_moves_expired_leases_to_retryable_with_lease_expired_error(h: &Harness) {
    let job = insert(h, new_job("hangs")).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    h.advance(LEASE + millis(1));

    let report = rescue(h, 100, secs(5)).await;
    assert_eq!(report.retried, vec![job.id]);
    assert_eq!(report.attempts.len(), 1, "{report:?}");
    assert_eq!(report.attempts[0].queue, job.queue);
    assert_eq!(report.attempts[0].kind, job.kind);
    assert_eq!(
        report.attempts[0].status,
        conveyor_core::AttemptStatus::Failed
    );
    assert_eq!(
        report.attempts[0].duration,
        LEASE + millis(1),
        "run from its start to the rescue"
    );
    assert!(report.dead.is_empty(), "{report:?}");
    let rescued = get(h, job.id).await;
    assert_eq!(rescued.state, JobState::Retryable);
    assert_eq!(rescued.lease, None);
    assert_eq!(rescued.attempt, 1);
    assert_eq!(
        rescued.run_at,
        h.now() + span(secs(5)),
        "backoff for attempt 1"
    );
    assert_eq!(rescued.errors.len(), 1, "{:?}", rescued.errors);
    assert_eq!(rescued.errors[0].class, error_class::LEASE_EXPIRED);
    assert_eq!(rescued.errors[0].attempt, 1);
    assert_eq!(rescued.errors[0].at, h.now());
    assert_eq!(
        rescued.errors[0].started_at,
        Some(h.now() - span(LEASE + millis(1))),
        "the rescued attempt's start"
    );

    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::LeaseLost,
        "the expired lease no longer completes"
    );
    assert!(
        rescue(h, 100, secs(5)).await.retried.is_empty(),
        "rescued once"
    );

    fetch_none(h, DEFAULT_QUEUE, "backing off after rescue").await;
    h.advance(secs(5));
    let again = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(again.id, job.id);
    assert_eq!(again.attempt, 2);
}

/// A rescued job with no attempts left goes `dead` (reported as such) with the
/// `lease_expired` error in its history.
pub async fn rescue_sends_exhausted_jobs_to_dead(h: &Harness) {
    let mut new = new_job("last-chance");
    new.max_attempts = 1;
    let job = insert(h, new).await;
    fetch_one(h, DEFAULT_QUEUE).await;
    h.advance(LEASE + secs(1));

    let report = rescue(h, 100, secs(5)).await;
    assert!(report.retried.is_empty(), "{report:?}");
    assert_eq!(report.dead, vec![job.id]);
    let dead = get(h, job.id).await;
    assert_eq!(dead.state, JobState::Dead);
    assert_eq!(dead.lease, None);
    assert_eq!(dead.finished_at, Some(h.now()), "dead is finished");
    assert_eq!(dead.errors.len(), 1);
    assert_eq!(dead.errors[0].class, error_class::LEASE_EXPIRED);
    h.advance(secs(3600));
    fetch_none(h, DEFAULT_QUEUE, "dead jobs do not run").await;
}

/// Leases that have not run out are left alone, and their holders can still complete.
pub async fn rescue_leaves_live_leases_alone(h: &Harness) {
    insert(h, new_job("busy")).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    let before = get(h, running.id).await;
    h.advance(LEASE - secs(1));

    let report = rescue(h, 100, secs(5)).await;
    assert_eq!(report, RescueReport::default(), "nothing expired");
    assert_eq!(get(h, running.id).await, before, "unchanged");
    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::Applied
    );
}

/// One call rescues at most `limit` jobs; the rest wait for the next call.
pub async fn rescue_honours_limit(h: &Harness) {
    for i in 0..3 {
        insert(h, new_job(&format!("stuck-{i}"))).await;
    }
    let running: HashSet<Uuid> = fetch(h, &[DEFAULT_QUEUE], 3)
        .await
        .iter()
        .map(|j| j.id)
        .collect();
    assert_eq!(running.len(), 3);
    h.advance(LEASE + secs(1));

    let first = rescue(h, 2, secs(5)).await;
    assert_eq!(
        first.retried.len() + first.dead.len(),
        2,
        "limit 2: {first:?}"
    );
    let second = rescue(h, 2, secs(5)).await;
    assert_eq!(
        second.retried.len() + second.dead.len(),
        1,
        "one left: {second:?}"
    );
    let third = rescue(h, 2, secs(5)).await;
    assert_eq!(third, RescueReport::default(), "none left");
    let rescued: HashSet<Uuid> = first
        .retried
        .iter()
        .chain(&second.retried)
        .copied()
        .collect();
    assert_eq!(rescued, running, "each stuck job rescued once");
}

/// After a rescue and a new claim, the old holder's completion is `LeaseLost` and the new
/// holder's is `Applied`.
pub async fn stale_completion_after_rescue_is_rejected(h: &Harness) {
    let job = insert(h, new_job("contested")).await;
    let old = fetch_one(h, DEFAULT_QUEUE).await;
    h.advance(LEASE + secs(1));
    assert_eq!(rescue(h, 100, secs(1)).await.retried, vec![job.id]);
    h.advance(secs(1));
    let new = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(new.id, job.id);
    assert_ne!(lease_of(&new).lease_token, lease_of(&old).lease_token);

    assert_eq!(
        complete(h, lease_of(&old), Some(serde_json::json!("old"))).await,
        LeaseOutcome::LeaseLost,
        "the rescued holder lost its lease"
    );
    let still = get(h, job.id).await;
    assert_eq!(
        still.state,
        JobState::Running,
        "the new attempt keeps running"
    );
    assert_eq!(still.lease, new.lease);

    assert_eq!(
        complete(h, lease_of(&new), Some(serde_json::json!("new"))).await,
        LeaseOutcome::Applied
    );
    let done = get(h, job.id).await;
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.result, Some(serde_json::json!("new")));
}
