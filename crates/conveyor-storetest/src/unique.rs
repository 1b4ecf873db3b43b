//! Unique jobs: a job enqueued with a `UniqueSpec` is refused (the existing job is returned with
//! `duplicate: true`) while a job with the same kind, queue and payload (or chosen fields of it)
//! exists in one of the spec's states, created within its period.

use conveyor_core::{
    Job, JobState, LeaseOutcome, NewJob, QueueSettings, RetryPlan, StoreError, UniqueSpec,
    DEFAULT_QUEUE,
};
use serde_json::{json, Value};
use std::collections::HashSet;
use uuid::Uuid;

use crate::kit::{
    backoff, complete, fail, fetch_one, get, insert, insert_one, job_in, lease_of, list_all,
    millis, new_job, secs, span, Harness,
};

/// A job of `kind` in the default queue with `payload`, unique under `spec`.
fn unique_job(kind: &str, payload: Value, spec: UniqueSpec) -> NewJob {
    let mut job = NewJob::new(kind, payload);
    job.unique = Some(spec);
    job
}

/// Asserts `job` is answered as a duplicate of the job with id `of`.
async fn assert_duplicate(h: &Harness, job: NewJob, of: Uuid, why: &str) -> Job {
    let again = insert_one(h, job).await;
    assert!(
        again.duplicate,
        "{why}: expected a duplicate, got {again:?}"
    );
    assert_eq!(again.job.id, of, "{why}: the existing job is returned");
    again.job
}

/// Asserts `job` is inserted as a new job and returns it.
async fn assert_new(h: &Harness, job: NewJob, why: &str) -> Job {
    let fresh = insert_one(h, job).await;
    assert!(!fresh.duplicate, "{why}: expected a new job, got {fresh:?}");
    fresh.job
}

fn every_state() -> [JobState; 9] {
    JobState::ALL
}

/// Unique by the whole payload: the same kind and payload while the first is unfinished is a
/// duplicate that stores nothing; another payload is a new job. The stored job carries its key.
pub async fn unique_by_whole_payload_returns_the_existing_job(h: &Harness) {
    let spec = UniqueSpec::whole_payload();
    let first = insert(h, unique_job("sync", json!({"user": 1}), spec.clone())).await;
    let key = first
        .unique_key
        .clone()
        .expect("a unique job stores its key");
    assert_eq!(key.len(), 64, "a SHA-256 hex digest: {key}");
    assert_eq!(get(h, first.id).await.unique_key, Some(key.clone()));

    let again = assert_duplicate(
        h,
        unique_job("sync", json!({"user": 1}), spec.clone()),
        first.id,
        "same kind and payload",
    )
    .await;
    assert_eq!(again.payload, json!({"user": 1}));
    let other = assert_new(
        h,
        unique_job("sync", json!({"user": 2}), spec.clone()),
        "another payload",
    )
    .await;
    assert_ne!(other.unique_key, Some(key));
    assert_eq!(list_all(h).await.len(), 2, "the duplicate stored nothing");

    // Jobs without a spec are neither refused nor counted.
    let plain = insert(h, NewJob::new("sync", json!({"user": 1}))).await;
    assert_eq!(plain.unique_key, None);
    assert_eq!(get(h, plain.id).await.unique_key, None);
    assert_duplicate(
        h,
        unique_job("sync", json!({"user": 1}), spec),
        first.id,
        "a plain job does not take the place of the unique one",
    )
    .await;
}

/// Unique by chosen fields: other fields do not matter, a missing field counts as null.
pub async fn unique_by_args_ignores_other_fields(h: &Harness) {
    let spec = UniqueSpec::by_args(["customer", "report"]);
    let first = insert(
        h,
        unique_job(
            "report",
            json!({"customer": 7, "report": "daily", "requested_by": "alice"}),
            spec.clone(),
        ),
    )
    .await;
    assert_duplicate(
        h,
        unique_job(
            "report",
            json!({"report": "daily", "customer": 7, "requested_by": "bob", "extra": [1]}),
            spec.clone(),
        ),
        first.id,
        "only customer and report count",
    )
    .await;
    assert_new(
        h,
        unique_job(
            "report",
            json!({"customer": 8, "report": "daily"}),
            spec.clone(),
        ),
        "another customer",
    )
    .await;
    let missing = assert_new(
        h,
        unique_job("report", json!({"customer": 9}), spec.clone()),
        "a first job without a report field",
    )
    .await;
    assert_duplicate(
        h,
        unique_job("report", json!({"customer": 9, "report": null}), spec),
        missing.id,
        "a missing field counts as null",
    )
    .await;
}

