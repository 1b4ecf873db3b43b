use super::*;

#[test]
fn durations_take_units_or_plain_seconds() {
    assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
    assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
    assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
    assert_eq!(parse_duration("45"), Ok(Duration::from_secs(45)));
    assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    for bad in ["", "0", "-5s", "10x", "m", "1e400s", "NaN"] {
        assert!(parse_duration(bad).is_err(), "{bad:?} was accepted");
    }
}

#[test]
fn the_mix_has_every_kind_in_its_proportion() {
    let mut counts = BTreeMap::new();
    for n in 0..1000 {
        *counts.entry(Kind::of(n)).or_insert(0) += 1;
    }
    assert_eq!(counts[&Kind::Ok], 840);
    assert_eq!(counts[&Kind::Slow], 50);
    assert_eq!(counts[&Kind::Flaky], 80);
    assert_eq!(counts[&Kind::Doomed], 20);
    assert_eq!(counts[&Kind::Poison], 10);
    for kind in KINDS {
        assert_eq!(Kind::from_name(kind.name()), Some(kind));
    }
}

#[test]
fn outcomes_are_summed_over_the_queue_only() {
    let text = "# HELP conveyor_jobs_processed_total x\n\
        conveyor_jobs_processed_total{kind=\"a\",queue=\"q\",status=\"failed\"} 3\n\
        conveyor_jobs_processed_total{kind=\"b\",queue=\"q\",status=\"failed\"} 4\n\
        conveyor_jobs_processed_total{kind=\"b\",queue=\"q\",status=\"completed\"} 9\n\
        conveyor_jobs_processed_total{kind=\"b\",queue=\"q2\",status=\"failed\"} 5\n";
    assert_eq!(processed(text, "q", "failed"), 7);
    assert_eq!(processed(text, "q", "completed"), 9);
}

fn stored(kind: Kind, state: &str, attempt: u64, errors: &[&str]) -> Stored {
    Stored {
        kind: kind.name().to_string(),
        state: state.to_string(),
        attempt,
        max_attempts: u64::from(kind.max_attempts()),
        error_classes: errors.iter().map(|e| e.to_string()).collect(),
    }
}

#[test]
fn states_are_judged_by_kind_and_history() {
    let fine = [
        stored(Kind::Ok, "completed", 1, &[]),
        stored(Kind::Ok, "completed", 2, &["lease_expired"]),
        stored(Kind::Flaky, "completed", 2, &["error"]),
        stored(
            Kind::Doomed,
            "dead",
            3,
            &["error", "lease_expired", "error"],
        ),
        stored(Kind::Poison, "dead", 1, &["permanent"]),
        stored(Kind::Ok, "dead", 5, &["lease_expired"; 5]),
    ];
    for job in &fine {
        assert!(
            matches!(judge(Kind::of_name(&job.kind), job), Ok(Fate::Finished)),
            "{} {} {}",
            job.kind,
            job.state,
            job.attempt
        );
    }
    let wrong = [
        stored(Kind::Ok, "completed", 2, &[]),
        stored(Kind::Ok, "completed", 2, &["error"]),
        stored(Kind::Flaky, "completed", 1, &[]),
        stored(Kind::Doomed, "completed", 1, &[]),
        stored(Kind::Doomed, "dead", 2, &["error", "error"]),
        stored(Kind::Ok, "dead", 1, &["permanent"]),
        stored(Kind::Ok, "cancelled", 0, &[]),
    ];
    for job in &wrong {
        assert!(
            judge(Kind::of_name(&job.kind), job).is_err(),
            "{} {} {} passed",
            job.kind,
            job.state,
            job.attempt
        );
    }
    assert!(matches!(
        judge(
            Kind::Ok,
            &stored(Kind::Ok, "retryable", 1, &["lease_expired"])
        ),
        Ok(Fate::Unfinished)
    ));
}

/// A run with one enqueue request every 100 ms for 60 s and reports every 10 s, whose log
/// holds `rows(t)` entries of `bytes(t)` bytes at a report at `t` seconds.
fn audit_run(rows: impl Fn(u64) -> u64, bytes: impl Fn(u64) -> u64) -> Value {
    let start = Instant::now();
    let at = |ms: u64| start + Duration::from_millis(ms);
    let requests: Vec<Instant> = (1..=600).map(|n| at(n * 100)).collect();
    let samples: Vec<Sample> = (1..=6)
        .map(|n| Sample {
            at: at(n * 10_000),
            enqueued: 0,
            counts: Counts::default(),
            resources: Resources::default(),
            audit: Some(AuditSize {
                rows: rows(n * 10),
                bytes: bytes(n * 10),
            }),
            audit_at: at(n * 10_000),
        })
        .collect();
    audit_report(AuditRun {
        samples: &samples,
        at_start: Some(AuditSize { rows: 3, bytes: 0 }),
        after_drain: None,
        retention: Some(Duration::from_secs(20)),
        requests: &requests,
        start,
        unacknowledged: 4,
    })
}

#[test]
fn the_audit_log_is_held_to_the_requests_of_its_retention() {
    // Pruned: 20 s of requests (200) once 20 s have passed; flat bytes once filled (30 s).
    let pruned = |t: u64| 10 * t.min(20) + 3;
    let fine = audit_run(pruned, |t| 1000 * t.min(30));
    assert_eq!(fine["ok"], true, "{fine}");
    assert_eq!(fine["reports_checked"], 6, "{fine}");
    assert_eq!(fine["reports_over_bound"], 0, "{fine}");
    assert_eq!(fine["filled_at_s"], 30.0, "{fine}");
    assert_eq!(fine["bytes"]["flat"], true, "{fine}");
    assert_eq!(fine["bytes"]["second_half_growth_pct"], 0.0, "{fine}");

    // Never pruned: every request stays, past the last 25 s of them from 30 s on.
    let kept = audit_run(|t| 10 * t + 3, |t| 1000 * t.min(30));
    assert_eq!(kept["ok"], false, "{kept}");
    assert_eq!(kept["rows_ok"], false, "{kept}");
    assert_eq!(kept["reports_over_bound"], 4, "{kept}");

    // Rows pruned, but their space never reused: past twice the filled size.
    let bloated = audit_run(pruned, |t| 1000 * t * t);
    assert_eq!(bloated["rows_ok"], true, "{bloated}");
    assert_eq!(bloated["bytes_ok"], false, "{bloated}");
    assert_eq!(bloated["bytes"]["flat"], false, "{bloated}");
    assert_eq!(bloated["ok"], false, "{bloated}");
}

impl Kind {
    fn of_name(name: &str) -> Kind {
        Kind::from_name(name).unwrap_or(Kind::Ok)
    }
}
