//! `conveyor bench --soak`: a short soak with real processes and kill -9 of workers, access
//! control on and a short audit retention, checked through its JSON report.

mod common;

use common::*;
use serde_json::Value;
use std::io::Read;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The bench kills its own children when it dies (and they die with it), so the watchdog only
/// needs to kill the bench.
const DEADLINE: Duration = Duration::from_secs(90);

#[test]
fn a_short_soak_kills_workers_loses_no_acknowledged_job_and_reports_its_figures() {
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "soak.db").display());
    let mut child = Command::new(BIN)
        .args(["bench", "--json", "--store", &store])
        .args(["--soak", "20s", "--soak-kill-every", "5s"])
        .args(["--soak-report-every", "5s", "--soak-rate", "100"])
        .args(["--soak-drain-timeout", "15s"])
        .args(["--soak-auth", "--soak-retain-audit-secs", "5"])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn conveyor bench --soak");
    let mut stdout = child.stdout.take().expect("stdout");
    let pid = child.id() as i32;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(DEADLINE).is_err() {
            // SAFETY: our own child, not yet reaped (the test reaps it after this thread ends).
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    });
    let mut output = String::new();
    stdout.read_to_string(&mut output).expect("read the report");
    let status = child.wait().expect("wait for the bench");
    let _ = done_tx.send(());
    watchdog.join().expect("watchdog");

    let records: Vec<Value> = output
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
        .collect();
    let of = |record: &str| -> Vec<&Value> {
        records.iter().filter(|r| r["record"] == record).collect()
    };
    assert!(
        status.success(),
        "the soak failed ({status}); its report:\n{output}"
    );
    assert!(records.iter().all(|r| r["workload"] == "soak"), "{output}");

    let start = of("start");
    assert_eq!(start.len(), 1, "{output}");
    assert!(start[0]["server_pid"].as_u64().is_some(), "{output}");
    let intervals = of("interval");
    assert_eq!(intervals.len(), 4, "one line per 5 s of 20 s:\n{output}");
    let kills = of("kill");
    assert!(kills.len() >= 3, "kills at 5, 10 and 15 s:\n{output}");
    for kill in &kills {
        assert_ne!(kill["killed_pid"], kill["restarted_pid"], "{output}");
    }

    let summaries = of("summary");
    assert_eq!(summaries.len(), 1, "{output}");
    let summary = summaries[0];
    assert_eq!(summary["kills"].as_u64(), Some(kills.len() as u64));
    assert_eq!(summary["unexpected_worker_exits"], 0, "{output}");
    assert_eq!(summary["drained"], true, "{output}");
    let completed_after_kill = summary["completed_after_last_kill"].as_u64().unwrap_or(0);
    assert!(
        completed_after_kill > 0,
        "jobs must complete after a kill:\n{output}"
    );
    // Intervals after the first kill completed jobs too, not only the drain.
    assert!(
        intervals[1..]
            .iter()
            .all(|i| i["completed"].as_u64().unwrap_or(0) > 0),
        "{output}"
    );

    let invariants = &summary["invariants"];
    assert_eq!(invariants["ok"], true, "{output}");
    assert_eq!(
        invariants["missing"], 0,
        "no acknowledged job lost:\n{output}"
    );
    assert_eq!(invariants["lost"], 0, "{output}");
    assert_eq!(invariants["completed_twice"], 0, "{output}");
    assert_eq!(invariants["bad_state"], 0, "{output}");
    assert_eq!(invariants["unfinished"], 0, "{output}");
    let acknowledged = invariants["acknowledged"].as_u64().unwrap_or(0);
    assert!(acknowledged >= 1000, "about 100 jobs/s for 20 s:\n{output}");
    assert_eq!(summary["enqueued"].as_u64(), Some(acknowledged), "{output}");
    // The mix: some jobs failed and were retried, some died, most completed.
    assert!(summary["retried"].as_u64().unwrap_or(0) > 0, "{output}");
    assert!(summary["dead"].as_u64().unwrap_or(0) > 0, "{output}");
    assert_eq!(
        summary["completed"].as_u64().unwrap_or(0) + summary["dead"].as_u64().unwrap_or(0),
        acknowledged,
        "{output}"
    );

    // The final figures: RSS, descriptors and WAL at each point, with a verdict.
    let resources = &summary["resources"];
    for key in ["rss_bytes", "fds", "sockets", "wal_bytes"] {
        for point in ["start", "first_interval", "last_interval", "after_drain"] {
            // A fresh database's WAL may be empty (or not yet created) at the start; every
            // other figure is positive whenever it is measured.
            let may_be_zero = key == "wal_bytes" && point == "start";
            assert!(
                resources[key][point]
                    .as_u64()
                    .is_some_and(|v| v > 0 || may_be_zero),
                "{key} at {point} missing:\n{output}"
            );
        }
        assert!(resources[key]["flat"].is_boolean(), "{key}:\n{output}");
    }
    for interval in &intervals {
        for key in ["rss_bytes", "fds", "wal_bytes", "audit_rows", "audit_bytes"] {
            assert!(interval[key].as_u64().is_some(), "{key}:\n{output}");
        }
    }

    // The audit log: one entry per enqueue request (by the producer token), pruned after 5 s,
    // so it holds about 5 s of requests, not the run's, and the checks held it to that.
    assert_eq!(start[0]["auth"], true, "{output}");
    let audit = &summary["audit"];
    assert_eq!(audit["checked"], true, "{output}");
    assert_eq!(audit["retention_s"], 5, "{output}");
    assert_eq!(audit["ok"], true, "{output}");
    assert_eq!(audit["rows_ok"], true, "{output}");
    assert_eq!(audit["reports_checked"], 4, "{output}");
    assert_eq!(audit["reports_over_bound"], 0, "{output}");
    assert_eq!(invariants["audit_ok"], true, "{output}");
    assert!(audit["filled_at_s"].as_f64().is_some(), "{output}");
    assert!(
        audit["bytes"]["filled"].as_u64().is_some_and(|b| b > 0),
        "{output}"
    );
    let last_rows = intervals[3]["audit_rows"].as_u64().unwrap_or(0);
    // About 52 requests a second (nine in ten carry one job, the tenth ten): 5 s of them.
    assert!(
        (100..=600).contains(&last_rows),
        "about 5 s of requests kept, not the run's ~1,000:\n{output}"
    );
}