/// The payload's key order, at any depth, does not change the identity.
pub async fn unique_key_ignores_payload_key_order(h: &Harness) {
    let parse = |text: &str| -> Value { serde_json::from_str(text).expect("valid JSON") };
    let spec = UniqueSpec::whole_payload();
    let first = insert(
        h,
        unique_job(
            "order",
            parse(r#"{"a": 1, "b": {"x": [1, {"p": true, "q": null}], "y": "z"}}"#),
            spec.clone(),
        ),
    )
    .await;
    assert_duplicate(
        h,
        unique_job(
            "order",
            parse(r#"{"b": {"y": "z", "x": [1, {"q": null, "p": true}]}, "a": 1}"#),
            spec.clone(),
        ),
        first.id,
        "the same object with its keys in another order",
    )
    .await;
    assert_new(
        h,
        unique_job(
            "order",
            parse(r#"{"a": 1, "b": {"x": [{"p": true, "q": null}, 1], "y": "z"}}"#),
            spec,
        ),
        "array order matters",
    )
    .await;
}

/// Another kind or another queue is another identity, unless the spec leaves the queue out.
pub async fn unique_distinguishes_kinds_and_queues(h: &Harness) {
    let payload = json!({"id": 1});
    let spec = UniqueSpec::whole_payload();
    let first = insert(h, unique_job("a", payload.clone(), spec.clone())).await;
    assert_new(
        h,
        unique_job("b", payload.clone(), spec.clone()),
        "another kind",
    )
    .await;
    let mut elsewhere = unique_job("a", payload.clone(), spec.clone());
    elsewhere.queue = "elsewhere".into();
    assert_new(h, elsewhere, "another queue").await;

    let across = spec.across_queues();
    let anywhere = insert(h, unique_job("c", payload.clone(), across.clone())).await;
    let mut other_queue = unique_job("c", payload, across);
    other_queue.queue = "elsewhere".into();
    assert_duplicate(h, other_queue, anywhere.id, "the queue is left out").await;
    assert_eq!(list_all(h).await.len(), 4);
    assert_ne!(first.id, anywhere.id);
}

/// Only an existing job in one of the spec's states blocks: with the default (unfinished)
/// states a completed or cancelled job lets a new one in; with `completed` among the states a
/// completed job blocks; a spec naming only `running` ignores queued jobs.
pub async fn unique_blocks_only_in_the_given_states(h: &Harness) {
    let payload = json!({"n": 1});
    let unfinished = || unique_job("work", payload.clone(), UniqueSpec::whole_payload());

    // scheduled
    let mut later = unfinished();
    later.queue = "later".into();
    later.run_at = Some(h.now() + span(secs(3600)));
    let scheduled = insert(h, later.clone()).await;
    assert_eq!(scheduled.state, JobState::Scheduled);
    assert_duplicate(h, later, scheduled.id, "while scheduled").await;

    // available, running, retryable
    let first = insert(h, unfinished()).await;
    assert_duplicate(h, unfinished(), first.id, "while available").await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(running.id, first.id);
    assert_duplicate(h, unfinished(), first.id, "while running").await;
    fail(
        h,
        lease_of(&running),
        "again",
        RetryPlan::Backoff(backoff(secs(1))),
    )
    .await
    .expect("fail");
    assert_duplicate(h, unfinished(), first.id, "while retryable").await;

    // completed: free for the unfinished states, blocking when `completed` is named
    h.advance(secs(2));
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(running.id, first.id);
    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::Applied
    );
    let completed_too = || {
        unique_job(
            "work",
            payload.clone(),
            UniqueSpec::whole_payload().states(every_state()),
        )
    };
    let second = assert_new(h, unfinished(), "the first one completed").await;
    let only_completed = unique_job(
        "work",
        payload.clone(),
        UniqueSpec::whole_payload().states([JobState::Completed]),
    );
    assert_duplicate(h, only_completed, first.id, "a completed job blocks").await;
    assert_duplicate(
        h,
        completed_too(),
        second.id,
        "the latest job in a named state is returned",
    )
    .await;

    // a spec naming only `running` ignores the available one
    let only_running = unique_job(
        "work",
        payload.clone(),
        UniqueSpec::whole_payload().states([JobState::Running]),
    );
    let third = assert_new(h, only_running, "nothing is running").await;

    // cancelled jobs free the key for the default states
    h.store.job_cancel(second.id).await.expect("cancel");
    assert_duplicate(h, unfinished(), third.id, "the third is still available").await;
    h.store.job_cancel(third.id).await.expect("cancel");
    assert_new(h, unfinished(), "every unfinished job was cancelled").await;
}

/// With a period, only jobs created less than that long ago count, whatever their state.
pub async fn unique_period_counts_only_jobs_created_within_it(h: &Harness) {
    let hourly = || {
        unique_job(
            "hourly",
            json!({"report": "sales"}),
            UniqueSpec::whole_payload()
                .period(secs(3600))
                .states(every_state()),
        )
    };
    let first = insert(h, hourly()).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::Applied
    );
    h.advance(secs(3599));
    assert_duplicate(h, hourly(), first.id, "created 59:59 ago").await;
    h.advance(secs(1));
    let second = assert_new(h, hourly(), "created an hour ago: outside the window").await;
    h.advance(millis(1));
    assert_duplicate(h, hourly(), second.id, "the new one counts from now").await;

    // Without a period, the old job would still count.
    let forever = unique_job(
        "hourly",
        json!({"report": "sales"}),
        UniqueSpec::whole_payload().states([JobState::Completed]),
    );
    assert_duplicate(h, forever, first.id, "no window: every job counts").await;
}

/// Two jobs with the same identity in one batch: the first is inserted, the second is its
/// duplicate. A job of the batch blocks a later one only in a state that one names.
pub async fn unique_deduplicates_within_one_batch(h: &Harness) {
    let spec = UniqueSpec::by_args(["id"]);
    let inserted = h
        .store
        .jobs_insert_many(vec![
            unique_job("sync", json!({"id": 1, "try": 1}), spec.clone()),
            new_job("other"),
            unique_job("sync", json!({"id": 1, "try": 2}), spec.clone()),
            unique_job("sync", json!({"id": 2}), spec.clone()),
        ])
        .await
        .expect("insert");
    assert_eq!(inserted.len(), 4);
    assert!(!inserted[0].duplicate && !inserted[1].duplicate && !inserted[3].duplicate);
    assert!(
        inserted[2].duplicate,
        "second of the identity: {inserted:?}"
    );
    assert_eq!(inserted[2].job.id, inserted[0].job.id);
    assert_eq!(inserted[2].job.payload, json!({"id": 1, "try": 1}));
    assert_eq!(list_all(h).await.len(), 3, "three jobs stored");

    // "Unique while running": queued jobs of the batch do not block each other.
    let running_only = UniqueSpec::whole_payload().states([JobState::Running]);
    let inserted = h
        .store
        .jobs_insert_many(vec![
            unique_job("poll", json!({}), running_only.clone()),
            unique_job("poll", json!({}), running_only),
        ])
        .await
        .expect("insert");
    assert!(inserted.iter().all(|i| !i.duplicate), "{inserted:?}");
    assert_ne!(inserted[0].job.id, inserted[1].job.id);
}

/// An idempotency key is checked first: a job with a key held by another job gets that job,
/// even when its unique identity is free.
pub async fn unique_idempotency_key_takes_precedence(h: &Harness) {
    let mut keyed = NewJob::new("pay", json!({"order": 1}));
    keyed.idempotency_key = Some("order-1".into());
    let first = insert(h, keyed).await;
    let mut both = unique_job("pay", json!({"order": 2}), UniqueSpec::whole_payload());
    both.idempotency_key = Some("order-1".into());
    assert_duplicate(h, both, first.id, "the key matches").await;
    let unique = insert(
        h,
        unique_job("pay", json!({"order": 2}), UniqueSpec::whole_payload()),
    )
    .await;
    assert_eq!(list_all(h).await.len(), 2);
    let mut fresh_key = unique_job("pay", json!({"order": 2}), UniqueSpec::whole_payload());
    fresh_key.idempotency_key = Some("order-2".into());
    assert_duplicate(h, fresh_key, unique.id, "a free key, a taken identity").await;
}

/// A unique duplicate adds nothing to a queue, so it is answered even when the queue is full,
/// and two of a kind in one batch take one place.
pub async fn unique_duplicate_into_a_full_queue_returns_the_existing_job(h: &Harness) {
    let limited = {
        let mut settings = QueueSettings::default();
        settings.max_depth = Some(1);
        settings
    };
    h.store
        .queue_settings_put("one", limited)
        .await
        .expect("limit");
    let job = || {
        let mut job = unique_job("k", json!({"n": 1}), UniqueSpec::whole_payload());
        job.queue = "one".into();
        job
    };
    let inserted = h
        .store
        .jobs_insert_many(vec![job(), job()])
        .await
        .expect("two of a kind take one place");
    assert!(!inserted[0].duplicate && inserted[1].duplicate);
    assert_duplicate(h, job(), inserted[0].job.id, "the queue is full").await;
    let refused = h
        .store
        .jobs_insert_many(vec![job_in("one", "k")])
        .await
        .expect_err("a new job is refused");
    assert!(
        matches!(refused, StoreError::QueueFull { .. }),
        "{refused:?}"
    );
}

/// Eight producers enqueueing the same unique job at once store exactly one: all get its id,
/// one of them as the new job.
pub async fn unique_concurrent_inserters_yield_one_job(h: &Harness) {
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let store = h.store.clone();
            tokio::spawn(async move {
                let job = unique_job(
                    "refresh",
                    json!({"customer": 42, "caller": i}),
                    UniqueSpec::by_args(["customer"]),
                );
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

/// Bad specs are refused before anything is stored, naming the field.
pub async fn unique_spec_is_validated(h: &Harness) {
    let mut empty_args = UniqueSpec::by_args(Vec::<String>::new());
    let mut zero_period = UniqueSpec::whole_payload();
    zero_period.period_ms = Some(0);
    let no_states = UniqueSpec::whole_payload().states([]);
    for (spec, field) in [
        (empty_args.clone(), "unique.args"),
        (zero_period, "unique.period_ms"),
        (no_states, "unique.states"),
    ] {
        let err = h
            .store
            .jobs_insert_many(vec![new_job("ok"), unique_job("k", json!({}), spec)])
            .await
            .expect_err("an invalid spec is refused");
        match err {
            StoreError::Invalid(e) => assert_eq!(e.field, field, "{e}"),
            other => panic!("expected StoreError::Invalid, got {other:?}"),
        }
    }
    empty_args.args = Some(vec!["x".into()]);
    insert(h, unique_job("k", json!({}), empty_args)).await;
    assert_eq!(list_all(h).await.len(), 1, "only the valid job is stored");
}

/// `jobs_import` keeps a job's unique key, and an imported job blocks like any other.
pub async fn unique_key_survives_import(h: &Harness) {
    let spec = UniqueSpec::whole_payload();
    let original = insert(h, unique_job("copy", json!({"n": 1}), spec.clone())).await;
    let mut copy = get(h, original.id).await;
    h.store.job_cancel(original.id).await.expect("cancel");
    copy.id = Uuid::now_v7();
    assert_eq!(
        h.store
            .jobs_import(vec![copy.clone()])
            .await
            .expect("import"),
        1
    );
    let imported = get(h, copy.id).await;
    assert_eq!(imported, copy, "imported as it was");
    assert_eq!(imported.unique_key, original.unique_key);
    assert_duplicate(
        h,
        unique_job("copy", json!({"n": 1}), spec),
        copy.id,
        "the imported (available) copy",
    )
    .await;
}
