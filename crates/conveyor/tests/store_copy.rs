//! `conveyor store copy`: a user who outgrows the embedded store moves everything it holds
//! (settings, kinds, breakers, tokens, schedules and runs, flows, jobs, audit, history) to
//! PostgreSQL in one command, and back; a flow caught mid-run finishes on the target.

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn run(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env("CONVEYOR_LOG", "warn")
        .output()
        .expect("run conveyor")
}

fn text(output: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// An HTTP client that sends the admin token.
struct Api {
    url: String,
    token: String,
}

impl Api {
    fn send(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = http()
            .request(method.clone(), format!("{}{path}", self.url))
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().expect("request");
        let status = response.status();
        let text = response.text().unwrap_or_default();
        assert!(status.is_success(), "{method} {path}: {status} {text}");
        serde_json::from_str(&text).unwrap_or(Value::Null)
    }

    fn post(&self, path: &str, body: Value) -> Value {
        self.send(reqwest::Method::POST, path, Some(body))
    }

    fn put(&self, path: &str, body: Value) -> Value {
        self.send(reqwest::Method::PUT, path, Some(body))
    }

    fn get(&self, path: &str) -> Value {
        self.send(reqwest::Method::GET, path, None)
    }

    /// Fetches one job of `queue` as worker `w`, if there is one.
    fn fetch(&self, queue: &str) -> Option<Value> {
        let fetched = self.post(
            "/v1/fetch",
            json!({"worker_id": "copy-test", "queues": [queue], "max": 1}),
        );
        fetched["jobs"]
            .as_array()
            .and_then(|jobs| jobs.first().cloned())
    }

    fn complete(&self, job: &Value, result: Value) {
        let id = job["id"].as_str().expect("id");
        self.post(
            &format!("/v1/jobs/{id}/complete"),
            json!({"lease_token": job["lease_token"], "result": result}),
        );
    }
}

/// The ids of the flows `populate` leaves mid-run: a chain whose first step completed, and a
/// flow whose first step waits for a signal.
struct Flows {
    chain: String,
    approval: String,
}

/// Fills every table of the store at `store` through the CLI and a real server with access
/// control on, then stops the server gracefully (so it writes its history rollups).
fn populate(store: &str) -> Flows {
    let created = run(&[
        "token", "create", "--role", "admin", "--name", "copier", "--store", store,
    ]);
    let (out, err) = text(&created);
    assert!(created.status.success(), "{err}");
    let token = out.trim().to_string();
    let old = run(&[
        "token", "create", "--role", "producer", "--name", "old", "--store", store,
    ]);
    assert!(old.status.success(), "{}", text(&old).1);
    let revoked = run(&["token", "revoke", "old", "--store", store]);
    assert!(revoked.status.success(), "{}", text(&revoked).1);

    let server = start_server_at(store, &["--auth=true"]);
    let api = Api {
        url: server.url.clone(),
        token,
    };
    api.put(
        "/v1/queues/orders",
        json!({"concurrency_limit": 50, "weight": 3, "max_depth": 10000,
               "circuit_breaker": {"failure_ratio": 0.5, "min_calls": 3, "open_ms": 600000}}),
    );
    api.put(
        "/v1/kinds/order.validate",
        json!({"schema": {"type": "object", "required": ["order"]}, "version": 2}),
    );
    api.put(
        "/v1/kinds/order.export",
        json!({"batch": {"max_size": 200, "max_wait_ms": 5000, "key": "payload.account"}}),
    );
    api.post(
        "/v1/kinds/legacy.fax/circuit/open",
        json!({"reason": "vendor outage"}),
    );
    api.put(
        "/v1/schedules/nightly",
        json!({"cron": "0 3 * * *", "timezone": "Europe/Berlin",
               "job": {"kind": "report.build", "queue": "reports", "payload": {"scope": "all"}}}),
    );
    api.post("/v1/schedules/nightly/trigger", json!({}));
    // A schedule firing every second records runs; paused once it has, so the copy sees it still.
    api.put(
        "/v1/schedules/ticker",
        json!({"cron": "* * * * * *", "job": {"kind": "tick", "queue": "ticks"}}),
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let runs = api.get("/v1/schedules/ticker/runs");
        let fired = runs
            .as_array()
            .or_else(|| runs["runs"].as_array())
            .is_some_and(|runs| !runs.is_empty());
        if fired {
            break;
        }
        assert!(Instant::now() < deadline, "the ticker never fired: {runs}");
        std::thread::sleep(Duration::from_millis(200));
    }
    api.post("/v1/schedules/ticker/pause", json!({}));

    let chain = api.post(
        "/v1/flows",
        json!({"name": "chain", "steps": [
            {"name": "a", "job": {"kind": "chain.a", "queue": "flows", "payload": {"n": 1}}},
            {"name": "b", "job": {"kind": "chain.b", "queue": "flows"}, "after": ["a"]},
            {"name": "c", "job": {"kind": "chain.c", "queue": "flows"}, "after": ["b"]}
        ]}),
    )["id"]
        .as_str()
        .expect("flow id")
        .to_string();
    let approval = api.post(
        "/v1/flows",
        json!({"name": "approval", "steps": [
            {"name": "approve", "wait": {"signal": "approved"}},
            {"name": "ship", "job": {"kind": "parcel.ship", "queue": "flows"}, "after": ["approve"]}
        ]}),
    )["id"]
        .as_str()
        .expect("flow id")
        .to_string();
    // The chain's first step completes here; the second is queued when the copy runs.
    let first = api.fetch("flows").expect("the chain's first job");
    assert_eq!(first["kind"], "chain.a");
    api.complete(&first, json!({"a": "done"}));

    for n in 0..12 {
        api.post(
            "/v1/jobs",
            json!({"kind": "order.validate", "queue": "orders", "payload": {"order": n},
                   "tags": ["t"], "priority": n % 3}),
        );
    }
    // A dead job with history, a cancelled one, a scheduled one, a completed one.
    let job = api.fetch("orders").expect("an order");
    let id = job["id"].as_str().expect("id");
    api.post(
        &format!("/v1/jobs/{id}/fail"),
        json!({"lease_token": job["lease_token"], "retry": "never", "error": {"message": "kept"}}),
    );
    let done = api.fetch("orders").expect("an order");
    api.complete(&done, json!({"ok": true}));
    let cancel = api.post("/v1/jobs", json!({"kind": "copy.me"}));
    api.post(
        &format!("/v1/jobs/{}/cancel", cancel["id"].as_str().expect("id")),
        json!({}),
    );
    api.post("/v1/jobs", json!({"kind": "later", "delay_ms": 3_600_000}));

    // A graceful stop flushes the history recorder.
    let Server { mut proc, .. } = server;
    proc.sigterm();
    assert!(proc.wait_exit(Duration::from_secs(30)).success());
    Flows { chain, approval }
}

/// Every record of every kind the copy moves, as the store exports it, by kind.
fn dump(store: &str) -> Value {
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let store = conveyor::open_store(store, Default::default())
            .await
            .expect("open store");
        let all = 100_000;
        let dump = json!({
            "queue_settings": serde_json::to_value(store.export_queue_settings().await.unwrap()).unwrap(),
            "kinds": serde_json::to_value(store.export_kinds().await.unwrap()).unwrap(),
            "breakers": serde_json::to_value(store.export_breakers().await.unwrap()).unwrap(),
            "tokens": store.export_tokens().await.unwrap().iter().map(|t| json!({
                "token": serde_json::to_value(&t.token).unwrap(), "secret_hash": t.secret_hash,
            })).collect::<Vec<_>>(),
            "schedules": serde_json::to_value(store.export_schedules().await.unwrap()).unwrap(),
            "schedule_runs": serde_json::to_value(store.export_schedule_runs(None, all).await.unwrap()).unwrap(),
            "flows": serde_json::to_value(store.export_flows(None, all).await.unwrap()).unwrap(),
            "jobs": serde_json::to_value(store.export_jobs(None, all).await.unwrap()).unwrap(),
            "audit": serde_json::to_value(store.export_audit(None, all).await.unwrap()).unwrap(),
            "rollups": serde_json::to_value(store.export_rollups(None, all).await.unwrap()).unwrap(),
        });
        drop(store);
        dump
    })
}

