//! Inserting jobs, idempotency keys, and reading jobs back.

use conveyor_core::job::DEFAULT_MAX_ATTEMPTS;
use conveyor_core::{Job, JobState, LeaseOutcome, NewJob, RetryPlan, StoreError, DEFAULT_QUEUE};
use serde_json::json;
use std::collections::HashSet;
use uuid::Uuid;

use crate::kit::{
    backoff, complete, fail, fetch_none, fetch_one, get, insert, lease_of, list_all, make_dead,
    millis, new_job, secs, span, Harness,
};

/// An inserted job is `available` at once, with a fresh time-ordered UUIDv7 id, no attempts yet,
/// `run_at` and `created_at` at the store's now, and the defaults of `NewJob::new`.
pub async fn insert_returns_available_job_with_uuid_v7(h: &Harness) {
    let now = h.now();
    let inserted = h
        .store
        .jobs_insert_many(vec![new_job("email")])
        .await
        .expect("insert should succeed");
    assert_eq!(inserted.len(), 1, "one result per job: {inserted:?}");
    assert!(!inserted[0].duplicate, "a fresh job is not a duplicate");
    let job = inserted[0].job.clone();

    assert_eq!(
        job.id.get_version(),
        Some(uuid::Version::SortRand),
        "ids are UUIDv7, got {}",
        job.id
    );
    assert_eq!(job.state, JobState::Available);
    assert_eq!(job.kind, "email");
    assert_eq!(job.queue, DEFAULT_QUEUE);
    assert_eq!(job.payload, json!({}));
    assert_eq!(job.priority, 0);
    assert_eq!(job.attempt, 0, "no attempt has started");
    assert_eq!(job.max_attempts, DEFAULT_MAX_ATTEMPTS);
    assert_eq!(job.run_at, now, "a job without run_at runs from now");
    assert_eq!(job.created_at, now, "created_at is the store's now");
    assert_eq!(job.started_at, None);
    assert_eq!(job.finished_at, None);
    assert_eq!(job.lease, None);
    assert_eq!(job.result, None);
    assert!(job.errors.is_empty(), "no errors yet: {:?}", job.errors);
    assert_eq!(
        get(h, job.id).await,
        job,
        "job_get returns what insert returned"
    );

    h.advance(millis(1));
    let later = insert(h, new_job("email")).await;
    assert_ne!(later.id, job.id, "every job gets its own id");
    assert!(
        later.id > job.id,
        "ids are time-ordered: {} inserted after {}",
        later.id,
        job.id
    );
}

/// A batch insert returns one result per job, in the order given, each stored.
pub async fn insert_many_returns_one_result_per_job_in_order(h: &Harness) {
    let kinds = ["first", "second", "third", "fourth"];
    let inserted = h
        .store
        .jobs_insert_many(kinds.iter().map(|k| new_job(k)).collect())
        .await
        .expect("insert should succeed");
    let got: Vec<&str> = inserted.iter().map(|i| i.job.kind.as_str()).collect();
    assert_eq!(got, kinds, "results come back in input order");
    assert!(inserted.iter().all(|i| !i.duplicate), "{inserted:?}");
    let distinct: HashSet<Uuid> = inserted.iter().map(|i| i.job.id).collect();
    assert_eq!(distinct.len(), kinds.len(), "every job gets its own id");
    for i in &inserted {
        assert_eq!(get(h, i.job.id).await, i.job, "stored as returned");
    }
    assert_eq!(list_all(h).await.len(), kinds.len(), "all jobs stored");
}

/// A job whose run_at is in the future is `scheduled`, keeps that run_at, and is not fetchable.
pub async fn insert_with_future_run_at_is_scheduled(h: &Harness) {
    let run_at = h.now() + span(secs(60));
    let mut job = new_job("later");
    job.run_at = Some(run_at);
    let job = insert(h, job).await;
    assert_eq!(job.state, JobState::Scheduled);
    assert_eq!(job.run_at, run_at, "run_at is kept");
    assert_eq!(get(h, job.id).await.state, JobState::Scheduled);
    fetch_none(h, DEFAULT_QUEUE, "the only job is scheduled for later").await;
    assert_eq!(get(h, job.id).await.state, JobState::Scheduled);
}

