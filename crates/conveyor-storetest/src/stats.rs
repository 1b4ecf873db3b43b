//! History rollups: flushes add up per minute, queue and kind (counts and histogram buckets),
//! reads filter by span, queue and kind, pruning drops old minutes, and a recorder on the
//! store's clock feeds a report whose totals match what was recorded.

use std::time::Duration;

use conveyor_core::stats::{Rollup, RollupCounts, StatsQuery, StatsReport, StatsRequest};
use conveyor_core::{AttemptEvent, AttemptStatus};
use conveyor_engine::StatsRecorder;

use crate::kit::Harness;

fn rollup(h: &Harness, minutes_ago: i64, queue: &str, kind: &str, completed: u64) -> Rollup {
    let mut counts = RollupCounts {
        completed,
        started: completed,
        ..RollupCounts::default()
    };
    for _ in 0..completed {
        counts.run_time.observe(Duration::from_millis(40));
    }
    Rollup {
        minute: conveyor_core::stats::minute_of(h.now() - chrono::Duration::minutes(minutes_ago)),
        queue: queue.to_string(),
        kind: kind.to_string(),
        counts,
    }
}

/// Two flushes of the same minute, queue and kind add up (counts and histogram buckets, even
/// of different lengths); reads keep to the span and filters, in minute order; pruning
/// deletes minutes before its bound only; a bad name is refused before anything is written.
pub async fn stats_rollups_add_up_filter_and_prune(h: &Harness) {
    let store = &h.store;
    store
        .stats_merge(vec![
            rollup(h, 10, "mail", "send", 3),
            rollup(h, 2, "mail", "send", 1),
            rollup(h, 2, "mail", "digest", 5),
            rollup(h, 2, "img", "resize", 7),
        ])
        .await
        .expect("first flush");
    let mut slow = rollup(h, 2, "mail", "send", 2);
    slow.counts.run_time = Default::default();
    slow.counts.run_time.observe(Duration::from_secs(7_200));
    slow.counts.run_time.observe(Duration::from_secs(7_200));
    slow.counts.failed = 1;
    slow.counts.dead = 1;
    store.stats_merge(vec![slow]).await.expect("second flush");

    let everything = StatsQuery {
        from: h.now() - chrono::Duration::hours(1),
        to: h.now() + chrono::Duration::minutes(1),
        queue: None,
        kind: None,
    };
    let rows = store.stats_read(everything.clone()).await.expect("read");
    assert_eq!(
        rows.len(),
        4,
        "one row per minute, queue and kind: {rows:?}"
    );
    assert!(rows.windows(2).all(|pair| pair[0].minute <= pair[1].minute));
    let send = rows
        .iter()
        .find(|r| r.kind == "send" && r.minute == rollup(h, 2, "", "", 0).minute)
        .expect("the merged row");
    assert_eq!(send.counts.completed, 3);
    assert_eq!((send.counts.failed, send.counts.dead), (1, 1));
    assert_eq!(send.counts.run_time.count(), 3, "buckets added");
    assert_eq!(
        send.counts.run_time.counts.len(),
        conveyor_core::stats::BUCKET_BOUNDS_MS.len() + 1
    );
    assert!((send.counts.run_time.sum_ms - (40.0 + 2.0 * 7_200_000.0)).abs() < 1e-6);

    let mail = store
        .stats_read(StatsQuery {
            queue: Some("mail".into()),
            ..everything.clone()
        })
        .await
        .expect("read mail");
    assert_eq!(mail.len(), 3);
    let digest = store
        .stats_read(StatsQuery {
            kind: Some("digest".into()),
            ..everything.clone()
        })
        .await
        .expect("read digest");
    assert_eq!(digest.len(), 1);
    assert_eq!(digest[0].counts.completed, 5);
    let recent = store
        .stats_read(StatsQuery {
            from: h.now() - chrono::Duration::minutes(5),
            ..everything.clone()
        })
        .await
        .expect("read recent");
    assert_eq!(recent.len(), 3, "the minute 10 minutes ago is outside");

    let bad = rollup(h, 1, "bad queue!", "send", 1);
    let error = store.stats_merge(vec![bad]).await.expect_err("bad name");
    assert!(error.to_string().contains("queue"), "{error}");

    let pruned = store
        .stats_prune(Duration::from_secs(4 * 60))
        .await
        .expect("prune");
    assert_eq!(pruned, 1);
    assert_eq!(store.stats_read(everything).await.expect("read").len(), 3);
}

/// A recorder on the store's clock: events of two minutes flushed (one flush failing on
/// nothing), then a report over the span gives per-step counts, totals and per-kind summaries
/// with estimated durations.
pub async fn stats_recorded_events_come_back_as_a_report(h: &Harness) {
    let recorder = StatsRecorder::new(h.clock.clone());
    let start = h.now();
    for _ in 0..4 {
        recorder.enqueued("q", "k");
        recorder.started("q", "k", Duration::from_millis(20));
        recorder.finished(&AttemptEvent {
            queue: "q",
            kind: "k",
            status: AttemptStatus::Completed,
            duration: Duration::from_millis(100),
        });
    }
    assert_eq!(recorder.flush(h.store.as_ref()).await.expect("flush"), 1);
    h.advance(Duration::from_secs(60));
    recorder.finished(&AttemptEvent {
        queue: "q",
        kind: "k",
        status: AttemptStatus::Failed,
        duration: Duration::from_millis(900),
    });
    recorder.flush(h.store.as_ref()).await.expect("flush");
    assert_eq!(recorder.flush(h.store.as_ref()).await.expect("empty"), 0);

    let request = StatsRequest::new(
        start - chrono::Duration::minutes(1),
        h.now() + chrono::Duration::seconds(1),
        Some(Duration::from_secs(60)),
        None,
        None,
    )
    .expect("request");
    let rows = h.store.stats_read(request.query()).await.expect("read");
    let report = StatsReport::build(&request, &rows);
    assert_eq!(report.totals.enqueued, 4);
    assert_eq!(report.totals.completed, 4);
    assert_eq!((report.totals.failed, report.totals.retried), (1, 1));
    assert_eq!(report.totals.failure_rate, Some(0.2));
    let wait = report.totals.queue_wait.expect("waits");
    assert_eq!(wait.count, 4);
    assert!(
        (20.0..=30.0).contains(&wait.p50_ms),
        "within 20 ms's bucket: {wait:?}"
    );
    let run = report.totals.run_time.expect("run times");
    assert!(run.p99_ms > 750.0, "the slow failure shows at p99: {run:?}");
    let busy: Vec<_> = report
        .series
        .iter()
        .filter(|p| p.completed + p.failed > 0)
        .collect();
    assert_eq!(
        busy.len(),
        2,
        "two minutes had outcomes: {:?}",
        report.series
    );
    assert_eq!(report.kinds.len(), 1);
    assert_eq!(report.kinds[0].totals.completed, 4);
}
