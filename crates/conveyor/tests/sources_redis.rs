//! Event sources end to end: a real `conveyor serve` reading a real Redis stream (127.0.0.1:6379)
//! through a consumer group. Each message becomes exactly one job and is acknowledged only once
//! that job is stored: 10,000 entries make 10,000 jobs with nothing left pending; a server killed
//! with SIGKILL mid-ingest and started again leaves every entry a job, none twice; a queue at its
//! maximum depth stops the reading (entries stay unacknowledged) until it accepts again; bodies
//! that are not JSON are kept as base64, and messages that cannot be mapped are dead-lettered.
//! Each test uses its own stream and deletes it.

mod common;

use common::*;
use redis::Commands;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

const REDIS: &str = "redis://127.0.0.1:6379";

/// A stream of this test's own, deleted when dropped.
struct Stream {
    name: String,
    redis: redis::Connection,
}

impl Stream {
    fn fresh(prefix: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let redis = redis::Client::open(REDIS)
            .and_then(|client| client.get_connection())
            .expect("Redis on 127.0.0.1:6379");
        Stream {
            name: format!("conveyor-test-{prefix}-{}-{nanos}", std::process::id()),
            redis,
        }
    }

    /// Adds entries whose `body` is each of `bodies` (with `headers` beside it), in one round trip.
    fn add(&mut self, bodies: impl IntoIterator<Item = Vec<u8>>, headers: &[(&str, &str)]) {
        let mut pipe = redis::pipe();
        for body in bodies {
            let mut fields: Vec<(String, Vec<u8>)> = vec![("body".into(), body)];
            for (name, value) in headers {
                fields.push((name.to_string(), value.as_bytes().to_vec()));
            }
            pipe.xadd(&self.name, "*", &fields).ignore();
        }
        let () = pipe.query(&mut self.redis).expect("XADD");
    }

    /// Entries the group has not acknowledged: read and pending, or not yet read.
    fn unacknowledged(&mut self) -> u64 {
        let info: redis::streams::StreamInfoGroupsReply =
            self.redis.xinfo_groups(&self.name).expect("XINFO GROUPS");
        let group = info
            .groups
            .iter()
            .find(|group| group.name == "conveyor")
            .expect("the group");
        group.pending as u64 + group.lag.unwrap_or(0) as u64
    }

    /// Entries the group has read and not acknowledged.
    fn pending(&mut self) -> u64 {
        let summary: redis::Value = redis::cmd("XPENDING")
            .arg(&self.name)
            .arg("conveyor")
            .query(&mut self.redis)
            .expect("XPENDING");
        match summary {
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::Int(n)) => u64::try_from(*n).unwrap_or(0),
                other => panic!("XPENDING count: {other:?}"),
            },
            other => panic!("XPENDING: {other:?}"),
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        let _: redis::RedisResult<i64> = self.redis.del(&self.name);
    }
}

fn sources_file(dir: &tempfile::TempDir, stream: &str, extra: &str) -> std::path::PathBuf {
    let path = path_in(dir, "sources.toml");
    std::fs::write(
        &path,
        format!(
            "[sources.orders]\ntype = \"redis_stream\"\nurl = \"{REDIS}\"\nstream = \"{stream}\"\n\
             group = \"conveyor\"\n\
             job = {{ kind = \"order.placed\", queue = \"orders\" }}\n{extra}"
        ),
    )
    .expect("write sources file");
    path
}

fn source(server: &str) -> Value {
    http()
        .get(format!("{server}/v1/sources/orders"))
        .send()
        .expect("GET source")
        .json()
        .expect("source JSON")
}

fn queue(server: &str, name: &str) -> Value {
    let answer: Value = http()
        .get(format!("{server}/v1/queues"))
        .send()
        .expect("GET queues")
        .json()
        .expect("queues JSON");
    answer["queues"]
        .as_array()
        .and_then(|queues| queues.iter().find(|q| q["name"] == name).cloned())
        .unwrap_or_else(|| json!({}))
}

fn waiting(queue: &Value) -> u64 {
    ["available", "scheduled", "running", "retryable"]
        .iter()
        .map(|state| queue[state].as_u64().unwrap_or(0))
        .sum()
}

