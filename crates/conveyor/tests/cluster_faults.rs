//! The cluster fault suite: two or three `conveyor serve` on one PostgreSQL, with `conveyor work`
//! processes (Rust, over HTTP) and workers speaking the HTTP protocol from this test, under a
//! steady load, while one fault at a time hits the cluster and heals:
//!
//! - clocks 90 s fast and slow, and a maintenance leader whose clock jumps during the run;
//! - a paused server, then a paused worker (`SIGSTOP` past their leases, then `SIGCONT`);
//! - a worker cut off from its server longer than a lease, and one whose answers are lost
//!   (a one-way partition: the server hears it, it hears nothing);
//! - a server cut off from PostgreSQL mid-commit and mid-long-poll, healed once with the held
//!   bytes delivered and once with every connection reset;
//! - the maintenance leader cut off from PostgreSQL while the other server takes over;
//! - PostgreSQL restarted, with a fast and then an immediate shutdown.
//!
//! One history checker judges every run ([`History::check`]): every acknowledged enqueue
//! completes, and so does every job stored; no job's completion is accepted twice; no attempt is
//! handed to two workers; an attempt is rescued only when its lease really expired by the
//! database's clock, and only from a worker the fault cut off; nothing is left waiting or
//! running once the fault heals. Per-second schedules (where a leader is hit) fire every tick
//! exactly once.
//!
//! Partitions are made with the test proxy (`support/proxy.rs`) on the link concerned: holding
//! the bytes is a partition that heals before TCP gives up, resetting the connections one that
//! outlasts it, and dropping only the answers a one-way partition as the processes on either
//! side see it (the far side's TCP still delivers what it heard).

mod common;
#[path = "support/proxy.rs"]
mod proxy;

use chrono::{DateTime, Utc};
use common::*;
use proxy::{Mode, Proxy};
use serde_json::{json, Value};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// Every worker's lease; renewed every third of it.
const LEASE_MS: u64 = 4_000;
const QUEUE: &str = "faults";
/// Jobs of this kind run longer than a lease, so only heartbeats keep them.
const LONG: &str = "long";
const LONG_SECS: u64 = 6;
/// How recently a long job must have started for a fault to still find it held (it has
/// `LONG_SECS` minus this left, more than the fault takes to land).
const LONG_FRESH: chrono::TimeDelta = chrono::TimeDelta::milliseconds(1_500);
/// The backlog the producer keeps, so every worker always holds jobs when a fault lands.
const BACKLOG: u64 = 40;
const SERVER_ARGS: [&str; 4] = [
    "--maintenance-interval-ms",
    "200",
    "--leader-ttl-ms",
    "1500",
];
const SCHEDULE: &str = "pulse";

fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

fn socket_of(url: &str) -> SocketAddr {
    let url = reqwest::Url::parse(url).expect("a URL");
    let host = url.host_str().expect("a host");
    let port = url.port_or_known_default().expect("a port");
    format!("{host}:{port}").parse().expect("an IP address")
}

/// `url` with its port replaced (to reach the same service through a proxy).
fn with_port(url: &str, port: u16) -> String {
    let mut url = reqwest::Url::parse(url).expect("a URL");
    url.set_port(Some(port)).expect("a URL with a port");
    url.to_string()
}

/// What workers report that the store cannot: completions the servers accepted or refused.
#[derive(Default)]
struct Ledger {
    accepted: HashMap<String, Vec<String>>,
    refused: BTreeMap<String, usize>,
}

struct Node {
    server: Server,
    /// The proxy between this server and PostgreSQL, for those that have one.
    pg: Option<Proxy>,
}

enum Runner {
    Exec { proc: Proc, log: PathBuf },
    Http { thread: Option<JoinHandle<()>> },
}

struct Worker {
    name: String,
    runner: Runner,
    /// The proxy between this worker and its server, for those that have one.
    link: Option<Proxy>,
}

struct Cluster {
    dir: tempfile::TempDir,
    store: String,
    runs: PathBuf,
    rt: tokio::runtime::Runtime,
    nodes: Vec<Node>,
    workers: Vec<Worker>,
    ledger: Arc<Mutex<Ledger>>,
    acked: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    producer: Option<JoinHandle<()>>,
    schedule: bool,
    _schema: Option<Schema>,
}

impl Cluster {
    /// A fresh schema on the machine's PostgreSQL.
    fn new() -> Cluster {
        let schema = Schema::fresh("conveyor_faults");
        let store = schema.url();
        Cluster::on(store, Some(schema))
    }

    fn on(store: String, schema: Option<Schema>) -> Cluster {
        migrate(&store);
        let dir = temp_dir();
        let runs = path_in(&dir, "runs");
        Cluster {
            dir,
            store,
            runs,
            rt: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(1)
                .enable_all()
                .build()
                .expect("a runtime for the proxies"),
            nodes: Vec::new(),
            workers: Vec::new(),
            ledger: Arc::default(),
            acked: Arc::default(),
            stop: Arc::default(),
            producer: None,
            schedule: false,
            _schema: schema,
        }
    }

