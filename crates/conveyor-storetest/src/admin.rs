//! Operator actions and introspection: cancel, dead-letter queue, listing, stats, promotion,
//! next-due and wake-ups.

use conveyor_core::{
    HeartbeatParams, JobListParams, JobState, LeaseOutcome, QueueStats, ReplaySelector,
    RescueParams, RetryPlan, StoreError, DEFAULT_QUEUE,
};
use std::future::Future;
use std::time::Duration;
use uuid::Uuid;

use crate::kit::{
    backoff, complete, fail, fetch_none, fetch_one, get, ids, insert, job_in, lease_of, list,
    list_all, make_dead, millis, new_job, secs, span, Harness, LEASE,
};

/// Cancelling an available, scheduled or retryable job makes it `cancelled` and finished at
/// now; it never runs, even once its run_at passes.
pub async fn cancel_unfinished_job(h: &Harness) {
    let available = insert(h, new_job("available")).await;
    let mut later = new_job("scheduled");
    later.run_at = Some(h.now() + span(secs(60)));
    let scheduled = insert(h, later).await;
    let mut retry = job_in("retry-q", "retryable");
    retry.max_attempts = 3;
    insert(h, retry).await;
    let running = fetch_one(h, "retry-q").await;
    let retryable = fail(
        h,
        lease_of(&running),
        "x",
        RetryPlan::Backoff(backoff(secs(60))),
    )
    .await
    .expect("fail");
    assert_eq!(retryable.state, JobState::Retryable);

    h.advance(secs(1));
    for (job, was) in [
        (&available, JobState::Available),
        (&scheduled, JobState::Scheduled),
        (&retryable, JobState::Retryable),
    ] {
        let cancelled = h.store.job_cancel(job.id).await.expect("cancel");
        assert_eq!(cancelled.id, job.id);
        assert_eq!(cancelled.state, JobState::Cancelled, "cancel a {was} job");
        assert_eq!(
            cancelled.finished_at,
            Some(h.now()),
            "cancelled is finished ({was})"
        );
        assert_eq!(
            get(h, job.id).await,
            cancelled,
            "stored as returned ({was})"
        );
    }

    h.advance(secs(3600));
    assert_eq!(
        h.store.jobs_promote_due().await.expect("promote"),
        0,
        "nothing to promote"
    );
    fetch_none(h, DEFAULT_QUEUE, "cancelled jobs do not run").await;
    fetch_none(h, "retry-q", "cancelled jobs do not run").await;
}

/// Cancelling a running job revokes its lease: the holder can no longer complete, fail,
/// heartbeat or release it, and the rescuer leaves it alone.
pub async fn cancel_running_job_revokes_lease(h: &Harness) {
    let job = insert(h, new_job("long")).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    let cancelled = h.store.job_cancel(job.id).await.expect("cancel");
    assert_eq!(cancelled.state, JobState::Cancelled);
    assert_eq!(cancelled.lease, None, "the lease is revoked");
    assert_eq!(cancelled.finished_at, Some(h.now()));

    let lease = lease_of(&running);
    assert_eq!(complete(h, lease, None).await, LeaseOutcome::LeaseLost);
    let err = fail(h, lease, "late", RetryPlan::Backoff(backoff(secs(1))))
        .await
        .expect_err("fail after cancel");
    assert!(
        matches!(err, StoreError::LeaseLost(id) if id == job.id),
        "got {err:?}"
    );
    let beats = h
        .store
        .jobs_heartbeat_many(vec![HeartbeatParams {
            lease,
            extend_by: secs(30),
        }])
        .await
        .expect("heartbeat");
    assert_eq!(beats, vec![None], "heartbeat after cancel");
    assert_eq!(
        h.store
            .jobs_release_many(vec![lease])
            .await
            .expect("release"),
        0
    );

    h.advance(LEASE + secs(1));
    let report = h
        .store
        .jobs_rescue_expired(RescueParams {
            limit: 100,
            retry: backoff(secs(1)),
        })
        .await
        .expect("rescue");
    assert!(
        report.retried.is_empty() && report.dead.is_empty(),
        "{report:?}"
    );
    assert_eq!(
        get(h, job.id).await,
        cancelled,
        "still cancelled, unchanged"
    );
}