/// Polls `check` until it is true, failing with `what` after `limit`.
fn wait_until(limit: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Every job of the queue, by the `n` its payload carries (each must be there once).
fn numbers_in(server: &str, queue: &str) -> BTreeSet<u64> {
    let mut numbers = BTreeSet::new();
    let mut after: Option<String> = None;
    let mut total = 0;
    loop {
        let mut url = format!("{server}/v1/jobs?queue={queue}&limit=500");
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let page: Value = http()
            .get(url)
            .send()
            .expect("GET jobs")
            .json()
            .expect("jobs");
        let jobs = page["jobs"].as_array().cloned().unwrap_or_default();
        if jobs.is_empty() {
            break;
        }
        for job in &jobs {
            total += 1;
            let n = job["payload"]["n"].as_u64().expect("payload n");
            assert!(numbers.insert(n), "message {n} became two jobs");
            assert!(job["idempotency_key"]
                .as_str()
                .is_some_and(|key| key.starts_with("source:orders:")));
        }
        after = jobs
            .last()
            .and_then(|job| job["id"].as_str())
            .map(String::from);
    }
    assert_eq!(total, numbers.len());
    numbers
}

fn bodies(range: std::ops::Range<u64>) -> impl Iterator<Item = Vec<u8>> {
    range.map(|n| json!({ "n": n }).to_string().into_bytes())
}

#[test]
fn ten_thousand_entries_become_ten_thousand_jobs_each_acknowledged() {
    let dir = temp_dir();
    let mut stream = Stream::fresh("drain");
    let file = sources_file(&dir, &stream.name, "max_in_flight = 500\n");
    let server = start_server(&path_in(&dir, "jobs.db"), &["--sources", path_str(&file)]);
    stream.add(bodies(0..10_000), &[]);
    wait_until(Duration::from_secs(120), "10,000 jobs", || {
        source(&server.url)["enqueued"] == 10_000
    });
    let status = source(&server.url);
    assert_eq!(status["state"], "running", "{status}");
    assert_eq!(status["received"], 10_000, "{status}");
    assert_eq!(status["duplicates"], 0, "{status}");
    assert_eq!(numbers_in(&server.url, "orders"), (0..10_000).collect());
    wait_until(Duration::from_secs(10), "every entry acknowledged", || {
        stream.pending() == 0
    });
    // An idle stream is not a failure: reads that block a second and come back empty leave the
    // source running with no error. There is no event for "nothing happened", so the source is
    // watched over a window of several blocked reads.
    let idle_until = Instant::now() + Duration::from_millis(3_500);
    while Instant::now() < idle_until {
        let status = source(&server.url);
        assert_eq!(status["state"], "running", "{status}");
        assert_eq!(status["last_error"], Value::Null, "{status}");
        std::thread::sleep(Duration::from_millis(250));
    }
    // Shown without a password, and listed.
    let list: Value = http()
        .get(format!("{}/v1/sources", server.url))
        .send()
        .expect("GET sources")
        .json()
        .expect("list");
    assert_eq!(list["sources"][0]["name"], "orders");
    assert_eq!(list["sources"][0]["type"], "redis_stream");
    let metrics = http()
        .get(format!("{}/metrics", server.url))
        .send()
        .expect("GET metrics")
        .text()
        .expect("metrics text");
    assert!(
        metrics.contains(
            "conveyor_source_messages_total{source=\"orders\",outcome=\"enqueued\"} 10000"
        ),
        "{metrics}"
    );
    assert!(metrics.contains("conveyor_source_paused{source=\"orders\"} 0"));
    let missing = http()
        .get(format!("{}/v1/sources/nope", server.url))
        .send()
        .expect("GET missing");
    assert_eq!(missing.status().as_u16(), 404);
}

#[test]
fn a_server_killed_mid_ingest_leaves_every_entry_one_job_after_its_restart() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let mut stream = Stream::fresh("kill");
    // Entries the killed server read and never acknowledged are taken over after a second.
    // Small batches, so the kill lands while most of the stream is still to do.
    let file = sources_file(
        &dir,
        &stream.name,
        "max_in_flight = 50\nclaim_idle_ms = 1000\n",
    );
    stream.add(bodies(0..20_000), &[]);
    let mut server = start_server(&db, &["--sources", path_str(&file)]);
    wait_until(Duration::from_secs(120), "some jobs stored", || {
        source(&server.url)["enqueued"].as_u64().unwrap_or(0) >= 1_000
    });
    server.proc.kill_9();
    assert!(
        stream.unacknowledged() > 0,
        "the kill came after the whole stream was ingested: it tested no recovery"
    );
    // Entries read but not acknowledged when it died are taken over after claim_idle_ms.
    let server = start_server(&db, &["--sources", path_str(&file)]);
    wait_until(Duration::from_secs(180), "20,000 jobs", || {
        waiting(&queue(&server.url, "orders")) >= 20_000
    });
    wait_until(Duration::from_secs(30), "every entry acknowledged", || {
        stream.pending() == 0
    });
    assert_eq!(numbers_in(&server.url, "orders"), (0..20_000).collect());
}

