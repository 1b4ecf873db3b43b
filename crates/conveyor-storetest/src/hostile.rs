//! Hostile input: what no store may store differently from another, or be stopped by. Found by
//! sending a live server what an attacker or a buggy client would (issue 9).

use conveyor_core::{
    CompleteParams, FailParams, JobListParams, JobState, LeaseOutcome, QueueSettings, RetryPlan,
    StoreError, StoreResult, UniqueSpec,
};
use serde_json::json;
use std::time::Duration;

use crate::kit::{fetch_one, fetch_params, get, insert, job_in, lease_of, new_job, Harness};

fn invalid_field<T: std::fmt::Debug>(outcome: StoreResult<T>) -> String {
    match outcome {
        Err(StoreError::Invalid(e)) => e.field,
        other => panic!("expected a validation error, got {other:?}"),
    }
}

/// PostgreSQL cannot store NUL characters in text or JSONB; SQLite can. Both refuse them, with
/// an error naming the place, and store nothing of the batch.
pub async fn nul_characters_are_refused_naming_the_field(h: &Harness) {
    let cases = [
        (
            {
                let mut job = new_job("nul");
                job.payload = json!({"user": {"name": "a\u{0}b"}});
                job
            },
            "payload/user/name",
        ),
        (
            {
                let mut job = new_job("nul");
                job.payload = json!({"list": [1, {"k\u{0}ey": true}]});
                job
            },
            "payload/list/1/k\u{0}ey",
        ),
        (
            {
                let mut job = new_job("nul");
                job.payload = json!("top\u{0}");
                job
            },
            "payload",
        ),
        (
            {
                let mut job = new_job("nul");
                job.idempotency_key = Some("order\u{0}1".to_string());
                job
            },
            "idempotency_key",
        ),
    ];
    for (bad, field) in cases {
        let outcome = h
            .store
            .jobs_insert_many(vec![new_job("fine-before"), bad])
            .await;
        assert_eq!(invalid_field(outcome), field);
    }
    let stored = h
        .store
        .jobs_list({
            let mut params = JobListParams::default();
            params.queue = None;
            params.state = None;
            params.kind = None;
            params.limit = 100;
            params.after = None;
            params
        })
        .await
        .expect("list");
    assert!(stored.is_empty(), "nothing of a refused batch: {stored:?}");

    // A worker id with NUL is refused at fetch; nothing is claimed.
    let job = insert(h, new_job("nul-fetch")).await;
    let mut params = fetch_params(&["default"], 1);
    params.worker_id = "w\u{0}1".to_string();
    assert_eq!(invalid_field(h.store.jobs_fetch(params).await), "worker_id");
    assert_eq!(get(h, job.id).await.state, JobState::Available);

    // A result with NUL is refused; the job stays running and a good result completes it.
    let running = fetch_one(h, "default").await;
    let outcome = h
        .store
        .jobs_complete_many(vec![CompleteParams {
            lease: lease_of(&running),
            result: Some(json!({"out": "x\u{0}"})),
        }])
        .await;
    assert_eq!(invalid_field(outcome), "result/out");
    assert_eq!(get(h, job.id).await.state, JobState::Running);
    let outcomes = h
        .store
        .jobs_complete_many(vec![CompleteParams {
            lease: lease_of(&running),
            result: Some(json!({"out": "x"})),
        }])
        .await
        .expect("complete");
    assert_eq!(outcomes, vec![LeaseOutcome::Applied]);
}

/// A failure's message is a report, not data: NUL characters in it are stored written out as
/// `\u0000`, identically by every store, and the failure is recorded.
pub async fn nul_characters_in_error_messages_are_stored_escaped(h: &Harness) {
    let job = insert(h, new_job("nul-error")).await;
    let running = fetch_one(h, "default").await;
    let failed = h
        .store
        .job_fail(FailParams {
            lease: lease_of(&running),
            class: "error".to_string(),
            message: "bad\u{0}byte".to_string(),
            retry: RetryPlan::Never,
            backtrace: None,
        })
        .await
        .expect("fail is recorded");
    assert_eq!(failed.state, JobState::Dead);
    let stored = get(h, job.id).await;
    let last = stored.errors.last().expect("an error record");
    assert_eq!(last.message, "bad\\u0000byte");
}

/// Both stores hold integers as signed 64-bit values: larger ones are refused, never clamped.
pub async fn numbers_beyond_i64_are_refused(h: &Harness) {
    let mut job = new_job("huge");
    job.timeout_ms = Some(u64::MAX);
    assert_eq!(
        invalid_field(h.store.jobs_insert_many(vec![job]).await),
        "timeout_ms"
    );
    let mut job = new_job("huge");
    job.timeout_ms = Some(i64::MAX as u64);
    let stored = insert(h, job).await;
    assert_eq!(get(h, stored.id).await.timeout_ms, Some(i64::MAX as u64));

    let mut job = new_job("huge");
    let mut spec = UniqueSpec::whole_payload();
    spec.period_ms = Some(u64::MAX);
    job.unique = Some(spec);
    assert_eq!(
        invalid_field(h.store.jobs_insert_many(vec![job]).await),
        "unique.period_ms"
    );

    for field in ["max_depth", "concurrency_limit", "completed_retention_secs"] {
        let mut settings = QueueSettings::default();
        match field {
            "max_depth" => settings.max_depth = Some(u64::MAX),
            "concurrency_limit" => settings.concurrency_limit = Some(i64::MAX as u64 + 1),
            _ => settings.completed_retention_secs = Some(u64::MAX),
        }
        let outcome = h.store.queue_settings_put("huge", settings).await;
        assert_eq!(invalid_field(outcome), field);
    }
    assert_eq!(
        h.store.queue_settings_get("huge").await.expect("get"),
        QueueSettings::default(),
        "nothing stored"
    );
}

