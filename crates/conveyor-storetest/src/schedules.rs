//! Cron and interval schedules: definitions round-trip, each tick is fired once however many callers race,
//! `overlap: skip` and `missed: catch_up` behave, a run's job state is visible, refused jobs are
//! recorded, and daylight-saving transitions fire at the right UTC instants (driven by the
//! manual clock, never by waiting).

use chrono::{DateTime, Datelike, Duration as Span, NaiveDate, TimeZone, Utc};
use conveyor_core::schedule::{RunStatus, DEFAULT_MISFIRE_THRESHOLD, RECENT_RUNS};
use conveyor_core::{
    FireOutcome, FireRequest, JobListParams, JobState, JobTemplate, MissedPolicy, OverlapPolicy,
    QueueSettings, RetryPlan, Schedule, ScheduleRun, ScheduleSpec, ScheduleView,
};
use serde_json::json;
use std::time::Duration;

use crate::kit::{complete, fail, fetch_one, get, lease_of, list, secs, span, Harness};

fn spec(cron: &str, kind: &str) -> ScheduleSpec {
    ScheduleSpec::new(cron, JobTemplate::new(kind, json!({ "from": "schedule" })))
}

fn schedule(name: &str, spec: ScheduleSpec) -> Schedule {
    Schedule::from_spec(name, spec).expect("valid schedule")
}

async fn put(h: &Harness, schedule: Schedule) -> ScheduleView {
    h.store
        .schedule_put(schedule)
        .await
        .expect("schedule_put should succeed")
}

async fn view(h: &Harness, name: &str) -> ScheduleView {
    h.store
        .schedule_get(name)
        .await
        .expect("schedule_get should succeed")
        .unwrap_or_else(|| panic!("schedule {name} should exist"))
}

/// What a scheduler pass does for one schedule: read it, plan at the store's now, fire.
/// Returns the runs recorded (none when nothing was due).
pub async fn fire_due(h: &Harness, name: &str, misfire: Duration) -> Vec<ScheduleRun> {
    let current = view(h, name).await;
    let plan = current.schedule.plan(current.due_after, h.now(), misfire);
    let Some(request) = FireRequest::from_plan(&current, &plan) else {
        return Vec::new();
    };
    match h
        .store
        .schedule_fire(request)
        .await
        .expect("schedule_fire should succeed")
    {
        FireOutcome::Fired(runs) => runs,
        FireOutcome::Conflict => panic!("nobody else fires {name}: no conflict expected"),
    }
}

/// Every run of `name`, oldest first.
async fn all_runs(h: &Harness, name: &str) -> Vec<ScheduleRun> {
    let mut runs = h
        .store
        .schedule_runs(name, 10_000)
        .await
        .expect("schedule_runs should succeed");
    runs.reverse();
    runs
}

fn ticks(runs: &[ScheduleRun]) -> Vec<DateTime<Utc>> {
    runs.iter().map(|run| run.tick).collect()
}

