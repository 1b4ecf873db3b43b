//! Structure-aware HTTP fuzzing of every route (issue 9's fault-injection suite), bounded for CI.
//!
//! Two routers run in-process over real SQLite stores in temp dirs, each served on a loopback
//! port with `axum::serve`: one with access control off, one with it on (requests carry an
//! admin, producer or worker token, a session cookie, or broken credentials). Every 100
//! requests a maintenance pass (rescue, stale workers, promotion, retention) and a cron scheduler
//! pass run over both stores, so whatever the fuzzer manages to store is also read back by them.
//!
//! For every route the generator starts from a VALID request (real job ids, lease tokens, dead
//! jobs, schedule and token names, learnt from earlier answers) and mutates it structurally:
//! dropped fields, wrong types, boundary and overflowing numbers (`u64::MAX`, `i64::MAX + 1`,
//! `-1`, `1e308`, `1e400`, `NaN`), very long strings, unicode, NUL characters in strings and
//! keys, deep nesting, empty and huge arrays, duplicate keys, unknown keys, non-JSON bytes,
//! truncation, other content types; path parameters and query strings get the same treatment.
//! Requests are written as raw HTTP/1.1 (nothing normalises them on the way) on a fresh
//! connection each.
//!
//! Every answer must be below 500, every 4xx must be `{"error": {"code", "field", "message"}}`
//! as JSON, no panic may happen anywhere in the process (a panic hook records them), and a 2xx
//! must mean what it says: an accepted job, queue setting, schedule or worker heartbeat reads
//! back exactly as answered (no silent clamping, no precision the store drops), and every 2xx
//! must be readable by serde_json with its default limits, as Conveyor's own clients read it.
//! Afterwards both servers still enqueue, fetch and complete, and maintenance still succeeds.
//!
//! The seed is fixed so CI is reproducible; explore others with
//! `CONVEYOR_FUZZ_SEED=<u64> CONVEYOR_FUZZ_REQUESTS=<n> cargo nextest run -p conveyor-server --test fuzz`.
//! A failure prints the seed, the request number and the exact request bytes.

mod check;
#[path = "../common/mod.rs"]
mod common;
mod generate;
mod learnt;
mod raw_http;

use common::TestServer;
use conveyor_core::{Role, Store};
use conveyor_server::ServerConfig;
use conveyor_worker::{Maintenance, Scheduler};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use uuid::Uuid;

const DEFAULT_SEED: u64 = 0x5EED_C0DE_0009;
const DEFAULT_REQUESTS: usize = 4000;
/// Largest payload the fuzzed servers accept (so the 413 paths are cheap to reach); the whole
/// body limit is then 1 MiB.
const MAX_PAYLOAD: usize = 16 * 1024;
const BODY_LIMIT: usize = 1024 * 1024;
const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);
/// Answers slower than this are listed (not failed) at the end.
const SLOW: Duration = Duration::from_secs(1);

use check::*;
use generate::*;
use learnt::*;
use raw_http::*;

// ---------------------------------------------------------------------------------------------
// Panics anywhere in the process (handler tasks, the SQLite writer thread, maintenance).
// ---------------------------------------------------------------------------------------------

static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

fn record_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        PANICS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(format!("thread {thread}: {info}"));
        default(info);
    }));
}

fn panics() -> Vec<String> {
    PANICS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

// ---------------------------------------------------------------------------------------------
// The servers.
// ---------------------------------------------------------------------------------------------

/// A test server and, with access control on, a token of each role.
struct Server {
    server: TestServer,
    admin: Option<String>,
    producer: Option<String>,
    worker: Option<String>,
}

impl std::ops::Deref for Server {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.server
    }
}

fn config() -> ServerConfig {
    ServerConfig {
        max_payload_bytes: MAX_PAYLOAD,
        // A fuzzed `wait_ms` must not hold the run up.
        max_fetch_wait: Duration::from_millis(20),
        fetch_poll: Duration::from_millis(10),
        ..ServerConfig::default()
    }
}

async fn start(auth: bool) -> Server {
    let server = TestServer::start_with_options(config(), common::auth(auth)).await;
    let mut secrets = Vec::new();
    if auth {
        for role in [Role::Admin, Role::Producer, Role::Worker] {
            secrets.push(server.token(role, &format!("fuzz-{role}")).await);
        }
    }
    let mut secrets = secrets.into_iter();
    Server {
        server,
        admin: secrets.next(),
        producer: secrets.next(),
        worker: secrets.next(),
    }
}

