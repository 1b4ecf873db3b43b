//! `conveyor bench --http URL` against a real `conveyor serve`: every workload reports, and the
//! server agrees afterwards that the jobs were done. Figures are printed, never asserted on.

mod common;

use common::{http, start_server, temp_dir, BIN};
use serde_json::Value;
use std::process::Command;

#[test]
fn bench_over_http_runs_every_workload_and_the_server_completed_every_job() {
    let dir = temp_dir();
    let server = start_server(&dir.path().join("jobs.db"), &[]);
    let output = Command::new(BIN)
        .args([
            "bench",
            "--http",
            &server.url,
            "--jobs",
            "2000",
            "--concurrency",
            "10",
            "--json",
        ])
        .env("CONVEYOR_LOG", "warn")
        .output()
        .expect("run conveyor bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "bench failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<Value> = stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    let workloads: Vec<&str> = lines
        .iter()
        .map(|line| line["workload"].as_str().expect("workload"))
        .collect();
    assert_eq!(workloads, ["enqueue", "drain", "latency"], "{stdout}");
    for line in &lines {
        println!("{line}");
        assert_eq!(line["mode"], "http", "{line}");
        assert_eq!(line["server"], server.url.as_str(), "{line}");
        assert_eq!(line["concurrency"], 10, "{line}");
        assert!(line["seconds"].as_f64().expect("seconds") > 0.0, "{line}");
        assert!(
            line["jobs_per_s"].as_f64().expect("jobs_per_s") > 0.0,
            "{line}"
        );
    }
    let (enqueue, drain, latency) = (&lines[0], &lines[1], &lines[2]);
    assert_eq!(enqueue["jobs"], 2000);
    assert_eq!(drain["jobs"], 2000);
    assert_eq!(drain["completed_on_server"], 2000, "{drain}");
    assert_eq!(latency["jobs"], 2000, "samples: at most 2,000");
    for key in ["p50_ms", "p95_ms", "p99_ms"] {
        assert!(latency[key].as_f64().expect(key) > 0.0, "{latency}");
    }
    let (p50, p95, p99) = (
        latency["p50_ms"].as_f64().expect("p50"),
        latency["p95_ms"].as_f64().expect("p95"),
        latency["p99_ms"].as_f64().expect("p99"),
    );
    assert!(p50 <= p95 && p95 <= p99, "{latency}");

    // The server's view: each workload's queue, and nothing left running or waiting in the
    // queues that were worked.
    let queues: Value = http()
        .get(format!("{}/v1/queues", server.url))
        .send()
        .expect("GET /v1/queues")
        .json()
        .expect("queues JSON");
    let queues = queues["queues"].as_array().expect("queues");
    let find = |workload: &str| -> &Value {
        let prefix = format!("bench-http-{workload}-");
        let found: Vec<&Value> = queues
            .iter()
            .filter(|q| q["name"].as_str().is_some_and(|n| n.starts_with(&prefix)))
            .collect();
        assert_eq!(found.len(), 1, "one {workload} queue: {queues:?}");
        found[0]
    };
    let enqueued = find("enqueue");
    assert_eq!(enqueued["available"], 2000, "{enqueued}");
    let drained = find("drain");
    assert_eq!(drained["completed"], 2000, "{drained}");
    let sampled = find("latency");
    assert!(
        sampled["completed"].as_u64().expect("completed") >= 2000,
        "{sampled}"
    );
    for queue in [drained, sampled] {
        for state in ["available", "running", "retryable", "dead", "scheduled"] {
            assert_eq!(queue[state], 0, "{state} in {queue}");
        }
    }
}
