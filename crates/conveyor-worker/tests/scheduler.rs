//! The cron scheduler against a real SQLite store: passes driven by a manual clock, the loop
//! run by maintenance, and two schedulers racing on one store.

use conveyor_core::schedule::RunStatus;
use conveyor_core::{
    JobListParams, JobTemplate, ManualClock, MissedPolicy, OverlapPolicy, Schedule, ScheduleRun,
    ScheduleSpec, Store,
};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use conveyor_storetest::eventually::eventually_within;
use conveyor_worker::{Maintenance, Scheduler};
use serde_json::json;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

fn open(dir: &tempfile::TempDir, clock: Option<Arc<ManualClock>>) -> Arc<dyn Store> {
    let mut options = SqliteOptions::default();
    if let Some(clock) = clock {
        options.clock = clock;
    }
    Arc::new(SqliteStore::open(dir.path().join("jobs.db"), options).expect("open store"))
}

fn every_second(name: &str) -> Schedule {
    let spec = ScheduleSpec::new("* * * * * *", JobTemplate::new("tick", json!({})))
        .overlap(OverlapPolicy::Allow);
    Schedule::from_spec(name, spec).expect("valid")
}

async fn runs(store: &Arc<dyn Store>, name: &str) -> Vec<ScheduleRun> {
    let mut runs = store.schedule_runs(name, 10_000).await.expect("runs");
    runs.reverse();
    runs
}

/// Asserts one enqueued run and one job per tick, the ticks one second apart.
async fn assert_once_per_tick(store: &Arc<dyn Store>, name: &str, runs: &[ScheduleRun]) {
    for pair in runs.windows(2) {
        assert_eq!(
            pair[1].tick - pair[0].tick,
            chrono::Duration::seconds(1),
            "consecutive ticks: {runs:?}"
        );
    }
    assert!(runs.iter().all(|r| r.status == RunStatus::Enqueued));
    let jobs = store
        .jobs_list({
            let mut params = JobListParams::default();
            params.limit = 10_000;
            params
        })
        .await
        .expect("list");
    let tag = format!("schedule:{name}");
    let keys: HashSet<String> = jobs
        .iter()
        .filter(|j| j.tags.contains(&tag))
        .filter_map(|j| j.idempotency_key.clone())
        .collect();
    let count = jobs.iter().filter(|j| j.tags.contains(&tag)).count();
    assert_eq!(count, runs.len(), "one job per run");
    assert_eq!(keys.len(), runs.len(), "one job per tick");
}

#[tokio::test]
async fn passes_fire_due_ticks_at_the_injected_clock() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::default());
    let store = open(&dir, Some(clock.clone()));
    let spec = ScheduleSpec::new("* * * * * *", JobTemplate::new("tick", json!({})))
        .overlap(OverlapPolicy::Allow)
        .missed(MissedPolicy::CatchUp { max: 2 });
    store
        .schedule_put(Schedule::from_spec("s", spec).expect("valid"))
        .await
        .expect("put");
    let scheduler = Scheduler::new(store.clone())
        .clock(clock.clone())
        .misfire_threshold(Duration::from_secs(2));

    let pass = scheduler.run_once().await.expect("pass");
    assert!(pass.runs.is_empty());
    assert!(pass
        .next_tick
        .is_some_and(|t| t > conveyor_core::Clock::now(&*clock)));

    clock.advance(Duration::from_secs(3));
    let pass = scheduler.run_once().await.expect("pass");
    assert_eq!(pass.runs.len(), 3, "{pass:?}");
    assert!(scheduler.run_once().await.expect("pass").runs.is_empty());

    // Ten seconds without a pass: two on time, two caught up, six dropped.
    clock.advance(Duration::from_secs(10));
    let pass = scheduler.run_once().await.expect("pass");
    let flags: Vec<bool> = pass.runs.iter().map(|r| r.catch_up).collect();
    assert_eq!(flags, vec![true, true, false, false]);
    let all = runs(&store, "s").await;
    assert_eq!(all.len(), 7);
}

