//! Clocks that disagree or jump (libfaketime on real server processes).
//!
//! Two `conveyor serve` on one PostgreSQL whose clocks disagree by 90 s (the maintenance
//! leader's), as a cluster on a bad day: a VM after suspend, a container on a drifting host, a
//! node whose NTP failed. Every time decision is the database's, so the skew changes nothing: a
//! live lease is never rescued early (its heartbeats keep answering, no second worker gets the
//! job), and a dead worker's lease is rescued once it expires, not 90 s late.
//!
//! One `conveyor serve` on SQLite whose wall clock steps an hour forward, then back: its lease
//! deadlines move with the step, so the same two promises hold.

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::Command;
use std::time::{Duration, Instant};

const LEASE_MS: u64 = 5_000;
const SKEW_SECS: i64 = 90;
const SERVER_ARGS: [&str; 4] = [
    "--maintenance-interval-ms",
    "200",
    "--leader-ttl-ms",
    "1500",
];

/// `conveyor serve` on `store` whose wall clock is `offset_secs` off; its monotonic clock is
/// left alone, as on a real machine whose wall clock is wrong.
fn skewed_server(store: &str, offset_secs: i64) -> Server {
    let offset = format!("{offset_secs:+}s");
    faked_server(store, &[("FAKETIME", offset.as_str())])
}