/// A schedule reads back as stored, with its state; re-putting the same definition changes
/// nothing; changing the job keeps its place, changing the expression restarts its ticks; the
/// list is by name; delete removes it (and a second delete finds nothing).
pub async fn schedule_put_get_list_delete_round_trip(h: &Harness) {
    assert!(h
        .store
        .schedule_get("nightly")
        .await
        .expect("get")
        .is_none());
    let nightly = schedule(
        "nightly",
        spec("0 3 * * *", "report")
            .timezone("Europe/Berlin")
            .overlap(OverlapPolicy::Allow)
            .missed(MissedPolicy::CatchUp { max: 2 }),
    );
    let created = put(h, nightly.clone()).await;
    assert_eq!(created.schedule, nightly);
    assert_eq!(created.schedule.timezone(), "Europe/Berlin");
    assert_eq!(created.schedule.missed(), MissedPolicy::CatchUp { max: 2 });
    assert_eq!(created.created_at, h.now());
    assert_eq!(created.updated_at, h.now());
    assert_eq!(created.due_after, h.now(), "ticks count from creation");
    assert_eq!(created.last_tick, None);
    assert!(created.last_run.is_none() && created.recent_runs.is_empty());
    assert_eq!(
        created.next_run_at,
        nightly.next_after(h.now()),
        "next run is the next 03:00 in Berlin"
    );
    assert_eq!(view(h, "nightly").await, created);

    h.advance(secs(5));
    let same = put(h, nightly.clone()).await;
    assert_eq!(same, created, "an unchanged definition changes nothing");

    let mut new_job = nightly.spec().clone();
    new_job.job.queue = "reports".into();
    let moved = put(h, schedule("nightly", new_job)).await;
    assert_eq!(moved.schedule.job().queue, "reports");
    assert_ne!(
        moved.revision, created.revision,
        "an update moves the revision"
    );
    assert_eq!(moved.due_after, created.due_after, "same ticks: same place");
    assert_eq!(moved.created_at, created.created_at);
    assert_eq!(moved.updated_at, h.now());

    h.advance(secs(5));
    let mut new_cron = moved.schedule.spec().clone();
    new_cron.cron = "*/5 * * * *".into();
    let restarted = put(h, schedule("nightly", new_cron)).await;
    assert_eq!(
        restarted.due_after,
        h.now(),
        "new ticks count from the change"
    );
    assert_ne!(restarted.revision, moved.revision);

    put(h, schedule("alpha", spec("* * * * *", "a"))).await;
    let names: Vec<String> = h
        .store
        .schedules_list()
        .await
        .expect("list")
        .iter()
        .map(|v| v.schedule.name().to_string())
        .collect();
    assert_eq!(names, vec!["alpha".to_string(), "nightly".to_string()]);

    assert!(h.store.schedule_delete("nightly").await.expect("delete"));
    assert!(h
        .store
        .schedule_get("nightly")
        .await
        .expect("get")
        .is_none());
    assert!(!h.store.schedule_delete("nightly").await.expect("delete"));
    assert_eq!(h.store.schedules_list().await.expect("list").len(), 1);
}