/// Cancelling a completed, dead or cancelled job is a `Conflict` naming its state, and
/// changes nothing.
pub async fn cancel_finished_job_conflicts(h: &Harness) {
    insert(h, new_job("done")).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::Applied
    );
    let completed = get(h, running.id).await;
    let dead = make_dead(h, new_job("dead")).await;
    let cancelled = insert(h, new_job("cancelled")).await;
    let cancelled = h.store.job_cancel(cancelled.id).await.expect("cancel");

    for (job, finished) in [
        (&completed, JobState::Completed),
        (&dead, JobState::Dead),
        (&cancelled, JobState::Cancelled),
    ] {
        let err = h
            .store
            .job_cancel(job.id)
            .await
            .expect_err("cannot cancel a finished job");
        match err {
            StoreError::Conflict { id, state, .. } => {
                assert_eq!(id, job.id);
                assert_eq!(state, finished, "the conflict names the job's state");
            }
            other => panic!("expected Conflict for a {finished} job, got {other:?}"),
        }
        assert_eq!(&get(h, job.id).await, job, "a {finished} job is unchanged");
    }
}

/// Cancelling an id the store never saw is `NotFound`.
pub async fn cancel_unknown_job_is_not_found(h: &Harness) {
    let unknown = Uuid::now_v7();
    let err = h.store.job_cancel(unknown).await.expect_err("unknown id");
    assert!(
        matches!(err, StoreError::NotFound(id) if id == unknown),
        "expected NotFound({unknown}), got {err:?}"
    );
}

/// Replaying dead jobs by id makes them `available` now with attempt 0 and their error history
/// kept, the failure that ended the run marked with the replay's time; ids that are not dead
/// are skipped. A replayed job runs again with fresh attempts.
pub async fn dead_replay_by_ids_keeps_history_and_resets_attempts(h: &Harness) {
    let a = make_dead(h, new_job("a")).await;
    let b = make_dead(h, new_job("b")).await;
    let alive = insert(h, job_in("elsewhere", "alive")).await;
    h.advance(secs(10));

    let replayed = h
        .store
        .dead_replay(ReplaySelector {
            ids: Some(vec![a.id, alive.id, Uuid::now_v7()]),
            ..Default::default()
        })
        .await
        .expect("replay");
    assert_eq!(replayed, 1, "only a is dead among the ids");
    let back = get(h, a.id).await;
    assert_eq!(back.state, JobState::Available);
    assert_eq!(back.attempt, 0, "a fresh set of attempts");
    assert_eq!(back.run_at, h.now(), "runs from now");
    assert_eq!(back.lease, None);
    let mut marked = a.errors.clone();
    if let Some(last) = marked.last_mut() {
        last.replayed_at = Some(h.now());
    }
    assert_eq!(
        back.errors, marked,
        "history kept, its last failure marked as replayed"
    );
    assert_eq!(get(h, b.id).await, b, "b not selected, still dead");
    assert_eq!(get(h, alive.id).await, alive, "a live job is not touched");

    let again = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(again.id, a.id);
    assert_eq!(again.attempt, 1);
    let dead = fail(
        h,
        lease_of(&again),
        "still broken",
        RetryPlan::Backoff(backoff(secs(1))),
    )
    .await
    .expect("fail");
    assert_eq!(dead.state, JobState::Dead, "max_attempts 1 again applies");
    let messages: Vec<&str> = dead.errors.iter().map(|e| e.message.as_str()).collect();
    assert_eq!(
        messages,
        ["fatal", "still broken"],
        "history spans the replay"
    );
    let runs: Vec<(u32, bool)> = dead
        .errors
        .iter()
        .map(|e| (e.attempt, e.replayed_at.is_some()))
        .collect();
    assert_eq!(
        runs,
        [(1, true), (1, false)],
        "attempt 1 twice, the first marked as followed by a replay"
    );
}

