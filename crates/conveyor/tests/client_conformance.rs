//! The client libraries' shared protocol conformance suite (issue 10, item 4).
//!
//! For each client (Python in `clients/python`, TypeScript in `clients/typescript`), every test
//! starts a real `conveyor serve` on a fresh SQLite store, spawns that client's conformance
//! worker process and checks what happens over HTTP. The same cases run for every client, so
//! both speak the protocol of `clients/PROTOCOL.md` alike; `clients/CONFORMANCE.md` describes
//! the worker process each client provides:
//!
//! * command: `python3 clients/python/conformance_worker.py`,
//!   `node clients/typescript/conformance/worker.mjs` (run from the repository root);
//! * environment: `CONVEYOR_URL`, `CONVEYOR_TOKEN` (optional), `CONVEYOR_QUEUES`
//!   (comma-separated), `CONVEYOR_CONCURRENCY`, `CONVEYOR_GRACE_SECS`, `CONVEYOR_LEASE_MS`;
//! * it prints a line `ready` on stdout once running, exits 0 after a SIGTERM drain, and exits
//!   non-zero naming the status (401, 403) when the server refuses its token;
//! * handlers: `ok` returns `{"echo": payload}`; `retry_twice` raises `Retry` until attempt 3,
//!   then returns `{"attempt": 3}`; `retry_after` raises `RetryAfter(0.5 s)` on attempt 1, then
//!   succeeds; `permanent` raises `Permanent(payload.message)`; `crash` raises the language's
//!   plain exception (Python `Exception`, JavaScript `Error`) with message `payload.message`;
//!   `slow` sleeps `payload.ms` milliseconds, then succeeds.
//!
//! Each client is a module of the same tests (`python::...`, `typescript::...`), so one client's
//! failures never hide the other's. A client whose worker or runtime is missing fails its tests
//! with a message saying so.

mod common;

use chrono::{DateTime, Utc};
use common::{eventually_blocking, eventually_blocking_within, http, path_in, temp_dir, Proc, BIN};
use conveyor::{Job, JobState, WorkerState};
use conveyor_server::api::{BatchResponse, EnqueuedJob, WorkersResponse};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use uuid::Uuid;

const QUEUE: &str = "conformance";

#[derive(Clone, Copy, Debug)]
enum Client {
    Python,
    TypeScript,
}

impl Client {
    fn name(self) -> &'static str {
        match self {
            Client::Python => "python",
            Client::TypeScript => "typescript",
        }
    }

    /// The class name a plain exception is recorded with.
    fn plain_exception_class(self) -> &'static str {
        match self {
            Client::Python => "Exception",
            Client::TypeScript => "Error",
        }
    }

    /// What the conformance worker's log lines carry at warning or error level.
    fn warning_markers(self) -> &'static [&'static str] {
        match self {
            Client::Python => &[" WARNING ", " ERROR ", " CRITICAL "],
            Client::TypeScript => &["conveyor worker: warning:", "conveyor worker: error:"],
        }
    }

    fn command(self) -> Command {
        let root = repo_root();
        let (program, script) = match self {
            Client::Python => (
                std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string()),
                root.join("clients/python/conformance_worker.py"),
            ),
            Client::TypeScript => (
                std::env::var("NODE").unwrap_or_else(|_| "node".to_string()),
                root.join("clients/typescript/conformance/worker.mjs"),
            ),
        };
        assert!(
            script.exists(),
            "the {} conformance worker {} does not exist",
            self.name(),
            script.display()
        );
        let mut command = Command::new(program);
        command.arg(script).current_dir(root);
        command
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .expect("repository root")
}

// ---------------------------------------------------------------------------------------------
// The server.
// ---------------------------------------------------------------------------------------------

/// `conveyor serve` on `listen` over the SQLite file `db`; returns once it listens.
struct Serve {
    proc: Proc,
    url: String,
}

fn serve(db: &Path, listen: &str, extra: &[&str]) -> Serve {
    let store = format!("sqlite://{}", db.display());
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", listen, "--store", &store])
        // Due retries become available within 100 ms rather than a second.
        .args(["--maintenance-interval-ms", "100"])
        .args(extra)
        .env("CONVEYOR_LOG", "warn")
        .env_remove("CONVEYOR_AUTH")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn conveyor serve");
    let stdout = child.stdout.take().expect("stdout");
    let proc = Proc { child };
    let mut reader = BufReader::new(stdout);
    let mut first = String::new();
    reader.read_line(&mut first).expect("read listen line");
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    Serve { proc, url }
}