/// Several callers fire the same tick at once from the same reading: exactly one records it
/// (one run, one job), the others get `Conflict` and nothing changes for them. A request from a
/// stale reading conflicts too.
pub async fn schedule_fire_is_exactly_once_under_a_race(h: &Harness) {
    let every_second = spec("* * * * * *", "tick").overlap(OverlapPolicy::Allow);
    put(h, schedule("every-second", every_second)).await;
    h.advance(Duration::from_millis(1500));
    let current = view(h, "every-second").await;
    let plan = current
        .schedule
        .plan(current.due_after, h.now(), DEFAULT_MISFIRE_THRESHOLD);
    let request = FireRequest::from_plan(&current, &plan).expect("a tick is due");
    let due = request.ticks.len();
    assert!(due >= 1, "{plan:?}");
    let racers: Vec<_> = (0..8)
        .map(|_| {
            let store = h.store.clone();
            let request = request.clone();
            tokio::spawn(async move { store.schedule_fire(request).await })
        })
        .collect();
    let mut fired = Vec::new();
    let mut conflicts = 0;
    for outcome in futures::future::join_all(racers).await {
        match outcome
            .expect("task")
            .expect("schedule_fire should succeed")
        {
            FireOutcome::Fired(runs) => fired.push(runs),
            FireOutcome::Conflict => conflicts += 1,
        }
    }
    assert_eq!(fired.len(), 1, "exactly one caller fires the tick");
    assert_eq!(conflicts, 7);
    let runs = &fired[0];
    assert_eq!(
        ticks(runs),
        request.ticks.iter().map(|t| t.at).collect::<Vec<_>>()
    );
    assert!(runs.iter().all(|run| run.status == RunStatus::Enqueued));
    let job_id = runs[0].job_id.expect("the run enqueued a job");
    assert_eq!(
        runs[0].job_state,
        Some(JobState::Available),
        "the job is due at once"
    );
    let job = get(h, job_id).await;
    assert_eq!(job.run_at, runs[0].tick, "the job is due at its tick");
    assert!(job.tags.contains(&"schedule:every-second".to_string()));
    assert!(job
        .idempotency_key
        .as_deref()
        .is_some_and(|key| key.starts_with("schedule:every-second:")));
    let jobs = list(h, {
        let mut params = JobListParams::default();
        params.kind = Some("tick".into());
        params.limit = 100;
        params
    })
    .await;
    assert_eq!(jobs.len(), due, "one job per tick");
    assert_eq!(
        all_runs(h, "every-second").await.len(),
        due,
        "one run per tick"
    );

    let after = view(h, "every-second").await;
    assert_eq!(after.last_tick, request.ticks.last().map(|t| t.at));
    assert_eq!(after.due_after, request.due_after);
    assert_eq!(
        after.last_run.as_ref().map(|r| r.job_id),
        runs.last().map(|r| r.job_id)
    );
    // The same tick again, from the stale reading, or planned anew: nothing more.
    assert_eq!(
        h.store.schedule_fire(request).await.expect("fire"),
        FireOutcome::Conflict
    );
    assert!(fire_due(h, "every-second", DEFAULT_MISFIRE_THRESHOLD)
        .await
        .is_empty());
    // Firing a deleted schedule conflicts as well.
    h.advance(secs(1));
    let current = view(h, "every-second").await;
    let plan = current
        .schedule
        .plan(current.due_after, h.now(), DEFAULT_MISFIRE_THRESHOLD);
    let request = FireRequest::from_plan(&current, &plan).expect("due");
    assert!(h
        .store
        .schedule_delete("every-second")
        .await
        .expect("delete"));
    assert_eq!(
        h.store.schedule_fire(request).await.expect("fire"),
        FireOutcome::Conflict
    );
}

/// `overlap: skip`: while the previous run's job is unfinished, a tick records a skipped run
/// naming it and enqueues nothing; once it finished, the next tick enqueues again. `allow`
/// enqueues regardless.
pub async fn schedule_overlap_skip_records_a_skipped_run(h: &Harness) {
    put(h, schedule("skipper", spec("* * * * * *", "slow"))).await;
    let mut allow = spec("* * * * * *", "slow-allowed");
    allow.job.queue = "allowed".into();
    put(h, schedule("allower", allow.overlap(OverlapPolicy::Allow))).await;

    h.advance(secs(1));
    let first = fire_due(h, "skipper", DEFAULT_MISFIRE_THRESHOLD).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].status, RunStatus::Enqueued);
    let first_job = first[0].job_id.expect("job");
    let running = fetch_one(h, "default").await;
    assert_eq!(running.id, first_job);

    h.advance(secs(1));
    let second = fire_due(h, "skipper", DEFAULT_MISFIRE_THRESHOLD).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].status, RunStatus::SkippedOverlap, "{second:?}");
    assert_eq!(second[0].job_id, None);
    let detail = second[0].detail.clone().unwrap_or_default();
    assert!(detail.contains(&first_job.to_string()), "{detail}");

    complete(h, lease_of(&running), None).await;
    h.advance(secs(1));
    let third = fire_due(h, "skipper", DEFAULT_MISFIRE_THRESHOLD).await;
    assert_eq!(third.len(), 1);
    assert_eq!(third[0].status, RunStatus::Enqueued, "{third:?}");
    assert_ne!(third[0].job_id, Some(first_job));

    let runs = all_runs(h, "skipper").await;
    let statuses: Vec<RunStatus> = runs.iter().map(|r| r.status).collect();
    assert_eq!(
        statuses,
        vec![
            RunStatus::Enqueued,
            RunStatus::SkippedOverlap,
            RunStatus::Enqueued
        ]
    );
    assert_eq!(runs[0].job_state, Some(JobState::Completed));

    // `allow`: three ticks in one firing, none waiting for the others.
    let allowed = fire_due(h, "allower", DEFAULT_MISFIRE_THRESHOLD).await;
    assert_eq!(allowed.len(), 3);
    assert!(allowed.iter().all(|r| r.status == RunStatus::Enqueued));
}

