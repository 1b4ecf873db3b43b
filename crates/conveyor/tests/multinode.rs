//! Scale-out on the real PostgreSQL: two `conveyor serve` processes and three worker processes
//! share one schema. 20,000 jobs are enqueued across both servers; one worker and then the
//! maintenance leader are killed with `kill -9` mid-run; every job still completes, and
//! leadership moves to the surviving server.

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

const JOBS: usize = 20_000;
const BATCH: usize = 1_000;
const CONCURRENCY: &str = "8";

/// Job id -> how many times a handler ran it, from the workers' run logs.
fn runs(dir: &Path) -> HashMap<String, usize> {
    let mut runs = HashMap::new();
    for n in 1..=3 {
        let text = std::fs::read_to_string(dir.join(format!("runs-{n}"))).unwrap_or_default();
        for id in text.lines().filter(|l| l.len() == 36) {
            *runs.entry(id.to_string()).or_insert(0) += 1;
        }
    }
    runs
}

fn completed(server: &str) -> u64 {
    let queues: Value = http()
        .get(format!("{server}/v1/queues"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["completed"].as_u64().unwrap())
        .sum()
}

#[test]
fn two_servers_three_workers_survive_kill_9_of_a_worker_and_the_leader() {
    let dir = temp_dir();
    let schema = Schema::fresh("conveyor_mn");
    let store = schema.url();
    migrate(&store);

    let server_args = [
        "--maintenance-interval-ms",
        "200",
        "--leader-ttl-ms",
        "1500",
    ];
    let mut servers = [
        start_server_at(&store, &server_args),
        start_server_at(&store, &server_args),
    ];
    let leader = eventually_blocking("one server to lead maintenance", || {
        let leading: Vec<usize> = (0..2).filter(|&i| is_leader(&servers[i].url)).collect();
        (leading.len() == 1).then(|| leading[0])
    });
    let follower = 1 - leader;
    let (leader_url, follower_url) = (servers[leader].url.clone(), servers[follower].url.clone());

    // 20,000 jobs, half through each server, in all-or-nothing batches.
    let http = http();
    for b in 0..JOBS / BATCH {
        let url = if b % 2 == 0 {
            &leader_url
        } else {
            &follower_url
        };
        let jobs: Vec<Value> = (0..BATCH)
            .map(|i| json!({"kind": "record", "payload": {"n": b * BATCH + i}}))
            .collect();
        let response = http
            .post(format!("{url}/v1/jobs/batch"))
            .json(&json!({"jobs": jobs}))
            .send()
            .unwrap();
        assert_eq!(response.status().as_u16(), 201);
    }

    // Each worker appends the id of every job it runs to its own log.
    let worker = |n: usize, server: &str| {
        let exec = format!(
            "echo \"$CONVEYOR_JOB_ID\" >> {}",
            dir.path().join(format!("runs-{n}")).display()
        );
        start_worker(
            server,
            &exec,
            &["--concurrency", CONCURRENCY, "--lease-ms", "2000"],
        )
    };
    let mut doomed = worker(1, &leader_url);
    let _w2 = worker(2, &follower_url);
    let _w3 = worker(3, &follower_url);

    // Each run spawns a shell; on a loaded two-core machine 5,000 of them take well over the
    // default wait, and how fast they go is the benchmarks' business, not this test's.
    eventually_blocking_within(
        "a quarter of the jobs to run",
        Duration::from_secs(300),
        || (runs(dir.path()).len() >= JOBS / 4).then_some(()),
    );
    doomed.kill_9();
    servers[leader].proc.kill_9();
    eventually_blocking("leadership to move to the surviving server", || {
        is_leader(&follower_url).then_some(())
    });

    eventually_blocking_within("every job to complete", Duration::from_secs(600), || {
        (completed(&follower_url) == JOBS as u64).then_some(())
    });
    let runs = runs(dir.path());
    assert_eq!(runs.len(), JOBS, "every job ran");
    let reruns: Vec<_> = runs.iter().filter(|(_, &n)| n > 1).collect();
    // At-least-once: only jobs in flight on the killed worker (at most its concurrency) may
    // have run twice; none ran three times.
    assert!(
        reruns.len() <= 8,
        "too many jobs ran twice: {}",
        reruns.len()
    );
    assert!(reruns.iter().all(|(_, &n)| n == 2), "{reruns:?}");
    let queues: Value = http
        .get(format!("{follower_url}/v1/queues"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let q = &queues["queues"][0];
    assert_eq!(
        (
            q["available"].as_u64(),
            q["running"].as_u64(),
            q["dead"].as_u64()
        ),
        (Some(0), Some(0), Some(0))
    );
}
