//! Debounce and throttle (`conveyor_core::debounce`): enqueues of one kind and queue sharing a
//! key fold into the job that stands, which the answer names (`debounced_into`). Jobs are
//! stamped with their fold key by the engine's `LimitStamps`, as every server and the facade
//! open their store.

use conveyor_core::clock::truncate_to_millis;
use conveyor_core::debounce::{DebounceMode, DebounceSpec, ThrottleSpec};
use conveyor_core::{Inserted, JobListParams, JobState, NewJob};
use conveyor_engine::LimitStamps;
use serde_json::json;

use crate::kit::{complete, fetch, job_in, lease_of, list, millis, secs, span, Harness};

fn stamped(h: &Harness) -> Harness {
    Harness::new(LimitStamps::wrap(h.store.clone()), h.clock.clone())
}

fn debounced(user: &str, n: u32, mode: DebounceMode, max_wait_ms: Option<u64>) -> NewJob {
    let mut job = job_in("profiles", "profile.sync");
    job.payload = json!({"user": user, "n": n});
    job.debounce = Some(DebounceSpec {
        key: "payload.user".into(),
        delay_ms: 1000,
        max_wait_ms,
        mode,
    });
    job
}

async fn enqueue(h: &Harness, job: NewJob) -> Inserted {
    let mut inserted = h.store.jobs_insert_many(vec![job]).await.expect("insert");
    inserted.pop().expect("one answer")
}

async fn jobs_in(h: &Harness, queue: &str) -> Vec<conveyor_core::Job> {
    let mut params = JobListParams::default();
    params.queue = Some(queue.into());
    params.limit = 100;
    list(h, params).await
}

/// Trailing: a burst of one key is one job, due a delay after the last enqueue, carrying the
/// last payload; another key is a job of its own; a burst within one batch folds too.
pub async fn a_trailing_debounce_keeps_the_last_payload_and_moves_the_run(h: &Harness) {
    let h = &stamped(h);
    let first = enqueue(h, debounced("ann", 1, DebounceMode::Trailing, None)).await;
    assert!(!first.duplicate && first.debounced_into.is_none());
    assert_eq!(first.job.state, JobState::Scheduled);
    assert_eq!(
        first.job.run_at,
        truncate_to_millis(h.now() + span(secs(1)))
    );
    h.advance(millis(600));
    let second = enqueue(h, debounced("ann", 2, DebounceMode::Trailing, None)).await;
    assert!(second.duplicate);
    assert_eq!(second.debounced_into, Some(first.job.id));
    assert_eq!(second.job.payload["n"], 2);
    assert_eq!(
        second.job.run_at,
        truncate_to_millis(h.now() + span(secs(1))),
        "moved later"
    );
    let batch = h
        .store
        .jobs_insert_many(vec![
            debounced("ann", 3, DebounceMode::Trailing, None),
            debounced("bob", 1, DebounceMode::Trailing, None),
            debounced("bob", 2, DebounceMode::Trailing, None),
        ])
        .await
        .expect("batch");
    assert_eq!(batch[0].debounced_into, Some(first.job.id));
    assert!(batch[1].debounced_into.is_none());
    assert_eq!(batch[2].debounced_into, Some(batch[1].job.id));
    assert_eq!(batch[2].job.payload["n"], 2);
    assert_eq!(jobs_in(h, "profiles").await.len(), 2, "one job per key");
    assert!(fetch(h, &["profiles"], 10).await.is_empty(), "not yet due");
    h.advance(millis(1100));
    let ran = fetch(h, &["profiles"], 10).await;
    let mut payloads: Vec<(String, u64)> = ran
        .iter()
        .map(|job| {
            (
                job.payload["user"].as_str().unwrap_or("?").to_string(),
                job.payload["n"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    payloads.sort();
    assert_eq!(payloads, [("ann".to_string(), 3), ("bob".to_string(), 2)]);
    // Started, it takes no more payloads: the next enqueue is a new job.
    let after = enqueue(h, debounced("ann", 4, DebounceMode::Trailing, None)).await;
    assert!(after.debounced_into.is_none());
    assert_ne!(after.job.id, first.job.id);
    let started = ran
        .iter()
        .find(|job| job.id == first.job.id)
        .expect("ann's");
    assert_eq!(started.payload["n"], 3);
    complete(h, lease_of(started), None).await;
}

/// `max_wait_ms` caps how far a burst moves its run: at most that long after the first.
pub async fn a_trailing_debounce_runs_by_max_wait_however_long_the_burst(h: &Harness) {
    let h = &stamped(h);
    let first = enqueue(h, debounced("ann", 0, DebounceMode::Trailing, Some(2500))).await;
    let deadline = h.now() + span(millis(2500));
    for n in 1..=5 {
        h.advance(millis(500));
        let folded = enqueue(h, debounced("ann", n, DebounceMode::Trailing, Some(2500))).await;
        assert_eq!(folded.debounced_into, Some(first.job.id));
        assert!(
            folded.job.run_at <= deadline,
            "{} > {deadline}",
            folded.job.run_at
        );
    }
    h.advance(millis(100));
    let ran = fetch(h, &["profiles"], 10).await;
    assert_eq!(ran.len(), 1, "due by max_wait even while the burst goes on");
    assert_eq!(ran[0].payload["n"], 5);
}

/// Leading: the first enqueue runs at once; the rest of the burst is dropped into it, each
/// pushing the window on; a quiet delay later, the next enqueue runs again.
pub async fn a_leading_debounce_runs_the_first_and_drops_the_rest(h: &Harness) {
    let h = &stamped(h);
    let first = enqueue(h, debounced("ann", 1, DebounceMode::Leading, None)).await;
    assert_eq!(first.job.state, JobState::Available);
    for n in 2..=4 {
        h.advance(millis(700));
        let dropped = enqueue(h, debounced("ann", n, DebounceMode::Leading, None)).await;
        assert_eq!(dropped.debounced_into, Some(first.job.id), "enqueue {n}");
        assert_eq!(dropped.job.payload["n"], 1, "the first's payload stands");
    }
    h.advance(millis(1100));
    let next = enqueue(h, debounced("ann", 5, DebounceMode::Leading, None)).await;
    assert!(next.debounced_into.is_none());
    assert_eq!(jobs_in(h, "profiles").await.len(), 2);
}

/// Throttle: one job per key per period, counted from the one that ran.
pub async fn a_throttle_lets_one_job_per_key_through_each_period(h: &Harness) {
    let h = &stamped(h);
    let throttled = |n: u32| {
        let mut job = job_in("reports", "report.build");
        job.payload = json!({"account": "acme", "n": n});
        job.throttle = Some(ThrottleSpec {
            key: "payload.account".into(),
            period_ms: 60_000,
        });
        job
    };
    let first = enqueue(h, throttled(1)).await;
    h.advance(secs(30));
    let dropped = enqueue(h, throttled(2)).await;
    assert_eq!(dropped.debounced_into, Some(first.job.id));
    h.advance(secs(30));
    let next = enqueue(h, throttled(3)).await;
    assert!(next.debounced_into.is_none(), "a new period");
    assert_eq!(next.job.payload["n"], 3);
    assert_eq!(jobs_in(h, "reports").await.len(), 2);
}