// ---------------------------------------------------------------------------------------------
// After the run: both servers still do their job.
// ---------------------------------------------------------------------------------------------

async fn call(server: &Server, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = match &body {
        Some(body) => Req::json("check", method, path.to_string(), body),
        None => Req::new("check", method, path.to_string()),
    };
    if let Some(admin) = &server.admin {
        req.headers
            .push(("authorization".into(), format!("Bearer {admin}")));
    }
    let answer = send(server.addr, &req)
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
    (answer.status, answer.json().unwrap_or(Value::Null))
}

async fn still_works(server: &Server) {
    assert!(!server.task.is_finished(), "the server task ended");
    let queue = format!("after-fuzz-{}", Uuid::new_v4().simple());
    let (status, job) = call(
        server,
        "POST",
        "/v1/jobs",
        Some(json!({"kind": "after_fuzz", "queue": queue, "payload": {"n": 1}})),
    )
    .await;
    assert_eq!(status, 201, "enqueue after fuzzing: {job}");
    let id = job["id"].as_str().expect("id").to_string();
    let (status, fetched) = call(
        server,
        "POST",
        "/v1/fetch",
        Some(json!({"worker_id": "after-fuzz", "queues": [queue], "max": 5})),
    )
    .await;
    assert_eq!(status, 200, "fetch after fuzzing: {fetched}");
    let jobs = fetched["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "{fetched}");
    assert_eq!(jobs[0]["id"], id.as_str());
    let token = jobs[0]["lease_token"].as_str().expect("token");
    let (status, done) = call(
        server,
        "POST",
        &format!("/v1/jobs/{id}/complete"),
        Some(json!({"lease_token": token, "result": {"ok": true}})),
    )
    .await;
    assert_eq!(status, 200, "complete after fuzzing: {done}");
    let (status, job) = call(server, "GET", &format!("/v1/jobs/{id}"), None).await;
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["attempt"], 1, "{job}");
    assert_eq!(job["result"], json!({"ok": true}), "{job}");
    let (status, health) = call(server, "GET", "/healthz", None).await;
    assert_eq!(status, 200, "{health}");
}

