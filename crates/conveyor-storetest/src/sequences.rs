//! Sequences (`conveyor_core::sequence`): jobs sharing a sequence key run one after another in
//! the order they were enqueued, whatever their priority; a retry holds its successors back; a
//! dead job blocks them or is skipped; cancelling, expiring or discarding the job in front lets
//! the next one run. Jobs are stamped with their sequence by the engine's `LimitStamps`, as
//! every server and the facade open their store.

use conveyor_core::kinds::KindSettings;
use conveyor_core::sequence::{OnDead, SequenceSpec};
use conveyor_core::{
    Job, JobListParams, JobState, NewJob, QueueSettings, ReplaySelector, RetryPlan,
};
use conveyor_engine::LimitStamps;
use serde_json::json;
use uuid::Uuid;

use crate::kit::{complete, fail, fetch, get, job_in, lease_of, list, secs, span, Harness};

/// The harness with its store behind the stamping decorator.
fn stamped(h: &Harness) -> Harness {
    Harness::new(LimitStamps::wrap(h.store.clone()), h.clock.clone())
}

fn sequence(key: &str, on_dead: OnDead) -> SequenceSpec {
    SequenceSpec {
        key: key.to_string(),
        on_dead,
    }
}

async fn queue_in_sequence(h: &Harness, queue: &str, spec: SequenceSpec) {
    let mut settings = QueueSettings::default();
    settings.sequence = Some(spec);
    h.store
        .queue_settings_put(queue, settings)
        .await
        .expect("queue settings");
}

fn account_job(queue: &str, account: &str, n: u32) -> NewJob {
    let mut job = job_in(queue, "sync");
    job.payload = json!({"account": account, "n": n});
    job
}

async fn insert_all(h: &Harness, jobs: Vec<NewJob>) -> Vec<Job> {
    h.store
        .jobs_insert_many(jobs)
        .await
        .expect("insert")
        .into_iter()
        .map(|inserted| inserted.job)
        .collect()
}

