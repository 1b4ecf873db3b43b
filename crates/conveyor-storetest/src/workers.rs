//! The worker registry (heartbeats, stale workers and the rescue of their jobs) and stuck jobs.

use conveyor_core::{
    error_class, FetchParams, Job, JobState, LeaseOutcome, NewJob, StaleReport, StaleWorkerParams,
    StoreError, StuckBasis, StuckJob, StuckParams, WorkerHeartbeat, WorkerInfo, WorkerState,
};
use std::time::Duration;

use crate::kit::{backoff, complete, get, insert, job_in, lease_of, secs, span, Harness, LEASE};

fn beat(h: &Harness, id: &str) -> WorkerHeartbeat {
    WorkerHeartbeat {
        id: id.to_string(),
        host: "host-a".to_string(),
        pid: Some(4242),
        queues: vec!["default".to_string(), "mail".to_string()],
        concurrency: 8,
        busy: 3,
        version: "1.2.3".to_string(),
        started_at: h.now() - span(secs(60)),
        stopping: false,
    }
}

async fn heartbeat(h: &Harness, beat: WorkerHeartbeat) -> WorkerInfo {
    h.store
        .workers_heartbeat(beat)
        .await
        .expect("workers_heartbeat should succeed")
}

async fn workers(h: &Harness) -> Vec<WorkerInfo> {
    h.store
        .workers_list()
        .await
        .expect("workers_list should succeed")
}

fn stale_after(older_than: Duration) -> StaleWorkerParams {
    let mut params = StaleWorkerParams::default();
    params.older_than = older_than;
    params.retry = backoff(secs(5));
    params.forget_after = secs(24 * 3600);
    params
}

async fn mark_stale(h: &Harness, params: StaleWorkerParams) -> StaleReport {
    h.store
        .workers_mark_stale(params)
        .await
        .expect("workers_mark_stale should succeed")
}

/// Fetches one job from `queue` as worker `worker`.
async fn fetch_as(h: &Harness, worker: &str, queue: &str) -> Job {
    let mut jobs = h
        .store
        .jobs_fetch(FetchParams {
            worker_id: worker.to_string(),
            queues: vec![queue.to_string()],
            max: 1,
            lease: LEASE,
            kinds: None,
            excluded_kinds: Vec::new(),
        })
        .await
        .expect("fetch should succeed");
    assert_eq!(jobs.len(), 1, "one job from {queue:?} for {worker}");
    jobs.remove(0)
}

/// An operator's command sticks to the worker's entry: shown by the list and by every later
/// heartbeat's answer (a heartbeat of the live worker never clears it), changed or cleared by
/// another command, kept on record when it stops; a restart under the same id starts without
/// it; an unknown worker is `None` and nothing is created.
pub async fn workers_keep_an_operators_command_across_heartbeats(h: &Harness) {
    use conveyor_core::WorkerCommand;
    heartbeat(h, beat(h, "w-cmd")).await;
    heartbeat(h, beat(h, "w-other")).await;
    let told = h
        .store
        .worker_command("w-cmd", Some(WorkerCommand::Quiet))
        .await
        .expect("command")
        .expect("a registered worker");
    assert_eq!(told.command, Some(WorkerCommand::Quiet));
    h.advance(secs(1));
    let answer = heartbeat(h, beat(h, "w-cmd")).await;
    assert_eq!(
        answer.command,
        Some(WorkerCommand::Quiet),
        "a heartbeat keeps it"
    );
    assert_eq!(answer.last_seen_at, h.now());
    let listed = workers(h).await;
    let other = listed.iter().find(|w| w.id == "w-other").expect("other");
    assert_eq!(other.command, None, "only the worker told");
    let stop = h
        .store
        .worker_command("w-cmd", Some(WorkerCommand::Stop))
        .await
        .expect("command")
        .expect("registered");
    assert_eq!(stop.command, Some(WorkerCommand::Stop));
    let mut goodbye = beat(h, "w-cmd");
    goodbye.stopping = true;
    let stopped = heartbeat(h, goodbye).await;
    assert_eq!(stopped.state, WorkerState::Stopped);
    assert_eq!(
        stopped.command,
        Some(WorkerCommand::Stop),
        "what it was told stays on record"
    );
    // Restarted under the same id, it is not told again.
    h.advance(secs(1));
    let restarted = heartbeat(h, beat(h, "w-cmd")).await;
    assert_eq!(restarted.state, WorkerState::Alive);
    assert_eq!(
        restarted.command, None,
        "a new life starts without the old command"
    );
    h.store
        .worker_command("w-cmd", Some(WorkerCommand::Stop))
        .await
        .expect("command");
    let cleared = h
        .store
        .worker_command("w-cmd", None)
        .await
        .expect("clear")
        .expect("registered");
    assert_eq!(cleared.command, None);
    assert!(h
        .store
        .worker_command("w-nobody", Some(WorkerCommand::Stop))
        .await
        .expect("command")
        .is_none());
    assert_eq!(
        workers(h).await.len(),
        2,
        "nothing created for an unknown id"
    );
}