/// Replaying by queue and/or kind selects exactly the dead jobs matching every given filter.
pub async fn dead_replay_by_queue_and_kind_filter(h: &Harness) {
    let q1_k1 = make_dead(h, job_in("q1", "k1")).await;
    let q1_k2 = make_dead(h, job_in("q1", "k2")).await;
    let q2_k1 = make_dead(h, job_in("q2", "k1")).await;
    let q2_k2 = make_dead(h, job_in("q2", "k2")).await;
    let live = insert(h, job_in("q1", "k1")).await;
    let state = |id| async move { get(h, id).await.state };
    let replay = |queue: Option<&str>, kind: Option<&str>| {
        let selector = ReplaySelector {
            ids: None,
            queue: queue.map(str::to_string),
            kind: kind.map(str::to_string),
        };
        async move { h.store.dead_replay(selector).await.expect("replay") }
    };

    assert_eq!(
        replay(Some("q1"), Some("k1")).await,
        1,
        "queue q1 and kind k1"
    );
    assert_eq!(state(q1_k1.id).await, JobState::Available);
    assert_eq!(state(q1_k2.id).await, JobState::Dead);
    assert_eq!(state(q2_k1.id).await, JobState::Dead);
    assert_eq!(state(q2_k2.id).await, JobState::Dead);
    assert_eq!(get(h, live.id).await, live, "live job untouched");

    assert_eq!(replay(None, Some("k2")).await, 2, "kind k2 in any queue");
    assert_eq!(state(q1_k2.id).await, JobState::Available);
    assert_eq!(state(q2_k2.id).await, JobState::Available);
    assert_eq!(state(q2_k1.id).await, JobState::Dead);

    assert_eq!(replay(Some("q3"), None).await, 0, "no dead jobs in q3");
    assert_eq!(replay(Some("q2"), None).await, 1, "the rest of q2");
    assert_eq!(state(q2_k1.id).await, JobState::Available);
    assert_eq!(replay(Some("q2"), None).await, 0, "nothing dead left");
    // A replay by filter marks the history the same way.
    let marked = get(h, q2_k1.id).await;
    assert_eq!(
        marked.errors.last().and_then(|e| e.replayed_at),
        Some(h.now()),
        "{:?}",
        marked.errors
    );
}

/// Discarding deletes a dead job and reports true; for a job that is not dead, or not there,
/// it reports false and deletes nothing.
pub async fn dead_discard_deletes_only_dead_jobs(h: &Harness) {
    let dead = make_dead(h, new_job("dead")).await;
    let alive = insert(h, new_job("alive")).await;

    assert!(
        h.store.dead_discard(dead.id).await.expect("discard"),
        "dead job discarded"
    );
    assert_eq!(h.store.job_get(dead.id).await.expect("get"), None, "gone");
    assert!(
        !h.store.dead_discard(dead.id).await.expect("discard"),
        "already gone"
    );
    assert!(
        !h.store.dead_discard(alive.id).await.expect("discard"),
        "not dead"
    );
    assert_eq!(get(h, alive.id).await, alive, "a live job stays");
    assert!(
        !h.store.dead_discard(Uuid::now_v7()).await.expect("discard"),
        "unknown id"
    );

    let stats = h.store.queues_stats().await.expect("stats");
    assert_eq!(stats.len(), 1, "{stats:?}");
    assert_eq!(stats[0].dead, 0);
    assert_eq!(stats[0].available, 1);
}