/// Every kind holds something (the test populates every table).
fn assert_every_kind_populated(dump: &Value) {
    for (kind, records) in dump.as_object().expect("object") {
        assert!(
            !records.as_array().expect("array").is_empty(),
            "no {kind} in the populated store"
        );
    }
    let steps: usize = dump["flows"]
        .as_array()
        .expect("flows")
        .iter()
        .map(|flow| flow["steps"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(steps, 5, "both flows with every step");
}

/// Compares two dumps kind by kind and record by record, naming the first difference.
fn assert_same_content(source: &Value, target: &Value) {
    for (kind, records) in source.as_object().expect("object") {
        let theirs = target[kind].as_array().expect("array");
        let ours = records.as_array().expect("array");
        assert_eq!(ours.len(), theirs.len(), "{kind}: as many records");
        for (mine, copied) in ours.iter().zip(theirs) {
            assert_eq!(mine, copied, "{kind}: the copy differs");
        }
    }
}

fn copy(from: &str, to: &str, extra: &[&str]) -> String {
    let mut args = vec!["store", "copy", "--from", from, "--to", to];
    args.extend_from_slice(extra);
    let output = run(&args);
    let (out, err) = text(&output);
    assert!(output.status.success(), "store copy failed: {err}\n{out}");
    out
}

/// The progress line of `kind`: (read, written, already there).
fn progress(out: &str, kind: &str) -> (u64, u64, u64) {
    let line = out
        .lines()
        .find(|line| line.starts_with(&format!("{kind}: ")))
        .unwrap_or_else(|| panic!("no progress line for {kind} in {out}"));
    let numbers: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit() && c != ',')
        .filter(|part| !part.is_empty() && part.chars().any(|c| c.is_ascii_digit()))
        .map(|part| part.replace(',', "").parse().expect("number"))
        .collect();
    assert_eq!(numbers.len(), 3, "{line}");
    (numbers[0], numbers[1], numbers[2])
}

const KINDS: [&str; 10] = [
    "queue settings",
    "kinds",
    "circuit breakers",
    "tokens",
    "schedules",
    "flows",
    "jobs",
    "schedule runs",
    "audit entries",
    "history rollups",
];

/// The whole scenario from `source` (populated here) to `target` (empty).
fn copy_everything(source: &str, target: &str) {
    let flows = populate(source);
    let before = dump(source);
    assert_every_kind_populated(&before);

    // A dry run counts what a copy would move and writes nothing.
    let dry = copy(source, target, &["--dry-run"]);
    for kind in KINDS {
        let line = dry
            .lines()
            .find(|line| line.starts_with(&format!("{kind}: ")))
            .unwrap_or_else(|| panic!("no dry-run line for {kind} in {dry}"));
        let expected = before[dump_key(kind)].as_array().expect("array").len();
        assert_eq!(line, format!("{kind}: {expected} to copy"), "{dry}");
    }
    assert!(dry.contains("nothing was written"), "{dry}");

    let first = copy(source, target, &[]);
    for kind in KINDS {
        let expected = before[dump_key(kind)].as_array().expect("array").len() as u64;
        assert_eq!(
            progress(&first, kind),
            (expected, expected, 0),
            "{kind} on the first run:\n{first}"
        );
    }
    let after = dump(target);
    assert_same_content(&before, &after);

    // Again: nothing doubles, everything is already there.
    let second = copy(source, target, &[]);
    for kind in KINDS {
        let expected = before[dump_key(kind)].as_array().expect("array").len() as u64;
        assert_eq!(
            progress(&second, kind),
            (expected, 0, expected),
            "{kind} on the second run:\n{second}"
        );
    }
    assert!(second.contains("copied 0 record(s)"), "{second}");
    assert_same_content(&before, &dump(target));

    // The flows caught mid-run finish on the target.
    let token_out = run(&[
        "token",
        "create",
        "--role",
        "admin",
        "--name",
        "after-copy",
        "--store",
        target,
    ]);
    assert!(token_out.status.success(), "{}", text(&token_out).1);
    let server = start_server_at(target, &["--auth=true"]);
    let api = Api {
        url: server.url.clone(),
        token: text(&token_out).0.trim().to_string(),
    };
    // The copied tokens authenticate on the target: the revoked one is listed as revoked.
    let tokens = api.get("/v1/tokens");
    let names: Vec<&str> = tokens["tokens"]
        .as_array()
        .map(|t| t.iter().filter_map(|t| t["name"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        names.contains(&"copier") && names.contains(&"old"),
        "{tokens}"
    );
    api.post(
        &format!("/v1/flows/{}/signal", flows.approval),
        json!({"signal": "approved", "payload": {"by": "ops"}}),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut ran = Vec::new();
    loop {
        let chain = api.get(&format!("/v1/flows/{}", flows.chain));
        let approval = api.get(&format!("/v1/flows/{}", flows.approval));
        if chain["state"] == "completed" && approval["state"] == "completed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "flows did not finish on the target: {chain} {approval} (ran {ran:?})"
        );
        match api.fetch("flows") {
            Some(job) => {
                ran.push(job["kind"].as_str().unwrap_or_default().to_string());
                api.complete(&job, json!({"step": job["kind"]}));
            }
            None => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    ran.sort();
    assert_eq!(
        ran,
        ["chain.b", "chain.c", "parcel.ship"],
        "each remaining step ran once on the target, the completed one not again"
    );
}

fn dump_key(kind: &str) -> &'static str {
    match kind {
        "queue settings" => "queue_settings",
        "kinds" => "kinds",
        "circuit breakers" => "breakers",
        "tokens" => "tokens",
        "schedules" => "schedules",
        "flows" => "flows",
        "jobs" => "jobs",
        "schedule runs" => "schedule_runs",
        "audit entries" => "audit",
        "history rollups" => "rollups",
        other => panic!("unknown kind {other}"),
    }
}

#[test]
fn store_copy_moves_every_kind_of_record_from_sqlite_to_postgres() {
    let dir = temp_dir();
    let sqlite = format!("sqlite://{}", path_in(&dir, "source.db").display());
    let schema = Schema::fresh("conveyor_copy");
    copy_everything(&sqlite, &schema.url());
}

#[test]
fn store_copy_moves_every_kind_of_record_from_postgres_to_sqlite() {
    let dir = temp_dir();
    let schema = Schema::fresh("conveyor_copy_back");
    let sqlite = format!("sqlite://{}", path_in(&dir, "target.db").display());
    copy_everything(&schema.url(), &sqlite);
}

#[test]
fn store_copy_dry_run_leaves_the_target_unmade() {
    let dir = temp_dir();
    let source = format!("sqlite://{}", path_in(&dir, "source.db").display());
    let target_path = path_in(&dir, "target.db");
    let target = format!("sqlite://{}", target_path.display());
    {
        let server = start_server_at(&source, &[]);
        enqueue(&server.url, json!({"kind": "copy.me"}));
    }
    let out = copy(&source, &target, &["--dry-run"]);
    assert!(out.contains("jobs: 1 to copy"), "{out}");
    assert!(!target_path.exists(), "a dry run creates no target");
}

#[test]
fn store_copy_refuses_the_same_store_and_an_unreachable_one() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let sqlite = format!("sqlite://{}", db.display());
    {
        let server = start_server(&db, &[]);
        enqueue(&server.url, json!({"kind": "copy.me"}));
    }
    let same = run(&["store", "copy", "--from", &sqlite, "--to", &sqlite]);
    assert!(!same.status.success());
    assert!(
        text(&same).1.contains("name the same store"),
        "{}",
        text(&same).1
    );

    let missing = format!("sqlite://{}", path_in(&dir, "nope.db").display());
    let absent = run(&["store", "copy", "--from", &missing, "--to", &sqlite]);
    assert!(!absent.status.success());
    assert!(
        text(&absent).1.contains("does not exist"),
        "{}",
        text(&absent).1
    );

    let unreachable = run(&[
        "store",
        "copy",
        "--from",
        &sqlite,
        "--to",
        "postgres://postgres@127.0.0.1:1/test?schema=nowhere",
    ]);
    assert!(!unreachable.status.success());
    assert!(
        text(&unreachable).1.contains("cannot open target store"),
        "{}",
        text(&unreachable).1
    );
}