fn faked_server(store: &str, faking: &[(&str, &str)]) -> Server {
    let preload = libfaketime();
    let mut env = vec![
        ("LD_PRELOAD", preload.as_str()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    env.extend_from_slice(faking);
    start_server_with(
        &["--listen", "127.0.0.1:0", "--store", store],
        &SERVER_ARGS,
        &env,
    )
}

/// How far the store's clock (which stamps a new job's `created_at`) is from this process's.
/// (Not the `Date` header: hyper caches it until a second after it was made, which a clock
/// stepped back does not reach for an hour.)
fn store_offset_secs(server: &str) -> i64 {
    let probe = enqueue(
        server,
        json!({"kind": "probe", "queue": "probe", "payload": {}}),
    );
    let id = probe["id"].as_str().expect("id").to_string();
    let created = time(&get_job(server, &id)["created_at"]);
    created.timestamp() - chrono::Utc::now().timestamp()
}

/// The database's clock.
fn database_now(url: &str) -> chrono::DateTime<chrono::Utc> {
    let out = Command::new("psql")
        .args([url, "-Atc", "SELECT to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.MS\"Z\"')"])
        .output()
        .expect("psql");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("a timestamp from psql")
}

fn fetch(server: &str, worker: &str) -> Vec<Value> {
    let answer: Value = http()
        .post(format!("{server}/v1/fetch"))
        .json(&json!({"worker_id": worker, "queues": ["clocks"], "max": 1,
                      "lease_ms": LEASE_MS, "wait_ms": 0}))
        .send()
        .expect("fetch")
        .json()
        .expect("fetch JSON");
    answer["jobs"].as_array().cloned().unwrap_or_default()
}

fn time(value: &Value) -> chrono::DateTime<chrono::Utc> {
    value
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a time: {value}"))
}

/// A cluster of a skewed leader and a server with a true clock, on a fresh schema.
struct Cluster {
    leader: Server,
    other: Server,
    _schema: Schema,
    pg: String,
}

fn cluster(offset_secs: i64) -> Cluster {
    let schema = Schema::fresh("conveyor_clocks");
    let store = schema.url();
    migrate(&store);
    let leader = skewed_server(&store, offset_secs);
    eventually_blocking("the skewed server to lead maintenance", || {
        is_leader(&leader.url).then_some(())
    });
    let other = start_server_at(&store, &SERVER_ARGS);
    let offset = clock_offset_secs(&leader.url);
    assert!(
        (offset - offset_secs).abs() <= 2,
        "the leader's clock is {offset} s off, not {offset_secs} s: is libfaketime in effect?"
    );
    assert!(!is_leader(&other.url), "one leader");
    Cluster {
        leader,
        other,
        _schema: schema,
        pg: pg_base(),
    }
}

/// A worker holds a job through the true server for two leases, heartbeating every second,
/// while the skewed leader runs maintenance every 200 ms: no heartbeat is refused, no other
/// worker (through either server) is handed the job, and it completes on its first attempt.
fn live_lease_is_never_rescued(cluster: &Cluster) {
    let id = claim_and_hold(
        &cluster.other.url,
        &[&cluster.other.url, &cluster.leader.url],
        Some(&cluster.pg),
        || {},
    );
    let job = get_job(&cluster.other.url, &id);
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["attempt"], 1, "{job}");
}

/// Enqueues and claims a job through `via`, runs `meanwhile`, then holds the lease for two
/// leases with a heartbeat a second while other workers try every server, and completes it.
/// With `pg`, checks that the lease counts from the database's clock. The job's id.
fn claim_and_hold(
    via: &str,
    servers: &[&str],
    pg: Option<&str>,
    meanwhile: impl FnOnce(),
) -> String {
    let id = enqueue(
        via,
        json!({"kind": "clocked", "queue": "clocks", "payload": {}}),
    )["id"]
        .as_str()
        .expect("id")
        .to_string();
    let claimed = fetch(via, "holder");
    assert_eq!(claimed.len(), 1);
    let token = claimed[0]["lease_token"].clone();
    if let Some(pg) = pg {
        // The lease counts from the database's clock, whichever server wrote it.
        let expires = time(&claimed[0]["lease_expires_at"]);
        let expected = database_now(pg) + chrono::Duration::milliseconds(LEASE_MS as i64);
        assert!(
            (expires - expected).num_milliseconds().abs() < 1_500,
            "lease expires at {expires}, the database's now + lease is {expected}"
        );
    }
    meanwhile();
    let held_until = Instant::now() + Duration::from_millis(2 * LEASE_MS);
    while Instant::now() < held_until {
        for server in servers {
            assert!(
                fetch(server, "thief").is_empty(),
                "a second worker was handed the job through {server}"
            );
        }
        let beat = http()
            .post(format!("{via}/v1/jobs/{id}/heartbeat"))
            .json(&json!({"lease_token": token, "lease_ms": LEASE_MS}))
            .send()
            .expect("heartbeat");
        assert_eq!(
            beat.status().as_u16(),
            200,
            "heartbeat refused: the lease was taken"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    let done = http()
        .post(format!("{via}/v1/jobs/{id}/complete"))
        .json(&json!({"lease_token": token}))
        .send()
        .expect("complete");
    assert!(done.status().is_success(), "{}", done.status());
    id
}

/// A worker claims through the skewed server and dies: the leader rescues the job once the
/// lease expired by the database's clock, not before and not a skew later.
fn dead_lease_is_rescued_on_time(cluster: &Cluster) {
    claim_and_abandon(&cluster.leader.url, &cluster.other.url, || {});
}

/// Enqueues and claims a job through `via`, runs `meanwhile`, then never heartbeats: the job
/// must be rescued (seen through `observer`) once the lease expired, not before, not much later.
fn claim_and_abandon(via: &str, observer: &str, meanwhile: impl FnOnce()) {
    let id = enqueue(
        observer,
        json!({"kind": "clocked", "queue": "clocks", "payload": {}}),
    )["id"]
        .as_str()
        .expect("id")
        .to_string();
    let claimed = fetch(via, "doomed");
    assert_eq!(claimed.len(), 1);
    let claimed_at = Instant::now();
    meanwhile();
    let rescued = eventually_blocking_within(
        "the dead worker's job to be rescued",
        Duration::from_secs(20),
        || {
            let job = get_job(observer, &id);
            (job["state"] != "running").then_some(job)
        },
    );
    let after = claimed_at.elapsed();
    assert!(
        after >= Duration::from_millis(LEASE_MS - 500),
        "rescued {after:?} after the claim, before its {LEASE_MS} ms lease expired: {rescued}"
    );
    assert!(
        after < Duration::from_secs(15),
        "rescued {after:?} after the claim, long after its lease expired"
    );
}

#[test]
fn a_leader_90_s_fast_neither_rescues_live_leases_nor_delays_dead_ones() {
    let cluster = cluster(SKEW_SECS);
    live_lease_is_never_rescued(&cluster);
    dead_lease_is_rescued_on_time(&cluster);
}

#[test]
fn a_leader_90_s_slow_neither_rescues_live_leases_nor_delays_dead_ones() {
    let cluster = cluster(-SKEW_SECS);
    live_lease_is_never_rescued(&cluster);
    dead_lease_is_rescued_on_time(&cluster);
}

/// An embedded server's wall clock steps an hour forward while a worker holds a lease, then an
/// hour back after another worker claimed a job and died. The writer sees each step (its
/// steady clock disagrees with the wall by an hour) and moves running leases with it: the held
/// lease keeps answering its heartbeats and completes on its first attempt, and the dead
/// worker's job is rescued when its lease expires, not an hour later.
#[test]
fn an_embedded_server_whose_wall_clock_steps_an_hour_keeps_its_leases() {
    let dir = temp_dir();
    let db = path_in(&dir, "steps.db");
    let offset_file = path_in(&dir, "faketime");
    let set_offset = |spec: &str| std::fs::write(&offset_file, spec).expect("write the offset");
    set_offset("+0s");
    let file = offset_file.display().to_string();
    let server = faked_server(
        &format!("sqlite://{}", db.display()),
        &[
            ("FAKETIME_TIMESTAMP_FILE", file.as_str()),
            ("FAKETIME_CACHE_DURATION", "1"),
        ],
    );
    let url = server.url.clone();
    let step_to = |offset_secs: i64| {
        set_offset(&format!("{offset_secs:+}s"));
        eventually_blocking("the store's clock to step", || {
            ((store_offset_secs(&url) - offset_secs).abs() <= 2).then_some(())
        });
    };
    let id = claim_and_hold(&url, &[&url], None, || step_to(3_600));
    let job = get_job(&url, &id);
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["attempt"], 1, "{job}");
    claim_and_abandon(&url, &url, || step_to(0));
}