    /// Starts a server (under `env`, such as libfaketime's), through a proxy to PostgreSQL when
    /// `pg_proxy`; its index.
    fn server(&mut self, env: &[(&str, &str)], pg_proxy: bool) -> usize {
        let (store, pg) = if pg_proxy {
            let proxy = self.rt.block_on(Proxy::start(socket_of(&self.store)));
            (with_port(&self.store, proxy.addr.port()), Some(proxy))
        } else {
            (self.store.clone(), None)
        };
        let server = start_server_with(
            &["--listen", "127.0.0.1:0", "--store", &store],
            &SERVER_ARGS,
            env,
        );
        self.nodes.push(Node { server, pg });
        self.nodes.len() - 1
    }

    fn url(&self, node: usize) -> String {
        self.nodes[node].server.url.clone()
    }

    /// Waits until `node` (alone) leads maintenance.
    fn await_leader(&self, node: usize) {
        eventually_blocking_within(
            &format!("server {node} to lead maintenance"),
            Duration::from_secs(30),
            || {
                let leaders: Vec<usize> = (0..self.nodes.len())
                    .filter(|&n| is_leader(&self.url(n)))
                    .collect();
                (leaders == [node]).then_some(())
            },
        );
    }

    /// The URL a worker uses to reach `node`: through a proxy of its own when `proxied`.
    fn link(&self, node: usize, proxied: bool) -> (String, Option<Proxy>) {
        let url = self.url(node);
        if !proxied {
            return (url, None);
        }
        let proxy = self.rt.block_on(Proxy::start(socket_of(&url)));
        (with_port(&url, proxy.addr.port()), Some(proxy))
    }