/// After downtime, `missed: catch_up` fires the configured maximum of the most recent missed
/// ticks (flagged `catch_up`, oldest first) besides the on-time ones; `skip` fires only the
/// on-time ones. Either way every due tick counts as handled.
pub async fn schedule_catch_up_fires_at_most_the_maximum_of_missed_ticks(h: &Harness) {
    let mut catch = spec("* * * * * *", "caught");
    catch.job.queue = "catch".into();
    let catch = catch
        .overlap(OverlapPolicy::Allow)
        .missed(MissedPolicy::CatchUp { max: 3 });
    put(h, schedule("catcher", catch)).await;
    let mut skip = spec("* * * * * *", "skipped");
    skip.job.queue = "skip".into();
    put(h, schedule("skipper", skip.overlap(OverlapPolicy::Allow))).await;

    // Down for 10 s; a 2 s threshold makes the last two ticks on time, eight missed.
    h.advance(secs(10));
    let misfire = secs(2);
    let caught = fire_due(h, "catcher", misfire).await;
    let flags: Vec<bool> = caught.iter().map(|r| r.catch_up).collect();
    assert_eq!(flags, vec![true, true, true, false, false], "{caught:?}");
    assert!(caught.windows(2).all(|w| w[0].tick < w[1].tick));
    assert!(caught.iter().all(|r| r.status == RunStatus::Enqueued));
    let skipped = fire_due(h, "skipper", misfire).await;
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert!(skipped.iter().all(|r| !r.catch_up));

    for (name, queue, expected) in [("catcher", "catch", 5), ("skipper", "skip", 2)] {
        let jobs = list(h, {
            let mut params = JobListParams::default();
            params.queue = Some(queue.into());
            params.limit = 100;
            params
        })
        .await;
        assert_eq!(jobs.len(), expected, "{name}");
        let current = view(h, name).await;
        assert_eq!(
            current.due_after,
            current.schedule.latest_at_or_before(h.now()).expect("tick"),
            "{name}: every due tick is handled"
        );
        assert!(fire_due(h, name, misfire).await.is_empty(), "{name}");
    }
}

/// A run whose job died shows it: the schedule's last run (and its recent runs) carry the
/// job's state, `dead`.
pub async fn schedule_run_history_shows_a_dead_runs_state(h: &Harness) {
    let mut failing = spec("* * * * * *", "doomed");
    failing.job.max_attempts = 1;
    put(h, schedule("doomed", failing.overlap(OverlapPolicy::Allow))).await;
    h.advance(secs(1));
    let runs = fire_due(h, "doomed", DEFAULT_MISFIRE_THRESHOLD).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].job_state, Some(JobState::Available));
    let running = fetch_one(h, "default").await;
    fail(h, lease_of(&running), "boom", RetryPlan::Never)
        .await
        .expect("fail");
    h.advance(secs(1));
    fire_due(h, "doomed", DEFAULT_MISFIRE_THRESHOLD).await;

    let current = view(h, "doomed").await;
    assert_eq!(current.recent_runs.len(), 2);
    assert!(current.recent_runs.len() <= RECENT_RUNS);
    assert_eq!(current.recent_runs[0].job_state, Some(JobState::Available));
    assert_eq!(current.recent_runs[1].job_state, Some(JobState::Dead));
    assert_eq!(current.recent_runs[1].job_id, Some(running.id));
    assert_eq!(current.last_run.as_ref(), current.recent_runs.first());
    let listed = h.store.schedules_list().await.expect("list");
    assert_eq!(
        listed[0].last_run.as_ref().map(|r| r.job_state),
        Some(Some(JobState::Available))
    );
    let history = h.store.schedule_runs("doomed", 1).await.expect("runs");
    assert_eq!(history.len(), 1, "limit honoured");
}