fn ns(jobs: &[Job]) -> Vec<(String, u64)> {
    let mut found: Vec<(String, u64)> = jobs
        .iter()
        .map(|job| {
            (
                job.payload["account"].as_str().unwrap_or("?").to_string(),
                job.payload["n"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    found.sort();
    found
}

async fn state_of(h: &Harness, id: Uuid) -> JobState {
    get(h, id).await.state
}

/// Jobs of one key run one at a time, in the order they were enqueued, even when later ones
/// have a higher priority; other keys run beside them. The ones behind wait `blocked`, numbered
/// in order, and the next is released when the one in front completes.
pub async fn a_sequence_runs_one_at_a_time_in_enqueue_order(h: &Harness) {
    let h = &stamped(h);
    queue_in_sequence(h, "seq", sequence("payload.account", OnDead::Block)).await;
    let mut jobs: Vec<NewJob> = (1..=3)
        .map(|n| {
            let mut job = account_job("seq", "acme", n);
            // Later jobs rank higher: the sequence, not priority, orders them.
            job.priority = n as i32 * 10;
            job
        })
        .collect();
    jobs.push(account_job("seq", "globex", 1));
    let inserted = insert_all(h, jobs).await;
    let states: Vec<JobState> = inserted.iter().map(|job| job.state).collect();
    assert_eq!(
        states,
        [
            JobState::Available,
            JobState::Blocked,
            JobState::Blocked,
            JobState::Available
        ]
    );
    let numbers: Vec<u64> = inserted
        .iter()
        .map(|job| job.sequence.as_ref().map_or(0, |s| s.no))
        .collect();
    assert_eq!(numbers, [1, 2, 3, 1]);
    assert_eq!(
        inserted[0].sequence.as_ref().map(|s| s.key.as_str()),
        Some("payload.account=acme")
    );

    let first = fetch(h, &["seq"], 10).await;
    assert_eq!(
        ns(&first),
        [("acme".to_string(), 1), ("globex".to_string(), 1)]
    );
    // A job enqueued now waits behind the ones already in the sequence.
    let later = insert_all(h, vec![account_job("seq", "acme", 4)]).await;
    assert_eq!(later[0].state, JobState::Blocked);
    assert_eq!(later[0].sequence.as_ref().map(|s| s.no), Some(4));

    let mut order = Vec::new();
    let mut running: Vec<Job> = first
        .into_iter()
        .filter(|job| job.payload["account"] == "acme")
        .collect();
    while let Some(job) = running.pop() {
        order.push(job.payload["n"].as_u64().unwrap_or(0));
        assert_eq!(
            complete(h, lease_of(&job), None).await,
            conveyor_core::LeaseOutcome::Applied
        );
        running = fetch(h, &["seq"], 10).await;
        assert!(
            running.len() <= 1,
            "one job of a key at a time: {running:?}"
        );
    }
    assert_eq!(order, [1, 2, 3, 4]);
}

/// A job that fails and will retry holds its successors back until it completes.
pub async fn a_retry_holds_back_its_successors(h: &Harness) {
    let h = &stamped(h);
    queue_in_sequence(h, "seq", sequence("payload.account", OnDead::Block)).await;
    let inserted = insert_all(
        h,
        vec![account_job("seq", "acme", 1), account_job("seq", "acme", 2)],
    )
    .await;
    let head = fetch(h, &["seq"], 10).await;
    assert_eq!(ns(&head), [("acme".to_string(), 1)]);
    let retry_at = h.now() + span(secs(5));
    let failed = fail(h, lease_of(&head[0]), "flaky", RetryPlan::At(retry_at))
        .await
        .expect("fail");
    assert_eq!(failed.state, JobState::Retryable);
    assert!(
        fetch(h, &["seq"], 10).await.is_empty(),
        "the successor waits"
    );
    assert_eq!(state_of(h, inserted[1].id).await, JobState::Blocked);
    h.advance(secs(6));
    let again = fetch(h, &["seq"], 10).await;
    assert_eq!(ns(&again), [("acme".to_string(), 1)]);
    assert_eq!(again[0].attempt, 2);
    complete(h, lease_of(&again[0]), None).await;
    let next = fetch(h, &["seq"], 10).await;
    assert_eq!(ns(&next), [("acme".to_string(), 2)]);
}

/// With `on_dead: block` a dead job holds its successors until it is discarded (or replayed
/// and completed); with `skip` the next one runs at once.
pub async fn a_dead_job_blocks_or_is_skipped(h: &Harness) {
    let h = &stamped(h);
    queue_in_sequence(h, "block", sequence("payload.account", OnDead::Block)).await;
    queue_in_sequence(h, "skip", sequence("payload.account", OnDead::Skip)).await;
    // One account per queue: jobs anywhere with the same key share a sequence.
    for (queue, account) in [("block", "acme"), ("skip", "globex")] {
        let mut head = account_job(queue, account, 1);
        head.max_attempts = 1;
        let inserted = insert_all(h, vec![head, account_job(queue, account, 2)]).await;
        let running = fetch(h, &[queue], 10).await;
        assert_eq!(running.len(), 1, "{queue}: {running:?}");
        let dead = fail(h, lease_of(&running[0]), "fatal", RetryPlan::Never)
            .await
            .expect("fail");
        assert_eq!(dead.state, JobState::Dead);
        let after = fetch(h, &[queue], 10).await;
        if queue == "skip" {
            assert_eq!(ns(&after), [(account.to_string(), 2)], "skipped");
        } else {
            assert!(after.is_empty(), "blocked behind the dead job: {after:?}");
            assert_eq!(state_of(h, inserted[1].id).await, JobState::Blocked);
            assert!(h.store.dead_discard(dead.id).await.expect("discard"));
            let released = fetch(h, &[queue], 10).await;
            assert_eq!(ns(&released), [(account.to_string(), 2)], "discarded");
        }
    }
}

/// A dead job replayed runs before the jobs that waited behind it.
pub async fn a_replayed_dead_job_runs_before_its_successors(h: &Harness) {
    let h = &stamped(h);
    queue_in_sequence(h, "seq", sequence("payload.account", OnDead::Block)).await;
    let mut head = account_job("seq", "acme", 1);
    head.max_attempts = 1;
    let inserted = insert_all(
        h,
        vec![
            head,
            account_job("seq", "acme", 2),
            account_job("seq", "acme", 3),
        ],
    )
    .await;
    let running = fetch(h, &["seq"], 10).await;
    fail(h, lease_of(&running[0]), "fatal", RetryPlan::Never)
        .await
        .expect("fail");
    let replayed = h
        .store
        .dead_replay(ReplaySelector {
            ids: Some(vec![inserted[0].id]),
            ..ReplaySelector::default()
        })
        .await
        .expect("replay");
    assert_eq!(replayed, 1);
    h.store.jobs_promote_due().await.expect("promote");
    let again = fetch(h, &["seq"], 10).await;
    assert_eq!(ns(&again), [("acme".to_string(), 1)]);
    complete(h, lease_of(&again[0]), None).await;
    let next = fetch(h, &["seq"], 10).await;
    assert_eq!(ns(&next), [("acme".to_string(), 2)]);
    assert_eq!(state_of(h, inserted[2].id).await, JobState::Blocked);
}

/// Cancelling a waiting job changes nothing for the others; cancelling the job in front, or
/// its expiry, lets the next one run.
pub async fn cancelling_or_expiring_the_job_in_front_releases_the_next(h: &Harness) {
    let h = &stamped(h);
    queue_in_sequence(h, "seq", sequence("payload.account", OnDead::Block)).await;
    let inserted = insert_all(
        h,
        vec![
            account_job("seq", "acme", 1),
            account_job("seq", "acme", 2),
            account_job("seq", "acme", 3),
            account_job("seq", "acme", 4),
        ],
    )
    .await;
    // The second waits behind the first: cancelling it leaves the order as it was.
    h.store.job_cancel(inserted[1].id).await.expect("cancel");
    assert_eq!(state_of(h, inserted[2].id).await, JobState::Blocked);
    // The first has not started: cancelling it releases the third.
    h.store.job_cancel(inserted[0].id).await.expect("cancel");
    assert_eq!(state_of(h, inserted[2].id).await, JobState::Available);
    assert_eq!(state_of(h, inserted[3].id).await, JobState::Blocked);

    // Another key whose first job expires before it starts.
    let mut head = account_job("seq", "globex", 1);
    head.expires_at = Some(h.now() + span(secs(2)));
    let globex = insert_all(h, vec![head, account_job("seq", "globex", 2)]).await;
    h.advance(secs(3));
    h.store.jobs_promote_due().await.expect("maintenance pass");
    assert_eq!(state_of(h, globex[0].id).await, JobState::Expired);
    let running = fetch(h, &["seq"], 10).await;
    assert_eq!(
        ns(&running),
        [("acme".to_string(), 3), ("globex".to_string(), 2)]
    );
}

/// A job's own sequence wins over its kind's, which wins over its queue's; a job without a
/// value for the key is not sequenced; jobs of one key in different queues share a sequence.
pub async fn a_jobs_sequence_comes_from_itself_its_kind_or_its_queue(h: &Harness) {
    let h = &stamped(h);
    queue_in_sequence(h, "seq", sequence("payload.account", OnDead::Block)).await;
    h.store
        .kind_put(KindSettings {
            kind: "ordered".into(),
            schema: None,
            version: None,
            circuit_breaker: None,
            limits: Vec::new(),
            sequence: Some(sequence("tenant", OnDead::Skip)),
            batch: None,
            updated_at: h.now(),
        })
        .await
        .expect("kind");
    let mut by_kind = account_job("seq", "acme", 1);
    by_kind.kind = "ordered".into();
    by_kind.tenant = Some("t1".into());
    let mut by_job = account_job("seq", "acme", 2);
    by_job.kind = "ordered".into();
    by_job.sequence = Some(sequence("payload.n", OnDead::Block));
    let by_queue = account_job("seq", "acme", 3);
    let mut no_value = job_in("seq", "sync");
    no_value.payload = json!({"other": 1});
    let mut elsewhere = job_in("other", "sync");
    elsewhere.payload = json!({"account": "acme", "n": 5});
    elsewhere.sequence = Some(sequence("payload.account", OnDead::Block));
    let inserted = insert_all(h, vec![by_kind, by_job, by_queue, no_value, elsewhere]).await;
    let keys: Vec<Option<(String, OnDead)>> = inserted
        .iter()
        .map(|job| job.sequence.as_ref().map(|s| (s.key.clone(), s.on_dead)))
        .collect();
    assert_eq!(
        keys,
        [
            Some(("tenant=t1".to_string(), OnDead::Skip)),
            Some(("payload.n=2".to_string(), OnDead::Block)),
            Some(("payload.account=acme".to_string(), OnDead::Block)),
            None,
            Some(("payload.account=acme".to_string(), OnDead::Block)),
        ]
    );
    // The job in another queue waits behind the one of the same key in `seq`.
    assert_eq!(inserted[4].state, JobState::Blocked);
    let mut params = JobListParams::default();
    params.sequence = Some("payload.account=acme".into());
    params.limit = 10;
    assert_eq!(list(h, params).await.len(), 2);
    let first = fetch(h, &["seq"], 10).await;
    let by_queue_job = first
        .iter()
        .find(|job| job.id == inserted[2].id)
        .expect("the queue's sequence head runs");
    complete(h, lease_of(by_queue_job), None).await;
    assert_eq!(state_of(h, inserted[4].id).await, JobState::Available);
}

/// Jobs blocked behind their sequence are queued work: they count towards the queue's depth
/// and their tenant's, so a sequence cannot grow a queue past `max_depth`.
pub async fn blocked_jobs_count_towards_the_queue_depth(h: &Harness) {
    let h = &stamped(h);
    let mut settings = QueueSettings::default();
    settings.sequence = Some(sequence("payload.account", OnDead::Block));
    settings.max_depth = Some(3);
    settings.max_depth_per_tenant = Some(2);
    h.store
        .queue_settings_put("seq-depth", settings)
        .await
        .expect("queue settings");
    let of_tenant = |tenant: &str, n: u32| {
        let mut job = account_job("seq-depth", "acme", n);
        job.tenant = Some(tenant.to_string());
        job
    };
    let inserted = insert_all(h, vec![of_tenant("t1", 1), of_tenant("t1", 2)]).await;
    let states: Vec<JobState> = inserted.iter().map(|job| job.state).collect();
    assert_eq!(states, [JobState::Available, JobState::Blocked]);
    // What refused a job: (tenant, depth, limit) of the full queue or tenant.
    let refused = |job: NewJob, why: &'static str| async move {
        match h.store.jobs_insert_many(vec![job]).await.expect_err(why) {
            conveyor_core::StoreError::QueueFull {
                tenant,
                depth,
                limit,
                ..
            } => (tenant, depth, limit),
            other => panic!("{why}: expected QueueFull, got {other:?}"),
        }
    };
    assert_eq!(
        refused(of_tenant("t1", 3), "t1 holds two jobs, one of them blocked").await,
        (Some("t1".to_string()), 2, 2)
    );
    let third = insert_all(h, vec![of_tenant("t2", 3)]).await;
    assert_eq!(third[0].state, JobState::Blocked);
    assert_eq!(
        refused(
            of_tenant("t3", 4),
            "the queue holds three jobs, two of them blocked"
        )
        .await,
        (None, 3, 3)
    );
    // Completing the one in front releases the next and frees a place.
    let running = fetch(h, &["seq-depth"], 10).await;
    assert_eq!(running.len(), 1);
    complete(h, lease_of(&running[0]), None).await;
    insert_all(h, vec![of_tenant("t3", 4)]).await;
}