/// A lease or heartbeat too long for the calendar is refused naming its field; it never
/// panics a store, and the store goes on working.
pub async fn absurd_leases_are_refused_and_the_store_keeps_working(h: &Harness) {
    let job = insert(h, new_job("lease")).await;
    let mut params = fetch_params(&["default"], 1);
    params.lease = Duration::MAX;
    assert_eq!(invalid_field(h.store.jobs_fetch(params).await), "lease");
    let running = fetch_one(h, "default").await;
    assert_eq!(running.id, job.id);
    let outcome = h
        .store
        .jobs_heartbeat_many(vec![conveyor_core::HeartbeatParams {
            lease: lease_of(&running),
            extend_by: Duration::MAX,
        }])
        .await;
    assert_eq!(invalid_field(outcome), "extend_by");
    // A leadership TTL is configuration, not input: absurd ones saturate instead.
    assert!(h
        .store
        .leader_try_acquire("node-a", Duration::MAX)
        .await
        .expect("leader"));
    let outcomes = h
        .store
        .jobs_complete_many(vec![CompleteParams {
            lease: lease_of(&running),
            result: None,
        }])
        .await
        .expect("the store still works");
    assert_eq!(outcomes, vec![LeaseOutcome::Applied]);
}

/// One fetch may name at most `MAX_FETCH_QUEUES` distinct queues; repeats of a name count once,
/// however many there are.
pub async fn fetches_name_a_bounded_number_of_distinct_queues(h: &Harness) {
    use conveyor_core::validate::MAX_FETCH_QUEUES;
    insert(h, job_in("q-7", "spread")).await;
    let too_many: Vec<String> = (0..=MAX_FETCH_QUEUES).map(|i| format!("q-{i}")).collect();
    let mut params = fetch_params(&[], 10);
    params.queues = too_many;
    assert_eq!(invalid_field(h.store.jobs_fetch(params).await), "queues");

    // A hundred thousand repeats of a few names: distinct names are what count.
    let mut params = fetch_params(&[], 10);
    params.queues = (0..100_000).map(|i| format!("q-{}", i % 8)).collect();
    let jobs = h.store.jobs_fetch(params).await.expect("fetch");
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0].queue, "q-7");

    let mut params = fetch_params(&[], 10);
    params.queues = vec!["bad queue".to_string()];
    assert_eq!(invalid_field(h.store.jobs_fetch(params).await), "queues[0]");
}

/// Found by the model-based test: the newest job with a key may have finished while an older
/// one with the same key is unfinished again (a replayed dead job). The key is held by the
/// unfinished one; a second job must not be inserted beside it.
pub async fn idempotency_key_is_held_by_an_older_job_made_unfinished_again(h: &Harness) {
    let keyed = || {
        let mut job = new_job("keyed");
        job.idempotency_key = Some("key-0".to_string());
        job.max_attempts = 1;
        job
    };
    let first = insert(h, keyed()).await;
    let running = fetch_one(h, "default").await;
    h.store
        .job_fail(FailParams {
            lease: lease_of(&running),
            class: "error".to_string(),
            message: "gone".to_string(),
            retry: RetryPlan::Never,
            backtrace: None,
        })
        .await
        .expect("fail");
    let second = insert(h, keyed()).await;
    assert_ne!(second.id, first.id, "a dead job does not hold its key");
    let replayed = h
        .store
        .dead_replay(conveyor_core::ReplaySelector {
            ids: Some(vec![first.id]),
            queue: None,
            kind: None,
        })
        .await
        .expect("replay");
    assert_eq!(replayed, 1);
    h.store.job_cancel(second.id).await.expect("cancel");
    let mut again = h
        .store
        .jobs_insert_many(vec![keyed()])
        .await
        .expect("insert");
    let again = again.pop().expect("one");
    assert!(again.duplicate, "the replayed job holds the key: {again:?}");
    assert_eq!(again.job.id, first.id);
}

/// A payload nested past `MAX_JSON_DEPTH` is refused: stored, it would come back wrapped in
/// answers too deep for common JSON parsers, and its workers could never read it.
pub async fn payloads_nested_too_deeply_are_refused(h: &Harness) {
    use conveyor_core::validate::MAX_JSON_DEPTH;
    let nest = |levels: usize| {
        let mut value = json!("leaf");
        for _ in 0..levels {
            value = json!({ "a": value });
        }
        value
    };
    let mut deep = new_job("deep");
    deep.payload = nest(MAX_JSON_DEPTH + 1);
    assert_eq!(
        invalid_field(h.store.jobs_insert_many(vec![deep]).await),
        "payload"
    );
    let mut fine = new_job("deep");
    fine.payload = nest(MAX_JSON_DEPTH);
    insert(h, fine).await;
}