/// Listing filters by queue, state and kind (together), returns newest first, and pages with
/// `after` = the last id of the previous page.
pub async fn list_filters_by_queue_state_kind_with_cursor_paging(h: &Harness) {
    let mut mail = Vec::new();
    for _ in 0..7 {
        mail.push(insert(h, job_in("mail", "send")).await.id);
        h.advance(millis(1));
    }
    let mut noise = Vec::new();
    for (queue, kind) in [
        ("other", "send"),
        ("other", "send"),
        ("mail", "bounce"),
        ("mail", "bounce"),
    ] {
        noise.push(insert(h, job_in(queue, kind)).await.id);
        h.advance(millis(1));
    }
    let newest_first = |mut v: Vec<Uuid>| {
        v.sort_by(|a, b| b.cmp(a));
        v
    };

    // Paging through queue=mail, kind=send, three at a time.
    let filter = |after| {
        let mut params = JobListParams::default();
        params.queue = Some("mail".into());
        params.kind = Some("send".into());
        params.limit = 3;
        params.after = after;
        params
    };
    let mut pages = Vec::new();
    let mut after = None;
    loop {
        let page = list(h, filter(after)).await;
        assert!(pages.len() < 10, "paging must end");
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 3, "limit respected: {}", page.len());
        after = Some(page.last().expect("non-empty").id);
        pages.push(ids(&page));
    }
    let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 3, 1], "seven jobs in pages of three");
    let listed: Vec<Uuid> = pages.concat();
    assert_eq!(
        listed,
        newest_first(mail.clone()),
        "newest first, no gaps or repeats"
    );

    // State filter: the two oldest mail jobs are claimed.
    let claimed = [fetch_one(h, "mail").await.id, fetch_one(h, "mail").await.id];
    assert_eq!(claimed, [mail[0], mail[1]]);
    let running = list(h, {
        let mut params = JobListParams::default();
        params.queue = Some("mail".into());
        params.state = Some(JobState::Running);
        params.limit = 100;
        params
    })
    .await;
    assert_eq!(
        ids(&running),
        newest_first(claimed.to_vec()),
        "running in mail"
    );
    let available_send = list(h, {
        let mut params = JobListParams::default();
        params.queue = Some("mail".into());
        params.state = Some(JobState::Available);
        params.kind = Some("send".into());
        params.limit = 100;
        params
    })
    .await;
    assert_eq!(ids(&available_send), newest_first(mail[2..].to_vec()));

    // Kind alone, queue alone, and no filter.
    let bounce = list(h, {
        let mut params = JobListParams::default();
        params.kind = Some("bounce".into());
        params.limit = 100;
        params
    })
    .await;
    assert_eq!(ids(&bounce), newest_first(noise[2..].to_vec()));
    let other = list(h, {
        let mut params = JobListParams::default();
        params.queue = Some("other".into());
        params.limit = 100;
        params
    })
    .await;
    assert_eq!(ids(&other), newest_first(noise[..2].to_vec()));
    let everything: Vec<Uuid> = mail.iter().chain(&noise).copied().collect();
    assert_eq!(ids(&list_all(h).await), newest_first(everything));
    let nothing = list(h, {
        let mut params = JobListParams::default();
        params.queue = Some("mail".into());
        params.state = Some(JobState::Dead);
        params.limit = 100;
        params
    })
    .await;
    assert!(nothing.is_empty(), "no dead mail: {nothing:?}");
}

/// Stats hold one entry per queue that has jobs, counting every state, with the age of the
/// oldest available job (now - its run_at; 0 when none is available).
pub async fn queue_stats_count_each_state_and_oldest_age(h: &Harness) {
    let stats = h.store.queues_stats().await.expect("stats");
    assert!(stats.is_empty(), "an empty store has no queues: {stats:?}");

    let q = "stats";
    // completed
    insert(h, job_in(q, "done")).await;
    let running = fetch_one(h, q).await;
    assert_eq!(
        complete(h, lease_of(&running), None).await,
        LeaseOutcome::Applied
    );
    // dead
    make_dead(h, job_in(q, "dead")).await;
    // cancelled
    let doomed = insert(h, job_in(q, "cancelled")).await;
    h.store.job_cancel(doomed.id).await.expect("cancel");
    // retryable (twice)
    for _ in 0..2 {
        insert(h, job_in(q, "retryable")).await;
        let running = fetch_one(h, q).await;
        fail(
            h,
            lease_of(&running),
            "x",
            RetryPlan::Backoff(backoff(secs(3600))),
        )
        .await
        .expect("fail");
    }
    // running
    insert(h, job_in(q, "running")).await;
    fetch_one(h, q).await;
    // scheduled
    let mut later = job_in(q, "scheduled");
    later.run_at = Some(h.now() + span(secs(600)));
    insert(h, later).await;
    // available: the oldest waits 2 s, a newer one 0.5 s
    insert(h, job_in(q, "available")).await;
    h.advance(millis(1_500));
    insert(h, job_in(q, "available")).await;
    insert(h, job_in(q, "available")).await;
    h.advance(millis(500));
    // another queue with one available job, and one with only a scheduled job
    insert(h, job_in("other", "x")).await;
    h.advance(millis(250));
    let mut idle = job_in("idle", "x");
    idle.run_at = Some(h.now() + span(secs(60)));
    insert(h, idle).await;

    let mut stats = h.store.queues_stats().await.expect("stats");
    stats.sort_by(|a, b| a.name.cmp(&b.name));
    let expected = vec![
        QueueStats {
            name: "idle".into(),
            scheduled: 1,
            oldest_available_age_ms: 0,
            ..Default::default()
        },
        QueueStats {
            name: "other".into(),
            available: 1,
            oldest_available_age_ms: 250,
            ..Default::default()
        },
        QueueStats {
            name: "stats".into(),
            available: 3,
            scheduled: 1,
            running: 1,
            retryable: 2,
            dead: 1,
            completed: 1,
            cancelled: 1,
            expired: 0,
            blocked: 0,
            oldest_available_age_ms: 2_250,
            paused: false,
        },
    ];
    assert_eq!(stats, expected);
}

