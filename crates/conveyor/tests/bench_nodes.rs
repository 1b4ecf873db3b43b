//! `conveyor bench --nodes K`: K worker nodes, each with its own connection pool, drain one
//! PostgreSQL queue together; the report carries PostgreSQL's CPU time and lock waits. On
//! SQLite it is refused (a file serves one process).

mod common;

use common::*;
use std::process::Command;

#[test]
fn two_nodes_drain_one_postgres_queue_and_report_the_database_side() {
    let schema = Schema::fresh("bench_nodes");
    let output = Command::new(BIN)
        .args([
            "bench",
            "--workload",
            "drain",
            "--jobs",
            "600",
            "--concurrency",
            "5",
        ])
        .args(["--nodes", "2", "--json", "--store", &schema.url()])
        .env("CONVEYOR_LOG", "warn")
        .output()
        .expect("run bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let line: serde_json::Value = serde_json::from_str(stdout.trim()).expect("one JSON line");
    assert_eq!(line["workload"], "drain");
    assert_eq!(line["nodes"], 2);
    assert_eq!(line["jobs"], 600);
    assert!(line["jobs_per_s"].as_f64().is_some_and(|rate| rate > 0.0));
    assert!(line["activity_samples"].as_u64().is_some());
    assert!(line.get("postgres_cpu_seconds").is_some());
}

#[test]
fn nodes_on_sqlite_are_refused_with_the_reason() {
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "bench.db").display());
    let output = Command::new(BIN)
        .args([
            "bench",
            "--workload",
            "drain",
            "--jobs",
            "10",
            "--nodes",
            "2",
        ])
        .args(["--store", &store])
        .output()
        .expect("run bench");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("--nodes needs --store postgres"),
        "{stderr}"
    );
}