/// A job whose run_at has already passed is `available` at once.
pub async fn insert_with_past_run_at_is_available(h: &Harness) {
    let mut job = new_job("overdue");
    job.run_at = Some(h.now() - span(secs(60)));
    let job = insert(h, job).await;
    assert_eq!(job.state, JobState::Available);
    assert!(job.run_at <= h.now(), "run_at is not in the future");
    let fetched = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(fetched.id, job.id);
}

/// A batch with one invalid job is rejected as a whole: a validation error naming the field,
/// and none of the batch stored.
pub async fn insert_many_is_all_or_nothing(h: &Harness) {
    let mut bad_attempts = new_job("bad");
    bad_attempts.max_attempts = 0;
    let err = h
        .store
        .jobs_insert_many(vec![new_job("good"), bad_attempts, new_job("good")])
        .await
        .expect_err("a batch with an invalid job must fail");
    match err {
        StoreError::Invalid(e) => assert_eq!(e.field, "max_attempts", "{e}"),
        other => panic!("expected StoreError::Invalid, got {other:?}"),
    }

    let mut bad_kind = new_job("good");
    bad_kind.kind = "not a valid kind!".to_string();
    let mut keyed = new_job("good");
    keyed.idempotency_key = Some("batch-key".into());
    let err = h
        .store
        .jobs_insert_many(vec![keyed.clone(), new_job("good"), bad_kind])
        .await
        .expect_err("a batch with an invalid kind must fail");
    match err {
        StoreError::Invalid(e) => assert_eq!(e.field, "kind", "{e}"),
        other => panic!("expected StoreError::Invalid, got {other:?}"),
    }

    let stored = list_all(h).await;
    assert!(stored.is_empty(), "nothing stored: {stored:?}");
    let stats = h.store.queues_stats().await.expect("stats");
    assert!(stats.is_empty(), "no queue has jobs: {stats:?}");

    // The rejected batch reserved nothing: its idempotency key is still free.
    let job = insert(h, keyed).await;
    assert_eq!(list_all(h).await.len(), 1);
    assert_eq!(job.idempotency_key.as_deref(), Some("batch-key"));
}

/// A key matching an unfinished job (scheduled, available, running or retryable) returns that
/// job with `duplicate: true` and stores nothing new.
pub async fn idempotency_key_returns_existing_unfinished_job(h: &Harness) {
    let keyed = |key: &str, n: i64| {
        let mut job = NewJob::new("charge", json!({ "n": n }));
        job.idempotency_key = Some(key.to_string());
        job
    };
    let insert_dup = |job: NewJob| async move {
        let mut r = h.store.jobs_insert_many(vec![job]).await.expect("insert");
        assert_eq!(r.len(), 1);
        r.pop().expect("one result")
    };

    // available
    let original = insert(h, keyed("k-1", 1)).await;
    let again = insert_dup(keyed("k-1", 2)).await;
    assert!(again.duplicate, "same key while available is a duplicate");
    assert_eq!(again.job.id, original.id);
    assert_eq!(
        again.job.payload,
        json!({ "n": 1 }),
        "the existing job, not the new payload"
    );
    assert_eq!(again.job.state, JobState::Available);

    // running
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(running.id, original.id);
    let again = insert_dup(keyed("k-1", 3)).await;
    assert!(again.duplicate, "same key while running is a duplicate");
    assert_eq!(again.job.id, original.id);
    assert_eq!(again.job.state, JobState::Running);

    // retryable
    fail(
        h,
        lease_of(&running),
        "try later",
        RetryPlan::Backoff(backoff(secs(60))),
    )
    .await
    .expect("fail");
    let again = insert_dup(keyed("k-1", 4)).await;
    assert!(again.duplicate, "same key while retryable is a duplicate");
    assert_eq!(again.job.id, original.id);
    assert_eq!(again.job.state, JobState::Retryable);

    // scheduled
    let mut later = keyed("k-2", 5);
    later.run_at = Some(h.now() + span(secs(3600)));
    let scheduled = insert(h, later).await;
    let again = insert_dup(keyed("k-2", 6)).await;
    assert!(again.duplicate, "same key while scheduled is a duplicate");
    assert_eq!(again.job.id, scheduled.id);
    assert_eq!(again.job.state, JobState::Scheduled);

    // a different key is a different job
    let other = insert(h, keyed("k-3", 7)).await;
    assert_ne!(other.id, original.id);
    assert_eq!(list_all(h).await.len(), 3, "duplicates stored nothing");
}