/// A heartbeat creates the worker's entry, alive and last seen now; the next one updates it in
/// place (one entry per id), every field as reported.
pub async fn workers_heartbeat_registers_and_updates_a_worker(h: &Harness) {
    let first = heartbeat(h, beat(h, "w-1")).await;
    let expected = WorkerInfo {
        id: "w-1".to_string(),
        host: "host-a".to_string(),
        pid: Some(4242),
        queues: vec!["default".to_string(), "mail".to_string()],
        concurrency: 8,
        busy: 3,
        version: "1.2.3".to_string(),
        started_at: h.now() - span(secs(60)),
        last_seen_at: h.now(),
        state: WorkerState::Alive,
        ended_at: None,
        command: None,
    };
    assert_eq!(first, expected);
    assert_eq!(workers(h).await, vec![expected.clone()]);

    h.advance(secs(5));
    let mut second = beat(h, "w-1");
    second.busy = 8;
    second.started_at = expected.started_at;
    let updated = heartbeat(h, second).await;
    assert_eq!(updated.busy, 8);
    assert_eq!(updated.last_seen_at, h.now());
    assert_eq!(workers(h).await, vec![updated]);

    heartbeat(h, beat(h, "w-0")).await;
    let ids: Vec<String> = workers(h).await.into_iter().map(|w| w.id).collect();
    assert_eq!(ids, vec!["w-0", "w-1"], "listed by id");
}

/// A worker's last heartbeat at a graceful shutdown records it `stopped` (ended now); staleness
/// never touches a stopped worker, and alive workers are listed before ended ones.
pub async fn workers_stopping_heartbeat_records_a_stopped_worker(h: &Harness) {
    heartbeat(h, beat(h, "w-a")).await;
    let mut last = beat(h, "w-b");
    last.stopping = true;
    last.busy = 0;
    let stopped = heartbeat(h, last).await;
    assert_eq!(stopped.state, WorkerState::Stopped);
    assert_eq!(stopped.ended_at, Some(h.now()));

    h.advance(secs(600));
    heartbeat(h, beat(h, "w-c")).await;
    let report = mark_stale(h, stale_after(secs(120))).await;
    assert_eq!(
        report.workers,
        vec!["w-a".to_string()],
        "only the silent alive one"
    );
    let listed: Vec<(String, WorkerState)> = workers(h)
        .await
        .into_iter()
        .map(|w| (w.id, w.state))
        .collect();
    assert_eq!(
        listed,
        vec![
            ("w-c".to_string(), WorkerState::Alive),
            ("w-a".to_string(), WorkerState::Dead),
            ("w-b".to_string(), WorkerState::Stopped),
        ]
    );
}

