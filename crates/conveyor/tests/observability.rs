//! Observability end to end, with real `conveyor serve` and `conveyor work` processes: the
//! worker registry (a `kill -9`'d worker is marked dead and its job rescued at once), JSON job
//! logs without payloads, and signed webhook alerts with a cool-down.

mod common;

use common::*;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn get(url: &str) -> Value {
    http().get(url).send().expect("GET").json().expect("JSON")
}

fn worker_entry(server: &str, id: &str) -> Option<Value> {
    get(&format!("{server}/v1/workers"))["workers"]
        .as_array()?
        .iter()
        .find(|w| w["id"] == id)
        .cloned()
}

#[test]
fn a_kill_9_worker_is_marked_dead_and_its_running_job_rescued_at_once() {
    let dir = temp_dir();
    let server = start_server(
        &path_in(&dir, "jobs.db"),
        &[
            "--worker-stale-secs",
            "1",
            "--maintenance-interval-ms",
            "100",
        ],
    );
    // A lease of 10 minutes: only the registry can explain a rescue within the test's time.
    let mut worker = start_worker(
        &server.url,
        "sleep 60",
        &[
            "--queues",
            "registry",
            "--worker-id",
            "w-doomed",
            "--registry-heartbeat-ms",
            "100",
            "--lease-ms",
            "600000",
            "--concurrency",
            "2",
        ],
    );
    let entry = eventually_blocking("the worker to register", || {
        worker_entry(&server.url, "w-doomed").filter(|w| w["state"] == "alive")
    });
    assert_eq!(entry["pid"], worker.pid());
    assert_eq!(entry["queues"], json!(["registry"]));
    assert_eq!(entry["concurrency"], 2);
    assert!(entry["host"].as_str().is_some_and(|h| !h.is_empty()));
    // The same from the command line.
    let listed = std::process::Command::new(BIN)
        .args(["workers", "--state", "alive", "--server", &server.url])
        .output()
        .expect("conveyor workers");
    let table = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.status.success(), "{table}");
    let row = table
        .lines()
        .find(|line| line.starts_with("w-doomed"))
        .unwrap_or_else(|| panic!("no row for the worker in {table}"));
    assert!(row.contains("alive") && row.contains("registry"), "{row}");

    let job = enqueue(
        &server.url,
        json!({"queue": "registry", "kind": "long", "max_attempts": 3}),
    );
    let id = job["id"].as_str().expect("id").to_string();
    eventually_blocking("the job to run on the worker", || {
        let job = get_job(&server.url, &id);
        (job["state"] == "running" && job["lease"]["worker_id"] == "w-doomed").then_some(())
    });
    eventually_blocking("the registry to show the busy slot", || {
        worker_entry(&server.url, "w-doomed").filter(|w| w["busy"] == 1)
    });

    worker.kill_9();
    let dead = eventually_blocking("the worker to be marked dead", || {
        worker_entry(&server.url, "w-doomed").filter(|w| w["state"] == "dead")
    });
    assert!(dead["ended_at"].is_string(), "{dead}");
    let rescued = eventually_blocking("the job to be rescued", || {
        let job = get_job(&server.url, &id);
        (job["state"] == "retryable").then_some(job)
    });
    let error = &rescued["errors"][0];
    assert_eq!(error["class"], "lease_expired");
    assert_eq!(error["attempt"], 1);
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("w-doomed") && m.contains("marked dead")),
        "{error}"
    );
    assert!(rescued["lease"].is_null(), "{rescued}");
}

/// Parses every stderr line as JSON (all must parse) and returns the job lifecycle events.
fn job_events(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            serde_json::from_str::<Value>(line)
                .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"))
        })
        .filter(|event| event["target"] == "conveyor::job")
        .collect()
}

fn event<'a>(events: &'a [Value], message: &str, job_id: &str) -> &'a Value {
    events
        .iter()
        .find(|e| e["fields"]["message"] == message && e["fields"]["job_id"] == job_id)
        .unwrap_or_else(|| panic!("no {message:?} event for {job_id} in {events:#?}"))
}

