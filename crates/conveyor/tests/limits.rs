//! Limits with real processes: rate limits and concurrency limits hold across worker
//! processes and servers, and one tenant's flood does not hold back another tenant's job.
//! Each runs on the embedded SQLite store and on PostgreSQL (there with two servers sharing
//! one schema, so the limits are shown to hold across nodes).

mod common;

use common::*;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

fn completed(server: &str, queue: &str) -> u64 {
    let stats: Value = http()
        .get(format!("{server}/v1/queues"))
        .send()
        .expect("GET queues")
        .json()
        .expect("queues JSON");
    stats["queues"]
        .as_array()
        .expect("queues")
        .iter()
        .find(|q| q["name"] == queue)
        .map_or(0, |q| q["completed"].as_u64().unwrap_or(0))
}

/// The handler script: appends "start <ns>", runs for `seconds`, appends "end <ns>".
fn recording_exec(log: &Path, seconds: &str) -> String {
    format!(
        "echo \"start $(date +%s%N)\" >> {log}; sleep {seconds}; echo \"end $(date +%s%N)\" >> {log}",
        log = log.display()
    )
}

/// (nanoseconds, +1 for a start / -1 for an end), sorted; ends sort before starts at the same
/// instant.
fn events(log: &Path) -> Vec<(u128, i32)> {
    let mut events: Vec<(u128, i32)> = std::fs::read_to_string(log)
        .expect("read log")
        .lines()
        .map(|line| {
            let (what, at) = line.split_once(' ').expect("event line");
            (
                at.parse().expect("timestamp"),
                if what == "start" { 1 } else { -1 },
            )
        })
        .collect();
    events.sort();
    events
}

/// 200 jobs under a rate limit of 20 per second, worked by two worker processes with 10 slots
/// each (on PostgreSQL, one per server): the handlers' recorded start times span at least
/// ~9 s, and no 1-second window holds more than 20 of them.
fn rate_limit_spreads_starts(backend: Backend) {
    let dir = temp_dir();
    let servers = backend.servers();
    set_queue(
        &servers[0].url,
        "api",
        json!({"rate_limit": {"count": 20, "period_ms": 1000}}),
    );
    let jobs: Vec<Value> = (0..200)
        .map(|n| json!({"kind": "call", "queue": "api", "payload": {"n": n}}))
        .collect();
    enqueue_many(&servers[0].url, jobs);
    let log = path_in(&dir, "starts.log");
    let exec = recording_exec(&log, "0");
    let _workers: Vec<Proc> = (0..2)
        .map(|n| {
            let server = &servers[n % servers.len()].url;
            start_worker(server, &exec, &["--queues", "api", "--concurrency", "10"])
        })
        .collect();
    eventually_blocking_within("all 200 jobs to complete", Duration::from_secs(60), || {
        (completed(&servers[0].url, "api") == 200).then_some(())
    });
    // The handlers' own records: every job ran, and the runs spread over ~9 s.
    let handler_starts: Vec<u128> = events(&log)
        .into_iter()
        .filter(|(_, delta)| *delta == 1)
        .map(|(at, _)| at)
        .collect();
    assert_eq!(handler_starts.len(), 200);
    let span_ms = (handler_starts[199] - handler_starts[0]) / 1_000_000;
    assert!(
        span_ms >= 8_500,
        "200 starts at 20/s took only {span_ms} ms"
    );
    // The store's record of each start (the claim time, which the limit governs; the handlers'
    // records add process start-up jitter): the 21st start after any start comes at least a
    // period later.
    let listed: Value = http()
        .get(format!("{}/v1/jobs?queue=api&limit=500", servers[0].url))
        .send()
        .expect("GET jobs")
        .json()
        .expect("jobs JSON");
    let mut starts: Vec<chrono::DateTime<chrono::Utc>> = listed["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|job| {
            job["started_at"]
                .as_str()
                .expect("started_at")
                .parse()
                .expect("timestamp")
        })
        .collect();
    starts.sort();
    assert_eq!(starts.len(), 200);
    for (first, twenty_first) in starts.iter().zip(starts.iter().skip(20)) {
        let gap = *twenty_first - *first;
        assert!(
            gap >= chrono::Duration::milliseconds(1000),
            "21 starts within {gap}"
        );
    }
}

#[test]
fn rate_limit_spreads_starts_on_sqlite() {
    rate_limit_spreads_starts(Backend::Sqlite(temp_dir()));
}

