//! Claiming jobs: order, limits, leases, and no double claims.

use conveyor_core::{FetchParams, Job, JobState, DEFAULT_QUEUE};
use std::collections::HashSet;
use uuid::Uuid;

use crate::kit::{
    fetch, fetch_none, fetch_one, fetch_params, get, insert, job_in, millis, new_job, secs, span,
    Harness,
};

/// Within a queue, a higher priority is claimed first, whatever the insertion order.
pub async fn fetch_claims_highest_priority_first(h: &Harness) {
    let mut by_priority = Vec::new();
    for priority in [0, 10, -5, 5] {
        let mut job = new_job("work");
        job.priority = priority;
        by_priority.push((priority, insert(h, job).await.id));
        h.advance(millis(1));
    }
    by_priority.sort_by_key(|(priority, _)| -priority);

    let mut claimed = Vec::new();
    for _ in 0..4 {
        claimed.push(fetch_one(h, DEFAULT_QUEUE).await);
    }
    let got: Vec<(i32, Uuid)> = claimed.iter().map(|j| (j.priority, j.id)).collect();
    assert_eq!(got, by_priority, "claimed by priority, highest first");
    fetch_none(h, DEFAULT_QUEUE, "all four claimed").await;
}

/// Within one priority, the earlier run_at is claimed first; with equal run_at, the older job
/// (the smaller UUIDv7 id) first. Priority still beats both.
pub async fn fetch_orders_by_run_at_then_age_within_priority(h: &Harness) {
    let t0 = h.now();
    let at = |s: u64| Some(t0 + span(secs(s)));
    let insert_at = |kind: &'static str, run_at, priority| async move {
        let mut job = new_job(kind);
        job.run_at = run_at;
        job.priority = priority;
        let job = insert(h, job).await;
        h.advance(millis(1));
        job
    };
    let a = insert_at("a", at(30), 0).await;
    let b = insert_at("b", at(20), 0).await;
    let c = insert_at("c", at(10), 0).await;
    let d = insert_at("d", at(10), 0).await;
    let urgent = insert_at("urgent", at(50), 1).await;
    assert!(
        c.id < d.id,
        "ids grow with insertion: {} then {}",
        c.id,
        d.id
    );

    h.advance(secs(60)); // all due
    let mut order = Vec::new();
    for _ in 0..5 {
        order.push(fetch_one(h, DEFAULT_QUEUE).await.id);
    }
    assert_eq!(
        order,
        vec![urgent.id, c.id, d.id, b.id, a.id],
        "priority, then run_at, then age"
    );

    // Equal priority and run_at: claim order is id order, however the ids came about.
    let same = h.now() - span(secs(5));
    let mut batch = Vec::new();
    for i in 0..5 {
        let mut job = new_job(&format!("same-{i}"));
        job.run_at = Some(same);
        batch.push(job);
    }
    let inserted = h.store.jobs_insert_many(batch).await.expect("insert");
    let mut expected: Vec<Uuid> = inserted.iter().map(|i| i.job.id).collect();
    expected.sort();
    let mut claimed = Vec::new();
    for _ in 0..5 {
        claimed.push(fetch_one(h, DEFAULT_QUEUE).await.id);
    }
    assert_eq!(claimed, expected, "ties broken by id, ascending");
}

/// A fetch claims at most `max` jobs and only from the queues it names.
pub async fn fetch_respects_max_and_queues(h: &Harness) {
    let mut wanted = HashSet::new();
    for _ in 0..3 {
        wanted.insert(insert(h, job_in("q1", "x")).await.id);
    }
    for _ in 0..2 {
        wanted.insert(insert(h, job_in("q2", "x")).await.id);
    }
    let other = insert(h, job_in("q3", "x")).await;

    let first = fetch(h, &["q1", "q2"], 4).await;
    assert_eq!(first.len(), 4, "max caps the claim: {first:?}");
    let second = fetch(h, &["q1", "q2"], 10).await;
    assert_eq!(second.len(), 1, "only one left in q1/q2: {second:?}");
    let third = fetch(h, &["q1", "q2"], 10).await;
    assert!(third.is_empty(), "q1 and q2 are drained: {third:?}");

    let claimed: HashSet<Uuid> = first.iter().chain(&second).map(|j| j.id).collect();
    assert_eq!(claimed, wanted, "exactly the q1 and q2 jobs, each once");
    assert!(
        first
            .iter()
            .chain(&second)
            .all(|j| j.queue == "q1" || j.queue == "q2"),
        "nothing from other queues"
    );
    assert_eq!(
        get(h, other.id).await.state,
        JobState::Available,
        "q3 untouched"
    );

    let single = fetch(h, &["q3"], 1).await;
    assert_eq!(single.len(), 1);
    assert_eq!(single[0].id, other.id);
}

