//! Ending an attempt: complete, heartbeat, fail, snooze, release.

use conveyor_core::{
    error_class, CompleteParams, ErrorRecord, FailParams, HeartbeatParams, JobState, LeaseOutcome,
    RescueParams, RetryPlan, SnoozeParams, StoreError, DEFAULT_QUEUE,
};
use serde_json::json;

use crate::kit::{
    backoff, bogus_lease, complete, fail, fetch_none, fetch_one, get, insert, lease_of, millis,
    new_job, secs, span, Harness, WORKER,
};

/// Completion is conditional on the current lease: a wrong token, an unknown job or a second
/// completion is `LeaseLost` and changes nothing; outcomes are reported per lease, in order.
pub async fn complete_requires_current_lease(h: &Harness) {
    insert(h, new_job("a")).await;
    insert(h, new_job("b")).await;
    let a = fetch_one(h, DEFAULT_QUEUE).await;
    let b = fetch_one(h, DEFAULT_QUEUE).await;
    let before_a = get(h, a.id).await;
    let before_b = get(h, b.id).await;

    assert_eq!(
        complete(h, bogus_lease(a.id), None).await,
        LeaseOutcome::LeaseLost,
        "a token nobody holds"
    );
    assert_eq!(
        get(h, a.id).await,
        before_a,
        "a wrong token changes nothing"
    );
    assert_eq!(
        complete(h, bogus_lease(uuid::Uuid::now_v7()), None).await,
        LeaseOutcome::LeaseLost,
        "an unknown job"
    );

    let mut swapped = lease_of(&a);
    swapped.id = b.id; // a's token on b's job
    let outcomes = h
        .store
        .jobs_complete_many(vec![
            CompleteParams {
                lease: swapped,
                result: Some(json!("wrong")),
            },
            CompleteParams {
                lease: lease_of(&a),
                result: Some(json!("right")),
            },
        ])
        .await
        .expect("complete");
    assert_eq!(
        outcomes,
        vec![LeaseOutcome::LeaseLost, LeaseOutcome::Applied],
        "one outcome per lease, in order"
    );
    assert_eq!(get(h, b.id).await, before_b, "b untouched by a's token");
    let done = get(h, a.id).await;
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.result, Some(json!("right")));

    assert_eq!(
        complete(h, lease_of(&a), Some(json!("again"))).await,
        LeaseOutcome::LeaseLost,
        "a finished job cannot be completed twice"
    );
    assert_eq!(
        get(h, a.id).await,
        done,
        "second completion changes nothing"
    );
}

/// Completing stores the result, `finished_at` = now, drops the lease, and keeps the attempt.
pub async fn complete_stores_result_and_finished_at(h: &Harness) {
    let job = insert(h, new_job("compute")).await;
    let started = h.now();
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    h.advance(secs(2));
    let result = json!({ "sum": 42, "parts": [40, 2] });
    assert_eq!(
        complete(h, lease_of(&running), Some(result.clone())).await,
        LeaseOutcome::Applied
    );
    let done = get(h, job.id).await;
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.result, Some(result));
    assert_eq!(
        done.finished_at,
        Some(h.now()),
        "finished at the store's now"
    );
    assert_eq!(done.started_at, Some(started), "started_at kept");
    assert_eq!(done.attempt, 1);
    assert_eq!(done.lease, None, "a finished job holds no lease");
    assert!(done.errors.is_empty());
    fetch_none(h, DEFAULT_QUEUE, "completed jobs do not run again").await;

    insert(h, new_job("no-result")).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::Applied
    );
    let done = get(h, running.id).await;
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.result, None, "no result given, none stored");
}