#[test]
fn rate_limit_spreads_starts_across_two_postgres_nodes() {
    rate_limit_spreads_starts(Backend::Postgres(Schema::fresh("flow_rate")));
}

/// Tenant A enqueues 10,000 jobs, then tenant B one: a worker with two slots starts B's job in
/// its first turn, not after A's flood.
fn tenant_flood_does_not_delay_another_tenant(backend: Backend) {
    let dir = temp_dir();
    let servers = backend.servers();
    let server = &servers[0].url;
    let flood: Vec<Value> = (0..10_000)
        .map(|n| json!({"kind": "sync", "queue": "shared", "tenant": "a", "payload": {"n": n}}))
        .collect();
    enqueue_many(server, flood);
    let single = enqueue(
        server,
        json!({"kind": "sync", "queue": "shared", "tenant": "b"}),
    );
    let b_id = single["id"].as_str().expect("id").to_string();
    let log = path_in(&dir, "order.log");
    let exec = format!("echo \"$CONVEYOR_JOB_ID\" >> {}", log.display());
    let mut worker = start_worker(server, &exec, &["--queues", "shared", "--concurrency", "2"]);
    let position = eventually_blocking("tenant b's job to start", || {
        let order = std::fs::read_to_string(&log).unwrap_or_default();
        order.lines().position(|id| id == b_id)
    });
    worker.kill_9();
    assert!(
        position < 4,
        "tenant b's job started as number {} after 10,000 of tenant a's",
        position + 1
    );
}

#[test]
fn tenant_flood_does_not_delay_another_tenant_on_sqlite() {
    tenant_flood_does_not_delay_another_tenant(Backend::Sqlite(temp_dir()));
}

#[test]
fn tenant_flood_does_not_delay_another_tenant_on_postgres() {
    tenant_flood_does_not_delay_another_tenant(Backend::Postgres(Schema::fresh("flow_fair")));
}

/// A concurrency limit of 3 and three worker processes with four slots each, spread over two
/// servers on one PostgreSQL schema: the handlers' own records never show more than 3 running.
/// (The SQLite variant is in `cli.rs`.)
#[test]
fn concurrency_limit_holds_across_two_postgres_nodes() {
    let backend = Backend::Postgres(Schema::fresh("flow_conc"));
    let dir = temp_dir();
    let servers = backend.servers();
    set_queue(&servers[1].url, "narrow", json!({"concurrency_limit": 3}));
    let jobs: Vec<Value> = (0..15)
        .map(|_| json!({"kind": "slow", "queue": "narrow"}))
        .collect();
    enqueue_many(&servers[0].url, jobs);
    let log = path_in(&dir, "runs.log");
    let exec = recording_exec(&log, "0.2");
    let _workers: Vec<Proc> = (0..3)
        .map(|n| {
            start_worker(
                &servers[n % 2].url,
                &exec,
                &["--queues", "narrow", "--concurrency", "4"],
            )
        })
        .collect();
    eventually_blocking_within("all 15 jobs to complete", Duration::from_secs(60), || {
        (completed(&servers[0].url, "narrow") == 15).then_some(())
    });
    let (mut running, mut peak) = (0, 0);
    let events = events(&log);
    for (_, delta) in &events {
        running += delta;
        peak = peak.max(running);
    }
    assert_eq!(events.len(), 30);
    assert_eq!(peak, 3, "the limit is reached but never passed");
}