fn env_number(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    let text = text.trim();
    let parsed = match text.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => text.parse(),
    };
    Some(parsed.unwrap_or_else(|e| panic!("{name}={text:?} is not a number: {e}")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_survives_structured_garbage() {
    record_panics();
    let seed = env_number("CONVEYOR_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let requests = env_number("CONVEYOR_FUZZ_REQUESTS").map_or(DEFAULT_REQUESTS, |n| n as usize);
    println!("fuzz seed {seed} ({seed:#x}), {requests} requests; reproduce with CONVEYOR_FUZZ_SEED={seed}");

    let open = start(false).await;
    let auth = start(true).await;
    // Maintenance and the cron scheduler read whatever the fuzzer stored: a pass over each
    // store every 100 requests (between requests, so the run stays reproducible).
    let maintenance = |store: &Arc<dyn Store>| {
        (
            Maintenance::new(store.clone()).without_scheduler(),
            Scheduler::new(store.clone()),
        )
    };
    let passes = [maintenance(&open.store), maintenance(&auth.store)];

    // Something to work on from the start: jobs, leases and a dead job.
    let mut world = World::default();
    let mut fuzzer = Gen {
        rng: StdRng::seed_from_u64(seed),
        raws: Vec::new(),
    };
    for queue in QUEUES {
        for _ in 0..3 {
            let (status, job) = call(
                &open,
                "POST",
                "/v1/jobs",
                Some(json!({"kind": "fz_seed", "queue": queue, "payload": {"user": 1}})),
            )
            .await;
            assert_eq!(status, 201, "{job}");
            keep(
                &mut world.jobs,
                job["id"].as_str().unwrap().parse().unwrap(),
            );
        }
    }
    let (status, fetched) = call(
        &open,
        "POST",
        "/v1/fetch",
        Some(json!({"worker_id": "fz-seed", "queues": QUEUES, "max": 8})),
    )
    .await;
    assert_eq!(status, 200, "{fetched}");
    for job in fetched["jobs"].as_array().unwrap() {
        let id: Uuid = job["id"].as_str().unwrap().parse().unwrap();
        let token: Uuid = job["lease_token"].as_str().unwrap().parse().unwrap();
        keep(&mut world.leases, (id, token));
    }
    let (dead_id, dead_token) = world.leases.pop().expect("a lease");
    let (status, dead) = call(
        &open,
        "POST",
        &format!("/v1/jobs/{dead_id}/fail"),
        Some(json!({"lease_token": dead_token, "error": {"message": "x"}, "retry": "never"})),
    )
    .await;
    assert_eq!(status, 200, "{dead}");
    keep(&mut world.dead, dead_id);

    let mut run = Run {
        seed,
        failures: BTreeMap::new(),
        failure_count: 0,
        slow: Vec::new(),
        statuses: BTreeMap::new(),
    };
    let started = Instant::now();
    for index in 0..requests {
        let mut req = fuzzer.request(&world);
        let server = if fuzzer.chance(0.2) {
            req.auth_server = true;
            fuzzer.credentials(&mut req, &auth, &world);
            &auth
        } else {
            &open
        };
        let before = Instant::now();
        let answer = send(server.addr, &req).await;
        let took = before.elapsed();
        if took > SLOW {
            run.slow.push(format!(
                "{took:?} for request #{index}:\n{}",
                req.describe()
            ));
        }
        let oversized = req.body.as_ref().is_some_and(|b| b.len() > BODY_LIMIT);
        match answer {
            Err(error) if oversized => {
                // Closing early on a body over the limit is legitimate HTTP.
                let _ = error;
            }
            Err(error) => {
                run.fail(
                    index,
                    &req,
                    "no answer (panic or dropped connection)",
                    error,
                );
            }
            Ok(answer) => {
                *run.statuses
                    .entry((req.route.to_string(), answer.status))
                    .or_default() += 1;
                check_shape(&mut run, index, &req, &answer);
                learn_and_verify(&mut run, &mut world, index, server, &req, &answer).await;
            }
        }
        if index % 100 == 99 {
            for (maintenance, scheduler) in &passes {
                if let Err(error) = maintenance.run_once().await {
                    run.fail(
                        index,
                        &req,
                        "maintenance pass failed after it",
                        error.to_string(),
                    );
                }
                if let Err(error) = scheduler.run_once().await {
                    run.fail(
                        index,
                        &req,
                        "scheduler pass failed after it",
                        error.to_string(),
                    );
                }
            }
        }
        // Keep some jobs to lease: refill when the fuzzer has used them up.
        if index % 200 == 199 {
            let queue = *fuzzer.pick(QUEUES);
            let (status, fetched) = call(
                &open,
                "POST",
                "/v1/fetch",
                Some(json!({"worker_id": "fz-refill", "queues": [queue], "max": 5})),
            )
            .await;
            if status == 200 {
                for job in fetched["jobs"].as_array().into_iter().flatten() {
                    let id = job["id"].as_str().and_then(|s| s.parse().ok());
                    let token = job["lease_token"].as_str().and_then(|s| s.parse().ok());
                    if let (Some(id), Some(token)) = (id, token) {
                        keep(&mut world.leases, (id, token));
                    }
                }
            }
        }
    }
    let fuzz_time = started.elapsed();

    let mut summary = String::new();
    for ((route, status), count) in &run.statuses {
        let _ = writeln!(summary, "  {route:<36} {status}: {count}");
    }
    println!("{requests} requests in {fuzz_time:?}; answers by route and status:\n{summary}");
    for slow in &run.slow {
        println!("slow answer: {slow}");
    }

    // Afterwards: both servers work, and maintenance over the fuzzed store succeeds.
    still_works(&open).await;
    still_works(&auth).await;
    for (maintenance, scheduler) in &passes {
        let pass = maintenance
            .run_once()
            .await
            .expect("a maintenance pass over the fuzzed store");
        let fired = scheduler
            .run_once()
            .await
            .expect("a scheduler pass over the fuzzed store");
        println!("after fuzzing: {pass:?}, {fired:?}");
    }

    let panics = panics();
    let mut report = String::new();
    for panic in &panics {
        let _ = writeln!(report, "PANIC: {panic}");
    }
    for failure in run.failures.values() {
        let _ = writeln!(report, "{failure}");
    }
    assert!(
        panics.is_empty() && run.failures.is_empty(),
        "fuzzing with seed {seed} found {} failing requests ({} kinds) and {} panics:\n{report}",
        run.failure_count,
        run.failures.len(),
        panics.len()
    );
}