/// A free loopback address whose port lies below the kernel's ephemeral range (32768 and up by
/// default), so that while the server is down neither another test's `127.0.0.1:0` nor an
/// outgoing connection can take it before the restart.
fn free_port_below_ephemeral_range() -> String {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos() as u64
        ^ u64::from(std::process::id()) << 16;
    for n in 0..1000u64 {
        let port = 20_000 + (seed.wrapping_add(n.wrapping_mul(7919)) % 10_000);
        let address = format!("127.0.0.1:{port}");
        if std::net::TcpListener::bind(&address).is_ok() {
            return address;
        }
    }
    panic!("no free port from 20000 to 29999");
}

/// `conveyor token create --role ROLE` on the store; the `cv_...` secret.
fn create_token(db: &Path, role: &str) -> String {
    let output = Command::new(BIN)
        .args(["token", "create", "--role", role, "--name"])
        .arg(format!("conformance-{role}"))
        .arg("--store")
        .arg(format!("sqlite://{}", db.display()))
        .env("CONVEYOR_LOG", "warn")
        .env_remove("CONVEYOR_STORE")
        .stdin(Stdio::null())
        .output()
        .expect("run conveyor token create");
    assert!(
        output.status.success(),
        "token create: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn post(url: &str, token: Option<&str>, body: &Value) -> (u16, Value) {
    let mut request = http().post(url).json(body);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().expect("POST");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

fn get(url: &str, token: Option<&str>) -> Value {
    let mut request = http().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request.send().expect("GET");
    assert!(
        response.status().is_success(),
        "GET {url}: {}",
        response.status()
    );
    response.json().expect("JSON")
}

/// Reads the server's answer `raw` to `what` as its `conveyor_server::api` (or `conveyor`)
/// type; panics showing the raw answer if it does not fit.
fn parse<T: DeserializeOwned>(what: &str, raw: Value) -> T {
    match serde_json::from_value(raw.clone()) {
        Ok(answer) => answer,
        Err(e) => panic!(
            "the answer to {what} does not read as {}: {e}\n{raw:#}",
            std::any::type_name::<T>()
        ),
    }
}

/// `GET url`, read as `T`.
fn get_as<T: DeserializeOwned>(url: &str, token: Option<&str>) -> T {
    parse(&format!("GET {url}"), get(url, token))
}

/// Enqueues `kind` with `payload` (and more fields) on the conformance queue; the job's id.
fn enqueue(server: &str, token: Option<&str>, kind: &str, payload: Value, more: Value) -> Uuid {
    let mut body = json!({"kind": kind, "payload": payload, "queue": QUEUE});
    if let Value::Object(fields) = more {
        body.as_object_mut().unwrap().extend(fields);
    }
    let (status, job) = post(&format!("{server}/v1/jobs"), token, &body);
    assert_eq!(status, 201, "enqueue {kind}: {job}");
    parse::<EnqueuedJob>(&format!("POST /v1/jobs ({kind})"), job).id()
}

fn job(server: &str, token: Option<&str>, id: Uuid) -> Job {
    get_as(&format!("{server}/v1/jobs/{id}"), token)
}

/// Polls the job until `done` holds for it (30 s at most); the job then.
fn wait_job(server: &str, id: Uuid, what: &str, done: impl Fn(&Job) -> bool) -> Job {
    wait_job_with(server, None, id, what, done)
}

fn wait_job_with(
    server: &str,
    token: Option<&str>,
    id: Uuid,
    what: &str,
    done: impl Fn(&Job) -> bool,
) -> Job {
    eventually_blocking(&format!("job {id} to be {what}"), || {
        let job = job(server, token, id);
        if done(&job) {
            Ok(job)
        } else {
            Err(format!("{job:#?}"))
        }
    })
}

fn wait_state(server: &str, id: Uuid, state: JobState) -> Job {
    wait_job(server, id, &state.to_string(), |job| job.state == state)
}

/// Milliseconds from `earlier` to `later`, each taken at millisecond precision.
fn millis_between(earlier: DateTime<Utc>, later: DateTime<Utc>) -> i64 {
    later.timestamp_millis() - earlier.timestamp_millis()
}

/// When the job finished; panics showing the job if it has not.
fn finished_at(job: &Job) -> DateTime<Utc> {
    job.finished_at
        .unwrap_or_else(|| panic!("no finished_at: {job:#?}"))
}

// ---------------------------------------------------------------------------------------------
// The client's worker process.
// ---------------------------------------------------------------------------------------------

struct Options {
    concurrency: u32,
    grace_secs: f64,
    lease_ms: Option<u64>,
    token: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            concurrency: 4,
            grace_secs: 10.0,
            lease_ms: None,
            token: None,
        }
    }
}