/// Back-pressure: with a maximum depth of 100, the 101st enqueue is refused with 429 and a
/// Retry-After header, and nothing is stored; once a worker has drained the queue, the same
/// enqueue succeeds.
fn max_depth_refuses_the_101st_until_drained(backend: Backend) {
    let servers = backend.servers();
    let server = &servers[0].url;
    set_queue(server, "inbox", json!({"max_depth": 100}));
    let jobs: Vec<Value> = (0..100)
        .map(|n| json!({"kind": "mail", "queue": "inbox", "payload": {"n": n}}))
        .collect();
    enqueue_many(server, jobs);
    let extra = json!({"kind": "mail", "queue": "inbox", "payload": {"n": 100}});
    // On PostgreSQL the other server refuses it too: the limit is the store's, not a process's.
    let refused = http()
        .post(format!("{}/v1/jobs", servers[servers.len() - 1].url))
        .json(&extra)
        .send()
        .expect("POST job");
    assert_eq!(refused.status(), 429);
    let retry_after: u64 = refused
        .headers()
        .get("retry-after")
        .expect("Retry-After header")
        .to_str()
        .expect("ascii")
        .parse()
        .expect("seconds");
    assert!(retry_after >= 1);
    let body: Value = refused.json().expect("error JSON");
    assert_eq!(body["error"]["code"], "queue_full");
    assert_eq!(body["error"]["field"], "queue");
    // Nothing of the refused enqueue was stored.
    let listed: Value = http()
        .get(format!("{server}/v1/jobs?queue=inbox&limit=500"))
        .send()
        .expect("GET jobs")
        .json()
        .expect("jobs JSON");
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(100));
    let _worker = start_worker(server, "true", &["--queues", "inbox", "--concurrency", "8"]);
    eventually_blocking("the queue to drain", || {
        (completed(server, "inbox") == 100).then_some(())
    });
    let accepted = enqueue(server, extra);
    let id = accepted["id"].as_str().expect("id");
    assert_eq!(
        get_job(server, id)["queue"],
        "inbox",
        "stored once accepted"
    );
    eventually_blocking("the accepted job to run", || {
        (get_job(server, id)["state"] == "completed").then_some(())
    });
    assert_eq!(
        completed(server, "inbox"),
        101,
        "exactly the 100 and the accepted one"
    );
}

#[test]
fn max_depth_refuses_the_101st_until_drained_on_sqlite() {
    max_depth_refuses_the_101st_until_drained(Backend::Sqlite(temp_dir()));
}

#[test]
fn max_depth_refuses_the_101st_until_drained_across_two_postgres_nodes() {
    max_depth_refuses_the_101st_until_drained(Backend::Postgres(Schema::fresh("flow_depth")));
}

fn put_limit(server: &str, name: &str, limit: Value) {
    let response = http()
        .put(format!("{server}/v1/limits/{name}"))
        .json(&limit)
        .send()
        .expect("PUT limit");
    assert_eq!(response.status(), 201, "{:?}", response.text());
}

/// The handler script for jobs whose payload names a `customer`: appends "start <customer>
/// <ns>", runs for `seconds`, appends "end <customer> <ns>".
fn customer_recording_exec(log: &Path, seconds: &str) -> String {
    format!(
        "c=$(sed 's/.*\"customer\": *\"\\([a-z0-9]*\\)\".*/\\1/'); \
         echo \"start $c $(date +%s%N)\" >> {log}; sleep {seconds}; \
         echo \"end $c $(date +%s%N)\" >> {log}",
        log = log.display()
    )
}

/// The most jobs the log shows running at once, per customer and in total.
fn peaks(log: &Path) -> (std::collections::BTreeMap<String, i32>, i32) {
    let mut events: Vec<(u128, i32, String)> = std::fs::read_to_string(log)
        .expect("read log")
        .lines()
        .map(|line| {
            let mut parts = line.split(' ');
            let what = parts.next().expect("event");
            let customer = parts.next().expect("customer").to_string();
            let at = parts.next().expect("time").parse().expect("timestamp");
            (at, if what == "start" { 1 } else { -1 }, customer)
        })
        .collect();
    // Ends sort before starts at the same instant.
    events.sort();
    let mut running: std::collections::BTreeMap<String, i32> = Default::default();
    let mut peaks: std::collections::BTreeMap<String, i32> = Default::default();
    let (mut total, mut total_peak) = (0, 0);
    for (_, delta, customer) in events {
        let now = running.entry(customer.clone()).or_default();
        *now += delta;
        let peak = peaks.entry(customer).or_default();
        *peak = (*peak).max(*now);
        total += delta;
        total_peak = total_peak.max(total);
    }
    (peaks, total_peak)
}