/// A heartbeat moves a held lease's expiry to now + `extend_by` (so the rescuer leaves it
/// alone) and reports `None` for a lease that is not held, per lease and in order.
pub async fn heartbeat_extends_lease_and_reports_lost_leases(h: &Harness) {
    insert(h, new_job("a")).await;
    insert(h, new_job("b")).await;
    let a = fetch_one(h, DEFAULT_QUEUE).await; // lease 30 s
    let b = fetch_one(h, DEFAULT_QUEUE).await;
    let a_token = lease_of(&a).lease_token;

    h.advance(secs(20));
    let now = h.now();
    let beats = h
        .store
        .jobs_heartbeat_many(vec![
            HeartbeatParams {
                lease: lease_of(&a),
                extend_by: secs(60),
            },
            HeartbeatParams {
                lease: bogus_lease(b.id),
                extend_by: secs(60),
            },
        ])
        .await
        .expect("heartbeat");
    assert_eq!(
        beats,
        vec![Some(now + span(secs(60))), None],
        "a extended to now + 60 s; b's bogus token is not held"
    );
    let held = get(h, a.id).await.lease.expect("a still holds its lease");
    assert_eq!(
        held.expires_at,
        now + span(secs(60)),
        "the new expiry is stored"
    );
    assert_eq!(held.token, a_token, "a heartbeat keeps the token");
    let b_lease = get(h, b.id).await.lease.expect("b still holds its lease");
    assert_eq!(
        b_lease,
        b.lease.clone().expect("lease"),
        "a bogus heartbeat changes nothing"
    );

    // 50 s on: a's original lease (30 s) has run out but the extended one (80 s) has not.
    h.advance(secs(30));
    let report = h
        .store
        .jobs_rescue_expired(RescueParams {
            limit: 100,
            retry: backoff(secs(1)),
        })
        .await
        .expect("rescue");
    assert_eq!(
        report.retried,
        vec![b.id],
        "only b, which never heartbeat, expired"
    );
    assert!(report.dead.is_empty());
    assert_eq!(get(h, a.id).await.state, JobState::Running);

    let beats = h
        .store
        .jobs_heartbeat_many(vec![HeartbeatParams {
            lease: lease_of(&b),
            extend_by: secs(60),
        }])
        .await
        .expect("heartbeat");
    assert_eq!(beats, vec![None], "b's lease was lost to the rescuer");

    assert_eq!(complete(h, lease_of(&a), None).await, LeaseOutcome::Applied);
    let beats = h
        .store
        .jobs_heartbeat_many(vec![HeartbeatParams {
            lease: lease_of(&a),
            extend_by: secs(60),
        }])
        .await
        .expect("heartbeat");
    assert_eq!(beats, vec![None], "a completed job's lease is gone");
    assert_eq!(get(h, a.id).await.state, JobState::Completed);
}

/// A failure with a backoff plan makes the job `retryable` with run_at = now + delay(attempt);
/// it is fetched again, as the next attempt, exactly when that time comes.
pub async fn fail_with_backoff_goes_retryable_then_runs_again(h: &Harness) {
    let job = insert(h, new_job("flaky")).await;
    let policy = backoff(secs(10)); // 10 s, 20 s, 40 s, ...
    let first = fetch_one(h, DEFAULT_QUEUE).await;
    let failed = fail(h, lease_of(&first), "oops", RetryPlan::Backoff(policy))
        .await
        .expect("fail");
    assert_eq!(failed.id, job.id);
    assert_eq!(failed.state, JobState::Retryable);
    assert_eq!(
        failed.run_at,
        h.now() + span(secs(10)),
        "first backoff is 10 s"
    );
    assert_eq!(failed.attempt, 1);
    assert_eq!(failed.lease, None, "a failed attempt gives up its lease");
    assert_eq!(failed.finished_at, None, "a retryable job is not finished");
    assert_eq!(get(h, job.id).await, failed, "stored as returned");

    fetch_none(h, DEFAULT_QUEUE, "backing off").await;
    h.advance(millis(9_999));
    fetch_none(h, DEFAULT_QUEUE, "1 ms of backoff left").await;
    h.advance(millis(1));
    let second = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(second.id, job.id);
    assert_eq!(second.attempt, 2, "the retry is the second attempt");
    assert_ne!(
        lease_of(&second).lease_token,
        lease_of(&first).lease_token,
        "a new attempt gets a new token"
    );

    let failed = fail(
        h,
        lease_of(&second),
        "oops again",
        RetryPlan::Backoff(policy),
    )
    .await
    .expect("fail");
    assert_eq!(failed.state, JobState::Retryable);
    assert_eq!(
        failed.run_at,
        h.now() + span(secs(20)),
        "second backoff is 20 s"
    );
}

/// Each failure appends {attempt, at, class, message} to the job's history, oldest first.
pub async fn fail_records_error_history_in_order(h: &Harness) {
    let mut new = new_job("history");
    new.max_attempts = 5;
    let job = insert(h, new).await;
    let classes = [error_class::ERROR, error_class::TIMEOUT, error_class::PANIC];
    let mut expected = Vec::new();
    for (i, class) in classes.iter().enumerate() {
        let running = fetch_one(h, DEFAULT_QUEUE).await;
        h.advance(secs(1));
        let message = format!("failure number {}", i + 1);
        let failed = h
            .store
            .job_fail(FailParams {
                lease: lease_of(&running),
                class: class.to_string(),
                message: message.clone(),
                retry: RetryPlan::Backoff(backoff(secs(5))),
                backtrace: Some(format!("at frame {i}\n\u{0}end")),
            })
            .await
            .expect("fail");
        expected.push(ErrorRecord {
            attempt: i as u32 + 1,
            at: h.now(),
            class: class.to_string(),
            message,
            // Who ran the attempt and since when (fetched a second before it failed), and
            // the backtrace as stored (no NUL).
            worker_id: Some(WORKER.to_string()),
            started_at: Some(h.now() - span(secs(1))),
            backtrace: Some(format!("at frame {i}\n\u{FFFD}end")),
            replayed_at: None,
        });
        assert_eq!(failed.errors, expected, "history after failure {}", i + 1);
        h.advance(secs(3600)); // past any backoff
    }
    assert_eq!(get(h, job.id).await.errors, expected, "history is stored");
}