    /// A `conveyor work` process on `node`, four jobs at a time; its handler logs each run.
    fn exec_worker(&mut self, name: &str, node: usize, proxied: bool) -> usize {
        let (url, link) = self.link(node, proxied);
        let handler = format!(
            "s=$(date +%s%3N); case \"$CONVEYOR_JOB_KIND\" in {LONG}) sleep {LONG_SECS};; *) sleep 0.2;; esac; \
             echo \"$CONVEYOR_JOB_ID $CONVEYOR_JOB_ATTEMPT {name} $s $(date +%s%3N)\" >> {}",
            self.runs.display()
        );
        let log = path_in(&self.dir, &format!("{name}.log"));
        let lease = LEASE_MS.to_string();
        let child = Command::new(BIN)
            .args([
                "work", "--server", &url, "--exec", &handler, "--queues", QUEUE,
            ])
            .args([
                "--concurrency",
                "4",
                "--lease-ms",
                &lease,
                "--worker-id",
                name,
            ])
            .args(["--drain-timeout-secs", "5"])
            .env("CONVEYOR_LOG", "warn,conveyor::job=info")
            .env("CONVEYOR_LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("worker log"))
            .spawn()
            .expect("spawn conveyor work");
        self.workers.push(Worker {
            name: name.to_string(),
            runner: Runner::Exec {
                proc: Proc { child },
                log,
            },
            link,
        });
        self.workers.len() - 1
    }

    /// A worker speaking the HTTP protocol from a thread of this test, on `node`.
    fn http_worker(&mut self, name: &str, node: usize, wait_ms: u64) -> usize {
        let (url, link) = self.link(node, false);
        let (name_owned, runs, ledger, stop) = (
            name.to_string(),
            self.runs.clone(),
            self.ledger.clone(),
            self.stop.clone(),
        );
        let thread = std::thread::spawn(move || {
            http_worker_loop(&name_owned, &url, wait_ms, &runs, &ledger, &stop)
        });
        self.workers.push(Worker {
            name: name.to_string(),
            runner: Runner::Http {
                thread: Some(thread),
            },
            link,
        });
        self.workers.len() - 1
    }

    fn exec_pid(&self, worker: usize) -> i32 {
        match &self.workers[worker].runner {
            Runner::Exec { proc, .. } => proc.pid(),
            Runner::Http { .. } => panic!("an HTTP worker has no process of its own"),
        }
    }

    /// Enqueues through every server in turn, keeping about [`BACKLOG`] jobs waiting; every
    /// twentieth job runs longer than a lease. Records the jobs acknowledged.
    fn start_load(&mut self) {
        let urls: Vec<String> = (0..self.nodes.len()).map(|n| self.url(n)).collect();
        let (acked, stop) = (self.acked.clone(), self.stop.clone());
        self.producer = Some(std::thread::spawn(move || {
            let client = reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(3))
                .build()
                .expect("client");
            let mut turn = 0usize;
            while !stop.load(Ordering::SeqCst) {
                turn += 1;
                let url = &urls[turn % urls.len()];
                let waiting = queue_stats(&client, url).and_then(|q| q["available"].as_u64());
                if waiting.is_none_or(|w| w >= BACKLOG) {
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
                let jobs: Vec<Value> = (0..10)
                    .map(|i| {
                        let kind = if (turn * 10 + i).is_multiple_of(20) {
                            LONG
                        } else {
                            "work"
                        };
                        json!({"kind": kind, "queue": QUEUE, "payload": {"turn": turn, "i": i}})
                    })
                    .collect();
                let answer = client
                    .post(format!("{url}/v1/jobs/batch"))
                    .json(&json!({ "jobs": jobs }))
                    .send();
                if let Ok(answer) = answer {
                    if answer.status().as_u16() == 201 {
                        if let Ok(body) = answer.json::<Value>() {
                            let ids = body["ids"].as_array().cloned().unwrap_or_default();
                            let mut acked = acked.lock().expect("acked");
                            acked.extend(ids.iter().filter_map(|id| id.as_str().map(String::from)));
                        }
                    }
                }
            }
        }));
    }

    /// A per-second schedule that catches up every missed tick: each tick fires exactly once.
    fn start_schedule(&mut self) {
        let answer = http()
            .put(format!("{}/v1/schedules/{SCHEDULE}", self.url(0)))
            .json(
                &json!({"cron": "* * * * * *", "job": {"kind": "tick", "queue": "ticks"},
                          "overlap": "allow", "missed": "catch_up", "max_catch_up": 600}),
            )
            .send()
            .expect("PUT schedule");
        assert_eq!(answer.status().as_u16(), 200, "{:?}", answer.text());
        self.schedule = true;
    }

    fn runs(&self) -> Vec<Run> {
        read_runs(&self.runs)
    }

    /// Waits for `more` runs beyond those logged so far.
    fn await_runs(&self, more: usize) {
        let target = self.runs().len() + more;
        eventually_blocking_within(&format!("{target} runs"), Duration::from_secs(120), || {
            (self.runs().len() >= target).then_some(())
        });
    }

    /// Waits until a job that `worker` held has been rescued (its lease expired) and run again.
    fn await_rescue_of(&self, worker: usize) {
        let name = self.workers[worker].name.clone();
        eventually_blocking_within(
            &format!("a job of {name} to be rescued and run again"),
            Duration::from_secs(60),
            || {
                let runs = self.runs();
                let rerun: HashSet<&str> = runs
                    .iter()
                    .filter(|r| r.attempt > 1)
                    .map(|r| r.id.as_str())
                    .collect();
                rerun
                    .iter()
                    .any(|id| {
                        let job = get_job(&self.url(self.live_node()), id);
                        job["errors"].as_array().is_some_and(|errors| {
                            errors.iter().any(|e| {
                                e["class"] == conveyor::error_class::LEASE_EXPIRED
                                    && e["worker_id"] == name.as_str()
                            })
                        })
                    })
                    .then_some(())
            },
        );
    }

    /// Waits until `worker` holds a job that runs longer than a lease and started at most
    /// [`LONG_FRESH`] ago, so a fault landing now finds it holding a lease for seconds yet.
    /// Short jobs alone do not promise that: four of them start together and end together,
    /// and a fault that lands while the worker reports them and asks for more finds it
    /// holding nothing to rescue.
    fn await_long_job_held_by(&self, worker: usize) {
        let name = self.workers[worker].name.clone();
        let url = self.url(self.live_node());
        eventually_blocking_within(
            &format!("{name} to start a {LONG} job"),
            Duration::from_secs(60),
            || {
                let page: Value = http()
                    .get(format!("{url}/v1/jobs"))
                    .query(&[("queue", QUEUE), ("state", "running"), ("kind", LONG)])
                    .send()
                    .ok()?
                    .json()
                    .ok()?;
                let now = Utc::now();
                page["jobs"]
                    .as_array()?
                    .iter()
                    .any(|job| {
                        job["lease"]["worker_id"] == name.as_str()
                            && job["started_at"]
                                .as_str()
                                .and_then(|at| at.parse::<DateTime<Utc>>().ok())
                                .is_some_and(|at| now - at <= LONG_FRESH)
                    })
                    .then_some(())
            },
        );
    }

    /// Waits until `worker` was told (409) that a lease it held was lost: a late heartbeat or
    /// completion, refused.
    fn await_refusal(&self, worker: usize) {
        let name = self.workers[worker].name.clone();
        eventually_blocking_within(
            &format!("{name} to be refused a late report"),
            Duration::from_secs(90),
            || (self.refused(worker) > 0).then_some(()),
        );
    }

    /// Waits until `worker` learnt the fate of a report it sent before a partition: refused
    /// (409), or failed (its connection gone).
    fn await_late_report_settled(&self, worker: usize) {
        let name = self.workers[worker].name.clone();
        let Runner::Exec { log, .. } = &self.workers[worker].runner else {
            panic!("{name} is not a `conveyor work` process");
        };
        eventually_blocking_within(
            &format!("{name} to learn its late reports' fate"),
            Duration::from_secs(90),
            || {
                let (_, refused, failed) = read_log_with_failures(log);
                (refused + failed > 0).then_some(())
            },
        );
    }

    fn refused(&self, worker: usize) -> usize {
        match &self.workers[worker].runner {
            Runner::Exec { log, .. } => read_log(log).1,
            Runner::Http { .. } => {
                let ledger = self.ledger.lock().expect("ledger");
                ledger
                    .refused
                    .get(&self.workers[worker].name)
                    .copied()
                    .unwrap_or(0)
            }
        }
    }

    /// A server not paused or cut off, to ask.
    fn live_node(&self) -> usize {
        (0..self.nodes.len())
            .find(|&n| {
                http()
                    .get(format!("{}/healthz", self.url(n)))
                    .timeout(Duration::from_millis(500))
                    .send()
                    .is_ok_and(|r| r.status().is_success())
            })
            .expect("a live server")
    }

    /// Stops the load, waits for every job to finish, stops the workers and gathers the
    /// history.
    fn finish(mut self) -> History {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(producer) = self.producer.take() {
            producer.join().expect("producer");
        }
        let url = self.url(self.live_node());
        eventually_blocking_within(
            "every job to finish once the fault healed",
            Duration::from_secs(180),
            || {
                let queue = queue_stats(&http(), &url)?;
                let open: u64 = ["available", "scheduled", "retryable", "running"]
                    .iter()
                    .map(|state| queue[*state].as_u64().unwrap_or(u64::MAX))
                    .sum();
                (open == 0).then_some(())
            },
        );
        let mut logs = Vec::new();
        for worker in &mut self.workers {
            match &mut worker.runner {
                Runner::Exec { proc, log } => {
                    proc.sigterm();
                    if proc
                        .child
                        .wait_timeout_or_kill(Duration::from_secs(20))
                        .is_none()
                    {
                        eprintln!("{} did not stop in time; killed", worker.name);
                    }
                    logs.push((worker.name.clone(), log.clone()));
                }
                Runner::Http { thread } => {
                    if let Some(thread) = thread.take() {
                        thread.join().expect("HTTP worker");
                    }
                }
            }
        }
        let mut ledger = std::mem::take(&mut *self.ledger.lock().expect("ledger"));
        for (name, log) in logs {
            let (accepted, refused) = read_log(&log);
            for id in accepted {
                ledger.accepted.entry(id).or_default().push(name.clone());
            }
            *ledger.refused.entry(name).or_default() += refused;
        }
        let ticks = self.schedule.then(|| schedule_ticks(&url));
        History {
            acked: self.acked.lock().expect("acked").clone(),
            runs: self.runs(),
            stored: stored_jobs(&url),
            ledger,
            ticks,
        }
    }
}

/// The queue's counts by state (all zero before its first job); `None` when the server does
/// not answer.
fn queue_stats(client: &reqwest::blocking::Client, url: &str) -> Option<Value> {
    let all: Value = client
        .get(format!("{url}/v1/queues"))
        .send()
        .ok()?
        .json()
        .ok()?;
    let found = all["queues"]
        .as_array()?
        .iter()
        .find(|q| q["name"] == QUEUE)
        .cloned();
    Some(
        found.unwrap_or_else(
            || json!({"available": 0, "scheduled": 0, "retryable": 0, "running": 0}),
        ),
    )
}

trait WaitOrKill {
    fn wait_timeout_or_kill(&mut self, timeout: Duration) -> Option<std::process::ExitStatus>;
}

impl WaitOrKill for std::process::Child {
    /// Waits up to `timeout` for the child to exit; kills it after. `None` when killed.
    fn wait_timeout_or_kill(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let exited = try_eventually_within_blocking(timeout, || self.try_wait().ok().flatten());
        if exited.is_none() {
            let _ = self.kill();
            let _ = self.wait();
        }
        exited
    }
}

/// Polls `probe` until it gives a value or `timeout` passes.
fn try_eventually_within_blocking<T>(
    timeout: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The HTTP worker: fetches a job at a time (long-polling `wait_ms`), runs it (renewing the
/// lease every third of it), logs the run and completes it, until told to stop.
fn http_worker_loop(
    name: &str,
    url: &str,
    wait_ms: u64,
    runs: &PathBuf,
    ledger: &Mutex<Ledger>,
    stop: &AtomicBool,
) {
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(wait_ms + 10_000))
        .build()
        .expect("client");
    while !stop.load(Ordering::SeqCst) {
        let fetched = client
            .post(format!("{url}/v1/fetch"))
            .json(&json!({"worker_id": name, "queues": [QUEUE], "max": 1,
                          "lease_ms": LEASE_MS, "wait_ms": wait_ms}))
            .send()
            .ok()
            .filter(|r| r.status().is_success())
            .and_then(|r| r.json::<Value>().ok());
        let Some(fetched) = fetched else {
            std::thread::sleep(Duration::from_millis(200));
            continue;
        };
        for job in fetched["jobs"].as_array().cloned().unwrap_or_default() {
            let id = job["id"].as_str().expect("id").to_string();
            let token = job["lease_token"].clone();
            let attempt = job["attempt"].as_u64().expect("attempt");
            let start = now_ms();
            let work = if job["kind"] == LONG {
                Duration::from_secs(LONG_SECS)
            } else {
                Duration::from_millis(200)
            };
            let mut lost = false;
            let until = std::time::Instant::now() + work;
            while !lost {
                let left = until.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(Duration::from_millis(LEASE_MS / 3)));
                let beat = client
                    .post(format!("{url}/v1/jobs/{id}/heartbeat"))
                    .json(&json!({"lease_token": token, "lease_ms": LEASE_MS}))
                    .send();
                lost = beat.is_ok_and(|b| b.status().as_u16() == 409);
            }
            if lost {
                *ledger
                    .lock()
                    .expect("ledger")
                    .refused
                    .entry(name.to_string())
                    .or_default() += 1;
                continue;
            }
            let line = format!("{id} {attempt} {name} {start} {}\n", now_ms());
            let logged = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(runs)
                .and_then(|mut f| f.write_all(line.as_bytes()));
            if logged.is_err() {
                // The test ended (its folder is gone) while this thread ran on.
                return;
            }
            let done = client
                .post(format!("{url}/v1/jobs/{id}/complete"))
                .json(&json!({"lease_token": token}))
                .send();
            let mut ledger = ledger.lock().expect("ledger");
            match done.map(|d| d.status().as_u16()) {
                Ok(200..=299) => ledger
                    .accepted
                    .entry(id)
                    .or_default()
                    .push(name.to_string()),
                Ok(409) => *ledger.refused.entry(name.to_string()).or_default() += 1,
                _ => {}
            }
        }
    }
}

/// One run of a job's handler, as it logged it.
#[derive(Clone, Debug)]
struct Run {
    id: String,
    attempt: u64,
    worker: String,
    start_ms: i64,
}

fn read_runs(path: &PathBuf) -> Vec<Run> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() != 5 {
                return None;
            }
            Some(Run {
                id: fields[0].to_string(),
                attempt: fields[1].parse().ok()?,
                worker: fields[2].to_string(),
                start_ms: fields[3].parse().ok()?,
            })
        })
        .collect()
}

