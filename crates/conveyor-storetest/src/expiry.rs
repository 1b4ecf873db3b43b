//! Expiry (`expires_at`, a queue's `default_ttl_ms`) and trace context carried by a job.

use conveyor_core::trace::TraceContext;
use conveyor_core::{
    FetchParams, JobListParams, JobState, NewJob, QueueSettings, ReplaySelector, RetryPlan,
    DEFAULT_QUEUE,
};
use std::time::Duration;

use crate::kit::{
    backoff, complete, fail, fetch_none, fetch_one, fetch_params, get, ids, insert, job_in,
    lease_of, list, new_job, secs, span, Harness,
};

fn expiring(kind: &str, h: &Harness, after: Duration) -> NewJob {
    let mut job = new_job(kind);
    job.expires_at = Some(h.now() + span(after));
    job
}

/// A job not started by its `expires_at` is never handed out: it becomes `expired`
/// (finished, counted in its queue's stats), and a job that started in time is unaffected.
pub async fn a_job_not_started_by_its_expiry_expires_instead_of_running(h: &Harness) {
    let stale = insert(h, expiring("stale", h, secs(10))).await;
    assert_eq!(stale.expires_at, Some(h.now() + span(secs(10))));
    let in_time = insert(h, expiring("in_time", h, secs(10))).await;
    let started = h
        .store
        .jobs_fetch(FetchParams {
            kinds: Some(vec!["in_time".to_string()]),
            ..fetch_params(&[DEFAULT_QUEUE], 10)
        })
        .await
        .expect("fetch");
    assert_eq!(ids(&started), vec![in_time.id]);
    h.advance(secs(10));
    fetch_none(h, DEFAULT_QUEUE, "the other job expired").await;
    h.store.jobs_promote_due().await.expect("maintenance pass");
    let expired = get(h, stale.id).await;
    assert_eq!(expired.state, JobState::Expired);
    assert_eq!(expired.attempt, 0, "never run");
    assert_eq!(expired.finished_at, Some(h.now()));
    let running = get(h, in_time.id).await;
    assert_eq!(
        running.state,
        JobState::Running,
        "started in time, it runs on"
    );
    complete(h, lease_of(&started[0]), None).await;
    let stats = h.store.queues_stats().await.expect("stats");
    let queue = stats
        .iter()
        .find(|q| q.name == DEFAULT_QUEUE)
        .expect("queue");
    assert_eq!((queue.expired, queue.available), (1, 0), "{queue:?}");
    let listed = list(h, {
        let mut params = JobListParams::default();
        params.state = Some(JobState::Expired);
        params.limit = 100;
        params
    })
    .await;
    assert_eq!(ids(&listed), vec![stale.id]);
}

/// A retry that could not start before the job's expiry expires the job instead; one that
/// can is scheduled as usual.
pub async fn a_retry_after_the_expiry_expires_the_job(h: &Harness) {
    let job = insert(h, expiring("flaky", h, secs(30))).await;
    let first = fetch_one(h, DEFAULT_QUEUE).await;
    let retried = fail(
        h,
        lease_of(&first),
        "oops",
        RetryPlan::Backoff(backoff(secs(10))),
    )
    .await
    .expect("fail");
    assert_eq!(retried.state, JobState::Retryable, "10 s < 30 s: retried");
    h.advance(secs(10));
    let second = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(second.id, job.id);
    // The next backoff is 20 s: at 30 s, when the job expires.
    let expired = fail(
        h,
        lease_of(&second),
        "oops",
        RetryPlan::Backoff(backoff(secs(10))),
    )
    .await
    .expect("fail");
    assert_eq!(expired.state, JobState::Expired);
    assert_eq!(expired.finished_at, Some(h.now()));
    assert_eq!(expired.errors.len(), 2, "the attempt's error is kept");
}

/// Expired jobs are replayed by id like dead ones, without their expiry (the replay asks for
/// them to run), and discarded like them; a replay by filter (the dead-letter queue's) leaves
/// them alone.
pub async fn expired_jobs_are_replayed_like_dead_ones(h: &Harness) {
    let job = insert(h, expiring("late", h, secs(1))).await;
    let other = insert(h, expiring("late", h, secs(1))).await;
    h.advance(secs(1));
    h.store.jobs_promote_due().await.expect("maintenance pass");
    assert_eq!(get(h, job.id).await.state, JobState::Expired);
    let by_filter = h
        .store
        .dead_replay(ReplaySelector {
            kind: Some("late".to_string()),
            ..ReplaySelector::default()
        })
        .await
        .expect("replay by filter");
    assert_eq!(by_filter, 0, "the dead-letter filters are about dead jobs");
    assert!(h.store.dead_discard(other.id).await.expect("discard"));
    assert_eq!(h.store.job_get(other.id).await.expect("get"), None);
    let replayed = h
        .store
        .dead_replay(ReplaySelector {
            ids: Some(vec![job.id]),
            ..ReplaySelector::default()
        })
        .await
        .expect("replay");
    assert_eq!(replayed, 1);
    let again = get(h, job.id).await;
    assert_eq!(again.state, JobState::Available);
    assert_eq!(again.expires_at, None, "replayed without its expiry");
    assert_eq!(fetch_one(h, DEFAULT_QUEUE).await.id, job.id);
}

/// A queue's `default_ttl_ms` gives jobs enqueued without an expiry one, counted from when they
/// can start; a job's own expiry wins.
pub async fn a_queue_default_ttl_gives_jobs_an_expiry(h: &Harness) {
    let mut settings = QueueSettings::default();
    settings.default_ttl_ms = Some(60_000);
    let stored = h
        .store
        .queue_settings_put("ttl", settings)
        .await
        .expect("settings");
    assert_eq!(stored.default_ttl_ms, Some(60_000));
    assert_eq!(
        h.store
            .queue_settings_get("ttl")
            .await
            .expect("get")
            .default_ttl_ms,
        Some(60_000)
    );
    let plain = insert(h, job_in("ttl", "k")).await;
    assert_eq!(plain.expires_at, Some(h.now() + span(secs(60))));
    let mut later = job_in("ttl", "k");
    later.run_at = Some(h.now() + span(secs(30)));
    let later = insert(h, later).await;
    assert_eq!(
        later.expires_at,
        Some(h.now() + span(secs(90))),
        "from its run_at"
    );
    let mut own = job_in("ttl", "k");
    own.expires_at = Some(h.now() + span(secs(5)));
    let own = insert(h, own).await;
    assert_eq!(
        own.expires_at,
        Some(h.now() + span(secs(5))),
        "its own wins"
    );
    let other = insert(h, job_in("other", "k")).await;
    assert_eq!(other.expires_at, None, "other queues are unaffected");
}

/// A job's W3C trace context is stored and handed to the worker with the job.
pub async fn trace_context_travels_with_the_job(h: &Harness) {
    let trace = TraceContext::parse(
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        Some("vendor=abc"),
        "",
    )
    .expect("valid");
    let mut job = new_job("traced");
    job.trace = Some(trace.clone());
    let stored = insert(h, job).await;
    assert_eq!(stored.trace.as_ref(), Some(&trace));
    let fetched = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(fetched.trace, Some(trace));
    let plain = insert(h, new_job("plain")).await;
    assert_eq!(plain.trace, None);
}