struct WorkerProc {
    client: Client,
    proc: Proc,
    stderr: Arc<Mutex<String>>,
    ready: mpsc::Receiver<()>,
}

impl WorkerProc {
    fn spawn(client: Client, server: &str, options: &Options) -> WorkerProc {
        let mut command = client.command();
        command
            .env("CONVEYOR_URL", server)
            .env("CONVEYOR_QUEUES", QUEUE)
            .env("CONVEYOR_CONCURRENCY", options.concurrency.to_string())
            .env("CONVEYOR_GRACE_SECS", options.grace_secs.to_string())
            .env("PYTHONUNBUFFERED", "1")
            .env_remove("CONVEYOR_TOKEN")
            .env_remove("CONVEYOR_LEASE_MS")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(lease) = options.lease_ms {
            command.env("CONVEYOR_LEASE_MS", lease.to_string());
        }
        if let Some(token) = &options.token {
            command.env("CONVEYOR_TOKEN", token);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start the {} worker: {e}", client.name()));
        let stdout = child.stdout.take().expect("stdout");
        let stderr_pipe = child.stderr.take().expect("stderr");
        let (ready_tx, ready) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if line.trim() == "ready" {
                    let _ = ready_tx.send(());
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let name = client.name();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stderr_pipe);
            let mut line = Vec::new();
            while matches!(reader.read_until(b'\n', &mut line), Ok(n) if n > 0) {
                let text = String::from_utf8_lossy(&line);
                // Shown with the test's output when it fails.
                eprint!("[{name} worker] {text}");
                sink.lock().unwrap().push_str(&text);
                line.clear();
            }
        });
        WorkerProc {
            client,
            proc: Proc { child },
            stderr,
            ready,
        }
    }

    /// Spawns the worker and waits for its `ready` line.
    fn start(client: Client, server: &str, options: &Options) -> WorkerProc {
        let mut worker = WorkerProc::spawn(client, server, options);
        if worker.ready.recv_timeout(Duration::from_secs(30)).is_err() {
            let status = worker.proc.child.try_wait().ok().flatten();
            panic!(
                "the {} worker never printed `ready` (exit: {status:?}); stderr:\n{}",
                client.name(),
                worker.stderr()
            );
        }
        worker
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for the process to exit by itself (it must within `seconds`).
    fn wait_exit(&mut self, seconds: u64) -> std::process::ExitStatus {
        let what = format!("the {} worker to exit", self.client.name());
        eventually_blocking_within(&what, Duration::from_secs(seconds), || {
            match self.proc.child.try_wait().expect("try_wait") {
                Some(status) => Ok(status),
                None => Err(format!("still running; stderr:\n{}", self.stderr())),
            }
        })
    }
}

// ---------------------------------------------------------------------------------------------
// A relay that sees every acknowledgement a worker sends.
// ---------------------------------------------------------------------------------------------

/// An HTTP/1.1 relay between a worker and the server that records the `(id, lease_token)` of
/// every acknowledgement the worker sends (the `complete` and `fail` items of `/v1/fetch` and
/// `/v1/ack`), so a test can tell an acknowledgement sent twice. One upstream connection per
/// worker connection, requests relayed in order.
struct AckRecorder {
    url: String,
    acks: Arc<Mutex<Vec<(String, String)>>>,
}

impl AckRecorder {
    fn start(upstream: &str) -> AckRecorder {
        let upstream: std::net::SocketAddr = upstream
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .parse()
            .expect("the server's address");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let url = format!("http://{}", listener.local_addr().expect("relay address"));
        let acks = Arc::new(Mutex::new(Vec::new()));
        let seen = acks.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { break };
                let seen = seen.clone();
                std::thread::spawn(move || {
                    let _ = relay_connection(conn, upstream, &seen);
                });
            }
        });
        AckRecorder { url, acks }
    }

    fn acks(&self) -> Vec<(String, String)> {
        self.acks.lock().unwrap().clone()
    }
}