#[test]
fn exec_worker_logs_each_job_as_json_without_its_payload() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let log_path = path_in(&dir, "worker.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let child = Command::new(BIN)
        .args(["--log-format", "json", "work", "--server", &server.url])
        .args(["--queues", "logs", "--worker-id", "w-logs"])
        // The payload arrives on stdin: a job marked doomed fails permanently. The command
        // writes the trace context it was given where the test can read it.
        .args([
            "--exec",
            &format!(
                "echo \"$TRACEPARENT\" > {}/$CONVEYOR_JOB_ID.trace; \
                 if grep -q doomed; then exit 65; fi",
                dir.path().display()
            ),
        ])
        .env("CONVEYOR_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn conveyor work");
    let mut worker = Proc { child };
    let secret = "hunter2-payload-marker";
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let ok = enqueue(
        &server.url,
        json!({"queue": "logs", "kind": "report", "traceparent": parent,
               "payload": {"secret": secret, "mode": "fine"}}),
    );
    let doomed = enqueue(
        &server.url,
        json!({"queue": "logs", "kind": "charge", "max_attempts": 1,
               "payload": {"secret": secret, "mode": "doomed"}}),
    );
    let ok_id = ok["id"].as_str().expect("id").to_string();
    let doomed_id = doomed["id"].as_str().expect("id").to_string();
    eventually_blocking("both jobs to finish", || {
        (get_job(&server.url, &ok_id)["state"] == "completed"
            && get_job(&server.url, &doomed_id)["state"] == "dead")
            .then_some(())
    });
    // A graceful stop flushes everything the worker logged.
    worker.sigterm();
    assert!(worker.wait_exit(Duration::from_secs(30)).success());

    let text = std::fs::read_to_string(&log_path).expect("read log");
    assert!(
        !text.contains(secret),
        "a payload leaked into the log:\n{text}"
    );
    let events = job_events(&text);
    for (id, kind) in [(&ok_id, "report"), (&doomed_id, "charge")] {
        let started = &event(&events, "job started", id)["fields"];
        assert_eq!(started["queue"], "logs");
        assert_eq!(started["kind"], kind);
        assert_eq!(started["attempt"], 1);
    }
    let completed = &event(&events, "job completed", &ok_id)["fields"];
    assert_eq!(completed["outcome"], "completed");
    // The job's trace: in its log lines, and handed to the command as a child span's context.
    assert_eq!(
        completed["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736",
        "{completed}"
    );
    assert_eq!(
        event(&events, "job started", &ok_id)["fields"]["trace_id"],
        "4bf92f3577b34da6a3ce929d0e0e4736"
    );
    let given = std::fs::read_to_string(dir.path().join(format!("{ok_id}.trace")))
        .expect("the command wrote its TRACEPARENT");
    let given: Vec<&str> = given.trim().split('-').collect();
    assert_eq!(given.len(), 4, "{given:?}");
    assert_eq!(given[1], "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_ne!(
        given[2], "00f067aa0ba902b7",
        "the command's span is a new span"
    );
    assert_eq!(completed["kind"], "report");
    assert_eq!(completed["attempt"], 1);
    assert!(completed["duration_ms"].is_u64(), "{completed}");
    let failed = event(&events, "job failed", &doomed_id);
    assert_eq!(failed["level"], "WARN");
    let failed = &failed["fields"];
    assert_eq!(failed["outcome"], "dead");
    assert_eq!(failed["error_class"], "permanent");
    assert_eq!(failed["queue"], "logs");
    assert!(failed["duration_ms"].is_u64(), "{failed}");
}

#[test]
fn the_rust_worker_of_serve_demo_logs_jobs_as_json_without_payloads() {
    let dir = temp_dir();
    let log_path = path_in(&dir, "serve.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let db = path_in(&dir, "jobs.db");
    let mut child = Command::new(BIN)
        .args([
            "--log-format",
            "json",
            "serve",
            "--demo",
            "--listen",
            "127.0.0.1:0",
        ])
        .args(["--store", &format!("sqlite://{}", db.display())])
        .args(["--drain-timeout-secs", "1"])
        .env("CONVEYOR_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::from(log))
        .spawn()
        .expect("spawn conveyor serve --demo");
    let stdout = child.stdout.take().expect("stdout");
    std::thread::spawn(move || std::io::copy(&mut BufReader::new(stdout), &mut std::io::sink()));
    let mut server = Proc { child };
    // The demo sends mail to userN@example.com: those addresses are payload, never logged.
    let completed = eventually_blocking("the demo worker to complete a mail job", || {
        let text = std::fs::read_to_string(&log_path).ok()?;
        let done: Vec<Value> = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .filter(|e| {
                e["target"] == "conveyor::job"
                    && e["fields"]["message"] == "job completed"
                    && e["fields"]["kind"] == "email.send"
            })
            .collect();
        done.into_iter().next()
    });
    server.sigterm();
    assert!(server.wait_exit(Duration::from_secs(30)).success());
    let fields = &completed["fields"];
    assert_eq!(fields["queue"], "mail");
    assert_eq!(fields["outcome"], "completed");
    assert!(fields["attempt"].is_u64() && fields["duration_ms"].is_u64());
    let text = std::fs::read_to_string(&log_path).expect("read log");
    let events = job_events(&text);
    let id = fields["job_id"].as_str().expect("job_id");
    assert_eq!(
        event(&events, "job started", id)["fields"]["kind"],
        "email.send"
    );
    assert!(!text.contains("@example.com"), "a payload leaked:\n{text}");
}

/// One request received by the test's webhook receiver.
struct Received {
    headers: HashMap<String, String>,
    body: Vec<u8>,
}

/// A minimal HTTP receiver on a loopback port: answers 200 to every request and hands each
/// one to the test.
fn receiver() -> (String, mpsc::Receiver<Received>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind receiver");
    let url = format!("http://{}/hook", listener.local_addr().expect("addr"));
    let (sender, received) = mpsc::channel();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().expect("clone stream"));
            let mut headers = HashMap::new();
            let mut line = String::new();
            reader.read_line(&mut line).expect("request line");
            loop {
                line.clear();
                reader.read_line(&mut line).expect("header line");
                let trimmed = line.trim_end();
                if trimmed.is_empty() {
                    break;
                }
                if let Some((name, value)) = trimmed.split_once(':') {
                    headers.insert(name.trim().to_ascii_lowercase(), value.trim().to_string());
                }
            }
            let length: usize = headers
                .get("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            let mut body = vec![0; length];
            reader.read_exact(&mut body).expect("body");
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            if sender.send(Received { headers, body }).is_err() {
                return;
            }
        }
    });
    (url, received)
}