/// A job the store refuses (its queue is full) is recorded as a refused run saying why; the
/// schedule moves on, and fires again once there is room.
pub async fn schedule_refused_job_is_recorded_as_a_refused_run(h: &Harness) {
    let full = {
        let mut settings = QueueSettings::default();
        settings.max_depth = Some(1);
        settings
    };
    h.store
        .queue_settings_put("narrow", full)
        .await
        .expect("settings");
    let mut narrow = spec("* * * * * *", "narrow");
    narrow.job.queue = "narrow".into();
    put(h, schedule("narrow", narrow.overlap(OverlapPolicy::Allow))).await;
    h.advance(secs(2));
    let runs = fire_due(h, "narrow", DEFAULT_MISFIRE_THRESHOLD).await;
    let statuses: Vec<RunStatus> = runs.iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![RunStatus::Enqueued, RunStatus::Refused]);
    assert!(runs[1]
        .detail
        .as_deref()
        .is_some_and(|d| d.contains("full")));
    let queued = fetch_one(h, "narrow").await;
    complete(h, lease_of(&queued), None).await;
    h.advance(secs(1));
    let runs = fire_due(h, "narrow", DEFAULT_MISFIRE_THRESHOLD).await;
    assert_eq!(runs.len(), 1);
    assert_eq!(runs[0].status, RunStatus::Enqueued);
}

/// 01:00 UTC on the last Sunday of `month` in `year`: when the EU changes its clocks.
fn eu_transition(year: i32, month: u32) -> DateTime<Utc> {
    let last = NaiveDate::from_ymd_opt(year, month, 31).expect("March and October have 31 days");
    let sunday = last - Span::days(i64::from(last.weekday().num_days_from_sunday()));
    Utc.from_utc_datetime(&sunday.and_hms_opt(1, 0, 0).expect("valid time"))
}

/// Moves the harness clock to `at` (which must not be in its past).
fn advance_to(h: &Harness, at: DateTime<Utc>) {
    let by = (at - h.now()).to_std().expect("target is in the future");
    h.advance(by);
}

/// Fires `names` every `step` up to `until`, as a scheduler would, on time.
async fn drive(h: &Harness, names: &[&str], until: DateTime<Utc>, step: Duration) {
    while h.now() + span(step) <= until {
        h.advance(step);
        for name in names {
            fire_due(h, name, DEFAULT_MISFIRE_THRESHOLD).await;
        }
    }
}

/// Europe/Berlin across next year's daylight-saving changes, with the manual clock stepping
/// through two days each: a daily 02:30 run fires once on the spring-forward day, at 03:00
/// CEST (the first instant after the missing hour), and once on the fall-back day, at the
/// first 02:30; an hourly schedule fires every real hour exactly once (no hour twice, none
/// lost).
pub async fn schedule_dst_edges_fire_at_the_right_utc_instants(h: &Harness) {
    let year = h.now().year() + 1;
    let hour = |at: DateTime<Utc>, h: i64| at + Span::hours(h);
    for (season, transition) in [
        ("spring", eu_transition(year, 3)),
        ("fall", eu_transition(year, 10)),
    ] {
        let start = transition - Span::hours(13); // 12:00 UTC the day before
        advance_to(h, start);
        let daily = format!("{season}-daily");
        let hourly = format!("{season}-hourly");
        put(
            h,
            schedule(
                &daily,
                spec("30 2 * * *", "daily").timezone("Europe/Berlin"),
            ),
        )
        .await;
        put(
            h,
            schedule(
                &hourly,
                spec("0 * * * *", "hourly")
                    .timezone("Europe/Berlin")
                    .overlap(OverlapPolicy::Allow),
            ),
        )
        .await;
        let end = start + Span::hours(48);
        drive(h, &[&daily, &hourly], end, secs(15 * 60)).await;

        let expected_daily = if season == "spring" {
            // 02:30 does not exist on the day: 03:00 CEST, once; the next day 02:30 CEST.
            vec![transition, hour(transition, 24) - Span::minutes(30)]
        } else {
            // 02:30 CEST (the first of the two); the next day 02:30 CET.
            vec![
                transition - Span::minutes(30),
                hour(transition, 24) + Span::minutes(30),
            ]
        };
        assert_eq!(
            ticks(&all_runs(h, &daily).await),
            expected_daily,
            "{season}: daily 02:30 in Berlin"
        );
        let expected_hourly: Vec<DateTime<Utc>> = (1..=48).map(|n| hour(start, n)).collect();
        assert_eq!(
            ticks(&all_runs(h, &hourly).await),
            expected_hourly,
            "{season}: every real hour once"
        );
    }
}