#[tokio::test]
async fn maintenance_runs_the_scheduler_on_time() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir, None);
    store
        .schedule_put(every_second("heartbeat"))
        .await
        .expect("put");
    let stop = CancellationToken::new();
    let maintenance = Maintenance::new(store.clone())
        .interval(Duration::from_millis(50))
        .scheduler(Scheduler::new(store.clone()).interval(Duration::from_millis(50)));
    let running = tokio::spawn(maintenance.run(stop.clone()));
    eventually_within("three ticks", Duration::from_secs(20), || async {
        let fired = runs(&store, "heartbeat").await;
        if fired.len() >= 3 {
            Ok(())
        } else {
            Err(format!("{fired:?}"))
        }
    })
    .await;
    stop.cancel();
    running.await.expect("maintenance stops");
    let fired = runs(&store, "heartbeat").await;
    assert_once_per_tick(&store, "heartbeat", &fired).await;
    for run in &fired {
        let late = run.fired_at - run.tick;
        assert!(
            late < chrono::Duration::milliseconds(1000),
            "fired within a second of its tick: {run:?}"
        );
    }
}

#[tokio::test]
async fn two_schedulers_on_one_store_fire_each_tick_once() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = open(&dir, None);
    store
        .schedule_put(every_second("raced"))
        .await
        .expect("put");
    let stop = CancellationToken::new();
    let racers: Vec<_> = (0..2)
        .map(|_| {
            let scheduler = Scheduler::new(store.clone()).interval(Duration::from_millis(20));
            tokio::spawn(scheduler.run(stop.clone()))
        })
        .collect();
    eventually_within("three ticks", Duration::from_secs(20), || async {
        let fired = runs(&store, "raced").await;
        if fired.len() >= 3 {
            Ok(())
        } else {
            Err(format!("{fired:?}"))
        }
    })
    .await;
    stop.cancel();
    for racer in racers {
        racer.await.expect("scheduler stops");
    }
    let fired = runs(&store, "raced").await;
    assert_once_per_tick(&store, "raced", &fired).await;
}

/// A paused schedule fires nothing, however many ticks pass (even with a catch-up policy);
/// resumed, it fires from its next tick on, and the ticks of the pause are never caught up.
#[tokio::test]
async fn a_paused_schedule_fires_nothing_and_resumes_from_its_next_tick() {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::default());
    let store = open(&dir, Some(clock.clone()));
    let spec = ScheduleSpec::new("* * * * * *", JobTemplate::new("tick", json!({})))
        .overlap(OverlapPolicy::Allow)
        .missed(MissedPolicy::CatchUp { max: 100 });
    let put = |paused: bool| {
        let store = store.clone();
        let spec = spec.clone().paused(paused);
        async move {
            store
                .schedule_put(Schedule::from_spec("p", spec).expect("valid"))
                .await
                .expect("put")
        }
    };
    let scheduler = Scheduler::new(store.clone())
        .clock(clock.clone())
        .misfire_threshold(Duration::from_secs(2));
    put(false).await;
    clock.advance(Duration::from_secs(2));
    assert_eq!(scheduler.run_once().await.expect("pass").runs.len(), 2);

    let paused = put(true).await;
    assert_eq!(paused.next_run_at, None, "nothing is due while paused");
    assert!(paused.schedule.spec().paused);
    for _ in 0..5 {
        clock.advance(Duration::from_secs(2));
        assert!(scheduler.run_once().await.expect("pass").runs.is_empty());
    }
    assert_eq!(runs(&store, "p").await.len(), 2, "no run while paused");

    let resumed = put(false).await;
    assert!(resumed.next_run_at.is_some());
    clock.advance(Duration::from_secs(1));
    let pass = scheduler.run_once().await.expect("pass");
    assert_eq!(
        pass.runs.len(),
        1,
        "the next tick only, no catch-up: {pass:?}"
    );
    assert!(!pass.runs[0].catch_up);
}