/// Checks the signature the way a receiver would (independently of Conveyor's own code):
/// HMAC-SHA256 over "{timestamp}.{body}", and a fresh timestamp.
fn assert_signed(request: &Received, secret: &str) -> Value {
    let timestamp = request
        .headers
        .get("x-conveyor-timestamp")
        .expect("timestamp header");
    let signature = request
        .headers
        .get("x-conveyor-signature")
        .expect("signature header");
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(&request.body);
    let expected: String = mac
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    assert_eq!(signature, &format!("sha256={expected}"));
    let sent: i64 = timestamp.parse().expect("numeric timestamp");
    assert!(
        (chrono::Utc::now().timestamp() - sent).abs() < 300,
        "stale timestamp"
    );
    serde_json::from_slice(&request.body).expect("JSON alert")
}

const ALERT_SECRET: &str = "test-alert-secret";

/// Starts `conveyor serve` on `store` alerting to `hook` (quick checks, a long cool-down,
/// workers stale after 1 s). Returns the process, its URL, and a channel told when a server's
/// alert rules have taken their baseline (what was already dead before it led is not news, so
/// jobs must die after that to be alerted on).
fn start_alerting_server(
    store: &str,
    hook: &str,
    armed: mpsc::Sender<()>,
    extra: &[&str],
) -> (Proc, String) {
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store", store])
        .args([
            "--alert-webhook",
            hook,
            "--alert-secret-env",
            "TEST_ALERT_SECRET",
        ])
        .args(["--alert-check-ms", "100", "--alert-cooldown-secs", "600"])
        .args([
            "--worker-stale-secs",
            "1",
            "--maintenance-interval-ms",
            "100",
        ])
        .args(extra)
        .env("TEST_ALERT_SECRET", ALERT_SECRET)
        .env("CONVEYOR_LOG", "warn,conveyor::alerts=info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn conveyor serve");
    let stderr = child.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("{line}");
            if line.contains("alerting on what happens from now on") {
                let _ = armed.send(());
            }
        }
    });
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout);
    let mut first = String::new();
    lines.read_line(&mut first).expect("listen line");
    std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
    let url = first
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    (Proc { child }, url)
}