fn relay_connection(
    worker: std::net::TcpStream,
    upstream: std::net::SocketAddr,
    acks: &Mutex<Vec<(String, String)>>,
) -> std::io::Result<()> {
    use std::io::Write;
    let mut server = std::net::TcpStream::connect(upstream)?;
    let mut from_worker = BufReader::new(worker.try_clone()?);
    let mut from_server = BufReader::new(server.try_clone()?);
    let mut to_worker = worker;
    while let Some((head, body)) = read_http_message(&mut from_worker)? {
        let line = String::from_utf8_lossy(&head[..head.len().min(64)]).to_string();
        if line.starts_with("POST /v1/fetch ") || line.starts_with("POST /v1/ack ") {
            if let Ok(request) = serde_json::from_slice::<Value>(&body) {
                let mut acks = acks.lock().unwrap();
                for list in ["complete", "fail"] {
                    for item in request[list].as_array().into_iter().flatten() {
                        acks.push((
                            item["id"].as_str().unwrap_or_default().to_string(),
                            item["lease_token"].as_str().unwrap_or_default().to_string(),
                        ));
                    }
                }
            }
        }
        server.write_all(&head)?;
        server.write_all(&body)?;
        let Some((head, body)) = read_http_message(&mut from_server)? else {
            break;
        };
        to_worker.write_all(&head)?;
        to_worker.write_all(&body)?;
    }
    Ok(())
}

/// One HTTP/1.1 message: its head (up to and including the blank line) and its body, as sent
/// (a chunked body keeps its framing). None at a clean end of the connection.
fn read_http_message(
    reader: &mut BufReader<std::net::TcpStream>,
) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    use std::io::Read;
    let mut head = Vec::new();
    let mut length = 0usize;
    let mut chunked = false;
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(None);
        }
        head.extend_from_slice(&line);
        if line == b"\r\n" {
            break;
        }
        let text = String::from_utf8_lossy(&line).to_ascii_lowercase();
        if let Some(value) = text.strip_prefix("content-length:") {
            length = value.trim().parse().unwrap_or(0);
        } else if text.starts_with("transfer-encoding:") && text.contains("chunked") {
            chunked = true;
        }
    }
    let mut body = Vec::new();
    if chunked {
        loop {
            let mut size_line = Vec::new();
            reader.read_until(b'\n', &mut size_line)?;
            body.extend_from_slice(&size_line);
            let size_text = String::from_utf8_lossy(&size_line);
            let size = usize::from_str_radix(size_text.trim().split(';').next().unwrap_or("0"), 16)
                .unwrap_or(0);
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk)?;
            body.extend_from_slice(&chunk);
            if size == 0 {
                break;
            }
        }
    } else {
        body.resize(length, 0);
        reader.read_exact(&mut body)?;
    }
    Ok(Some((head, body)))
}

fn setup(client: Client, options: &Options) -> (tempfile::TempDir, Serve, WorkerProc) {
    let dir = temp_dir();
    let server = serve(&path_in(&dir, "jobs.db"), "127.0.0.1:0", &[]);
    let worker = WorkerProc::start(client, &server.url, options);
    (dir, server, worker)
}

// ---------------------------------------------------------------------------------------------
// The cases.
// ---------------------------------------------------------------------------------------------

/// Jobs enqueued one by one and in a batch are all run once and completed with their handler's
/// result; a kind without a handler is never claimed (`kinds`); the worker shows in
/// `/v1/workers` with its concurrency.
fn ok_single_and_batch(client: Client) {
    let (_dir, server, _worker) = setup(client, &Options::default());
    let url = &server.url;
    let single = enqueue(url, None, "ok", json!({"n": "single"}), json!({}));
    let unknown = enqueue(url, None, "no_such_handler", json!({}), json!({}));
    let jobs: Vec<Value> = (0..30)
        .map(|n| json!({"kind": "ok", "queue": QUEUE, "payload": {"n": n, "text": "héllo ✓"}}))
        .collect();
    let (status, batch) = post(
        &format!("{url}/v1/jobs/batch"),
        None,
        &json!({"jobs": jobs}),
    );
    assert_eq!(status, 201, "{batch}");
    let batch: BatchResponse = parse("POST /v1/jobs/batch", batch);
    assert_eq!(batch.ids.len(), 30, "{batch:?}");

    let done = wait_state(url, single, JobState::Completed);
    assert_eq!(
        done.result,
        Some(json!({"echo": {"n": "single"}})),
        "{done:#?}"
    );
    assert_eq!(done.attempt, 1, "{done:#?}");
    for (n, &id) in batch.ids.iter().enumerate() {
        let done = wait_state(url, id, JobState::Completed);
        assert_eq!(
            done.result,
            Some(json!({"echo": {"n": n, "text": "héllo ✓"}})),
            "{done:#?}"
        );
        assert_eq!(done.attempt, 1, "{done:#?}");
        assert!(done.errors.is_empty(), "{done:#?}");
    }
    let never = job(url, None, unknown);
    assert_eq!(never.state, JobState::Available, "{never:#?}");
    assert_eq!(never.attempt, 0, "claimed without a handler: {never:#?}");

    let workers: WorkersResponse = get_as(&format!("{url}/v1/workers"), None);
    let registered = workers
        .workers
        .iter()
        .any(|w| w.concurrency == 4 && w.state == WorkerState::Alive);
    assert!(
        registered,
        "the worker is not registered with concurrency 4: {workers:#?}"
    );
}