/// An interval schedule (`every`) ticks at `anchor + k * every`, the anchor being when it was
/// created (in whole seconds): one run and one job per tick however often the scheduler looks;
/// after a gap `missed: catch_up` runs the most recent missed ticks; `overlap: skip` applies as
/// for cron; changing the interval re-anchors it (ticks count from the change), while the same
/// interval spelt differently or a new job keeps its place.
pub async fn schedule_interval_ticks_from_its_anchor(h: &Harness) {
    let every = |every: &str| {
        ScheduleSpec::every(
            every,
            JobTemplate::new("pulse", json!({ "from": "interval" })),
        )
        .overlap(OverlapPolicy::Allow)
        .missed(MissedPolicy::CatchUp { max: 2 })
    };
    let created = put(h, schedule("pulse", every("30s"))).await;
    let t0 = h.now();
    let base = t0 - span(Duration::from_nanos(u64::from(t0.timestamp_subsec_nanos())));
    let at = |s: i64| base + Span::seconds(s);
    assert_eq!(created.due_after, t0, "ticks count from creation");
    assert_eq!(created.schedule.every(), Some(secs(30)));
    assert_eq!(created.schedule.spec().every.as_deref(), Some("30s"));
    assert_eq!(created.next_run_at, Some(at(30)));

    h.advance(secs(29));
    assert!(fire_due(h, "pulse", DEFAULT_MISFIRE_THRESHOLD)
        .await
        .is_empty());
    // Looked at every 3 s for 3 minutes: each tick once, on time.
    for _ in 0..60 {
        h.advance(secs(3));
        fire_due(h, "pulse", DEFAULT_MISFIRE_THRESHOLD).await;
        assert!(fire_due(h, "pulse", DEFAULT_MISFIRE_THRESHOLD)
            .await
            .is_empty());
    }
    let runs = all_runs(h, "pulse").await;
    assert_eq!(
        ticks(&runs),
        (1..=6).map(|k| at(30 * k)).collect::<Vec<_>>(),
        "one run per tick, at anchor + k * 30 s"
    );
    assert!(
        runs.iter()
            .all(|r| r.status == RunStatus::Enqueued && !r.catch_up),
        "{runs:?}"
    );
    let jobs = list(h, {
        let mut params = JobListParams::default();
        params.kind = Some("pulse".into());
        params.limit = 100;
        params
    })
    .await;
    assert_eq!(jobs.len(), 6, "one job per tick");
    let current = view(h, "pulse").await;
    assert_eq!(current.last_tick, Some(at(180)));
    assert_eq!(current.next_run_at, Some(at(210)));

    // Down for 273 s (now anchor + 482 s): the ticks 210 .. 480 are due; 480 is on time,
    // the two most recent missed ones are caught up, the other seven dropped.
    h.advance(secs(273));
    let caught = fire_due(h, "pulse", DEFAULT_MISFIRE_THRESHOLD).await;
    let got: Vec<_> = caught.iter().map(|r| (r.tick, r.catch_up)).collect();
    assert_eq!(
        got,
        vec![(at(420), true), (at(450), true), (at(480), false)]
    );
    assert_eq!(view(h, "pulse").await.due_after, at(480));

    // A new job, or the same interval spelt differently, keeps the anchor.
    let mut new_job = every("0m30s");
    new_job.job.queue = "pulses".into();
    let kept = put(h, schedule("pulse", new_job)).await;
    assert_eq!(kept.due_after, at(480), "same interval: same place");
    assert_eq!(kept.next_run_at, Some(at(510)));

    // Changing the interval re-anchors: ticks from now (anchor + 482 s + fraction) every
    // minute, never on the old 30 s lattice.
    let changed = put(h, schedule("pulse", every("1m"))).await;
    assert_eq!(
        changed.due_after,
        h.now(),
        "a new interval counts from the change"
    );
    assert_eq!(changed.next_run_at, Some(at(542)));
    h.advance(secs(30));
    assert!(fire_due(h, "pulse", DEFAULT_MISFIRE_THRESHOLD)
        .await
        .is_empty());
    h.advance(secs(29));
    assert!(fire_due(h, "pulse", DEFAULT_MISFIRE_THRESHOLD)
        .await
        .is_empty());
    h.advance(secs(1));
    let fired = fire_due(h, "pulse", DEFAULT_MISFIRE_THRESHOLD).await;
    assert_eq!(ticks(&fired), vec![at(542)]);

    // overlap: skip, as for cron: the second tick finds the first run's job unfinished.
    let skipper = ScheduleSpec::every("5s", JobTemplate::new("pulse", json!({})));
    put(h, schedule("pulse-skip", skipper)).await;
    h.advance(secs(5));
    let first = fire_due(h, "pulse-skip", DEFAULT_MISFIRE_THRESHOLD).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].status, RunStatus::Enqueued);
    h.advance(secs(5));
    let second = fire_due(h, "pulse-skip", DEFAULT_MISFIRE_THRESHOLD).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].status, RunStatus::SkippedOverlap);
    assert_eq!(second[0].tick - first[0].tick, Span::seconds(5));
}