#[test]
fn alerts_for_a_dead_job_and_a_stale_worker_are_signed_and_respect_the_cool_down() {
    let secret = ALERT_SECRET;
    let (hook, alerts) = receiver();
    let dir = temp_dir();
    let (armed, is_armed) = mpsc::channel();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    let (_server, url) = start_alerting_server(&store, &hook, armed, &[]);

    is_armed
        .recv_timeout(Duration::from_secs(30))
        .expect("the alert engine to take its baseline");
    let mut worker = start_worker(
        &url,
        "exit 65",
        &[
            "--queues",
            "alerts",
            "--worker-id",
            "w-alerting",
            "--registry-heartbeat-ms",
            "100",
        ],
    );
    eventually_blocking("the worker to register", || {
        worker_entry(&url, "w-alerting").filter(|w| w["state"] == "alive")
    });

    let payload = json!({"card": "4111-secret-card"});
    let first_dead = enqueue(
        &url,
        json!({"queue": "alerts", "kind": "charge", "max_attempts": 1, "payload": payload}),
    );
    let request = alerts
        .recv_timeout(Duration::from_secs(30))
        .expect("a dead-letter alert");
    let alert = assert_signed(&request, secret);
    assert_eq!(alert["alert"], "job_dead", "{alert}");
    assert_eq!(alert["subject"], "alerts");
    assert_eq!(alert["details"]["count"], 1);
    assert_eq!(alert["details"]["jobs"][0]["id"], first_dead["id"]);
    assert_eq!(alert["details"]["jobs"][0]["error_class"], "permanent");
    assert!(
        !String::from_utf8_lossy(&request.body).contains("4111-secret-card"),
        "no payload in alerts"
    );

    // A second death within the cool-down: no second alert for the queue.
    let second = enqueue(
        &url,
        json!({"queue": "alerts", "kind": "charge", "max_attempts": 1, "payload": payload}),
    );
    let second_id = second["id"].as_str().expect("id").to_string();
    eventually_blocking("the second job to die", || {
        (get_job(&url, &second_id)["state"] == "dead").then_some(())
    });

    // The worker goes silent. Alerts are delivered in order from one queue, so the next one
    // arriving being the stale-worker alert shows the second death was not alerted on.
    worker.kill_9();
    let request = alerts
        .recv_timeout(Duration::from_secs(30))
        .expect("a stale-worker alert");
    let alert = assert_signed(&request, secret);
    assert_eq!(alert["alert"], "worker_stale", "{alert}");
    assert_eq!(alert["subject"], "w-alerting");
    assert_eq!(alert["details"]["queues"], json!(["alerts"]));
    assert!(
        alerts.recv_timeout(Duration::from_millis(500)).is_err(),
        "nothing more within the cool-down"
    );
}