/// `Retry` fails the attempt and the server's backoff (1 s, then 2 s, ±20 %) spaces the
/// attempts; the third succeeds.
fn retry_twice_with_backoff(client: Client) {
    let (_dir, server, _worker) = setup(client, &Options::default());
    let id = enqueue(&server.url, None, "retry_twice", json!({}), json!({}));
    let done = wait_state(&server.url, id, JobState::Completed);
    assert_eq!(done.attempt, 3, "{done:#?}");
    assert_eq!(done.result, Some(json!({"attempt": 3})), "{done:#?}");
    let errors = &done.errors;
    assert_eq!(errors.len(), 2, "{done:#?}");
    for (attempt, error) in (1..).zip(errors) {
        assert_eq!(error.attempt, attempt, "{done:#?}");
        assert_eq!(
            error.class, "error",
            "Retry records class `error`: {done:#?}"
        );
    }
    let first_gap = millis_between(errors[0].at, errors[1].at);
    let second_gap = millis_between(errors[1].at, finished_at(&done));
    assert!(first_gap >= 750, "retried after {first_gap} ms: {done:#?}");
    assert!(
        second_gap >= 1500,
        "retried after {second_gap} ms: {done:#?}"
    );
}

/// `RetryAfter(0.5 s)` retries the job after half a second (class `retry_after`).
fn retry_after(client: Client) {
    let (_dir, server, _worker) = setup(client, &Options::default());
    let id = enqueue(&server.url, None, "retry_after", json!({}), json!({}));
    let done = wait_state(&server.url, id, JobState::Completed);
    assert_eq!(done.attempt, 2, "{done:#?}");
    let errors = &done.errors;
    assert_eq!(errors.len(), 1, "{done:#?}");
    assert_eq!(errors[0].class, "retry_after", "{done:#?}");
    let gap = millis_between(errors[0].at, finished_at(&done));
    assert!(gap >= 450, "retried after {gap} ms, asked 500: {done:#?}");
}

/// `Permanent` sends the job straight to the dead-letter queue, attempts left or not.
fn permanent_goes_dead(client: Client) {
    let (_dir, server, _worker) = setup(client, &Options::default());
    let id = enqueue(
        &server.url,
        None,
        "permanent",
        json!({"message": "no such customer 42"}),
        json!({"max_attempts": 5}),
    );
    let dead = wait_state(&server.url, id, JobState::Dead);
    assert_eq!(dead.attempt, 1, "{dead:#?}");
    let errors = &dead.errors;
    assert_eq!(errors.len(), 1, "{dead:#?}");
    assert_eq!(errors[0].class, "permanent", "{dead:#?}");
    assert!(
        errors[0].message.contains("no such customer 42"),
        "{dead:#?}"
    );
}

/// A plain exception fails the attempt with its class name and message (a traceback is
/// welcome) and is retried; on the last attempt the job is dead.
fn crash_retries_then_dies(client: Client) {
    let (_dir, server, _worker) = setup(client, &Options::default());
    let url = &server.url;
    let once = enqueue(
        url,
        None,
        "crash",
        json!({"message": "kaboom-once"}),
        json!({"max_attempts": 1}),
    );
    let twice = enqueue(
        url,
        None,
        "crash",
        json!({"message": "kaboom-twice"}),
        json!({"max_attempts": 2}),
    );
    let class = client.plain_exception_class();
    let dead = wait_state(url, once, JobState::Dead);
    assert_eq!(dead.attempt, 1, "{dead:#?}");
    let first = dead
        .errors
        .first()
        .unwrap_or_else(|| panic!("no error recorded: {dead:#?}"));
    assert_eq!(first.class, class, "{dead:#?}");
    assert!(first.message.contains("kaboom-once"), "{dead:#?}");
    let dead = wait_state(url, twice, JobState::Dead);
    assert_eq!(dead.attempt, 2, "retried once: {dead:#?}");
    let errors = &dead.errors;
    assert_eq!(errors.len(), 2, "{dead:#?}");
    for error in errors {
        assert_eq!(error.class, class, "{dead:#?}");
        assert!(error.message.contains("kaboom-twice"), "{dead:#?}");
    }
}