/// From a `conveyor work` JSON log: the jobs whose completion the server accepted, and how
/// many reports it refused because the lease was lost.
fn read_log(path: &PathBuf) -> (Vec<String>, usize) {
    let (accepted, refused, _) = read_log_with_failures(path);
    (accepted, refused)
}

/// [`read_log`], with how many reports failed to reach the server at all.
fn read_log_with_failures(path: &PathBuf) -> (Vec<String>, usize, usize) {
    let Ok(file) = std::fs::File::open(path) else {
        return (Vec::new(), 0, 0);
    };
    let (mut accepted, mut refused, mut failed) = (Vec::new(), 0, 0);
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        let Ok(event) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        let fields = &event["fields"];
        match fields["outcome"].as_str() {
            Some("completed") => accepted.push(fields["job_id"].as_str().unwrap_or("").into()),
            Some("lease_lost") => refused += 1,
            _ if fields["message"]
                .as_str()
                .is_some_and(|m| m.starts_with("could not report the outcome")) =>
            {
                failed += 1
            }
            _ => {}
        }
    }
    (accepted, refused, failed)
}

/// A stored job, as far as the checks need it.
struct Stored {
    state: String,
    attempt: u64,
    errors: Vec<Value>,
}

fn stored_jobs(url: &str) -> HashMap<String, Stored> {
    let mut stored = HashMap::new();
    let mut after: Option<String> = None;
    loop {
        let mut path = format!("{url}/v1/jobs?queue={QUEUE}&limit=500");
        if let Some(after) = &after {
            path.push_str(&format!("&after={after}"));
        }
        let page: Value = http()
            .get(path)
            .send()
            .expect("list jobs")
            .json()
            .expect("a job page");
        for job in page["jobs"].as_array().expect("jobs") {
            stored.insert(
                job["id"].as_str().expect("id").to_string(),
                Stored {
                    state: job["state"].as_str().unwrap_or("").to_string(),
                    attempt: job["attempt"].as_u64().unwrap_or(0),
                    errors: job["errors"].as_array().cloned().unwrap_or_default(),
                },
            );
        }
        match page["next"].as_str() {
            Some(next) => after = Some(next.to_string()),
            None => return stored,
        }
    }
}