/// Promotion makes due `scheduled` and `retryable` jobs `available` (returning how many),
/// leaves jobs not yet due alone, and does nothing when run twice.
pub async fn promote_due_makes_scheduled_and_retryable_available(h: &Harness) {
    let t0 = h.now();
    let mut soon = new_job("scheduled");
    soon.run_at = Some(t0 + span(secs(10)));
    let scheduled = insert(h, soon).await;
    let mut much_later = new_job("later");
    much_later.run_at = Some(t0 + span(secs(3600)));
    let later = insert(h, much_later).await;
    insert(h, job_in("retry-q", "retryable")).await;
    let running = fetch_one(h, "retry-q").await;
    let retryable = fail(
        h,
        lease_of(&running),
        "x",
        RetryPlan::Backoff(backoff(secs(10))),
    )
    .await
    .expect("fail");
    assert_eq!(retryable.run_at, t0 + span(secs(10)));

    assert_eq!(
        h.store.jobs_promote_due().await.expect("promote"),
        0,
        "nothing due yet"
    );
    assert_eq!(get(h, scheduled.id).await.state, JobState::Scheduled);
    assert_eq!(get(h, retryable.id).await.state, JobState::Retryable);

    h.advance(secs(10));
    assert_eq!(
        h.store.jobs_promote_due().await.expect("promote"),
        2,
        "two came due"
    );
    let promoted_s = get(h, scheduled.id).await;
    let promoted_r = get(h, retryable.id).await;
    assert_eq!(promoted_s.state, JobState::Available);
    assert_eq!(promoted_r.state, JobState::Available);
    assert_eq!(promoted_r.attempt, 1, "promotion does not count an attempt");
    assert_eq!(promoted_r.errors.len(), 1, "promotion keeps the history");
    assert_eq!(get(h, later.id).await, later, "not due, untouched");
    assert_eq!(
        h.store.jobs_promote_due().await.expect("promote"),
        0,
        "idempotent"
    );
}

/// next_due is the earliest run_at among scheduled and retryable jobs in the given queues;
/// `None` when there is none. Available and running jobs do not count.
pub async fn next_due_reports_earliest_scheduled_run_at(h: &Harness) {
    let t0 = h.now();
    let next_due = |queues: &[&str]| {
        let queues: Vec<String> = queues.iter().map(|q| q.to_string()).collect();
        async move { h.store.jobs_next_due(&queues).await.expect("next_due") }
    };
    assert_eq!(next_due(&["a"]).await, None, "empty store");

    // retryable in a, due at t0 + 10 s
    insert(h, job_in("a", "retryable")).await;
    let running = fetch_one(h, "a").await;
    fail(
        h,
        lease_of(&running),
        "x",
        RetryPlan::Backoff(backoff(secs(10))),
    )
    .await
    .expect("fail");
    insert(h, job_in("a", "available")).await;
    insert(h, job_in("a", "running")).await;
    fetch_one(h, "a").await;
    for (queue, after) in [("a", 60), ("a", 30), ("b", 5)] {
        let mut job = job_in(queue, "scheduled");
        job.run_at = Some(t0 + span(secs(after)));
        insert(h, job).await;
    }
    insert(h, job_in("c", "available")).await;

    assert_eq!(
        next_due(&["a"]).await,
        Some(t0 + span(secs(10))),
        "the retryable job"
    );
    assert_eq!(
        next_due(&["a", "b"]).await,
        Some(t0 + span(secs(5))),
        "b's job is earlier"
    );
    assert_eq!(next_due(&["b"]).await, Some(t0 + span(secs(5))));
    assert_eq!(next_due(&["c"]).await, None, "only an available job in c");
    assert_eq!(next_due(&["nowhere"]).await, None);
}

/// Waits for `notified` to fire (up to a few seconds of real time), after running `action`.
async fn notified_after<F: Future>(h: &Harness, what: &str, action: F) {
    let wakeup = h.store.wakeup();
    let notified = wakeup.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    action.await;
    let fired = tokio::time::timeout(Duration::from_secs(5), notified).await;
    assert!(fired.is_ok(), "wakeup() was not notified after {what}");
}