/// A job running three times longer than its 1 s lease keeps it by heartbeats: one attempt.
fn heartbeats_keep_a_long_job(client: Client) {
    let options = Options {
        lease_ms: Some(1000),
        ..Options::default()
    };
    let (_dir, server, _worker) = setup(client, &options);
    let id = enqueue(&server.url, None, "slow", json!({"ms": 3000}), json!({}));
    let running = wait_state(&server.url, id, JobState::Running);
    let lease_end = |job: &Job| job.lease.as_ref().map(|lease| lease.expires_at);
    let first_expiry = lease_end(&running);
    let renewed = wait_job(&server.url, id, "renewed", |job| {
        job.state != JobState::Running || lease_end(job) != first_expiry
    });
    assert_eq!(renewed.state, JobState::Running, "{renewed:#?}");
    let done = wait_state(&server.url, id, JobState::Completed);
    assert_eq!(done.attempt, 1, "{done:#?}");
    assert!(done.errors.is_empty(), "{done:#?}");
}

/// A running job cancelled by an operator: the worker learns its lease is lost (heartbeat or
/// acknowledgement), drops the handler's result and logs it (naming the job), and carries on:
/// with one slot, the next job runs once the lost one's handler has given its slot back.
fn lease_lost_drops_the_result(client: Client) {
    let options = Options {
        concurrency: 1,
        lease_ms: Some(1000),
        ..Options::default()
    };
    let (_dir, server, worker) = setup(client, &options);
    let url = &server.url;
    let id = enqueue(url, None, "slow", json!({"ms": 2000}), json!({}));
    wait_state(url, id, JobState::Running);
    let (status, cancelled) = post(&format!("{url}/v1/jobs/{id}/cancel"), None, &json!({}));
    assert_eq!(status, 200, "{cancelled}");
    let after = enqueue(url, None, "ok", json!({"after": true}), json!({}));
    let named = id.to_string();
    eventually_blocking_within(
        "the worker to log the lost lease",
        Duration::from_secs(30),
        || worker.stderr().contains(&named).then_some(()),
    );
    let done = wait_state(url, after, JobState::Completed);
    assert_eq!(
        done.result,
        Some(json!({"echo": {"after": true}})),
        "{done:#?}"
    );
    let lost = job(url, None, id);
    assert_eq!(lost.state, JobState::Cancelled, "{lost:#?}");
    assert_eq!(lost.result, None, "{lost:#?}");
    assert!(lost.errors.is_empty(), "{lost:#?}");
}

/// SIGTERM: the worker stops fetching, lets a job shorter than the grace period finish,
/// releases the one that would outlast it (available again, the attempt not counted) and
/// exits 0 soon after the grace period.
fn sigterm_drains_then_releases(client: Client) {
    let options = Options {
        grace_secs: 2.0,
        ..Options::default()
    };
    let (_dir, server, mut worker) = setup(client, &options);
    let url = &server.url;
    let short = enqueue(url, None, "slow", json!({"ms": 800}), json!({}));
    let long = enqueue(url, None, "slow", json!({"ms": 30000}), json!({}));
    wait_state(url, short, JobState::Running);
    wait_state(url, long, JobState::Running);
    let signalled = Instant::now();
    worker.proc.sigterm();
    // Enqueued while the worker drains: never run (at most claimed and handed back). Only once
    // the worker says it drains: a signal is handled in the worker's own time, and a job
    // fetched before that is rightly run (seen: a long-poll answered with it first).
    eventually_blocking_within(
        "the worker to say it drains",
        Duration::from_secs(10),
        || worker.stderr().contains("draining").then_some(()),
    );
    let late = enqueue(url, None, "ok", json!({}), json!({}));
    let status = worker.wait_exit(20);
    let took = signalled.elapsed();
    assert!(
        status.success(),
        "exit {status:?}; stderr:\n{}",
        worker.stderr()
    );
    assert!(
        took < Duration::from_secs(8),
        "exited {took:?} after SIGTERM"
    );
    let finished = job(url, None, short);
    assert_eq!(finished.state, JobState::Completed, "{finished:#?}");
    assert_eq!(finished.attempt, 1, "{finished:#?}");
    let released = job(url, None, long);
    assert_eq!(released.state, JobState::Available, "{released:#?}");
    assert_eq!(released.attempt, 0, "the attempt counted: {released:#?}");
    assert!(released.errors.is_empty(), "{released:#?}");
    let late = job(url, None, late);
    assert_eq!(late.state, JobState::Available, "{late:#?}");
    assert_eq!(late.attempt, 0, "{late:#?}");
}