#[test]
fn a_full_queue_stops_the_reading_until_it_accepts_again() {
    let dir = temp_dir();
    let mut stream = Stream::fresh("full");
    let file = sources_file(&dir, &stream.name, "max_in_flight = 20\n");
    let server = start_server(&path_in(&dir, "jobs.db"), &["--sources", path_str(&file)]);
    let put = http()
        .put(format!("{}/v1/queues/orders", server.url))
        .json(&json!({ "max_depth": 50 }))
        .send()
        .expect("PUT queue");
    assert!(put.status().is_success());
    stream.add(bodies(0..200), &[]);
    wait_until(Duration::from_secs(60), "the source to back off", || {
        source(&server.url)["state"] == "backing_off"
    });
    assert!(waiting(&queue(&server.url, "orders")) <= 50);
    // The refused batch is held, not acknowledged.
    assert!(stream.pending() > 0);
    let put = http()
        .put(format!("{}/v1/queues/orders", server.url))
        .json(&json!({ "max_depth": null }))
        .send()
        .expect("PUT queue");
    assert!(put.status().is_success());
    wait_until(Duration::from_secs(60), "all 200 jobs", || {
        waiting(&queue(&server.url, "orders")) == 200
    });
    wait_until(Duration::from_secs(10), "every entry acknowledged", || {
        stream.pending() == 0
    });
    let status = source(&server.url);
    assert_eq!(status["state"], "running", "{status}");
    assert!(status["refused"].as_u64().unwrap_or(0) >= 1, "{status}");
    assert_eq!(numbers_in(&server.url, "orders"), (0..200).collect());
}