/// Two jobs with the same key in one batch: the first is inserted, the second is its duplicate.
pub async fn idempotency_key_deduplicates_within_one_batch(h: &Harness) {
    let mut a = new_job("sync");
    a.idempotency_key = Some("same".into());
    let b = a.clone();
    let inserted = h
        .store
        .jobs_insert_many(vec![a, new_job("other"), b])
        .await
        .expect("insert");
    assert_eq!(inserted.len(), 3);
    assert!(!inserted[0].duplicate, "first of the key is new");
    assert!(!inserted[1].duplicate, "unkeyed job is new");
    assert!(inserted[2].duplicate, "second of the key is a duplicate");
    assert_eq!(inserted[2].job.id, inserted[0].job.id);
    assert_eq!(list_all(h).await.len(), 2, "two jobs stored");
}

/// A completed job still counts for its key for `completed_idempotency_window` (24 h by
/// default) measured from when it finished; after that the key makes a new job.
pub async fn idempotency_key_matches_completed_job_within_window_only(h: &Harness) {
    let keyed = || {
        let mut job = new_job("report");
        job.idempotency_key = Some("daily-report".into());
        job
    };
    let original = insert(h, keyed()).await;
    // Finish an hour after creation, so a window counted from created_at would show.
    h.advance(secs(3600));
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::Applied
    );

    h.advance(secs(23 * 3600 + 30 * 60)); // 23.5 h after finishing, 24.5 h after creation
    let again = h
        .store
        .jobs_insert_many(vec![keyed()])
        .await
        .expect("insert");
    assert!(
        again[0].duplicate,
        "completed 23.5 h ago: still a duplicate"
    );
    assert_eq!(again[0].job.id, original.id);
    assert_eq!(again[0].job.state, JobState::Completed);

    h.advance(secs(3600)); // 24.5 h after finishing
    let fresh = h
        .store
        .jobs_insert_many(vec![keyed()])
        .await
        .expect("insert");
    assert!(
        !fresh[0].duplicate,
        "completed 24.5 h ago: outside the window"
    );
    assert_ne!(fresh[0].job.id, original.id);
    assert_eq!(fresh[0].job.state, JobState::Available);
    assert_eq!(list_all(h).await.len(), 2);
}

/// Dead and cancelled jobs never hold their key: the same key makes a new job.
pub async fn idempotency_key_ignores_dead_and_cancelled_jobs(h: &Harness) {
    let keyed = |key: &str| {
        let mut job = new_job("notify");
        job.idempotency_key = Some(key.to_string());
        job
    };

    let cancelled = insert(h, keyed("k-cancel")).await;
    h.store.job_cancel(cancelled.id).await.expect("cancel");
    let fresh = h
        .store
        .jobs_insert_many(vec![keyed("k-cancel")])
        .await
        .expect("insert");
    assert!(!fresh[0].duplicate, "a cancelled job does not hold its key");
    assert_ne!(fresh[0].job.id, cancelled.id);
    h.store.job_cancel(fresh[0].job.id).await.expect("cancel");

    let dead = make_dead(h, keyed("k-dead")).await;
    let fresh = h
        .store
        .jobs_insert_many(vec![keyed("k-dead")])
        .await
        .expect("insert");
    assert!(!fresh[0].duplicate, "a dead job does not hold its key");
    assert_ne!(fresh[0].job.id, dead.id);
    assert_eq!(fresh[0].job.state, JobState::Available);
}