/// The server is killed mid-run and restarted on the same store and port: the worker keeps
/// its finished job's acknowledgement, reconnects with backoff, and runs jobs enqueued after.
fn server_restart_mid_run(client: Client) {
    let options = Options {
        lease_ms: Some(15_000),
        ..Options::default()
    };
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let listen = free_port_below_ephemeral_range();
    let mut server = serve(&db, &listen, &[]);
    let url = server.url.clone();
    let _worker = WorkerProc::start(client, &url, &options);
    let first = enqueue(&url, None, "ok", json!({"n": 1}), json!({}));
    wait_state(&url, first, JobState::Completed);
    let slow = enqueue(&url, None, "slow", json!({"ms": 1500}), json!({}));
    wait_state(&url, slow, JobState::Running);

    server.proc.kill_9();
    // The outage: the slow job finishes meanwhile; fetches, heartbeats and its acknowledgement
    // meet a closed port.
    std::thread::sleep(Duration::from_millis(2000));
    let restarted = serve(&db, &listen, &[]);
    assert_eq!(restarted.url, url);

    let done = wait_state(&url, slow, JobState::Completed);
    assert_eq!(done.attempt, 1, "{done:#?}");
    let after: Vec<Uuid> = (0..5)
        .map(|n| enqueue(&url, None, "ok", json!({"after": n}), json!({})))
        .collect();
    for (n, &id) in after.iter().enumerate() {
        let done = wait_state(&url, id, JobState::Completed);
        assert_eq!(
            done.result,
            Some(json!({"echo": {"after": n}})),
            "{done:#?}"
        );
    }
}

/// With access control on: an unknown token stops the worker with an error naming 401; a
/// producer's token (which may not fetch) with one naming 403; a worker's token works.
fn auth_errors_stop_the_worker(client: Client) {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let admin = create_token(&db, "admin");
    let producer = create_token(&db, "producer");
    let worker_token = create_token(&db, "worker");
    let server = serve(&db, "127.0.0.1:0", &["--auth"]);
    let url = &server.url;

    let bad = format!("cv_{}_{}", "0".repeat(32), "0".repeat(64));
    for (token, status) in [(bad.as_str(), "401"), (producer.as_str(), "403")] {
        let options = Options {
            token: Some(token.to_string()),
            ..Options::default()
        };
        let mut worker = WorkerProc::spawn(client, url, &options);
        let exit = worker.wait_exit(30);
        let stderr = worker.stderr();
        assert!(
            !exit.success(),
            "the worker with a {status} token exited {exit:?}; stderr:\n{stderr}"
        );
        assert!(
            stderr.contains(status),
            "the worker's error does not name {status}:\n{stderr}"
        );
    }

    let options = Options {
        token: Some(worker_token),
        ..Options::default()
    };
    let _worker = WorkerProc::start(client, url, &options);
    let id = enqueue(url, Some(&admin), "ok", json!({"auth": true}), json!({}));
    let done = wait_job_with(url, Some(&admin), id, "completed", |job| {
        job.state == JobState::Completed
    });
    assert_eq!(
        done.result,
        Some(json!({"echo": {"auth": true}})),
        "{done:#?}"
    );
}

/// Every job of `QUEUE` in `state`, read page by page.
fn all_jobs(server: &str, state: JobState) -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut after = String::new();
    loop {
        let page: conveyor_server::api::JobPage = get_as(
            &format!("{server}/v1/jobs?queue={QUEUE}&state={state}&limit=500{after}"),
            None,
        );
        jobs.extend(page.jobs);
        match page.next {
            Some(next) => after = format!("&after={next}"),
            None => return jobs,
        }
    }
}

/// How long after its handler returned a `stamp` job was finished at the server (ms).
fn ack_lag_ms(job: &Job) -> i64 {
    let returned = job
        .result
        .as_ref()
        .and_then(|r| r["returned_at_ms"].as_i64())
        .unwrap_or_else(|| panic!("no returned_at_ms in the result: {job:#?}"));
    finished_at(job).timestamp_millis() - returned
}