/// Marking a silent worker dead rescues the running jobs leased to it at once (long before
/// their leases expire): `retryable` with backoff and a `lease_expired` error naming the
/// worker, or `dead` on the last attempt. Its stale lease no longer settles anything; the jobs
/// of live workers are untouched.
pub async fn workers_mark_stale_rescues_the_jobs_of_dead_workers(h: &Harness) {
    heartbeat(h, beat(h, "w-dies")).await;
    heartbeat(h, beat(h, "w-lives")).await;
    let mut retried = job_in("q1", "work");
    retried.max_attempts = 3;
    let retried = insert(h, retried).await;
    let mut last = job_in("q2", "work");
    last.max_attempts = 1;
    let last = insert(h, last).await;
    let other = insert(h, job_in("q3", "work")).await;
    let held = fetch_as(h, "w-dies", "q1").await;
    fetch_as(h, "w-dies", "q2").await;
    fetch_as(h, "w-lives", "q3").await;

    h.advance(secs(90));
    heartbeat(h, beat(h, "w-lives")).await;
    let report = mark_stale(h, stale_after(secs(120))).await;
    assert!(
        report.workers.is_empty(),
        "90 s is not stale yet: {report:?}"
    );

    h.advance(secs(31));
    let report = mark_stale(h, stale_after(secs(120))).await;
    assert_eq!(report.workers, vec!["w-dies".to_string()]);
    assert_eq!(report.rescued.retried, vec![retried.id]);
    assert_eq!(report.rescued.dead, vec![last.id]);

    let rescued = get(h, retried.id).await;
    assert_eq!(rescued.state, JobState::Retryable);
    assert_eq!(rescued.lease, None);
    assert_eq!(
        rescued.run_at,
        h.now() + span(secs(5)),
        "backoff for attempt 1"
    );
    assert_eq!(rescued.errors.len(), 1);
    assert_eq!(rescued.errors[0].class, error_class::LEASE_EXPIRED);
    assert_eq!(rescued.errors[0].attempt, 1);
    assert_eq!(rescued.errors[0].at, h.now());
    assert_eq!(
        rescued.errors[0].started_at,
        Some(h.now() - span(secs(121))),
        "the rescued attempt's start"
    );
    assert!(
        rescued.errors[0].message.contains("w-dies"),
        "{:?}",
        rescued.errors[0]
    );
    assert_eq!(get(h, last.id).await.state, JobState::Dead);
    assert_eq!(
        complete(h, lease_of(&held), None).await,
        LeaseOutcome::LeaseLost,
        "the dead worker's lease no longer completes"
    );
    let untouched = get(h, other.id).await;
    assert_eq!(
        untouched.state,
        JobState::Running,
        "a live worker's job stays"
    );

    let dead = workers(h)
        .await
        .into_iter()
        .find(|w| w.id == "w-dies")
        .expect("still listed");
    assert_eq!(dead.state, WorkerState::Dead);
    assert_eq!(dead.ended_at, Some(h.now()));
    h.advance(secs(120));
    let report = mark_stale(h, stale_after(secs(120))).await;
    assert_eq!(
        (report.workers, report.rescued.retried, report.rescued.dead),
        (vec!["w-lives".to_string()], vec![other.id], vec![]),
        "each worker is marked dead once; the other one is silent by now too"
    );
    assert_eq!(
        report
            .rescued
            .attempts
            .iter()
            .map(|a| (a.queue.as_str(), a.kind.as_str(), a.status))
            .collect::<Vec<_>>(),
        vec![(
            other.queue.as_str(),
            other.kind.as_str(),
            conveyor_core::AttemptStatus::Failed
        )],
        "the rescued attempt is reported with its queue and kind, for history"
    );
    assert!(mark_stale(h, stale_after(secs(120)))
        .await
        .workers
        .is_empty());
}

