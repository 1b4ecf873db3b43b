//! Helpers for tests that run the real `conveyor` binary as child processes.
#![allow(dead_code)]

use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

// Waiting for conditions: the workspace's one poll loop (the test kit's).
#[allow(unused_imports)]
pub use conveyor_storetest::eventually::{
    eventually, eventually_blocking, eventually_blocking_within, eventually_within,
    try_eventually_within,
};

pub const BIN: &str = env!("CARGO_BIN_EXE_conveyor");

/// A child process killed (SIGKILL) and reaped when dropped, so no test leaves one behind.
pub struct Proc {
    pub child: Child,
}

impl Proc {
    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn sigterm(&self) {
        // SAFETY: sending a signal to our own child process.
        unsafe {
            libc::kill(self.pid(), libc::SIGTERM);
        }
    }

    /// Waits for the process to exit on its own; panics after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let what = format!("process {} to exit", self.pid());
        eventually_blocking_within(&what, timeout, || {
            self.child.try_wait().expect("try_wait").ok_or("running")
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Server {
    pub proc: Proc,
    pub url: String,
}

/// Starts `conveyor serve` on a free port over the SQLite file `db`; returns once it listens.
pub fn start_server(db: &Path, extra: &[&str]) -> Server {
    start_server_at(&format!("sqlite://{}", db.display()), extra)
}

/// Starts `conveyor serve` on a free port over the store at `url`; returns once it listens.
pub fn start_server_at(url: &str, extra: &[&str]) -> Server {
    start_server_with(&["--listen", "127.0.0.1:0", "--store", url], extra, &[])
}

/// Starts `conveyor serve` with these arguments and environment variables; returns once it
/// listens.
pub fn start_server_with(args: &[&str], extra: &[&str], env: &[(&str, &str)]) -> Server {
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .args(extra)
        .envs(env.iter().copied())
        .env("CONVEYOR_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn conveyor serve");
    let stdout = child.stdout.take().expect("stdout");
    let mut reader = BufReader::new(stdout);
    let mut first = String::new();
    reader.read_line(&mut first).expect("read listen line");
    // Keep reading so the server never writes into a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut reader, &mut std::io::sink()));
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://") || w.starts_with("https://"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    Server {
        proc: Proc { child },
        url,
    }
}

/// Starts `conveyor work --exec CMD` against `server` with extra flags.
pub fn start_worker(server: &str, exec: &str, extra: &[&str]) -> Proc {
    let child = Command::new(BIN)
        .args(["work", "--server", server, "--exec", exec])
        .args(extra)
        .env("CONVEYOR_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn conveyor work");
    Proc { child }
}

/// Whether `server` says (on `/healthz`) that it leads maintenance.
pub fn is_leader(server: &str) -> bool {
    http()
        .get(format!("{server}/healthz"))
        .send()
        .ok()
        .and_then(|r| r.json::<Value>().ok())
        .is_some_and(|h| h["leader"] == true)
}

/// Migrates the store at `url` (`conveyor migrate`), so servers started on it after do not race
/// to.
pub fn migrate(url: &str) {
    let migrate = conveyor(&["migrate", "--store", url]);
    assert!(
        migrate.status.success(),
        "{}",
        String::from_utf8_lossy(&migrate.stderr)
    );
}

pub fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .expect("client")
}

pub fn get_job(server: &str, id: &str) -> Value {
    http()
        .get(format!("{server}/v1/jobs/{id}"))
        .send()
        .expect("GET job")
        .json()
        .expect("job JSON")
}

pub fn enqueue(server: &str, body: Value) -> Value {
    let response = http()
        .post(format!("{server}/v1/jobs"))
        .json(&body)
        .send()
        .expect("POST job");
    assert!(
        response.status().is_success(),
        "enqueue failed: {}",
        response.status()
    );
    response.json().expect("job JSON")
}

pub fn temp_dir() -> tempfile::TempDir {
    tempfile::tempdir().expect("temp dir")
}

pub fn path_in(dir: &tempfile::TempDir, name: &str) -> PathBuf {
    dir.path().join(name)
}

/// The PostgreSQL database the tests use (`CONVEYOR_TEST_PG_URL` overrides it).
pub fn pg_base() -> String {
    std::env::var("CONVEYOR_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// A PostgreSQL schema of the test's own, dropped when the test ends however it ends.
pub struct Schema(pub String);

impl Schema {
    pub fn fresh(prefix: &str) -> Self {
        Schema(format!("{prefix}_{}", uuid::Uuid::new_v4().simple()))
    }

    /// The store URL naming this schema.
    pub fn url(&self) -> String {
        format!("{}?schema={}", pg_base(), self.0)
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        let _ = Command::new("psql")
            .args([
                &pg_base(),
                "-q",
                "-c",
                &format!("DROP SCHEMA IF EXISTS {} CASCADE", self.0),
            ])
            .output();
    }
}

/// Runs the `conveyor` command line to its end (warnings only in its log).
pub fn conveyor(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .args(args)
        .env("CONVEYOR_LOG", "warn")
        .output()
        .expect("run conveyor")
}

/// Debian's libfaketime (package `faketime`; `scripts/test.sh` installs it).
pub fn libfaketime() -> String {
    std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path().join("faketime/libfaketime.so.1"))
        .find(|path| path.exists())
        .map(|path| path.display().to_string())
        .expect("libfaketime (Debian package faketime: apt-get install faketime)")
}

/// Sends `signal` (such as `libc::SIGSTOP` or `libc::SIGCONT`) to a child of this test.
pub fn signal(pid: i32, signal: i32) {
    // SAFETY: signalling a process this test started and has not reaped.
    let sent = unsafe { libc::kill(pid, signal) };
    assert_eq!(sent, 0, "signal {signal} to {pid}");
}

/// How far `server`'s wall clock is from this process's, by its HTTP `Date` header (whole
/// seconds): shows that the skew is really in effect.
pub fn clock_offset_secs(server: &str) -> i64 {
    let response = http()
        .get(format!("{server}/healthz"))
        .send()
        .expect("healthz");
    let date = response
        .headers()
        .get("date")
        .and_then(|d| d.to_str().ok())
        .expect("a Date header")
        .to_string();
    let at = chrono::DateTime::parse_from_rfc2822(&date).expect("an HTTP date");
    at.timestamp() - chrono::Utc::now().timestamp()
}

/// Where the test's servers keep their jobs: a SQLite file (one server) or a PostgreSQL
/// schema shared by two servers.
pub enum Backend {
    Sqlite(tempfile::TempDir),
    Postgres(Schema),
}

impl Backend {
    pub fn servers(&self) -> Vec<Server> {
        match self {
            Backend::Sqlite(dir) => vec![start_server(&path_in(dir, "jobs.db"), &[])],
            Backend::Postgres(schema) => {
                let first = start_server_at(&schema.url(), &[]);
                let second = start_server_at(&schema.url(), &["--no-migrate"]);
                vec![first, second]
            }
        }
    }
}

pub fn set_queue(server: &str, queue: &str, settings: Value) {
    let response = http()
        .put(format!("{server}/v1/queues/{queue}"))
        .json(&settings)
        .send()
        .expect("PUT settings");
    assert_eq!(response.status(), 200, "{:?}", response.text());
}

/// `POST /v1/jobs/batch` of `jobs`, which must be stored (201): the answer.
pub fn enqueue_batch(server: &str, jobs: &[Value]) -> Value {
    let response = http()
        .post(format!("{server}/v1/jobs/batch"))
        .json(&json!({ "jobs": jobs }))
        .send()
        .expect("POST batch");
    assert_eq!(response.status(), 201);
    response.json().expect("batch JSON")
}

pub fn enqueue_many(server: &str, jobs: Vec<Value>) -> Vec<String> {
    let mut ids = Vec::with_capacity(jobs.len());
    for chunk in jobs.chunks(1000) {
        let body = enqueue_batch(server, chunk);
        ids.extend(
            body["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|id| id.as_str().expect("id").to_string()),
        );
    }
    ids
}