/// Attempts are counted at fetch: the failure of attempt `max_attempts` sends the job to `dead`
/// (finished, no lease, full history) whatever the retry plan, and it never runs again.
pub async fn fail_after_last_attempt_goes_dead(h: &Harness) {
    let mut new = new_job("doomed");
    new.max_attempts = 2;
    let job = insert(h, new).await;

    let first = fetch_one(h, DEFAULT_QUEUE).await;
    let failed = fail(
        h,
        lease_of(&first),
        "one",
        RetryPlan::Backoff(backoff(secs(1))),
    )
    .await
    .expect("fail");
    assert_eq!(failed.state, JobState::Retryable, "attempt 1 of 2 retries");

    h.advance(secs(1));
    let second = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(second.attempt, 2);
    let dead = fail(
        h,
        lease_of(&second),
        "two",
        RetryPlan::Backoff(backoff(secs(1))),
    )
    .await
    .expect("fail");
    assert_eq!(dead.state, JobState::Dead, "attempt 2 of 2 is the last");
    assert_eq!(dead.attempt, 2);
    assert_eq!(dead.lease, None);
    assert_eq!(dead.finished_at, Some(h.now()), "dead is finished");
    let messages: Vec<&str> = dead.errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(messages, ["one", "two"]);
    assert_eq!(get(h, job.id).await, dead, "stored as returned");

    h.advance(secs(86_400));
    assert_eq!(h.store.jobs_promote_due().await.expect("promote"), 0);
    fetch_none(h, DEFAULT_QUEUE, "dead jobs do not run").await;

    // The same holds for a plan with an explicit time.
    let mut once = new_job("once");
    once.max_attempts = 1;
    insert(h, once).await;
    let only = fetch_one(h, DEFAULT_QUEUE).await;
    let at = h.now() + span(secs(60));
    let dead = fail(h, lease_of(&only), "only", RetryPlan::At(at))
        .await
        .expect("fail");
    assert_eq!(
        dead.state,
        JobState::Dead,
        "RetryPlan::At on the last attempt"
    );
}

/// `RetryPlan::Never` sends the job to `dead` at once, with attempts left.
pub async fn fail_never_goes_dead_at_once(h: &Harness) {
    let job = insert(h, new_job("permanent")).await; // 25 attempts
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    let dead = h
        .store
        .job_fail(FailParams {
            lease: lease_of(&running),
            class: error_class::PERMANENT.into(),
            message: "bad input".into(),
            retry: RetryPlan::Never,
            backtrace: None,
        })
        .await
        .expect("fail");
    assert_eq!(dead.id, job.id);
    assert_eq!(dead.state, JobState::Dead);
    assert_eq!(dead.attempt, 1);
    assert_eq!(
        dead.errors,
        vec![ErrorRecord {
            attempt: 1,
            at: h.now(),
            class: error_class::PERMANENT.into(),
            message: "bad input".into(),
            worker_id: Some(WORKER.to_string()),
            started_at: Some(h.now()),
            backtrace: None,
            replayed_at: None,
        }]
    );
    h.advance(secs(86_400));
    fetch_none(h, DEFAULT_QUEUE, "dead jobs do not run").await;
}

/// `RetryPlan::At(t)` makes the job `retryable` with run_at = t, fetchable from t.
pub async fn fail_at_sets_run_at(h: &Harness) {
    let job = insert(h, new_job("rate-limited")).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    let at = h.now() + span(secs(90));
    let failed = h
        .store
        .job_fail(FailParams {
            lease: lease_of(&running),
            class: error_class::RETRY_AFTER.into(),
            message: "429".into(),
            retry: RetryPlan::At(at),
            backtrace: None,
        })
        .await
        .expect("fail");
    assert_eq!(failed.state, JobState::Retryable);
    assert_eq!(failed.run_at, at);
    assert_eq!(failed.errors.len(), 1);
    assert_eq!(failed.errors[0].class, error_class::RETRY_AFTER);

    h.advance(secs(89));
    fetch_none(h, DEFAULT_QUEUE, "retry-after not reached").await;
    h.advance(secs(1));
    let again = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(again.id, job.id);
    assert_eq!(again.attempt, 2);
}

