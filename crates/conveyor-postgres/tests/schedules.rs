//! Cron schedules on a real PostgreSQL: two stores with pools of their own (as two servers
//! have) each run a scheduler with no leadership at all, waking at every tick together; each
//! tick of a per-second schedule is still recorded, and its job enqueued, exactly once.

mod common;

use chrono::{DateTime, Utc};
use conveyor_core::schedule::RunStatus;
use conveyor_core::{
    Clock, JobListParams, JobTemplate, OverlapPolicy, Schedule, ScheduleSpec, Store, SystemClock,
};
use conveyor_worker::Scheduler;
use serde_json::json;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_unled_schedulers_fire_each_tick_once() {
    let schema = common::fresh_schema();
    let _guard = common::DropSchema::new(&schema);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let first: Arc<dyn Store> = Arc::new(common::connect(&schema, clock.clone()).await);
    let second: Arc<dyn Store> = Arc::new(common::connect(&schema, clock.clone()).await);
    let spec = ScheduleSpec::new("* * * * * *", JobTemplate::new("tick", json!({})))
        .overlap(OverlapPolicy::Allow);
    first
        .schedule_put(Schedule::from_spec("raced", spec).expect("valid"))
        .await
        .expect("put");

    let stop = Arc::new(AtomicBool::new(false));
    let conflicts = Arc::new(AtomicUsize::new(0));
    let racers: Vec<_> = [first.clone(), second.clone()]
        .into_iter()
        .map(|store| {
            let scheduler = Scheduler::new(store);
            let (stop, conflicts) = (stop.clone(), conflicts.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let pass = scheduler.run_once().await.expect("pass");
                    conflicts.fetch_add(pass.conflicts, Ordering::Relaxed);
                    // Both wake one millisecond after the next tick: they race for every one.
                    let wait = pass
                        .next_tick
                        .map(|tick| (tick - Utc::now()).num_milliseconds().max(0) as u64 + 1)
                        .unwrap_or(50)
                        .min(250);
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
            })
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while first.schedule_runs("raced", 100).await.expect("runs").len() < 6 {
        assert!(Instant::now() < deadline, "six ticks within a minute");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for racer in racers {
        racer.await.expect("racer");
    }

    let mut runs = first.schedule_runs("raced", 1000).await.expect("runs");
    runs.reverse();
    let ticks: Vec<DateTime<Utc>> = runs.iter().map(|r| r.tick).collect();
    for pair in ticks.windows(2) {
        assert_eq!(pair[1] - pair[0], chrono::Duration::seconds(1), "{ticks:?}");
    }
    assert!(runs.iter().all(|r| r.status == RunStatus::Enqueued));
    let jobs = second
        .jobs_list({
            let mut params = JobListParams::default();
            params.kind = Some("tick".into());
            params.limit = 1000;
            params
        })
        .await
        .expect("jobs");
    let mut per_tick: HashMap<DateTime<Utc>, usize> = HashMap::new();
    for job in &jobs {
        *per_tick.entry(job.run_at).or_default() += 1;
    }
    assert_eq!(per_tick.len(), ticks.len(), "a job per tick: {per_tick:?}");
    assert!(per_tick.values().all(|&n| n == 1), "{per_tick:?}");
    assert!(ticks.iter().all(|tick| per_tick.contains_key(tick)));
    eprintln!(
        "{} ticks fired once each; the other scheduler lost {} race(s)",
        ticks.len(),
        conflicts.load(Ordering::Relaxed)
    );
}