/// A worker marked dead that heartbeats again (it was only partitioned) is alive again.
pub async fn workers_dead_worker_that_heartbeats_is_alive_again(h: &Harness) {
    heartbeat(h, beat(h, "w-1")).await;
    h.advance(secs(200));
    assert_eq!(
        mark_stale(h, stale_after(secs(120))).await.workers,
        vec!["w-1".to_string()]
    );
    let back = heartbeat(h, beat(h, "w-1")).await;
    assert_eq!(back.state, WorkerState::Alive);
    assert_eq!(back.ended_at, None);
    assert_eq!(back.last_seen_at, h.now());
}

/// Stopped and dead workers are deleted once they ended longer ago than `forget_after`.
pub async fn workers_ended_long_ago_are_forgotten(h: &Harness) {
    let mut stopping = beat(h, "w-stopped");
    stopping.stopping = true;
    heartbeat(h, stopping).await;
    heartbeat(h, beat(h, "w-dead")).await;
    h.advance(secs(200));
    let params = {
        let mut params = stale_after(secs(120));
        params.forget_after = secs(3600);
        params
    };
    mark_stale(h, params.clone()).await;
    assert_eq!(workers(h).await.len(), 2, "ended, not yet forgotten");
    h.advance(secs(3400));
    heartbeat(h, beat(h, "w-new")).await;
    mark_stale(h, params.clone()).await;
    let ids: Vec<String> = workers(h).await.into_iter().map(|w| w.id).collect();
    assert_eq!(
        ids,
        vec!["w-new", "w-dead"],
        "the stopped one ended 3600 s ago"
    );
    h.advance(secs(200));
    mark_stale(h, params).await;
    let ids: Vec<String> = workers(h).await.into_iter().map(|w| w.id).collect();
    assert_eq!(ids, vec!["w-new"]);
}

/// A heartbeat with a bad field is refused, naming it, and stores nothing.
pub async fn workers_heartbeat_is_validated(h: &Harness) {
    let mut empty = beat(h, "");
    empty.id.clear();
    match h.store.workers_heartbeat(empty).await {
        Err(StoreError::Invalid(e)) => assert_eq!(e.field, "worker_id"),
        other => panic!("expected a validation error, got {other:?}"),
    }
    let mut bad = beat(h, "w-1");
    bad.queues = vec!["not a queue".to_string()];
    match h.store.workers_heartbeat(bad).await {
        Err(StoreError::Invalid(e)) => assert_eq!(e.field, "queues[0]"),
        other => panic!("expected a validation error, got {other:?}"),
    }
    assert!(workers(h).await.is_empty());
}

/// Runs one job of `kind` in `queue` for `took`, completing it.
async fn run_for(h: &Harness, queue: &str, kind: &str, took: Duration) {
    insert(h, job_in(queue, kind)).await;
    let job = fetch_as(h, "w-1", queue).await;
    h.advance(took);
    assert_eq!(
        complete(h, lease_of(&job), None).await,
        LeaseOutcome::Applied
    );
}

async fn stuck(h: &Harness) -> Vec<StuckJob> {
    h.store
        .jobs_stuck(StuckParams::default())
        .await
        .expect("jobs_stuck should succeed")
}

fn summary(stuck: &[StuckJob]) -> Vec<(String, StuckBasis, u64, Option<u64>)> {
    stuck
        .iter()
        .map(|s| (s.kind.clone(), s.basis, s.threshold_ms, s.typical_ms))
        .collect()
}