/// A schedule's runs are stamped like any enqueue: in a queue with a sequence, each run waits
/// behind the one before it (blocked) instead of running beside it.
pub async fn schedule_runs_enter_their_queues_sequence(h: &Harness) {
    let h = &Harness::new(
        conveyor_engine::LimitStamps::wrap(h.store.clone()),
        h.clock.clone(),
    );
    let mut settings = QueueSettings::default();
    settings.sequence = Some(conveyor_core::sequence::SequenceSpec::key("kind"));
    h.store
        .queue_settings_put("nightly", settings)
        .await
        .expect("queue settings");
    let mut every_second = spec("* * * * * *", "rollup");
    every_second.job.queue = "nightly".into();
    put(
        h,
        schedule("rollup", every_second.overlap(OverlapPolicy::Allow)),
    )
    .await;
    h.advance(secs(1));
    fire_due(h, "rollup", DEFAULT_MISFIRE_THRESHOLD).await;
    h.advance(secs(1));
    fire_due(h, "rollup", DEFAULT_MISFIRE_THRESHOLD).await;
    let mut params = JobListParams::default();
    params.queue = Some("nightly".into());
    params.limit = 10;
    let mut jobs = list(h, params).await;
    jobs.sort_by_key(|job| job.sequence.as_ref().map(|s| s.no));
    let seen: Vec<(Option<String>, JobState)> = jobs
        .iter()
        .map(|job| (job.sequence.as_ref().map(|s| s.key.clone()), job.state))
        .collect();
    assert_eq!(
        seen,
        [
            (Some("kind=rollup".to_string()), JobState::Available),
            (Some("kind=rollup".to_string()), JobState::Blocked),
        ]
    );
}