/// Failing under a lease that is not held is `StoreError::LeaseLost` and changes nothing.
pub async fn fail_with_stale_token_changes_nothing(h: &Harness) {
    insert(h, new_job("held")).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    let before = get(h, running.id).await;
    let err = fail(h, bogus_lease(running.id), "nope", RetryPlan::Never)
        .await
        .expect_err("a token nobody holds");
    assert!(
        matches!(err, StoreError::LeaseLost(id) if id == running.id),
        "expected LeaseLost({}), got {err:?}",
        running.id
    );
    assert_eq!(get(h, running.id).await, before, "nothing changed");

    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::Applied
    );
    let done = get(h, running.id).await;
    let err = fail(h, lease_of(&running), "late", RetryPlan::Never)
        .await
        .expect_err("the job is completed");
    assert!(matches!(err, StoreError::LeaseLost(_)), "got {err:?}");
    assert_eq!(
        get(h, running.id).await,
        done,
        "a completed job stays completed"
    );
}

/// Snoozing puts a running job back to `scheduled` until the given time without counting the
/// attempt or recording an error; a snooze under a lost lease is `LeaseLost`.
pub async fn snooze_does_not_count_an_attempt(h: &Harness) {
    let mut new = new_job("sleepy");
    new.max_attempts = 1;
    let job = insert(h, new).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(running.attempt, 1);

    let until = h.now() + span(secs(60));
    let snoozed = h
        .store
        .job_snooze(SnoozeParams {
            lease: lease_of(&running),
            until,
        })
        .await
        .expect("snooze");
    assert_eq!(snoozed.state, JobState::Scheduled);
    assert_eq!(snoozed.run_at, until);
    assert_eq!(snoozed.attempt, 0, "the snoozed attempt is not counted");
    assert_eq!(snoozed.lease, None);
    assert!(snoozed.errors.is_empty(), "a snooze is not an error");
    assert_eq!(get(h, job.id).await, snoozed, "stored as returned");

    fetch_none(h, DEFAULT_QUEUE, "snoozed").await;
    h.advance(secs(60));
    let again = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(again.id, job.id);
    assert_eq!(again.attempt, 1, "still the first attempt of one");

    // The old lease is gone.
    let err = h
        .store
        .job_snooze(SnoozeParams {
            lease: lease_of(&running),
            until,
        })
        .await
        .expect_err("a stale token");
    assert!(
        matches!(err, StoreError::LeaseLost(id) if id == job.id),
        "got {err:?}"
    );
    assert_eq!(
        get(h, job.id).await,
        again,
        "a stale snooze changes nothing"
    );

    // Snoozes never used up the single attempt: this failure is attempt 1 of 1, so dead.
    let dead = fail(
        h,
        lease_of(&again),
        "x",
        RetryPlan::Backoff(backoff(secs(1))),
    )
    .await
    .expect("fail");
    assert_eq!(dead.state, JobState::Dead, "attempt 1 of 1 failed");
    assert_eq!(dead.errors.len(), 1);
}

/// Releasing returns running jobs to `available` at once without counting the attempt, and
/// reports how many leases were still held (a stale lease is skipped and left alone).
pub async fn release_returns_job_available_without_counting_attempt(h: &Harness) {
    insert(h, new_job("a")).await;
    insert(h, new_job("b")).await;
    let a = fetch_one(h, DEFAULT_QUEUE).await;
    let b = fetch_one(h, DEFAULT_QUEUE).await;
    let b_before = get(h, b.id).await;

    let released = h
        .store
        .jobs_release_many(vec![lease_of(&a), bogus_lease(b.id)])
        .await
        .expect("release");
    assert_eq!(released, 1, "only a's lease was held");
    let a_now = get(h, a.id).await;
    assert_eq!(a_now.state, JobState::Available);
    assert_eq!(a_now.attempt, 0, "the released attempt is not counted");
    assert_eq!(a_now.lease, None);
    assert!(a_now.errors.is_empty(), "a release is not an error");
    assert_eq!(get(h, b.id).await, b_before, "b untouched");

    let again = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(again.id, a.id, "available again at once");
    assert_eq!(again.attempt, 1);
    assert_eq!(
        complete(h, lease_of(&a), None).await,
        LeaseOutcome::LeaseLost,
        "the released lease no longer completes"
    );
    assert_eq!(
        h.store
            .jobs_release_many(vec![lease_of(&a)])
            .await
            .expect("release"),
        0,
        "the released lease is not held any more"
    );
    assert_eq!(
        get(h, a.id).await.state,
        JobState::Running,
        "the new attempt keeps running"
    );
}
