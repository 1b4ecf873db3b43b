use super::*;

fn at(ms: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(1_800_000_000_000 + ms).expect("time")
}

fn settings() -> BreakerSettings {
    BreakerSettings {
        failure_ratio: 0.5,
        min_calls: 4,
        window_ms: 10_000,
        open_ms: 5_000,
        half_open_calls: 2,
        pause_on_retry_after: true,
    }
}

#[test]
fn opens_only_past_min_calls_and_the_ratio() {
    let s = settings();
    let mut record = BreakerRecord::closed(at(0));
    assert_eq!(
        record.record(Some(&s), at(1), 0, 3),
        None,
        "3 calls < min_calls 4"
    );
    assert_eq!(
        record.record(Some(&s), at(2), 5, 0),
        None,
        "3 of 8 failed < 50%"
    );
    assert_eq!(
        record.record(Some(&s), at(3), 0, 1),
        None,
        "4 of 9 failed < 50%"
    );
    let opened = record
        .record(Some(&s), at(4), 0, 1)
        .expect("5 of 10 failed");
    assert_eq!(
        (opened.from, opened.to),
        (BreakerState::Closed, BreakerState::Open)
    );
    assert_eq!(record.open_until, Some(at(5_004)));
    assert!(!record.manual);
    assert_eq!(
        record.record(Some(&s), at(5), 0, 9),
        None,
        "late outcomes change nothing"
    );
}

#[test]
fn the_ratio_counts_the_sliding_window() {
    let s = settings();
    let mut record = BreakerRecord::closed(at(0));
    assert_eq!(record.record(Some(&s), at(1), 4, 0), None);
    assert_eq!(record.record(Some(&s), at(2), 0, 3), None, "3 of 7 failed");
    // Half the next window later the old window weighs half: 2 + 1.5 of 3.5 + 2 failed.
    let t = record.record(Some(&s), at(15_000), 0, 2).expect("opens");
    assert_eq!((t.from, t.to), (BreakerState::Closed, BreakerState::Open));
    assert_eq!(record.open_until, Some(at(20_000)));
    // Two windows later nothing of the old counts is left.
    let mut fresh = BreakerRecord::closed(at(0));
    fresh.record(Some(&s), at(1), 0, 3);
    assert_eq!(
        fresh.record(Some(&s), at(25_000), 0, 1),
        None,
        "1 call only"
    );
}

#[test]
fn open_probes_then_closes_after_enough_successes() {
    let s = settings();
    let mut record = BreakerRecord::closed(at(0));
    record.record(Some(&s), at(1), 0, 4).expect("opens");
    assert_eq!(record.take_probes(Some(&s), 5), 0, "no probes while open");
    assert!(!record.due(Some(&s), at(4_000)));
    assert_eq!(record.tick(Some(&s), at(4_000)), None);
    assert!(record.due(Some(&s), at(5_001)));
    let t = record.tick(Some(&s), at(5_001)).expect("half-opens");
    assert_eq!(t.to, BreakerState::HalfOpen);
    assert_eq!(record.take_probes(Some(&s), 5), 2, "half_open_calls");
    assert_eq!(record.take_probes(Some(&s), 5), 0, "all handed out");
    record.return_probes(1);
    assert_eq!(record.take_probes(Some(&s), 5), 1);
    assert_eq!(record.record(Some(&s), at(5_100), 1, 0), None, "1 of 2");
    let t = record.record(Some(&s), at(5_200), 1, 0).expect("closes");
    assert_eq!(t.to, BreakerState::Closed);
    assert_eq!((record.calls, record.failures), (0, 0), "counting afresh");
}

#[test]
fn a_failed_probe_reopens_and_lost_probes_are_reissued() {
    let s = settings();
    let mut record = BreakerRecord::closed(at(0));
    record.record(Some(&s), at(1), 0, 4);
    record.tick(Some(&s), at(6_000));
    assert_eq!(record.take_probes(Some(&s), 2), 2);
    // The probes' workers died: after a window new probes are handed out.
    assert_eq!(record.take_probes(Some(&s), 2), 0);
    record.tick(Some(&s), at(16_001));
    assert_eq!(record.take_probes(Some(&s), 2), 2);
    let t = record.record(Some(&s), at(16_100), 0, 1).expect("reopens");
    assert_eq!((t.from, t.to), (BreakerState::HalfOpen, BreakerState::Open));
    assert_eq!(record.open_until, Some(at(21_100)));
}

#[test]
fn manual_open_without_end_stays_until_closed_by_hand() {
    let s = settings();
    let mut record = BreakerRecord::closed(at(0));
    record
        .open_by_hand(at(1), None, "maintenance".into())
        .expect("opens");
    assert_eq!(record.tick(Some(&s), at(1_000_000_000)), None);
    assert_eq!(
        record.pause_until(at(2), at(10_000), "429".into()),
        None,
        "a retry-after does not shorten an open without end"
    );
    assert_eq!(record.open_until, None);
    record.close_by_hand(at(3), "done".into()).expect("closes");
    assert_eq!(record.state, BreakerState::Closed);
    assert!(!record.manual);
}

#[test]
fn retry_after_pauses_until_then_and_only_extends() {
    let s = settings();
    let mut record = BreakerRecord::closed(at(0));
    let t = record
        .pause_until(at(1), at(30_000), "429".into())
        .expect("opens");
    assert_eq!(t.to, BreakerState::Open);
    assert_eq!(record.pause_until(at(2), at(20_000), "429".into()), None);
    assert_eq!(record.open_until, Some(at(30_000)), "not shortened");
    record.pause_until(at(3), at(40_000), "429".into());
    assert_eq!(record.open_until, Some(at(40_000)), "extended");
    // Without a breaker configured, time up closes it outright.
    assert_eq!(
        record.tick(None, at(40_000)).map(|t| t.to),
        Some(BreakerState::Closed)
    );
    let _ = s;
}

#[test]
fn settings_from_json_name_the_field() {
    let parsed = BreakerSettings::from_json(
        "circuit_breaker",
        &serde_json::json!({"failure_ratio": 0.25, "min_calls": 5.0}),
    )
    .expect("valid");
    assert_eq!(parsed.failure_ratio, 0.25);
    assert_eq!(parsed.min_calls, 5);
    assert_eq!(parsed.window_ms, BreakerSettings::default().window_ms);
    for (body, field) in [
        (
            serde_json::json!({"failure_ratio": 0}),
            "circuit_breaker.failure_ratio",
        ),
        (
            serde_json::json!({"failure_ratio": 1.5}),
            "circuit_breaker.failure_ratio",
        ),
        (
            serde_json::json!({"min_calls": 0}),
            "circuit_breaker.min_calls",
        ),
        (
            serde_json::json!({"window_ms": 5}),
            "circuit_breaker.window_ms",
        ),
        (
            serde_json::json!({"open_ms": "x"}),
            "circuit_breaker.open_ms",
        ),
        (
            serde_json::json!({"half_open_calls": 0}),
            "circuit_breaker.half_open_calls",
        ),
        (
            serde_json::json!({"pause_on_retry_after": 1}),
            "circuit_breaker.pause_on_retry_after",
        ),
        (serde_json::json!({"ratio": 0.5}), "circuit_breaker.ratio"),
        (serde_json::json!([1]), "circuit_breaker"),
    ] {
        let error = BreakerSettings::from_json("circuit_breaker", &body).expect_err("bad");
        assert_eq!(error.field, field, "{body}");
    }
}