/// The ticks the schedule fired, oldest first.
fn schedule_ticks(url: &str) -> Vec<DateTime<Utc>> {
    let answer: Value = http()
        .get(format!("{url}/v1/schedules/{SCHEDULE}/runs?limit=1000"))
        .send()
        .expect("GET runs")
        .json()
        .expect("runs JSON");
    let mut ticks: Vec<DateTime<Utc>> = answer["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|run| time(&run["tick"]))
        .collect();
    ticks.sort();
    ticks
}

fn time(value: &Value) -> DateTime<Utc> {
    value
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not a time: {value}"))
}

/// What a run left behind, for the checker.
struct History {
    acked: Vec<String>,
    runs: Vec<Run>,
    stored: HashMap<String, Stored>,
    ledger: Ledger,
    ticks: Option<Vec<DateTime<Utc>>>,
}

impl History {
    /// Judges the run, given the workers the faults cut off (the only ones whose leases may
    /// expire). Panics listing what went wrong.
    fn check(&self, cut_off: &[&str]) {
        let mut wrong: Vec<String> = Vec::new();
        let cut_off: HashSet<&str> = cut_off.iter().copied().collect();
        let mut runs: HashMap<&str, Vec<&Run>> = HashMap::new();
        for run in &self.runs {
            runs.entry(run.id.as_str()).or_default().push(run);
        }
        for id in &self.acked {
            if !self.stored.contains_key(id) {
                wrong.push(format!("acknowledged job {id} is not stored"));
            }
        }
        for (id, job) in &self.stored {
            if job.state != "completed" {
                wrong.push(format!(
                    "job {id} ended {} (attempt {})",
                    job.state, job.attempt
                ));
                continue;
            }
            let job_runs = runs.get(id.as_str()).cloned().unwrap_or_default();
            let mut attempts = BTreeSet::new();
            for run in &job_runs {
                if !attempts.insert(run.attempt) {
                    wrong.push(format!(
                        "job {id}: attempt {} was handed to two workers: {job_runs:?}",
                        run.attempt
                    ));
                }
            }
            // A run again starts only once the attempt before it was rescued (its lease
            // expired by the database's clock, which `judge_rescue` checks): never while that
            // lease held. (A paused or cut-off worker may start its stale attempt late, even
            // after the next one: that is the rerun at-least-once allows.)
            for run in &job_runs {
                // The rescue of an attempt names the worker that ran it.
                let rescue = job
                    .errors
                    .iter()
                    .find(|e| e["attempt"].as_u64() == Some(run.attempt));
                if let Some(rescue) = rescue.filter(|e| e["worker_id"] != run.worker.as_str()) {
                    wrong.push(format!(
                        "job {id}: attempt {} ran on {} but its rescue names {}",
                        run.attempt, run.worker, rescue["worker_id"]
                    ));
                }
                let rescued_at = job
                    .errors
                    .iter()
                    .find(|e| e["attempt"].as_u64() == Some(run.attempt - 1))
                    .map(|e| time(&e["at"]).timestamp_millis());
                match rescued_at {
                    _ if run.attempt == 1 => {}
                    None => wrong.push(format!(
                        "job {id} ran attempt {} with no rescue of the one before: {job_runs:?}",
                        run.attempt
                    )),
                    // Rescue times are the database's, in whole milliseconds; start times this
                    // machine's: the same clock, so only rounding separates them.
                    Some(at) if run.start_ms + 5 < at => wrong.push(format!(
                        "job {id} ran attempt {} {} ms before the attempt before it was rescued: {job_runs:?}",
                        run.attempt,
                        at - run.start_ms
                    )),
                    Some(_) => {}
                }
            }
            if !attempts.contains(&job.attempt) {
                wrong.push(format!(
                    "job {id} completed at attempt {} that no handler ran: {job_runs:?}",
                    job.attempt
                ));
            }
            if job.errors.len() as u64 + 1 != job.attempt {
                wrong.push(format!(
                    "job {id} completed at attempt {} with {} errors",
                    job.attempt,
                    job.errors.len()
                ));
            }
            for error in &job.errors {
                wrong.extend(judge_rescue(id, error, &cut_off));
            }
            let accepted = self.ledger.accepted.get(id).map_or(0, Vec::len);
            if accepted > 1 {
                wrong.push(format!(
                    "job {id}: {accepted} completions accepted, by {:?}",
                    self.ledger.accepted[id]
                ));
            }
        }
        for (worker, refused) in &self.ledger.refused {
            if *refused > 0 && !cut_off.contains(worker.as_str()) {
                wrong.push(format!(
                    "{worker}, never cut off, was refused {refused} reports: it lost leases"
                ));
            }
        }
        if let Some(ticks) = &self.ticks {
            wrong.extend(judge_ticks(ticks));
        }
        let total = wrong.len();
        wrong.truncate(20);
        assert!(
            total == 0,
            "{total} violations in {} jobs ({} acknowledged, {} runs):\n{}",
            self.stored.len(),
            self.acked.len(),
            self.runs.len(),
            wrong.join("\n")
        );
        assert!(!self.acked.is_empty(), "the load acknowledged no job");
    }

    /// How many jobs were rescued (run again after a lease expired).
    fn rescued(&self) -> usize {
        self.stored.values().filter(|job| job.attempt > 1).count()
    }
}

/// An error recorded on a completed job may only be a rescue of a worker the fault cut off,
/// made once its lease had expired by the database's clock.
fn judge_rescue(id: &str, error: &Value, cut_off: &HashSet<&str>) -> Option<String> {
    if error["class"] != conveyor::error_class::LEASE_EXPIRED {
        return Some(format!(
            "job {id} failed, though its handler never fails: {error}"
        ));
    }
    let worker = error["worker_id"].as_str().unwrap_or("");
    if !cut_off.contains(worker) {
        return Some(format!(
            "job {id}: the lease of {worker:?}, never cut off, was rescued: {error}"
        ));
    }
    let held = time(&error["at"]) - time(&error["started_at"]);
    (held < chrono::Duration::milliseconds(LEASE_MS as i64)).then(|| {
        format!(
            "job {id}: rescued {} ms after its attempt started, inside its {LEASE_MS} ms lease: {error}",
            held.num_milliseconds()
        )
    })
}

/// A per-second schedule that catches up every missed tick fires each tick exactly once.
fn judge_ticks(ticks: &[DateTime<Utc>]) -> Vec<String> {
    let mut wrong = Vec::new();
    if ticks.len() < 5 {
        wrong.push(format!("the schedule fired only {} ticks", ticks.len()));
    }
    for pair in ticks.windows(2) {
        let step = pair[1] - pair[0];
        if step == chrono::Duration::zero() {
            wrong.push(format!("tick {} fired twice", pair[0]));
        } else if step != chrono::Duration::seconds(1) {
            wrong.push(format!(
                "ticks between {} and {} were lost",
                pair[0], pair[1]
            ));
        }
    }
    wrong
}

/// Libfaketime's environment for a process whose wall clock reads `offset` (`+90s`, or the
/// offset file for one that jumps) with its monotonic clock left true.
fn faked_clock(preload: &str, setting: (&'static str, String)) -> Vec<(&'static str, String)> {
    vec![
        ("LD_PRELOAD", preload.to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
        setting,
        ("FAKETIME_CACHE_DURATION", "1".to_string()),
    ]
}

fn env_refs<'a>(env: &'a [(&'static str, String)]) -> Vec<(&'static str, &'a str)> {
    env.iter().map(|(k, v)| (*k, v.as_str())).collect()
}

// ---------------------------------------------------------------------------------------------
// The scenarios.
// ---------------------------------------------------------------------------------------------

/// Three servers: the leader's clock 90 s fast, then jumping 5 minutes ahead and 5 minutes
/// back mid-run; another's 90 s slow; the third's true. No lease is rescued, no report refused,
/// every tick of a per-second schedule fires once.
#[test]
fn skewed_and_jumping_clocks_change_nothing() {
    let mut cluster = Cluster::new();
    let preload = libfaketime();
    let offset = path_in(&cluster.dir, "leader-clock");
    let jump = |spec: &str| std::fs::write(&offset, spec).expect("write the clock offset");
    jump("+90s");
    let leader_env = faked_clock(
        &preload,
        ("FAKETIME_TIMESTAMP_FILE", offset.display().to_string()),
    );
    let slow_env = faked_clock(&preload, ("FAKETIME", "-90s".to_string()));
    let leader = cluster.server(&env_refs(&leader_env), false);
    cluster.await_leader(leader);
    let leader_url = cluster.url(leader);
    // The skew is really in effect (by the leader's HTTP `Date`, which follows a clock forward).
    let jumped = |offset_secs: i64| {
        eventually_blocking("the leader's clock to read the offset", || {
            ((clock_offset_secs(&leader_url) - offset_secs).abs() <= 2).then_some(())
        })
    };
    jumped(90);
    let slow = cluster.server(&env_refs(&slow_env), false);
    let true_clock = cluster.server(&[], false);
    cluster.exec_worker("fast-exec", leader, false);
    cluster.exec_worker("slow-exec", slow, false);
    cluster.http_worker("true-http", true_clock, 1_000);
    cluster.start_schedule();
    cluster.start_load();
    cluster.await_runs(60);
    jump("+390s");
    jumped(390);
    cluster.await_runs(60);
    jump("-210s");
    cluster.await_runs(60);
    let history = cluster.finish();
    history.check(&[]);
    assert_eq!(history.rescued(), 0);
}

/// The leader is paused past every lease, then resumed; then a worker is. Jobs held through
/// the paused server, and by the paused worker, are rescued once their leases expired and run
/// again once; their late reports are refused.
#[test]
fn a_paused_server_then_a_paused_worker_lose_only_their_leases() {
    let mut cluster = Cluster::new();
    let first = cluster.server(&[], false);
    cluster.await_leader(first);
    let second = cluster.server(&[], false);
    let on_first = cluster.exec_worker("exec-on-paused-server", first, false);
    let paused = cluster.exec_worker("paused-exec", second, false);
    cluster.http_worker("http", second, 1_000);
    cluster.start_load();
    cluster.await_runs(40);

    let server_pid = cluster.nodes[first].server.proc.pid();
    cluster.await_long_job_held_by(on_first);
    signal(server_pid, libc::SIGSTOP);
    cluster.await_rescue_of(on_first);
    signal(server_pid, libc::SIGCONT);
    cluster.await_refusal(on_first);
    cluster.await_runs(40);

    let worker_pid = cluster.exec_pid(paused);
    cluster.await_long_job_held_by(paused);
    signal(worker_pid, libc::SIGSTOP);
    cluster.await_rescue_of(paused);
    signal(worker_pid, libc::SIGCONT);
    cluster.await_refusal(paused);
    cluster.await_runs(40);

    let history = cluster.finish();
    history.check(&["exec-on-paused-server", "paused-exec"]);
}

/// A worker's link to its server is cut for longer than a lease, then heals with the bytes it
/// held; later only its answers are lost for a while. Its jobs are rescued and run again, its
/// late reports refused, and no completion counts twice.
#[test]
fn a_worker_cut_off_from_its_server_loses_only_its_leases() {
    let mut cluster = Cluster::new();
    let first = cluster.server(&[], false);
    cluster.await_leader(first);
    let second = cluster.server(&[], false);
    let cut = cluster.exec_worker("cut-exec", first, true);
    cluster.exec_worker("exec", second, false);
    cluster.http_worker("http", first, 1_000);
    cluster.start_load();
    cluster.await_runs(40);

    let link = |cluster: &Cluster, mode: Mode| {
        cluster.workers[cut]
            .link
            .as_ref()
            .expect("a proxied worker")
            .set_mode(mode)
    };
    cluster.await_long_job_held_by(cut);
    link(&cluster, Mode::Hold);
    cluster.await_rescue_of(cut);
    link(&cluster, Mode::Forward);
    // Its held reports now reach the server and are refused, unless the server had closed
    // their connection meanwhile (a request must arrive within its header timeout): then the
    // worker sees the report fail. Either way the rerun stands; the checker sees to the rest.
    cluster.await_late_report_settled(cut);
    cluster.await_runs(40);

    link(&cluster, Mode::DropAnswers);
    cluster.await_rescue_of(cut);
    cluster.workers[cut].link.as_ref().expect("proxy").cut();
    link(&cluster, Mode::Forward);
    cluster.await_runs(40);

    let history = cluster.finish();
    history.check(&["cut-exec"]);
}

/// A server's link to PostgreSQL is held the moment a transaction is about to commit, while
/// its HTTP worker long-polls through it, for longer than a lease; it heals once with the held
/// bytes delivered and once with every connection reset. The other server rescues what its
/// workers held; it serves again by itself once healed.
#[test]
fn a_server_cut_off_from_postgres_mid_commit_recovers_without_doubling() {
    let mut cluster = Cluster::new();
    let leader = cluster.server(&[], false);
    cluster.await_leader(leader);
    let cut = cluster.server(&[], true);
    cluster.exec_worker("exec", leader, false);
    let exec_cut = cluster.exec_worker("exec-on-cut", cut, false);
    cluster.http_worker("http-on-cut", cut, 5_000);
    cluster.start_load();
    cluster.await_runs(40);

    for heal_by_reset in [false, true] {
        cluster.await_long_job_held_by(exec_cut);
        let proxy = cluster.nodes[cut].pg.as_ref().expect("a proxied server");
        proxy.hold_when(&[b"COMMIT"], false);
        eventually_blocking("a commit to be held", || proxy.triggered().then_some(()));
        cluster.await_rescue_of(exec_cut);
        let proxy = cluster.nodes[cut].pg.as_ref().expect("a proxied server");
        if heal_by_reset {
            proxy.cut();
        }
        proxy.resume();
        let url = cluster.url(cut);
        eventually_blocking_within(
            "the cut-off server to enqueue again",
            Duration::from_secs(60),
            || {
                http()
                    .post(format!("{url}/v1/jobs"))
                    .json(&json!({"kind": "work", "queue": QUEUE, "payload": {}}))
                    .send()
                    .ok()
                    .filter(|r| r.status().is_success())
                    .and_then(|r| r.json::<Value>().ok())
                    .and_then(|job| job["id"].as_str().map(String::from))
            },
        );
        cluster.await_runs(40);
    }

    let history = cluster.finish();
    history.check(&["exec-on-cut", "http-on-cut"]);
}

/// The maintenance leader is cut off from PostgreSQL in the middle of firing a tick of a
/// per-second schedule (its row locked); the other server takes over, and fires once
/// PostgreSQL has ended the stalled session. When the link heals, the old leader's held bytes
/// go through, yet no tick fires twice and none is lost.
#[test]
fn a_leader_cut_off_from_postgres_hands_over_without_a_doubled_or_lost_tick() {
    let mut cluster = Cluster::new();
    let leader = cluster.server(&[], true);
    cluster.await_leader(leader);
    let other = cluster.server(&[], false);
    let on_leader = cluster.exec_worker("exec-on-leader", leader, false);
    cluster.exec_worker("exec", other, false);
    cluster.http_worker("http", other, 1_000);
    cluster.start_schedule();
    cluster.start_load();
    cluster.await_runs(40);

    // Held while it fires a tick (the schedule's row locked, the commit not yet sent): the
    // row stays locked until PostgreSQL ends the stalled session.
    cluster.await_long_job_held_by(on_leader);
    let proxy = cluster.nodes[leader].pg.as_ref().expect("a proxied leader");
    proxy.hold_when(&[SCHEDULE.as_bytes(), b"COMMIT"], false);
    eventually_blocking("the leader to be held mid-firing", || {
        proxy.triggered().then_some(())
    });
    cluster.await_leader(other);
    cluster.await_rescue_of(on_leader);
    let before = schedule_ticks(&cluster.url(other)).len();
    eventually_blocking("the new leader to fire ticks", || {
        (schedule_ticks(&cluster.url(other)).len() >= before + 3).then_some(())
    });
    cluster.nodes[leader]
        .pg
        .as_ref()
        .expect("a proxied leader")
        .resume();
    cluster.await_runs(40);

    let history = cluster.finish();
    history.check(&["exec-on-leader"]);
}

/// PostgreSQL (a private cluster) restarts under load, with a fast shutdown and then an
/// immediate one (a crash, recovered from its WAL). Every acknowledged job survives and
/// completes once; a lease may lapse while the database is down, and is then rescued.
#[test]
fn postgres_restarted_fast_then_immediate_under_load_loses_and_doubles_nothing() {
    let pg = conveyor_storetest::pg_cluster::Cluster::create();
    let mut cluster = Cluster::on(pg.url(), None);
    let first = cluster.server(&[], false);
    cluster.await_leader(first);
    let second = cluster.server(&[], false);
    cluster.exec_worker("exec-1", first, false);
    cluster.exec_worker("exec-2", second, false);
    cluster.http_worker("http", first, 1_000);
    cluster.start_load();
    cluster.await_runs(40);
    for mode in ["fast", "immediate"] {
        pg.ctl_with("restart", &["-m", mode]);
        cluster.await_runs(60);
    }
    let history = cluster.finish();
    history.check(&["exec-1", "exec-2", "http"]);
    drop(pg);
}