/// A fetched job is `running`, its attempt counted, `started_at` set, and held under a lease
/// naming the worker, with a fresh token expiring `lease` from now. Running jobs are not
/// fetched again.
pub async fn fetch_sets_lease_and_increments_attempt(h: &Harness) {
    let job = insert(h, new_job("lease-me")).await;
    h.advance(secs(3));
    let now = h.now();
    let lease = secs(45);
    let fetched = h
        .store
        .jobs_fetch(FetchParams {
            worker_id: "worker-7".into(),
            queues: vec![DEFAULT_QUEUE.into()],
            max: 5,
            lease,
            kinds: None,
            excluded_kinds: Vec::new(),
        })
        .await
        .expect("fetch");
    assert_eq!(fetched.len(), 1, "{fetched:?}");
    let running = &fetched[0];
    assert_eq!(running.id, job.id);
    assert_eq!(running.state, JobState::Running);
    assert_eq!(running.attempt, 1, "fetch counts the attempt");
    assert_eq!(running.started_at, Some(now));
    let held = running.lease.as_ref().expect("a running job has a lease");
    assert_eq!(held.worker_id, "worker-7");
    assert_eq!(held.expires_at, now + span(lease));
    assert!(!held.token.is_nil(), "a real token");
    assert_eq!(&get(h, job.id).await, running, "stored as returned");

    fetch_none(h, DEFAULT_QUEUE, "the only job is running").await;

    let other = insert(h, new_job("lease-me-too")).await;
    let second = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(second.id, other.id);
    let second_token = second.lease.as_ref().expect("lease").token;
    assert_ne!(second_token, held.token, "each claim gets a fresh token");
}

/// Many workers fetching at once never claim the same job twice, and together claim them all.
pub async fn concurrent_fetches_never_claim_a_job_twice(h: &Harness) {
    let total = 60;
    let batch: Vec<_> = (0..total).map(|i| new_job(&format!("job-{i}"))).collect();
    let inserted = h.store.jobs_insert_many(batch).await.expect("insert");
    let all: HashSet<Uuid> = inserted.iter().map(|i| i.job.id).collect();

    let workers: Vec<_> = (0..6)
        .map(|w| {
            let store = h.store.clone();
            tokio::spawn(async move {
                let mut mine: Vec<Job> = Vec::new();
                loop {
                    let params = FetchParams {
                        worker_id: format!("worker-{w}"),
                        queues: vec![DEFAULT_QUEUE.into()],
                        max: 4,
                        lease: secs(30),
                        kinds: None,
                        excluded_kinds: Vec::new(),
                    };
                    let jobs = store.jobs_fetch(params).await.expect("fetch");
                    if jobs.is_empty() {
                        return mine;
                    }
                    mine.extend(jobs);
                }
            })
        })
        .collect();

    let mut seen = HashSet::new();
    let mut claimed = 0;
    for worker in futures::future::join_all(workers).await {
        for job in worker.expect("worker task panicked") {
            claimed += 1;
            assert!(seen.insert(job.id), "job {} claimed twice", job.id);
            assert_eq!(job.attempt, 1, "claimed once, so one attempt: {job:?}");
            assert_eq!(job.state, JobState::Running);
        }
    }
    assert_eq!(claimed, total, "every job claimed exactly once");
    assert_eq!(seen, all);
    let stats = h.store.queues_stats().await.expect("stats");
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert_eq!(stats[0].running, total as u64);
    assert_eq!(stats[0].available, 0);
}

/// A scheduled job is not fetchable until the clock reaches its run_at, then it is.
pub async fn scheduled_job_becomes_fetchable_when_due(h: &Harness) {
    let mut job = new_job("later");
    job.run_at = Some(h.now() + span(secs(60)));
    let job = insert(h, job).await;

    fetch_none(h, DEFAULT_QUEUE, "due in 60 s").await;
    h.advance(secs(59));
    fetch_none(h, DEFAULT_QUEUE, "due in 1 s").await;
    assert_eq!(get(h, job.id).await.state, JobState::Scheduled);

    h.advance(secs(1)); // run_at == now: due
    let fetched = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(fetched.id, job.id);
    assert_eq!(fetched.state, JobState::Running);
    assert_eq!(fetched.attempt, 1);
}

/// A fetch naming `kinds` claims only jobs of those kinds, in claim order, leaving the others
/// available: during a rolling deploy an old worker never claims a kind it has no handler for.
/// An empty list claims nothing.
pub async fn fetch_with_kinds_claims_only_those_kinds(h: &Harness) {
    let mut new_kind = new_job("new-kind");
    new_kind.priority = 10;
    let unknown = insert(h, new_kind).await;
    let known = insert(h, new_job("known")).await;
    let also = insert(h, new_job("also-known")).await;
    let mut params = fetch_params(&[DEFAULT_QUEUE], 10);
    params.kinds = Some(vec!["known".to_string(), "also-known".to_string()]);
    let jobs = h.store.jobs_fetch(params).await.expect("fetch");
    let ids: Vec<Uuid> = jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, vec![known.id, also.id]);
    assert_eq!(get(h, unknown.id).await.state, JobState::Available);

    let mut params = fetch_params(&[DEFAULT_QUEUE], 10);
    params.kinds = Some(Vec::new());
    assert!(h.store.jobs_fetch(params).await.expect("fetch").is_empty());

    // The same through the limits (a tenanted job takes the limited claim).
    let mut tenanted = job_in("fair", "known");
    tenanted.tenant = Some("acme".to_string());
    let tenanted = insert(h, tenanted).await;
    let mut other = job_in("fair", "new-kind");
    other.tenant = Some("acme".to_string());
    let other = insert(h, other).await;
    let mut params = fetch_params(&["fair"], 10);
    params.kinds = Some(vec!["known".to_string()]);
    let jobs = h.store.jobs_fetch(params).await.expect("fetch");
    assert_eq!(
        jobs.iter().map(|j| j.id).collect::<Vec<_>>(),
        vec![tenanted.id]
    );
    assert_eq!(get(h, other.id).await.state, JobState::Available);
    assert_eq!(
        fetch_one(h, DEFAULT_QUEUE).await.id,
        unknown.id,
        "others still take it"
    );
}