/// Acknowledgements reach the server promptly and once (issue 27): through a drain of 3,000
/// jobs at concurrency 10 and then one job at a time on an idle queue, every job is finished at
/// the server within a second of its handler returning (mid-drain, at its end and while the
/// worker long-polls); after a SIGTERM drain, no acknowledgement was sent twice, every job was
/// acknowledged, and the worker logged no warning or error.
fn acks_are_prompt_and_sent_once(client: Client) {
    const DRAIN: usize = 3_000;
    const IDLE: usize = 5;
    let dir = temp_dir();
    let server = serve(&path_in(&dir, "jobs.db"), "127.0.0.1:0", &[]);
    let url = &server.url;
    let relay = AckRecorder::start(url);
    let options = Options {
        concurrency: 10,
        ..Options::default()
    };
    let mut worker = WorkerProc::start(client, &relay.url, &options);

    let jobs: Vec<Value> = (0..DRAIN)
        .map(|n| json!({"kind": "stamp", "queue": QUEUE, "payload": {"n": n}}))
        .collect();
    let (status, batch) = post(
        &format!("{url}/v1/jobs/batch"),
        None,
        &json!({"jobs": jobs}),
    );
    assert_eq!(status, 201, "{batch}");
    let completed =
        eventually_blocking_within("the drain to complete", Duration::from_secs(120), || {
            let jobs = all_jobs(url, JobState::Completed);
            if jobs.len() == DRAIN {
                Ok(jobs)
            } else {
                Err(format!("{} of {DRAIN} completed", jobs.len()))
            }
        });
    let mut lags: Vec<(i64, Uuid)> = completed.iter().map(|j| (ack_lag_ms(j), j.id)).collect();
    lags.sort();
    let (worst, worst_id) = *lags.last().expect("jobs");
    assert!(
        worst <= 1_000,
        "a drained job was finished {worst} ms after its handler returned (job {worst_id}); \
         {} of {DRAIN} took over 1 s",
        lags.iter().filter(|(lag, _)| *lag > 1_000).count()
    );

    // The queue idle: each job alone, while the worker long-polls.
    for n in 0..IDLE {
        let id = enqueue(url, None, "stamp", json!({"idle": n}), json!({}));
        let done = wait_state(url, id, JobState::Completed);
        let lag = ack_lag_ms(&done);
        assert!(
            lag <= 1_000,
            "job {id}, alone on an idle queue, was finished {lag} ms after its handler returned"
        );
    }

    worker.proc.sigterm();
    let status = worker.wait_exit(20);
    assert!(
        status.success(),
        "exit {status:?}; stderr:\n{}",
        worker.stderr()
    );
    let stderr = worker.stderr();
    let warnings: Vec<&str> = stderr
        .lines()
        .filter(|line| client.warning_markers().iter().any(|m| line.contains(m)))
        .collect();
    assert!(
        warnings.is_empty(),
        "a clean run logged warnings or errors:\n{}",
        warnings.join("\n")
    );

    let acks = relay.acks();
    let mut seen = std::collections::HashSet::new();
    let twice: Vec<&(String, String)> = acks.iter().filter(|ack| !seen.insert(*ack)).collect();
    assert!(
        twice.is_empty(),
        "{} acknowledgement(s) sent twice, e.g. job {:?}",
        twice.len(),
        twice.first()
    );
    assert_eq!(
        seen.len(),
        DRAIN + IDLE,
        "every job is acknowledged once through the relay"
    );
}

macro_rules! conformance {
    ($module:ident, $client:expr) => {
        mod $module {
            use super::*;

            #[test]
            fn ok_single_and_batch() {
                super::ok_single_and_batch($client);
            }

            #[test]
            fn retry_twice_with_backoff() {
                super::retry_twice_with_backoff($client);
            }

            #[test]
            fn retry_after() {
                super::retry_after($client);
            }

            #[test]
            fn permanent_goes_dead() {
                super::permanent_goes_dead($client);
            }

            #[test]
            fn crash_retries_then_dies() {
                super::crash_retries_then_dies($client);
            }

            #[test]
            fn heartbeats_keep_a_long_job() {
                super::heartbeats_keep_a_long_job($client);
            }

            #[test]
            fn lease_lost_drops_the_result() {
                super::lease_lost_drops_the_result($client);
            }

            #[test]
            fn sigterm_drains_then_releases() {
                super::sigterm_drains_then_releases($client);
            }

            #[test]
            fn server_restart_mid_run() {
                super::server_restart_mid_run($client);
            }

            #[test]
            fn acks_are_prompt_and_sent_once() {
                super::acks_are_prompt_and_sent_once($client);
            }

            #[test]
            fn auth_errors_stop_the_worker() {
                super::auth_errors_stop_the_worker($client);
            }
        }
    };
}

conformance!(python, Client::Python);
conformance!(typescript, Client::TypeScript);