#[test]
fn of_two_servers_only_the_leader_alerts() {
    let (hook, alerts) = receiver();
    let schema = Schema::fresh("conveyor_alerts");
    let store = schema.url();
    let (armed, is_armed) = mpsc::channel();
    let leader_ttl = ["--leader-ttl-ms", "1500"];
    let (_a, url_a) = start_alerting_server(&store, &hook, armed.clone(), &leader_ttl);
    let (_b, _url_b) = start_alerting_server(&store, &hook, armed, &leader_ttl);
    is_armed
        .recv_timeout(Duration::from_secs(30))
        .expect("one server to lead and take its baseline");
    let mut worker = start_worker(
        &url_a,
        "exit 65",
        &[
            "--queues",
            "pg-alerts",
            "--worker-id",
            "w-pg",
            "--registry-heartbeat-ms",
            "100",
        ],
    );
    eventually_blocking("the worker to register", || {
        worker_entry(&url_a, "w-pg").filter(|w| w["state"] == "alive")
    });
    enqueue(
        &url_a,
        json!({"queue": "pg-alerts", "kind": "charge", "max_attempts": 1}),
    );
    let first = assert_signed(
        &alerts
            .recv_timeout(Duration::from_secs(30))
            .expect("a dead-letter alert"),
        ALERT_SECRET,
    );
    assert_eq!(first["alert"], "job_dead", "{first}");
    // Both servers check every 100 ms: a second server alerting would have sent its copy of
    // the dead-letter alert long before the worker, killed now, goes stale (after 1 s).
    worker.kill_9();
    let mut kinds = vec![first["alert"].as_str().unwrap_or_default().to_string()];
    loop {
        let alert = assert_signed(
            &alerts
                .recv_timeout(Duration::from_secs(30))
                .expect("the stale-worker alert"),
            ALERT_SECRET,
        );
        kinds.push(alert["alert"].as_str().unwrap_or_default().to_string());
        if alert["alert"] == "worker_stale" {
            break;
        }
    }
    while let Ok(late) = alerts.recv_timeout(Duration::from_millis(500)) {
        kinds.push(assert_signed(&late, ALERT_SECRET)["alert"].to_string());
    }
    assert_eq!(
        kinds,
        vec!["job_dead", "worker_stale"],
        "one alert of each, from the leader"
    );
}

/// `conveyor worker quiet|resume|stop` against a real server and a real `conveyor work`
/// process: quiet, it takes no job enqueued afterwards (the server hands it none) while the
/// job it holds finishes; resumed, it takes jobs again; stopped, it drains and exits on its
/// own with the registry saying `stopped`; every command is in the audit log; an unknown
/// worker is a clear error.
#[test]
fn workers_are_quieted_resumed_and_stopped_from_the_cli() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    let mut worker = start_worker(
        s,
        "true",
        &[
            "--queues",
            "told",
            "--worker-id",
            "w-told",
            "--registry-heartbeat-ms",
            "50",
        ],
    );
    eventually_blocking("the worker to register", || {
        worker_entry(s, "w-told").filter(|w| w["state"] == "alive")
    });
    let first = enqueue(s, json!({"kind": "noop", "queue": "told"}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    eventually_blocking("the first job done", || {
        (get_job(s, &first)["state"] == "completed").then_some(())
    });

    let out = conveyor(&["worker", "quiet", "w-told", "--server", s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(worker_entry(s, "w-told").unwrap()["command"], "quiet");
    let held = enqueue(s, json!({"kind": "noop", "queue": "told"}))["id"]
        .as_str()
        .unwrap()
        .to_string();

    let out = conveyor(&["worker", "resume", "w-told", "--server", s, "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resumed: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(resumed["command"].is_null(), "{resumed}");
    eventually_blocking("the held job done after resuming", || {
        (get_job(s, &held)["state"] == "completed").then_some(())
    });

    let out = conveyor(&["worker", "quiet", "w-told", "--server", s]);
    assert!(out.status.success());
    let never = enqueue(s, json!({"kind": "noop", "queue": "told"}))["id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = conveyor(&["worker", "stop", "w-told", "--server", s]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = worker.wait_exit(Duration::from_secs(30));
    assert!(
        status.success(),
        "a stopped worker exits cleanly: {status:?}"
    );
    assert_eq!(worker_entry(s, "w-told").unwrap()["state"], "stopped");
    assert_eq!(
        get_job(s, &never)["state"],
        "available",
        "a quiet worker took nothing new"
    );

    let audit: Value = http()
        .get(format!("{s}/v1/audit?limit=50"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["action"].as_str())
        .collect();
    for action in ["worker.quiet", "worker.resume", "worker.stop"] {
        assert!(actions.contains(&action), "{action} in {actions:?}");
    }
    let out = conveyor(&["worker", "stop", "w-nobody", "--server", s]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("w-nobody"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