/// A running job is stuck past 3x its kind's p95 duration when the kind has history (five
/// recent completions), past 3x its timeout when it has none, past 10 minutes otherwise. Old
/// completions (outside the window) are no history.
pub async fn stuck_jobs_are_judged_by_history_then_timeout_then_default(h: &Harness) {
    // History for "quick": durations 1, 1, 2, 2, 2 s: p95 (rank 5 of 5) is 2 s.
    for took in [1, 2, 1, 2, 2] {
        run_for(h, "history", "quick", secs(took)).await;
    }
    // Four completions of "rare" are not enough history.
    for _ in 0..4 {
        run_for(h, "history", "rare", secs(1)).await;
    }
    insert(h, job_in("q-quick", "quick")).await;
    let quick = fetch_as(h, "w-1", "q-quick").await;
    let mut with_timeout = NewJob::new("rare", serde_json::json!({}));
    with_timeout.queue = "q-rare".to_string();
    with_timeout.timeout_ms = Some(4_000);
    insert(h, with_timeout).await;
    let rare = fetch_as(h, "w-1", "q-rare").await;
    insert(h, job_in("q-unknown", "unknown")).await;
    let unknown = fetch_as(h, "w-1", "q-unknown").await;

    h.advance(secs(6));
    assert!(stuck(h).await.is_empty(), "6 s is not past 3 x 2 s");
    h.advance(secs(1));
    let found = stuck(h).await;
    assert_eq!(
        summary(&found),
        vec![("quick".to_string(), StuckBasis::History, 6_000, Some(2_000))]
    );
    assert_eq!(found[0].id, quick.id);
    assert_eq!(found[0].queue, "q-quick");
    assert_eq!(found[0].attempt, 1);
    assert_eq!(found[0].worker_id.as_deref(), Some("w-1"));
    assert_eq!(found[0].started_at, quick.started_at.expect("started"));
    assert_eq!(found[0].running_ms, 7_000);

    h.advance(secs(6)); // 13 s: past 3 x the 4 s timeout
    assert_eq!(
        summary(&stuck(h).await),
        vec![
            ("quick".to_string(), StuckBasis::History, 6_000, Some(2_000)),
            ("rare".to_string(), StuckBasis::Timeout, 12_000, None),
        ]
    );

    // An hour later the completions are outside the window: "quick" falls back to the
    // default, which the running jobs are now past too.
    h.advance(secs(3600));
    let found = stuck(h).await;
    assert_eq!(
        summary(&found),
        vec![
            ("quick".to_string(), StuckBasis::Default, 600_000, None),
            ("rare".to_string(), StuckBasis::Timeout, 12_000, None),
            ("unknown".to_string(), StuckBasis::Default, 600_000, None),
        ]
    );
    let ids: Vec<_> = found.iter().map(|s| s.id).collect();
    assert_eq!(
        ids,
        vec![quick.id, rare.id, unknown.id],
        "all started together"
    );
    assert_eq!(
        complete(h, lease_of(&quick), None).await,
        LeaseOutcome::Applied
    );
    assert_eq!(stuck(h).await.len(), 2, "a finished job is not stuck");
}

/// A registration refreshed from a worker's fetches knows less than the worker's own
/// heartbeat: what it leaves empty keeps what the store has.
pub async fn heartbeat_keeps_what_a_later_one_leaves_out(h: &Harness) {
    let full = WorkerHeartbeat {
        id: "w-known".to_string(),
        host: "box-1".to_string(),
        pid: Some(4242),
        queues: vec!["mail".to_string()],
        concurrency: 8,
        busy: 2,
        version: "1.2.3".to_string(),
        started_at: h.now(),
        stopping: false,
    };
    h.store.workers_heartbeat(full.clone()).await.expect("beat");
    h.advance(secs(5));
    let sparse = WorkerHeartbeat {
        host: String::new(),
        pid: None,
        queues: Vec::new(),
        concurrency: 0,
        busy: 5,
        version: String::new(),
        started_at: h.now(),
        ..full.clone()
    };
    let info = h.store.workers_heartbeat(sparse).await.expect("beat");
    assert_eq!(
        (
            info.host.as_str(),
            info.pid,
            info.queues.clone(),
            info.concurrency,
            info.version.as_str()
        ),
        ("box-1", Some(4242), vec!["mail".to_string()], 8, "1.2.3")
    );
    assert_eq!(info.busy, 5, "busy is always the latest");
    assert_eq!(
        info.started_at, full.started_at,
        "started_at never moves later"
    );
    assert_eq!(info.last_seen_at, h.now());
}