/// Inserting a job notifies the store's wake-up, so waiting fetchers look again.
pub async fn wakeup_is_notified_after_insert(h: &Harness) {
    notified_after(h, "an insert", async {
        insert(h, new_job("wake")).await;
    })
    .await;
    let fetched = fetch_one(h, DEFAULT_QUEUE).await;
    assert_eq!(fetched.kind, "wake");
}

/// Jobs that become available again (released, replayed from dead, promoted) also notify the
/// wake-up.
pub async fn wakeup_is_notified_when_jobs_become_available_again(h: &Harness) {
    insert(h, new_job("released")).await;
    let running = fetch_one(h, DEFAULT_QUEUE).await;
    notified_after(h, "a release", async {
        let held = h
            .store
            .jobs_release_many(vec![lease_of(&running)])
            .await
            .expect("release");
        assert_eq!(held, 1);
    })
    .await;
    h.store.job_cancel(running.id).await.expect("cancel");

    let dead = make_dead(h, new_job("replayed")).await;
    notified_after(h, "a dead replay", async {
        let replayed = h
            .store
            .dead_replay(ReplaySelector {
                ids: Some(vec![dead.id]),
                ..Default::default()
            })
            .await
            .expect("replay");
        assert_eq!(replayed, 1);
    })
    .await;
    h.store.job_cancel(dead.id).await.expect("cancel");

    let mut later = new_job("promoted");
    later.run_at = Some(h.now() + span(secs(10)));
    insert(h, later).await;
    h.advance(secs(10));
    notified_after(h, "a promotion", async {
        assert_eq!(h.store.jobs_promote_due().await.expect("promote"), 1);
    })
    .await;
}

/// `jobs_import` stores a job exactly as given (state, attempts, history, lease, timestamps),
/// counts it in its queue, and leaves an id that already exists alone.
pub async fn import_preserves_every_field_and_skips_existing_ids(h: &Harness) {
    let mut source = job_in("imports", "imported");
    source.max_attempts = 2;
    source.tags = vec!["t1".into()];
    source.tenant = Some("acme".into());
    insert(h, source).await;
    let running = fetch_one(h, "imports").await;
    let dead = fail(h, lease_of(&running), "boom", RetryPlan::Never)
        .await
        .expect("fail");

    let mut copy = dead.clone();
    copy.id = Uuid::now_v7();
    let mut leased = running.clone();
    leased.id = Uuid::now_v7();
    let imported = h
        .store
        .jobs_import(vec![copy.clone(), leased.clone()])
        .await
        .expect("import");
    assert_eq!(imported, 2);
    assert_eq!(
        get(h, copy.id).await,
        copy,
        "a dead job is imported as it was"
    );
    assert_eq!(
        get(h, leased.id).await,
        leased,
        "a running job keeps its lease"
    );

    let again = h
        .store
        .jobs_import(vec![copy.clone()])
        .await
        .expect("import again");
    assert_eq!(again, 0, "an existing id is skipped");
    let stats = h.store.queues_stats().await.expect("stats");
    let imports = stats
        .iter()
        .find(|q| q.name == "imports")
        .expect("queue counted");
    assert_eq!((imports.dead, imports.running), (2, 1));
}

/// Maintenance leadership: one holder at a time; renewing keeps it; another takes over once
/// the holder stops renewing for `ttl`, or at once when the holder releases it.
pub async fn leadership_is_exclusive_until_released_or_expired(h: &Harness) {
    let ttl = secs(10);
    let lead = |holder: &'static str| async move {
        h.store
            .leader_try_acquire(holder, ttl)
            .await
            .expect("leader election")
    };
    assert!(lead("node-a").await, "the first node leads");
    assert!(!lead("node-b").await, "a second node does not");
    h.advance(secs(9));
    assert!(lead("node-a").await, "the leader renews");
    h.advance(secs(9));
    assert!(!lead("node-b").await, "renewed leadership has not expired");
    h.advance(secs(2));
    assert!(
        lead("node-b").await,
        "an unrenewed leadership expires and moves"
    );
    assert!(!lead("node-a").await, "the old leader lost it");
    h.store.leader_release("node-a").await.expect("release");
    assert!(
        !lead("node-a").await,
        "releasing what one does not hold changes nothing"
    );
    h.store.leader_release("node-b").await.expect("release");
    assert!(
        lead("node-a").await,
        "a released leadership is taken at once"
    );
}