/// Twenty concurrent inserts with the same key store exactly one job: all twenty get its id,
/// exactly one of them as the non-duplicate.
pub async fn concurrent_duplicate_enqueues_yield_one_job(h: &Harness) {
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = h.store.clone();
            tokio::spawn(async move {
                let mut job = NewJob::new("pay", json!({ "task": i }));
                job.idempotency_key = Some("order-42".into());
                store.jobs_insert_many(vec![job]).await
            })
        })
        .collect();
    let mut results = Vec::new();
    for outcome in futures::future::join_all(tasks).await {
        let inserted = outcome
            .expect("task panicked")
            .expect("insert should succeed");
        assert_eq!(inserted.len(), 1);
        results.extend(inserted);
    }
    let ids: HashSet<Uuid> = results.iter().map(|i| i.job.id).collect();
    assert_eq!(ids.len(), 1, "one distinct job: {ids:?}");
    let fresh = results.iter().filter(|i| !i.duplicate).count();
    assert_eq!(fresh, 1, "exactly one insert is not a duplicate");
    assert_eq!(list_all(h).await.len(), 1, "one job stored");
}

/// Every field of a job survives storage: nested JSON with unicode and big integers, tags in
/// order, tenant, timeout, priority, max_attempts and key, through insert, get, list and fetch.
pub async fn payload_and_tags_round_trip(h: &Harness) {
    let payload = json!({
        "user": { "name": "Zoë 中文 🚀", "quote": "she said \"hi\"\n\\ok", "ids": [1, 2, 3] },
        "big": 9_007_199_254_740_993_i64,
        "negative": -17,
        "ratio": 1.5,
        "flags": [true, false, null],
        "empty": {},
        "nested": [[{ "deep": ["x"] }]]
    });
    let mut new = NewJob::new("round.trip:v2", payload.clone());
    new.queue = "q-round_trip".into();
    new.priority = -3;
    new.max_attempts = 7;
    new.timeout_ms = Some(1_500);
    new.idempotency_key = Some("ключ-1 with spaces/and:colons".into());
    new.tags = vec!["b-tag".into(), "a:tag".into(), "c.tag_1".into()];
    new.tenant = Some("acme-corp".into());

    let inserted = insert(h, new.clone()).await;
    let check = |job: &Job, how: &str| {
        assert_eq!(job.kind, new.kind, "kind via {how}");
        assert_eq!(job.queue, new.queue, "queue via {how}");
        assert_eq!(job.payload, payload, "payload via {how}");
        assert_eq!(job.priority, -3, "priority via {how}");
        assert_eq!(job.max_attempts, 7, "max_attempts via {how}");
        assert_eq!(job.timeout_ms, Some(1_500), "timeout_ms via {how}");
        assert_eq!(job.idempotency_key, new.idempotency_key, "key via {how}");
        assert_eq!(job.tags, new.tags, "tags (in order) via {how}");
        assert_eq!(job.tenant.as_deref(), Some("acme-corp"), "tenant via {how}");
    };
    check(&inserted, "insert");
    check(&get(h, inserted.id).await, "get");
    let listed = list_all(h).await;
    assert_eq!(listed.len(), 1);
    check(&listed[0], "list");
    let fetched = fetch_one(h, "q-round_trip").await;
    check(&fetched, "fetch");

    let result = json!({ "receipt": "№ 7 ✓", "lines": [{ "n": 1 }] });
    assert_eq!(
        complete(h, lease_of(&fetched), Some(result.clone())).await,
        LeaseOutcome::Applied
    );
    let done = get(h, inserted.id).await;
    check(&done, "get after complete");
    assert_eq!(done.result, Some(result), "result round-trips");

    // A job without the optional fields reads back with them unset.
    let plain = insert(h, new_job("plain")).await;
    let plain = get(h, plain.id).await;
    assert_eq!(plain.timeout_ms, None);
    assert_eq!(plain.idempotency_key, None);
    assert_eq!(plain.tenant, None);
    assert!(plain.tags.is_empty());
}

/// `job_get` of an id the store never saw is `None`, not an error.
pub async fn get_unknown_id_returns_none(h: &Harness) {
    let unknown = Uuid::now_v7();
    assert_eq!(h.store.job_get(unknown).await.expect("job_get"), None);
    insert(h, new_job("something")).await;
    assert_eq!(
        h.store.job_get(unknown).await.expect("job_get"),
        None,
        "still unknown with other jobs stored"
    );
}
