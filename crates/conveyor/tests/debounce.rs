//! Debounce with real processes: a storm of 10,000 enqueues over 100 keys, sent in batches
//! (on PostgreSQL alternately to two servers sharing one schema), becomes exactly 100 runs,
//! each with its key's last payload.

mod common;

use common::*;
use serde_json::{json, Value};
use std::time::Duration;

const KEYS: u64 = 100;
const ENQUEUES: u64 = 10_000;

fn debounce_storm(backend: Backend) {
    let dir = temp_dir();
    let servers = backend.servers();
    let jobs: Vec<Value> = (0..ENQUEUES)
        .map(|n| {
            json!({
                "kind": "profile.sync", "queue": "storm",
                "payload": {"user": format!("u{}", n % KEYS), "n": n},
                "debounce": {"key": "payload.user", "delay_ms": 3000},
            })
        })
        .collect();
    let mut folded = 0;
    for (index, chunk) in jobs.chunks(500).enumerate() {
        let body = enqueue_batch(&servers[index % servers.len()].url, chunk);
        folded += body["debounced_into"]
            .as_array()
            .map_or(0, |ids| ids.iter().filter(|id| !id.is_null()).count());
    }
    assert_eq!(
        folded as u64,
        ENQUEUES - KEYS,
        "all but each key's first folded"
    );

    let log = path_in(&dir, "runs.log");
    // One write per run (a line well under PIPE_BUF appends whole beside concurrent ones).
    let exec = format!("p=$(cat); echo \"$p\" >> {}", log.display());
    let _workers: Vec<Proc> = servers
        .iter()
        .map(|s| start_worker(&s.url, &exec, &["--queues", "storm", "--concurrency", "8"]))
        .collect();
    let server = &servers[0].url;
    let listed = eventually_blocking_within(
        "every key's job to complete",
        Duration::from_secs(60),
        || {
            let listed: Value = http()
                .get(format!("{server}/v1/jobs?queue=storm&limit=500"))
                .send()
                .expect("GET jobs")
                .json()
                .expect("jobs JSON");
            let jobs = listed["jobs"].as_array().cloned().unwrap_or_default();
            jobs.iter()
                .all(|job| job["state"] == "completed")
                .then_some(jobs)
        },
    );
    assert_eq!(listed.len() as u64, KEYS, "one job per key");
    for job in &listed {
        let user = job["payload"]["user"].as_str().expect("user");
        let key: u64 = user[1..].parse().expect("key");
        assert_eq!(
            job["payload"]["n"].as_u64(),
            Some(ENQUEUES - KEYS + key),
            "{user} ran with its last payload"
        );
        assert_eq!(job["attempt"], 1);
    }
    let runs: Vec<Value> = std::fs::read_to_string(&log)
        .expect("log")
        .lines()
        .map(|line| serde_json::from_str(line).expect("a payload"))
        .collect();
    assert_eq!(runs.len() as u64, KEYS, "exactly one run per key");
}

#[test]
fn a_debounce_storm_runs_each_key_once_with_its_last_payload_on_sqlite() {
    debounce_storm(Backend::Sqlite(temp_dir()));
}

#[test]
fn a_debounce_storm_runs_each_key_once_with_its_last_payload_on_two_postgres_servers() {
    debounce_storm(Backend::Postgres(Schema::fresh("debounce_storm")));
}