#[test]
fn bodies_that_are_not_json_are_kept_and_messages_that_cannot_run_are_dead_lettered() {
    let dir = temp_dir();
    let mut stream = Stream::fresh("invalid");
    let path = path_in(&dir, "sources.toml");
    std::fs::write(
        &path,
        format!(
            "[sources.orders]\ntype = \"redis_stream\"\nurl = \"{REDIS}\"\nstream = \"{}\"\n\
             group = \"conveyor\"\njob = {{ kind = {{ from = \"header:kind\" }}, queue = \"orders\" }}\n",
            stream.name
        ),
    )
    .expect("write sources file");
    let server = start_server(&path_in(&dir, "jobs.db"), &["--sources", path_str(&path)]);
    stream.add([b"\x01plain text".to_vec()], &[("kind", "note")]);
    stream.add([b"{\"n\": 1}".to_vec()], &[]);
    // A kind the checks refuse: dead-lettered alone, not holding up the good message beside it.
    stream.add(
        [b"{\"n\": 2}".to_vec(), b"{\"n\": 3}".to_vec()],
        &[("kind", "bad kind!")],
    );
    stream.add([b"{\"n\": 4}".to_vec()], &[("kind", "note")]);
    wait_until(Duration::from_secs(30), "every message stored", || {
        source(&server.url)["enqueued"] == 5
    });
    let status = source(&server.url);
    assert_eq!(status["invalid"], 4, "{status}");
    let jobs: Value = http()
        .get(format!("{}/v1/jobs?queue=orders&kind=note", server.url))
        .send()
        .expect("GET jobs")
        .json()
        .expect("jobs");
    let notes = jobs["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(notes.len(), 2, "{notes:?}");
    assert!(notes
        .iter()
        .any(|job| job["payload"]["raw_base64"] == "AXBsYWluIHRleHQ="));
    assert!(notes.iter().any(|job| job["payload"]["n"] == 4));
    let dead: Value = http()
        .get(format!("{}/v1/dead", server.url))
        .send()
        .expect("GET dead")
        .json()
        .expect("dead");
    let dead = dead["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(dead.len(), 3, "{dead:?}");
    for job in &dead {
        assert_eq!(job["kind"], "orders.unmapped");
        // A UUIDv7 (time-ordered, as retention's scan expects), derived from the entry.
        assert_eq!(
            job["id"].as_str().and_then(|id| id.chars().nth(14)),
            Some('7')
        );
        assert!(job["errors"][0]["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("source orders: ")));
    }
    let raw: BTreeSet<&str> = dead
        .iter()
        .filter_map(|job| job["payload"]["raw_base64"].as_str())
        .collect();
    // {"n": 1} (no kind header), {"n": 2} and {"n": 3} (a kind the checks refuse).
    assert_eq!(
        raw,
        BTreeSet::from(["eyJuIjogMX0=", "eyJuIjogMn0=", "eyJuIjogM30="])
    );
    wait_until(Duration::from_secs(10), "both acknowledged", || {
        stream.pending() == 0
    });
}

#[test]
fn payloads_are_checked_against_their_kinds_schema() {
    let dir = temp_dir();
    let mut stream = Stream::fresh("schema");
    let file = sources_file(&dir, &stream.name, "");
    let server = start_server(&path_in(&dir, "jobs.db"), &["--sources", path_str(&file)]);
    let put = http()
        .put(format!("{}/v1/kinds/order.placed", server.url))
        .json(&json!({ "schema": {
            "type": "object", "required": ["n"], "properties": { "n": { "type": "integer" } }
        }}))
        .send()
        .expect("PUT kind");
    assert!(put.status().is_success(), "{:?}", put.text());
    stream.add([b"{\"n\": 1}".to_vec(), b"{\"n\": \"one\"}".to_vec()], &[]);
    wait_until(Duration::from_secs(30), "both messages stored", || {
        source(&server.url)["enqueued"] == 2
    });
    assert_eq!(source(&server.url)["invalid"], 1);
    assert_eq!(waiting(&queue(&server.url, "orders")), 1);
    let dead: Value = http()
        .get(format!("{}/v1/dead", server.url))
        .send()
        .expect("GET dead")
        .json()
        .expect("dead");
    // Dead-lettered under its own kind and queue, the raw message kept.
    assert_eq!(dead["jobs"][0]["kind"], "order.placed");
    assert_eq!(dead["jobs"][0]["queue"], "orders");
    assert_eq!(dead["jobs"][0]["payload"]["raw_base64"], "eyJuIjogIm9uZSJ9");
    assert!(dead["jobs"][0]["errors"][0]["message"]
        .as_str()
        .is_some_and(|m| m.contains("schema of kind \"order.placed\"")));
    wait_until(Duration::from_secs(10), "both acknowledged", || {
        stream.pending() == 0
    });
}

#[test]
fn a_bad_sources_file_stops_the_start_naming_the_field() {
    let dir = temp_dir();
    let path = path_in(&dir, "sources.toml");
    std::fs::write(
        &path,
        "[sources.orders]\ntype = \"redis_stream\"\nurl = \"http://nope\"\nstream = \"s\"\n\
         group = \"g\"\njob = { kind = \"k\" }\n",
    )
    .expect("write");
    let db = path_in(&dir, "jobs.db");
    let output = conveyor(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        &format!("sqlite://{}", db.display()),
        "--sources",
        path_str(&path),
    ]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("source \"orders\": invalid url"),
        "{stderr}"
    );
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// The source's JSON for `PUT /v1/sources/orders` on `stream`.
fn source_body(stream: &str) -> Value {
    json!({
        "type": "redis_stream", "url": REDIS, "stream": stream, "group": "conveyor",
        "job": {"kind": "order.placed", "queue": "orders"}, "max_in_flight": 200,
    })
}

fn send(method: reqwest::Method, url: &str, body: Option<&Value>) -> (u16, Value) {
    let mut request = http().request(method, url);
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().expect("request");
    let status = response.status().as_u16();
    let text = response.text().expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn conveyor_ok(args: &[&str]) -> String {
    let output = conveyor(args);
    assert!(
        output.status.success(),
        "conveyor {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Sources are stored: set over HTTP (or with `conveyor source set`), kept across a restart,
/// paused and resumed for every reader, refused naming the field, deleted. While paused, new
/// entries wait in the stream; resumed, they arrive, and the lag is shown.
#[test]
fn a_stored_source_is_set_paused_resumed_and_deleted_over_the_api_and_cli() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let mut stream = Stream::fresh("api");
    let mut server = start_server(&db, &[]);
    let url = format!("{}/v1/sources/orders", server.url);

    // Refused, naming the field; nothing stored.
    let mut bad = source_body(&stream.name);
    bad.as_object_mut().expect("object").remove("stream");
    let (status, answer) = send(reqwest::Method::PUT, &url, Some(&bad));
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["field"], "stream", "{answer}");
    let (status, answer) = send(
        reqwest::Method::PUT,
        &url,
        Some(&json!({"type": "ftp", "job": {"kind": "k"}})),
    );
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("type")),
        "{answer}"
    );
    assert_eq!(send(reqwest::Method::GET, &url, None).0, 404);

    // Set with the CLI; the server reads it at once.
    let body = source_body(&stream.name).to_string();
    let said = conveyor_ok(&[
        "source",
        "set",
        "orders",
        "--spec",
        &body,
        "--server",
        &server.url,
    ]);
    assert!(said.contains("source orders set"), "{said}");
    stream.add(bodies(0..100), &[]);
    wait_until(Duration::from_secs(30), "100 jobs", || {
        source(&server.url)["enqueued"] == 100
    });

    // Paused: no server reads it; entries wait at the broker, and the lag says how many.
    let paused = conveyor_ok(&["source", "pause", "orders", "--server", &server.url]);
    assert!(paused.contains("paused"), "{paused}");
    assert_eq!(source(&server.url)["paused"], true);
    wait_until(Duration::from_secs(10), "the source paused", || {
        source(&server.url)["state"] == "paused"
    });
    stream.add(bodies(100..150), &[]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(source(&server.url)["enqueued"], 0, "a paused source read");
    assert_eq!(stream.unacknowledged(), 50);

    // Kept, paused, across a restart.
    server.proc.sigterm();
    server.proc.wait_exit(Duration::from_secs(20));
    let server = start_server(&db, &[]);
    let url = format!("{}/v1/sources/orders", server.url);
    let shown = source(&server.url);
    assert_eq!(
        (shown["state"].as_str(), shown["paused"].as_bool()),
        (Some("paused"), Some(true)),
        "{shown}"
    );
    let list = conveyor_ok(&["source", "list", "--server", &server.url]);
    assert!(list.contains("orders") && list.contains("paused"), "{list}");

    // A PUT without `paused` keeps it paused; resume reads the 50 that waited.
    let (status, answer) = send(reqwest::Method::PUT, &url, Some(&source_body(&stream.name)));
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["paused"], true, "{answer}");
    conveyor_ok(&["source", "resume", "orders", "--server", &server.url]);
    wait_until(Duration::from_secs(30), "the 50 that waited", || {
        source(&server.url)["enqueued"] == 50
    });
    assert_eq!(numbers_in(&server.url, "orders"), (0..150).collect());
    wait_until(Duration::from_secs(10), "the lag read as 0", || {
        source(&server.url)["lag"] == 0
    });
    let metrics = http()
        .get(format!("{}/metrics", server.url))
        .send()
        .expect("GET metrics")
        .text()
        .expect("metrics text");
    assert!(
        metrics.contains("conveyor_source_lag{source=\"orders\"} 0"),
        "{metrics}"
    );

    // Deleted: it stops, and is gone.
    conveyor_ok(&["source", "delete", "orders", "--server", &server.url]);
    assert_eq!(send(reqwest::Method::GET, &url, None).0, 404);
    assert_eq!(send(reqwest::Method::DELETE, &url, None).0, 404);
    let missing = conveyor(&["source", "show", "orders", "--server", &server.url]);
    assert!(!missing.status.success());
    stream.add(bodies(150..160), &[]);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(stream.unacknowledged(), 10, "a deleted source read");
}

/// Two servers on one PostgreSQL: a source set through one is read by both (the consumer
/// group spreads the entries), and every entry is exactly one job.
#[test]
fn two_servers_on_postgres_share_a_stored_source_without_duplicates() {
    let schema = Schema::fresh("conveyor_src");
    let store = schema.url();
    migrate(&store);
    let mut stream = Stream::fresh("shared");
    let servers = [start_server_at(&store, &[]), start_server_at(&store, &[])];
    let mut body = source_body(&stream.name);
    body["max_in_flight"] = json!(50);
    let (status, answer) = send(
        reqwest::Method::PUT,
        &format!("{}/v1/sources/orders", servers[0].url),
        Some(&body),
    );
    assert_eq!(status, 201, "{answer}");
    // The other server starts reading within a second or so.
    wait_until(
        Duration::from_secs(10),
        "both servers running the source",
        || {
            servers
                .iter()
                .all(|server| source(&server.url)["state"] == "running")
        },
    );
    stream.add(bodies(0..5_000), &[]);
    wait_until(Duration::from_secs(120), "5,000 jobs", || {
        servers
            .iter()
            .map(|server| source(&server.url)["enqueued"].as_u64().unwrap_or(0))
            .sum::<u64>()
            == 5_000
    });
    assert_eq!(numbers_in(&servers[0].url, "orders"), (0..5_000).collect());
    let received: Vec<u64> = servers
        .iter()
        .map(|server| source(&server.url)["received"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        received.iter().all(|&n| n > 0),
        "one server read everything: {received:?}"
    );
    assert_eq!(received.iter().sum::<u64>(), 5_000, "{received:?}");
    wait_until(Duration::from_secs(10), "every entry acknowledged", || {
        stream.pending() == 0
    });
}
