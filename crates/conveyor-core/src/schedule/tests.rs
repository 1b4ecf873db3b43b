use super::*;
use chrono::TimeZone;

fn utc(y: i32, mo: u32, d: u32, h: u32, mi: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(y, mo, d, h, mi, s).unwrap()
}

fn schedule(cron: &str, timezone: &str) -> Schedule {
    let spec =
        ScheduleSpec::new(cron, JobTemplate::new("tick", serde_json::json!({}))).timezone(timezone);
    Schedule::from_spec("s", spec).unwrap()
}

fn field_of(result: Result<Schedule, ValidationError>) -> String {
    result.expect_err("should be invalid").field
}

/// Every tick in `(from, to]`, walking forwards.
fn ticks(s: &Schedule, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<DateTime<Utc>> {
    let mut out = Vec::new();
    let mut at = from;
    while let Some(next) = s.next_after(at).filter(|t| *t <= to) {
        out.push(next);
        at = next;
    }
    out
}

/// Every tick the planner fires when called every `step` from `from` to `to` (on time).
fn driven(s: &Schedule, from: DateTime<Utc>, to: DateTime<Utc>, step: i64) -> Vec<DateTime<Utc>> {
    let mut due_after = from;
    let mut fired = Vec::new();
    let mut now = from;
    while now <= to {
        let plan = s.plan(due_after, now, DEFAULT_MISFIRE_THRESHOLD);
        assert!(plan.fire.iter().all(|t| !t.catch_up));
        fired.extend(plan.fire.iter().map(|t| t.at));
        if let Some(d) = plan.due_after {
            due_after = d;
        }
        now += chrono::Duration::seconds(step);
    }
    fired
}

#[test]
fn five_and_six_field_expressions_parse() {
    let five = schedule("*/15 * * * *", "UTC");
    assert_eq!(
        five.next_after(utc(2026, 1, 1, 0, 0, 0)),
        Some(utc(2026, 1, 1, 0, 15, 0))
    );
    let six = schedule("*/10 * * * * *", "UTC");
    assert_eq!(
        six.next_after(utc(2026, 1, 1, 0, 0, 0)),
        Some(utc(2026, 1, 1, 0, 0, 10))
    );
    let nickname = schedule("@daily", "UTC");
    assert_eq!(
        nickname.next_after(utc(2026, 1, 1, 0, 0, 0)),
        Some(utc(2026, 1, 2, 0, 0, 0))
    );
    // A fractional "after" still excludes the tick at its whole second.
    assert_eq!(
        six.next_after(utc(2026, 1, 1, 0, 0, 10) + chrono::Duration::milliseconds(300)),
        Some(utc(2026, 1, 1, 0, 0, 20))
    );
}

#[test]
fn bad_input_names_the_field() {
    let job = || JobTemplate::new("tick", serde_json::json!({}));
    for bad in [
        "",
        "* * * *",
        "61 * * * *",
        "* * * * * * *",
        "0 0 1 1 * 2030",
        "nonsense",
    ] {
        let spec = ScheduleSpec::new(bad, job());
        assert_eq!(field_of(Schedule::from_spec("s", spec)), "cron", "{bad:?}");
    }
    let never = ScheduleSpec::new("0 0 30 2 *", job());
    assert_eq!(field_of(Schedule::from_spec("s", never)), "cron");
    let zone = ScheduleSpec::new("* * * * *", job()).timezone("Mars/Olympus_Mons");
    let err = Schedule::from_spec("s", zone).unwrap_err();
    assert_eq!(err.field, "timezone");
    assert!(err.message.contains("Mars/Olympus_Mons"), "{err}");
    let mut kind = ScheduleSpec::new("* * * * *", job());
    kind.job.kind = "bad kind".into();
    assert_eq!(field_of(Schedule::from_spec("s", kind)), "job.kind");
    let mut queue = ScheduleSpec::new("* * * * *", job());
    queue.job.queue = String::new();
    assert_eq!(field_of(Schedule::from_spec("s", queue)), "job.queue");
    let mut tags = ScheduleSpec::new("* * * * *", job());
    tags.job.tags = (0..validate::MAX_TAGS).map(|i| format!("t{i}")).collect();
    assert_eq!(field_of(Schedule::from_spec("s", tags)), "job.tags");
    let mut skip_with_max = ScheduleSpec::new("* * * * *", job());
    skip_with_max.max_catch_up = Some(3);
    assert_eq!(
        field_of(Schedule::from_spec("s", skip_with_max)),
        "max_catch_up"
    );
    for max in [0, MAX_CATCH_UP_LIMIT + 1] {
        let spec = ScheduleSpec::new("* * * * *", job()).missed(MissedPolicy::CatchUp { max });
        assert_eq!(field_of(Schedule::from_spec("s", spec)), "max_catch_up");
    }
    for name in ["", "has space", &"n".repeat(MAX_SCHEDULE_NAME_LEN + 1)] {
        let spec = ScheduleSpec::new("* * * * *", job());
        assert_eq!(field_of(Schedule::from_spec(name, spec)), "name");
    }
}

#[test]
fn defaults_and_round_trip() {
    let s = schedule("0 3 * * *", "Europe/Berlin");
    assert_eq!(s.overlap(), OverlapPolicy::Skip);
    assert_eq!(s.missed(), MissedPolicy::Skip);
    let spec: ScheduleSpec = serde_json::from_str(
        r#"{"cron": "0 3 * * *", "job": {"kind": "k"}, "missed": "catch_up"}"#,
    )
    .unwrap();
    let parsed = Schedule::from_spec("n", spec).unwrap();
    assert_eq!(parsed.timezone(), "UTC");
    assert_eq!(
        parsed.missed(),
        MissedPolicy::CatchUp {
            max: DEFAULT_MAX_CATCH_UP
        }
    );
    assert_eq!(parsed.job().queue, DEFAULT_QUEUE);
    assert_eq!(parsed.job().payload, Value::Null);
    let back = Schedule::from_json("n", &parsed.to_json()).unwrap();
    assert_eq!(back, parsed);
    let json = serde_json::to_value(&parsed).unwrap();
    assert_eq!(json["name"], "n");
    assert_eq!(json["missed"], "catch_up");
    assert_eq!(json["max_catch_up"], DEFAULT_MAX_CATCH_UP);
    assert_eq!(json["overlap"], "skip");
    assert!(serde_json::from_str::<ScheduleSpec>(
        r#"{"cron": "* * * * *", "job": {"kind": "k"}, "bogus": 1}"#
    )
    .is_err());
}

#[test]
fn run_jobs_carry_key_tag_and_tick() {
    let mut spec = ScheduleSpec::new(
        "* * * * * *",
        JobTemplate::new("k", serde_json::json!({"a": 1})),
    );
    spec.job.tags = vec!["mine".into()];
    spec.job.queue = "q".into();
    let s = Schedule::from_spec("every-second", spec).unwrap();
    let tick = utc(2026, 5, 1, 12, 0, 1);
    let job = s.job_for(tick);
    assert_eq!(
        job.idempotency_key.as_deref(),
        Some("schedule:every-second:2026-05-01T12:00:01Z")
    );
    assert_eq!(
        job.tags,
        vec!["mine".to_string(), "schedule:every-second".to_string()]
    );
    assert_eq!(job.run_at, Some(tick));
    assert_eq!(job.queue, "q");
    assert_eq!(job.payload, serde_json::json!({"a": 1}));
}

#[test]
fn plan_fires_each_due_tick_once() {
    let s = schedule("* * * * * *", "UTC");
    let t0 = utc(2026, 5, 1, 12, 0, 0) + chrono::Duration::milliseconds(400);
    // Nothing due before the first tick.
    let plan = s.plan(
        t0,
        t0 + chrono::Duration::milliseconds(500),
        DEFAULT_MISFIRE_THRESHOLD,
    );
    assert!(plan.fire.is_empty());
    assert_eq!(plan.due_after, None);
    assert_eq!(plan.next, Some(utc(2026, 5, 1, 12, 0, 1)));
    // Late by 2.5 s, within the threshold: every tick fires, in order.
    let now = utc(2026, 5, 1, 12, 0, 3) + chrono::Duration::milliseconds(500);
    let plan = s.plan(t0, now, DEFAULT_MISFIRE_THRESHOLD);
    let at: Vec<_> = plan.fire.iter().map(|t| t.at).collect();
    assert_eq!(
        at,
        vec![
            utc(2026, 5, 1, 12, 0, 1),
            utc(2026, 5, 1, 12, 0, 2),
            utc(2026, 5, 1, 12, 0, 3)
        ]
    );
    assert_eq!(plan.due_after, Some(utc(2026, 5, 1, 12, 0, 3)));
    assert_eq!(plan.dropped, 0);
    // From there, the same instant plans nothing more.
    let again = s.plan(plan.due_after.unwrap(), now, DEFAULT_MISFIRE_THRESHOLD);
    assert!(again.fire.is_empty() && again.due_after.is_none());
    // Driven every 300 ms for a minute: each second exactly once.
    let mut due_after = t0;
    let mut all = Vec::new();
    let mut now = t0;
    for _ in 0..200 {
        now += chrono::Duration::milliseconds(300);
        let plan = s.plan(due_after, now, DEFAULT_MISFIRE_THRESHOLD);
        all.extend(plan.fire.iter().map(|t| t.at));
        due_after = plan.due_after.unwrap_or(due_after);
    }
    assert_eq!(all, ticks(&s, t0, now));
    assert_eq!(all.len(), 60);
}

#[test]
fn missed_ticks_are_skipped_or_caught_up_to_the_maximum() {
    let spec = ScheduleSpec::new("* * * * * *", JobTemplate::new("k", Value::Null));
    let skip = Schedule::from_spec("s", spec.clone()).unwrap();
    let catch_up = Schedule::from_spec("s", spec.missed(MissedPolicy::CatchUp { max: 3 })).unwrap();
    let down_at = utc(2026, 5, 1, 12, 0, 0);
    // Back after 10 s with a 2 s threshold: 12:00:09 and :10 are on time, :01 to :08 missed.
    let now = utc(2026, 5, 1, 12, 0, 10) + chrono::Duration::milliseconds(200);
    let misfire = Duration::from_secs(2);
    let plan = skip.plan(down_at, now, misfire);
    assert_eq!(
        plan.fire,
        vec![
            PlannedTick {
                at: utc(2026, 5, 1, 12, 0, 9),
                catch_up: false
            },
            PlannedTick {
                at: utc(2026, 5, 1, 12, 0, 10),
                catch_up: false
            },
        ]
    );
    assert_eq!(plan.dropped, 8);
    assert_eq!(plan.due_after, Some(utc(2026, 5, 1, 12, 0, 10)));
    let plan = catch_up.plan(down_at, now, misfire);
    let caught: Vec<_> = plan
        .fire
        .iter()
        .filter(|t| t.catch_up)
        .map(|t| t.at)
        .collect();
    assert_eq!(
        caught,
        vec![
            utc(2026, 5, 1, 12, 0, 6),
            utc(2026, 5, 1, 12, 0, 7),
            utc(2026, 5, 1, 12, 0, 8)
        ]
    );
    assert_eq!(plan.fire.len(), 5);
    assert_eq!(plan.dropped, 5);
    // Oldest first, never a tick twice.
    assert!(plan.fire.windows(2).all(|w| w[0].at < w[1].at));
    // A long outage costs bounded work: a year of seconds, dropped count capped.
    let long = skip.plan(down_at - chrono::Duration::days(365), now, misfire);
    assert_eq!(long.fire.len(), 2);
    assert_eq!(long.dropped, DROPPED_COUNT_CAP);
    assert_eq!(long.due_after, Some(utc(2026, 5, 1, 12, 0, 10)));
    // A daily schedule down over its hour: skip drops it, catch_up runs it once.
    let daily = ScheduleSpec::new("0 3 * * *", JobTemplate::new("k", Value::Null));
    let skip_daily = Schedule::from_spec("d", daily.clone()).unwrap();
    let catch_daily =
        Schedule::from_spec("d", daily.missed(MissedPolicy::CatchUp { max: 1 })).unwrap();
    let (from, now) = (utc(2026, 5, 1, 2, 0, 0), utc(2026, 5, 3, 4, 0, 0));
    let p = skip_daily.plan(from, now, DEFAULT_MISFIRE_THRESHOLD);
    assert!(p.fire.is_empty());
    assert_eq!(p.dropped, 3);
    assert_eq!(p.due_after, Some(utc(2026, 5, 3, 3, 0, 0)));
    let p = catch_daily.plan(from, now, DEFAULT_MISFIRE_THRESHOLD);
    assert_eq!(
        p.fire,
        vec![PlannedTick {
            at: utc(2026, 5, 3, 3, 0, 0),
            catch_up: true
        }]
    );
    assert_eq!(p.dropped, 2);
}

// Europe/Berlin, 2026: clocks go from 02:00 CET (UTC+1) to 03:00 CEST (UTC+2) on March 29
// at 01:00 UTC, and from 03:00 CEST back to 02:00 CET on October 25 at 01:00 UTC.

#[test]
fn berlin_spring_forward_fixed_time_runs_once_after_the_gap() {
    let s = schedule("30 2 * * *", "Europe/Berlin");
    let fired = driven(
        &s,
        utc(2026, 3, 27, 12, 0, 0),
        utc(2026, 3, 31, 12, 0, 0),
        600,
    );
    assert_eq!(
        fired,
        vec![
            utc(2026, 3, 28, 1, 30, 0), // 02:30 CET
            utc(2026, 3, 29, 1, 0, 0),  // 02:30 does not exist: 03:00 CEST, once
            utc(2026, 3, 30, 0, 30, 0), // 02:30 CEST
            utc(2026, 3, 31, 0, 30, 0),
        ]
    );
}

#[test]
fn berlin_spring_forward_interval_skips_the_missing_hour() {
    let hourly = schedule("0 * * * *", "Europe/Berlin");
    let fired = driven(
        &hourly,
        utc(2026, 3, 28, 22, 30, 0),
        utc(2026, 3, 29, 3, 30, 0),
        60,
    );
    // Local 00:00, 01:00, (02:00 does not exist), 03:00, 04:00, 05:00: every real hour once.
    assert_eq!(
        fired,
        vec![
            utc(2026, 3, 28, 23, 0, 0),
            utc(2026, 3, 29, 0, 0, 0),
            utc(2026, 3, 29, 1, 0, 0),
            utc(2026, 3, 29, 2, 0, 0),
            utc(2026, 3, 29, 3, 0, 0),
        ]
    );
    let quarter = schedule("*/30 2 * * *", "Europe/Berlin");
    let fired = driven(
        &quarter,
        utc(2026, 3, 27, 12, 0, 0),
        utc(2026, 3, 30, 12, 0, 0),
        300,
    );
    // 02:00 and 02:30 exist on the 28th and 30th only; on the 29th there is no 2 o'clock.
    assert_eq!(
        fired,
        vec![
            utc(2026, 3, 29, 1, 0, 0) - chrono::Duration::days(1),
            utc(2026, 3, 29, 1, 30, 0) - chrono::Duration::days(1),
            utc(2026, 3, 30, 0, 0, 0),
            utc(2026, 3, 30, 0, 30, 0),
        ]
    );
}

#[test]
fn berlin_fall_back_fixed_time_runs_once_interval_runs_every_real_hour() {
    let daily = schedule("30 2 * * *", "Europe/Berlin");
    let fired = driven(
        &daily,
        utc(2026, 10, 24, 12, 0, 0),
        utc(2026, 10, 26, 12, 0, 0),
        300,
    );
    // 02:30 happens twice on the 25th (00:30 UTC in CEST, 01:30 UTC in CET): once, the first.
    assert_eq!(
        fired,
        vec![utc(2026, 10, 25, 0, 30, 0), utc(2026, 10, 26, 1, 30, 0),]
    );
    let hourly = schedule("0 * * * *", "Europe/Berlin");
    let fired = driven(
        &hourly,
        utc(2026, 10, 24, 22, 30, 0),
        utc(2026, 10, 25, 3, 30, 0),
        60,
    );
    // Local 01:00 CEST, 02:00 CEST, 02:00 CET, 03:00 CET, 04:00: each real hour once.
    assert_eq!(
        fired,
        vec![
            utc(2026, 10, 24, 23, 0, 0),
            utc(2026, 10, 25, 0, 0, 0),
            utc(2026, 10, 25, 1, 0, 0),
            utc(2026, 10, 25, 2, 0, 0),
            utc(2026, 10, 25, 3, 0, 0),
        ]
    );
}

#[test]
fn backward_planning_agrees_with_forward_walks_across_dst() {
    // The planner walks backwards; a walk forwards must find the same ticks.
    for cron in ["30 2 * * *", "0 * * * *", "*/20 1-3 * * *", "15 2 * * SUN"] {
        let s = schedule(cron, "Europe/Berlin");
        for (from, to) in [
            (utc(2026, 3, 26, 0, 0, 0), utc(2026, 4, 2, 0, 0, 0)),
            (utc(2026, 10, 22, 0, 0, 0), utc(2026, 10, 29, 0, 0, 0)),
        ] {
            let forward = ticks(&s, from, to);
            let plan = s.plan(from, to, Duration::from_secs(30 * 86_400));
            let planned: Vec<_> = plan.fire.iter().map(|t| t.at).collect();
            assert_eq!(planned, forward, "{cron} from {from}");
            let mut dedup = planned.clone();
            dedup.dedup();
            assert_eq!(dedup, planned, "{cron}: no tick twice");
        }
    }
}

fn interval(every: &str) -> Schedule {
    let spec = ScheduleSpec::every(every, JobTemplate::new("tick", serde_json::json!({})));
    Schedule::from_spec("s", spec).unwrap()
}

#[test]
fn intervals_parse() {
    for (text, secs) in [
        ("30s", 30),
        ("1s", 1),
        ("5m", 300),
        ("1h30m", 5_400),
        ("2d", 172_800),
        ("1w", 604_800),
        (" 90s ", 90),
        ("1h0m5s", 3_605),
        ("366d", 366 * 86_400),
    ] {
        assert_eq!(
            parse_every(text).unwrap(),
            Duration::from_secs(secs),
            "{text:?}"
        );
    }
    for bad in [
        "",
        "0s",
        "0m0s",
        "abc",
        "30",
        "1h30",
        "s",
        "-5s",
        "1.5h",
        "30 s",
        "5ms",
        "367d",
        "99999999999999999999s",
        "18446744073709551615w",
    ] {
        let err = parse_every(bad).unwrap_err();
        assert_eq!(err.field, "every", "{bad:?}");
        assert!(err.message.contains(&format!("{:?}", bad)), "{err}");
    }
}

#[test]
fn interval_specs_are_checked() {
    let job = || JobTemplate::new("tick", serde_json::json!({}));
    let mut both = ScheduleSpec::every("30s", job());
    both.cron = "* * * * *".into();
    assert_eq!(field_of(Schedule::from_spec("s", both)), "every");
    let neither = ScheduleSpec::new("", job());
    assert_eq!(field_of(Schedule::from_spec("s", neither)), "cron");
    let blank = ScheduleSpec::new("  ", job());
    assert_eq!(field_of(Schedule::from_spec("s", blank)), "cron");
    for bad in ["0s", "abc", "30"] {
        let spec = ScheduleSpec::every(bad, job());
        assert_eq!(field_of(Schedule::from_spec("s", spec)), "every");
    }
    // Time zones are for cron only: an interval takes UTC (the default) or nothing.
    let zoned = ScheduleSpec::every("30s", job()).timezone("Europe/Berlin");
    assert_eq!(field_of(Schedule::from_spec("s", zoned)), "timezone");
    let utc_zone = ScheduleSpec::every(" 30s ", job()).timezone("UTC");
    let s = Schedule::from_spec("s", utc_zone).unwrap();
    assert_eq!(s.every(), Some(Duration::from_secs(30)));
    assert_eq!(s.spec().every.as_deref(), Some("30s"));
    assert_eq!(s.cron(), "");
    // Round trip, and `cron` is left out of an interval schedule's JSON.
    let json = serde_json::to_value(&s).unwrap();
    assert_eq!(json["every"], "30s");
    assert!(json.get("cron").is_none());
    assert_eq!(Schedule::from_json("s", &s.to_json()).unwrap(), s);
    let parsed: ScheduleSpec =
        serde_json::from_str(r#"{"every": "1h30m", "job": {"kind": "k"}, "missed": "catch_up"}"#)
            .unwrap();
    let parsed = Schedule::from_spec("n", parsed).unwrap();
    assert_eq!(parsed.every(), Some(Duration::from_secs(5_400)));
    // A given cron must say something, even beside every.
    assert!(serde_json::from_str::<ScheduleSpec>(
        r#"{"cron": " ", "every": "30s", "job": {"kind": "k"}}"#
    )
    .is_err());
    // A cron schedule's JSON has no `every`, as before.
    let cron = schedule("0 3 * * *", "UTC");
    assert!(serde_json::to_value(&cron).unwrap().get("every").is_none());
    assert_eq!(cron.every(), None);
    // Same interval (however written) keeps the anchor; another interval or cron does not.
    assert!(interval("90s").same_ticks(&interval("1m30s")));
    assert!(!interval("90s").same_ticks(&interval("2m")));
    assert!(!interval("1m").same_ticks(&schedule("* * * * *", "UTC")));
    assert!(!schedule("* * * * *", "UTC").same_ticks(&interval("1m")));
}

#[test]
fn interval_ticks_count_from_the_anchor() {
    let s = interval("30s");
    // Created at 12:00:07.250: ticks at :37, 12:01:07, ... (whole seconds from the anchor).
    let anchor = utc(2026, 5, 1, 12, 0, 7) + chrono::Duration::milliseconds(250);
    assert_eq!(s.next_after(anchor), None);
    assert_eq!(s.next_run(anchor, anchor), Some(utc(2026, 5, 1, 12, 0, 37)));
    let plan = s.plan(
        anchor,
        utc(2026, 5, 1, 12, 0, 36),
        DEFAULT_MISFIRE_THRESHOLD,
    );
    assert!(plan.fire.is_empty() && plan.due_after.is_none());
    assert_eq!(plan.next, Some(utc(2026, 5, 1, 12, 0, 37)));
    let now = utc(2026, 5, 1, 12, 0, 38);
    let plan = s.plan(anchor, now, DEFAULT_MISFIRE_THRESHOLD);
    assert_eq!(
        plan.fire,
        vec![PlannedTick {
            at: utc(2026, 5, 1, 12, 0, 37),
            catch_up: false
        }]
    );
    assert_eq!(plan.due_after, Some(utc(2026, 5, 1, 12, 0, 37)));
    assert_eq!(plan.next, Some(utc(2026, 5, 1, 12, 1, 7)));
    // From the fired tick on, the same lattice; driven every 3 s for 10 minutes: each
    // tick exactly once.
    let fired = driven(&s, anchor, anchor + chrono::Duration::minutes(10), 3);
    assert_eq!(fired.len(), 20);
    for (k, at) in fired.iter().enumerate() {
        assert_eq!(
            *at,
            utc(2026, 5, 1, 12, 0, 7) + chrono::Duration::seconds(30 * (k as i64 + 1))
        );
    }
    // A tick exactly at "now" is due; the next one is a whole interval later.
    let tick = utc(2026, 5, 1, 12, 1, 7);
    let plan = s.plan(utc(2026, 5, 1, 12, 0, 37), tick, DEFAULT_MISFIRE_THRESHOLD);
    assert_eq!(plan.due_after, Some(tick));
    assert_eq!(s.next_run(tick, tick), Some(utc(2026, 5, 1, 12, 1, 37)));
}

#[test]
fn interval_missed_ticks_follow_the_policy() {
    let spec = ScheduleSpec::every("10s", JobTemplate::new("k", Value::Null));
    let skip = Schedule::from_spec("s", spec.clone()).unwrap();
    let catch_up = Schedule::from_spec("s", spec.missed(MissedPolicy::CatchUp { max: 2 })).unwrap();
    let last = utc(2026, 5, 1, 12, 0, 0);
    // Down for 94 s: ticks :10 .. 1:30 are due; only 1:30 is on time (threshold 5 s).
    let now = utc(2026, 5, 1, 12, 1, 34);
    let plan = skip.plan(last, now, DEFAULT_MISFIRE_THRESHOLD);
    assert_eq!(
        plan.fire,
        vec![PlannedTick {
            at: utc(2026, 5, 1, 12, 1, 30),
            catch_up: false
        }]
    );
    assert_eq!(plan.dropped, 8);
    assert_eq!(plan.due_after, Some(utc(2026, 5, 1, 12, 1, 30)));
    assert_eq!(plan.next, Some(utc(2026, 5, 1, 12, 1, 40)));
    let plan = catch_up.plan(last, now, DEFAULT_MISFIRE_THRESHOLD);
    let at: Vec<_> = plan.fire.iter().map(|t| (t.at, t.catch_up)).collect();
    assert_eq!(
        at,
        vec![
            (utc(2026, 5, 1, 12, 1, 10), true),
            (utc(2026, 5, 1, 12, 1, 20), true),
            (utc(2026, 5, 1, 12, 1, 30), false),
        ]
    );
    assert_eq!(plan.dropped, 6);
    // A year down on a 1 s interval: bounded work.
    let long = skip.plan(
        last - chrono::Duration::days(365),
        now,
        DEFAULT_MISFIRE_THRESHOLD,
    );
    assert_eq!(long.dropped, DROPPED_COUNT_CAP);
    assert_eq!(long.due_after, Some(utc(2026, 5, 1, 12, 1, 30)));
}

#[test]
fn fire_requests_are_checked() {
    let base = utc(2026, 1, 1, 0, 0, 0);
    let tick = |s: i64| PlannedTick {
        at: base + chrono::Duration::seconds(s),
        catch_up: false,
    };
    let request = |ticks: Vec<PlannedTick>, due: i64| FireRequest {
        name: "s".into(),
        revision: 1,
        ticks,
        due_after: base + chrono::Duration::seconds(due),
        stamp: RunStamp::default(),
    };
    assert!(request(vec![tick(1), tick(2)], 2).check(base).is_ok());
    assert!(request(vec![], 5).check(base).is_ok());
    assert!(request(vec![tick(2), tick(1)], 2).check(base).is_err());
    assert!(request(vec![tick(0)], 2).check(base).is_err());
    assert!(request(vec![tick(3)], 2).check(base).is_err());
    assert!(request(vec![], 0).check(base).is_err());
}