/// Two named limits on one queue, set through different servers on one PostgreSQL schema: at
/// most 2 jobs per customer (a key from the payload) and 5 in total. Jobs enqueued through both
/// servers, four worker processes with four slots each spread over both: the handlers' own
/// records show each customer reaching 2 and never passing it, and the total never passing 5.
#[test]
fn named_limits_hold_per_key_and_in_total_across_two_postgres_nodes() {
    let backend = Backend::Postgres(Schema::fresh("named_limits"));
    let dir = temp_dir();
    let servers = backend.servers();
    put_limit(
        &servers[0].url,
        "per-customer",
        json!({"concurrency": 2, "key": "payload.customer"}),
    );
    put_limit(&servers[1].url, "vendor", json!({"concurrency": 5}));
    set_queue(
        &servers[1].url,
        "calls",
        json!({"limits": ["per-customer", "vendor"]}),
    );
    for (n, server) in servers.iter().enumerate() {
        let jobs: Vec<Value> = (0..12)
            .map(|i| {
                let customer = ["acme", "globex", "initech", "umbrella"][(i + n) % 4];
                json!({"kind": "call", "queue": "calls", "payload": {"customer": customer}})
            })
            .collect();
        enqueue_many(&server.url, jobs);
    }
    let log = path_in(&dir, "runs.log");
    let exec = customer_recording_exec(&log, "0.3");
    let _workers: Vec<Proc> = (0..4)
        .map(|n| {
            start_worker(
                &servers[n % 2].url,
                &exec,
                &["--queues", "calls", "--concurrency", "4"],
            )
        })
        .collect();
    eventually_blocking_within("all 24 jobs to complete", Duration::from_secs(120), || {
        (completed(&servers[0].url, "calls") == 24).then_some(())
    });
    let (per_customer, total) = peaks(&log);
    assert_eq!(per_customer.len(), 4, "{per_customer:?}");
    for (customer, peak) in &per_customer {
        assert!(
            *peak <= 2,
            "{customer} ran {peak} at once: {per_customer:?}"
        );
    }
    assert!(
        per_customer.values().any(|peak| *peak == 2),
        "the per-customer limit is reached: {per_customer:?}"
    );
    assert!(total <= 5, "{total} ran at once");
    let usage: Value = http()
        .get(format!("{}/v1/limits/per-customer", servers[1].url))
        .send()
        .expect("GET limit")
        .json()
        .expect("limit JSON");
    assert_eq!(usage["concurrency"], 2, "{usage}");
    assert_eq!(
        usage["usage"].as_array().map(Vec::len),
        Some(0),
        "nothing runs any more: {usage}"
    );
}

/// Fairness among a keyed limit's keys: 10,000 jobs of one customer enqueued first, then ten
/// jobs each of nine others, under a per-customer limit too wide to hold anyone back. Worked two
/// at a time, every one of the 90 small customers' jobs starts within the first 120 starts (a
/// turn is one job per customer, so ten turns serve them all), not after the 10,000.
fn keys_take_turns(backend: Backend) {
    let dir = temp_dir();
    let servers = backend.servers();
    let first = &servers[0].url;
    let last = &servers[servers.len() - 1].url;
    put_limit(
        first,
        "per-customer",
        json!({"concurrency": 1000, "key": "payload.customer"}),
    );
    set_queue(last, "fair", json!({"limits": ["per-customer"]}));
    let flood: Vec<Value> = (0..10_000)
        .map(|_| json!({"kind": "sync", "queue": "fair", "payload": {"customer": "big"}}))
        .collect();
    enqueue_many(first, flood);
    let small: Vec<Value> = (1..=9)
        .flat_map(|n| {
            (0..10).map(move |_| {
                json!({"kind": "sync", "queue": "fair", "payload": {"customer": format!("small{n}")}})
            })
        })
        .collect();
    enqueue_many(last, small);
    let log = path_in(&dir, "order.log");
    // The payload comes on stdin without a final newline, so the line is ended by echo.
    let exec = format!(
        "c=$(sed 's/.*\"customer\": *\"\\([a-z0-9]*\\)\".*/\\1/'); echo \"$c\" >> {}",
        log.display()
    );
    let mut workers: Vec<Proc> = servers
        .iter()
        .map(|server| {
            start_worker(
                &server.url,
                &exec,
                &["--queues", "fair", "--concurrency", "1"],
            )
        })
        .collect();
    let order = eventually_blocking("the 90 small customers' jobs to start", || {
        let order = std::fs::read_to_string(&log).unwrap_or_default();
        let smalls = order.lines().filter(|c| c.starts_with("small")).count();
        (smalls == 90).then_some(order)
    });
    for worker in &mut workers {
        worker.kill_9();
    }
    let lines: Vec<&str> = order.lines().collect();
    let last_small = lines
        .iter()
        .rposition(|c| c.starts_with("small"))
        .expect("a small customer");
    assert!(
        last_small < 120,
        "the last small customer's job started as number {} of {}",
        last_small + 1,
        lines.len()
    );
}

#[test]
fn keys_take_turns_on_sqlite() {
    keys_take_turns(Backend::Sqlite(temp_dir()));
}

#[test]
fn keys_take_turns_across_two_postgres_nodes() {
    keys_take_turns(Backend::Postgres(Schema::fresh("named_fair")));
}
