//! The `conveyor` command line against a real server: client commands, the dead-letter queue,
//! bad input, the demo and the benchmark.

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::Output;

fn stdout_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "command failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON on stdout")
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn client_commands_enqueue_show_cancel_and_count() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    let job = stdout_json(&conveyor(&[
        "enqueue",
        "report.build",
        "--payload",
        r#"{"month": "2026-11"}"#,
        "--queue",
        "reports",
        "--priority",
        "5",
        "--tag",
        "monthly",
        "--idempotency-key",
        "nov-report",
        "--server",
        s,
        "--json",
    ]));
    assert_eq!(job["state"], "available");
    assert_eq!(job["duplicate"], false);
    let id = job["id"].as_str().unwrap();

    let again = stdout_json(&conveyor(&[
        "enqueue",
        "report.build",
        "--idempotency-key",
        "nov-report",
        "--server",
        s,
        "--json",
    ]));
    assert_eq!(again["id"], id, "same idempotency key returns the same job");
    assert_eq!(again["duplicate"], true);

    let shown = stdout_json(&conveyor(&["job", "show", id, "--server", s, "--json"]));
    assert_eq!(shown["payload"], json!({"month": "2026-11"}));
    assert_eq!(shown["priority"], 5);
    assert_eq!(shown["tags"], json!(["monthly"]));

    let queues = stdout_json(&conveyor(&["queues", "--server", s, "--json"]));
    let reports = queues["queues"]
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["name"] == "reports")
        .unwrap();
    assert_eq!(reports["available"], 1);

    let cancelled = stdout_json(&conveyor(&["job", "cancel", id, "--server", s, "--json"]));
    assert_eq!(cancelled["state"], "cancelled");
    let twice = conveyor(&["job", "cancel", id, "--server", s]);
    assert!(!twice.status.success());
    assert!(stderr(&twice).contains("409"), "{}", stderr(&twice));

    let table = conveyor(&["queues", "--server", s]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.contains("QUEUE") && text.contains("reports"), "{text}");
}

#[test]
fn dead_letter_queue_list_replay_and_discard() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    let http = http();
    let kill = |id: &str| {
        let fetched: Value = http
            .post(format!("{s}/v1/fetch"))
            .json(&json!({"worker_id": "test", "queues": ["default"]}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let job = &fetched["jobs"][0];
        assert_eq!(job["id"], id);
        let failed: Value = http
            .post(format!("{s}/v1/jobs/{id}/fail"))
            .json(&json!({"lease_token": job["lease_token"], "retry": "never",
                          "error": {"class": "permanent", "message": "bad address"}}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(failed["state"], "dead");
    };
    let job = enqueue(
        s,
        json!({"kind": "email.send", "payload": {"to": "nobody"}}),
    );
    let id = job["id"].as_str().unwrap();
    kill(id);

    let listed = stdout_json(&conveyor(&["dead", "list", "--server", s, "--json"]));
    assert_eq!(listed["jobs"][0]["id"], id);
    let table = conveyor(&["dead", "list", "--server", s]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("bad address"));

    let replayed = stdout_json(&conveyor(&["dead", "replay", id, "--server", s, "--json"]));
    assert_eq!(replayed["replayed"], 1);
    let back = get_job(s, id);
    assert_eq!(back["state"], "available");
    assert_eq!(
        back["errors"][0]["message"], "bad address",
        "replay keeps the history"
    );
    assert!(
        back["errors"][0]["replayed_at"].is_string(),
        "and marks the failure it follows: {back}"
    );

    kill(id);
    // Attempt 1 twice, the replay between them shown.
    let shown = conveyor(&["job", "show", id, "--server", s]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert_eq!(text.matches("attempt 1 at").count(), 2, "{text}");
    assert!(text.contains("-- replayed at "), "{text}");
    let none = conveyor(&["dead", "replay", "--server", s]);
    assert!(
        !none.status.success(),
        "replay without a selection must refuse"
    );
    assert!(stderr(&none).contains("--all"), "{}", stderr(&none));
    stdout_json(&conveyor(&["dead", "discard", id, "--server", s, "--json"]));
    let gone = conveyor(&["job", "show", id, "--server", s]);
    assert!(!gone.status.success());
    assert!(stderr(&gone).contains("404"), "{}", stderr(&gone));
}

#[test]
fn bad_input_gets_a_clear_message_and_a_non_zero_exit() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();

    let bad_json = conveyor(&["enqueue", "k", "--payload", "{oops", "--server", s]);
    assert!(!bad_json.status.success());
    assert!(
        stderr(&bad_json).contains("--payload is not valid JSON"),
        "{}",
        stderr(&bad_json)
    );

    let bad_kind = conveyor(&["enqueue", "bad kind!", "--server", s]);
    assert!(!bad_kind.status.success());
    assert!(
        stderr(&bad_kind).contains("field: kind"),
        "{}",
        stderr(&bad_kind)
    );

    let bad_id = conveyor(&["job", "show", "not-a-uuid", "--server", s]);
    assert!(!bad_id.status.success());
    assert!(
        stderr(&bad_id).contains("not a job id"),
        "{}",
        stderr(&bad_id)
    );

    let queues = stdout_json(&conveyor(&["queues", "--server", s, "--json"]));
    assert_eq!(
        queues["queues"],
        json!([]),
        "nothing was stored by the rejected commands"
    );

    let nobody = conveyor(&["queues", "--server", "http://127.0.0.1:9"]);
    assert!(!nobody.status.success());
    assert!(
        stderr(&nobody).contains("cannot reach the Conveyor server"),
        "{}",
        stderr(&nobody)
    );
}

#[test]
fn serve_refuses_a_corrupt_database_or_unknown_store_with_a_clear_error() {
    let dir = temp_dir();
    let corrupt = path_in(&dir, "corrupt.db");
    std::fs::write(&corrupt, vec![0x5a; 8192]).unwrap();
    let out = conveyor(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        &format!("sqlite://{}", corrupt.display()),
    ]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not a database"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));

    let out = conveyor(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--store",
        "mysql://localhost/jobs",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("unsupported store URL"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn demo_shows_jobs_completing_retrying_and_dying() {
    let dir = temp_dir();
    let server = start_server(
        &path_in(&dir, "demo.db"),
        &["--demo", "--drain-timeout-secs", "1"],
    );
    let s = server.url.clone();
    let seen = eventually_blocking("the demo to complete, retry and kill jobs", || {
        let queues = stdout_json(&conveyor(&["queues", "--server", &s, "--json"]));
        let total = |field: &str| -> u64 {
            queues["queues"]
                .as_array()
                .unwrap()
                .iter()
                .map(|q| q[field].as_u64().unwrap())
                .sum()
        };
        let errors_seen = total("retryable") > 0 || total("dead") > 0;
        let busy_queues = queues["queues"].as_array().unwrap().len();
        (total("completed") >= 3 && total("dead") >= 1 && errors_seen && busy_queues >= 2)
            .then_some(queues)
    });
    let names: Vec<&str> = seen["queues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|q| q["name"].as_str().unwrap())
        .collect();
    assert!(
        names.len() >= 2,
        "jobs flow through several queues: {names:?}"
    );
    let dead = stdout_json(&conveyor(&["dead", "list", "--server", &s, "--json"]));
    assert!(
        !dead["jobs"][0]["errors"].as_array().unwrap().is_empty(),
        "dead jobs carry their errors"
    );
    let schedule: Value = http()
        .get(format!("{s}/v1/schedules/demo-digest"))
        .send()
        .expect("GET schedule")
        .json()
        .expect("schedule JSON");
    assert_eq!(schedule["cron"], "*/15 * * * * *", "{schedule}");
    // The demo's own producer and in-process worker feed the history like HTTP clients do.
    let history = stdout_json(&conveyor(&["stats", "--server", &s, "--json"]));
    let totals = &history["totals"];
    for field in ["enqueued", "started", "completed", "failed"] {
        assert!(
            totals[field].as_u64().unwrap_or(0) > 0,
            "{field}: {history}"
        );
    }
    assert!(totals["queue_wait"]["p50_ms"].is_number(), "{history}");
}

#[cfg(feature = "bench")]
#[test]
fn bench_reports_one_json_line_per_workload() {
    let out = conveyor(&["bench", "--jobs", "300", "--concurrency", "8", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let workloads: Vec<&str> = lines
        .iter()
        .map(|l| l["workload"].as_str().unwrap())
        .collect();
    assert_eq!(workloads, ["enqueue", "drain", "latency"]);
    for line in &lines {
        assert!(line["jobs_per_s"].as_f64().unwrap() > 0.0, "{line}");
        assert_eq!(line["durable"], true);
    }
    assert!(lines[2]["p50_ms"].as_f64().unwrap() <= lines[2]["p99_ms"].as_f64().unwrap());
}

#[test]
fn queue_commands_pause_resume_and_limit_depth() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    let paused = stdout_json(&conveyor(&[
        "queue", "pause", "mail", "--server", s, "--json",
    ]));
    assert_eq!(paused["paused"], true);
    let table = conveyor(&["queue", "show", "mail", "--server", s]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("mail: paused"));

    let limited = stdout_json(&conveyor(&[
        "queue",
        "set",
        "mail",
        "--max-depth",
        "1",
        "--server",
        s,
        "--json",
    ]));
    assert_eq!(
        (limited["max_depth"].as_u64(), limited["paused"].as_bool()),
        (Some(1), Some(true))
    );
    stdout_json(&conveyor(&[
        "enqueue", "k", "--queue", "mail", "--server", s, "--json",
    ]));
    let full = conveyor(&["enqueue", "k", "--queue", "mail", "--server", s]);
    assert!(!full.status.success());
    assert!(
        stderr(&full).contains("429") && stderr(&full).contains("queue_full"),
        "{}",
        stderr(&full)
    );

    let resumed = stdout_json(&conveyor(&[
        "queue", "resume", "mail", "--server", s, "--json",
    ]));
    assert_eq!(resumed["paused"], false);
    let cleared = stdout_json(&conveyor(&[
        "queue",
        "set",
        "mail",
        "--max-depth",
        "none",
        "--server",
        s,
        "--json",
    ]));
    assert_eq!(cleared["max_depth"], Value::Null);
    let bad = conveyor(&["queue", "set", "mail", "--max-depth", "-3", "--server", s]);
    assert!(!bad.status.success());
    let nothing = conveyor(&["queue", "set", "mail", "--server", s]);
    assert!(
        stderr(&nothing).contains("nothing to set"),
        "{}",
        stderr(&nothing)
    );
}

/// A running server deletes completed jobs once they are past their retention, and keeps
/// unfinished ones.
#[test]
fn retention_deletes_completed_jobs_in_a_running_server() {
    let dir = temp_dir();
    let server = start_server(
        &path_in(&dir, "jobs.db"),
        &[
            "--retain-completed-secs",
            "1",
            "--maintenance-interval-ms",
            "100",
        ],
    );
    let s = server.url.as_str();
    let done = enqueue(s, json!({"kind": "k", "queue": "quick"}));
    let done_id = done["id"].as_str().unwrap().to_string();
    let waiting = enqueue(
        s,
        json!({"kind": "k", "queue": "held", "run_at": "2099-01-01T00:00:00Z"}),
    );
    let waiting_id = waiting["id"].as_str().unwrap().to_string();
    let _worker = start_worker(s, "true", &["--queues", "quick"]);
    eventually_blocking("the job to complete", || {
        (get_job(s, &done_id)["state"] == "completed").then_some(())
    });
    eventually_blocking("the completed job to be pruned", || {
        let status = http()
            .get(format!("{s}/v1/jobs/{done_id}"))
            .send()
            .expect("GET job")
            .status();
        (status == 404).then_some(())
    });
    assert_eq!(
        get_job(s, &waiting_id)["state"],
        "scheduled",
        "unfinished jobs stay"
    );
}

/// `conveyor stuck` lists a job that runs far longer than allowed, with its worker.
#[test]
fn stuck_lists_a_job_running_past_its_threshold() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &["--stuck-default-secs", "1"]);
    let s = server.url.as_str();
    let none = conveyor(&["stuck", "--server", s]);
    assert!(String::from_utf8_lossy(&none.stdout).contains("no stuck jobs"));
    let job = enqueue(s, json!({"kind": "hang", "queue": "slow"}));
    let id = job["id"].as_str().unwrap().to_string();
    let _worker = start_worker(
        s,
        "sleep 30",
        &["--queues", "slow", "--worker-id", "w-slow"],
    );
    let row = eventually_blocking("the job to be listed as stuck", || {
        let out = conveyor(&["stuck", "--queue", "slow", "--server", s]);
        let table = String::from_utf8_lossy(&out.stdout).to_string();
        table
            .lines()
            .find(|line| line.starts_with(&id))
            .map(str::to_string)
    });
    assert!(row.contains("w-slow") && row.contains("hang"), "{row}");
    let bad = conveyor(&["stuck", "--queue", "bad name", "--server", s]);
    assert!(!bad.status.success());
}

#[test]
fn queue_set_takes_rate_limits_weights_and_per_tenant_limits() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    let set = stdout_json(&conveyor(&[
        "queue",
        "set",
        "api",
        "--rate-limit",
        "20/1s",
        "--per-key-rate-limit",
        "100/500ms",
        "--per-key-concurrency-limit",
        "2",
        "--weight",
        "3",
        "--server",
        s,
        "--json",
    ]));
    assert_eq!(set["rate_limit"], json!({"count": 20, "period_ms": 1000}));
    assert_eq!(
        set["per_key_rate_limit"],
        json!({"count": 100, "period_ms": 500})
    );
    assert_eq!(set["per_key_concurrency_limit"], 2);
    assert_eq!(set["weight"], 3);
    let shown = conveyor(&["queue", "show", "api", "--server", s]);
    let text = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(text.contains("rate limit 20 per 1000 ms"), "{text}");
    let cleared = stdout_json(&conveyor(&[
        "queue",
        "set",
        "api",
        "--rate-limit",
        "none",
        "--server",
        s,
        "--json",
    ]));
    assert_eq!(cleared["rate_limit"], Value::Null);
    assert_eq!(cleared["weight"], 3, "other settings kept");
    for bad in ["0/1s", "20/0s", "20", "20/1y", "x/1s"] {
        let refused = conveyor(&["queue", "set", "api", "--rate-limit", bad, "--server", s]);
        assert!(!refused.status.success(), "{bad} accepted");
        assert!(
            stderr(&refused).contains("rate"),
            "{bad}: {}",
            stderr(&refused)
        );
    }
}

/// Three worker processes with four slots each share a queue limited to 3 running jobs: the
/// handlers' own records never show more than 3 at once.
#[test]
fn concurrency_limit_holds_across_three_worker_processes() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    stdout_json(&conveyor(&[
        "queue",
        "set",
        "default",
        "--concurrency-limit",
        "3",
        "--server",
        s,
        "--json",
    ]));
    let ids: Vec<String> = (0..12)
        .map(|_| {
            enqueue(s, json!({"kind": "slow"}))["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let log = path_in(&dir, "runs.log");
    // Each run appends "start <ns>" and "end <ns>"; a run's end precedes its completion, which
    // must commit before the freed place can be claimed.
    let exec = format!(
        "echo \"start $(date +%s%N)\" >> {log}; sleep 0.2; echo \"end $(date +%s%N)\" >> {log}",
        log = log.display()
    );
    let _workers: Vec<_> = (0..3)
        .map(|_| start_worker(s, &exec, &["--concurrency", "4"]))
        .collect();
    for id in &ids {
        eventually_blocking("every job to complete", || {
            (get_job(s, id)["state"] == "completed").then_some(())
        });
    }
    let mut events: Vec<(u128, i32)> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|line| {
            let (what, at) = line.split_once(' ').unwrap();
            (at.parse().unwrap(), if what == "start" { 1 } else { -1 })
        })
        .collect();
    // Ends sort before starts at the same instant.
    events.sort();
    let (mut running, mut peak) = (0, 0);
    for (_, delta) in &events {
        running += delta;
        peak = peak.max(running);
    }
    assert_eq!(events.len(), 24);
    assert_eq!(peak, 3, "the limit is reached but never passed");
}

#[test]
fn flow_commands_create_show_signal_list_and_cancel() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    let file = path_in(&dir, "flow.json");
    std::fs::write(
        &file,
        json!({"name": "release", "steps": [
            {"name": "build", "job": {"kind": "build"}},
            {"name": "approve", "wait": {"signal": "go"}, "after": ["build"]},
            {"name": "deploy", "job": {"kind": "deploy"}, "after": ["approve"]}
        ]})
        .to_string(),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let created = stdout_json(&conveyor(&[
        "flow", "create", file, "--server", s, "--json",
    ]));
    let id = created["id"].as_str().unwrap().to_string();
    assert!(created["steps"]["build"].is_string(), "{created}");

    // The table view names every step with its state.
    let shown = conveyor(&["flow", "show", &id, "--server", s]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = String::from_utf8_lossy(&shown.stdout);
    for expected in [
        "release", "running", "build", "active", "approve", "pending", "deploy",
    ] {
        assert!(
            text.contains(expected),
            "{expected:?} missing from:\n{text}"
        );
    }

    // An early signal is kept for the step.
    let signalled = conveyor(&[
        "flow",
        "signal",
        &id,
        "go",
        "--payload",
        r#"{"by": "ops"}"#,
        "--server",
        s,
    ]);
    assert!(signalled.status.success(), "{}", stderr(&signalled));
    assert!(String::from_utf8_lossy(&signalled.stdout).contains("stored"));
    let bad_signal = conveyor(&["flow", "signal", &id, "nope", "--server", s]);
    assert!(!bad_signal.status.success());
    assert!(
        stderr(&bad_signal).contains("signal"),
        "{}",
        stderr(&bad_signal)
    );

    let listed = stdout_json(&conveyor(&[
        "flow", "list", "--state", "running", "--server", s, "--json",
    ]));
    assert_eq!(listed["flows"][0]["id"], id.as_str());

    let cancelled = conveyor(&["flow", "cancel", &id, "--server", s]);
    assert!(cancelled.status.success(), "{}", stderr(&cancelled));
    assert!(String::from_utf8_lossy(&cancelled.stdout).contains("cancelled"));
    let again = conveyor(&["flow", "cancel", &id, "--server", s]);
    assert!(!again.status.success(), "a second cancel is refused");
    assert!(stderr(&again).contains("409"), "{}", stderr(&again));

    // A flow with a cycle is refused naming the field, and a file that is not JSON is named.
    std::fs::write(
        path_in(&dir, "cycle.json"),
        json!({"steps": [
            {"name": "a", "job": {"kind": "k"}, "after": ["b"]},
            {"name": "b", "job": {"kind": "k"}, "after": ["a"]}
        ]})
        .to_string(),
    )
    .unwrap();
    let cycle = conveyor(&[
        "flow",
        "create",
        path_in(&dir, "cycle.json").to_str().unwrap(),
        "--server",
        s,
    ]);
    assert!(!cycle.status.success());
    assert!(
        stderr(&cycle).contains("steps[0].after"),
        "{}",
        stderr(&cycle)
    );
    std::fs::write(path_in(&dir, "broken.json"), "{not json").unwrap();
    let broken = conveyor(&[
        "flow",
        "create",
        path_in(&dir, "broken.json").to_str().unwrap(),
        "--server",
        s,
    ]);
    assert!(!broken.status.success());
    assert!(
        stderr(&broken).contains("not valid JSON"),
        "{}",
        stderr(&broken)
    );
}

#[test]
fn kind_commands_set_list_show_enforce_and_delete_a_schema() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    // A queued job the schema will not accept.
    let queued = conveyor(&[
        "enqueue",
        "signup",
        "--payload",
        r#"{"user_id": "x"}"#,
        "--server",
        s,
    ]);
    assert!(queued.status.success(), "{}", stderr(&queued));

    let file = path_in(&dir, "signup.json");
    std::fs::write(
        &file,
        json!({"type": "object", "required": ["user_id"],
               "properties": {"user_id": {"type": "integer"}}})
        .to_string(),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let refused = conveyor(&["kind", "set", "signup", "--schema", file, "--server", s]);
    assert!(!refused.status.success());
    let why = stderr(&refused);
    assert!(why.contains("409") && why.contains("1 of the 1"), "{why}");

    let set = conveyor(&[
        "kind",
        "set",
        "signup",
        "--schema",
        file,
        "--version",
        "2",
        "--force",
        "--server",
        s,
    ]);
    assert!(set.status.success(), "{}", stderr(&set));
    let listed = conveyor(&["kind", "list", "--server", s]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains("signup") && text.contains("v2"), "{text}");
    let shown = stdout_json(&conveyor(&[
        "kind", "show", "signup", "--server", s, "--json",
    ]));
    assert_eq!(shown["schema"]["required"][0], "user_id");

    // Enforced on the CLI's own enqueue: the failing pointer is named.
    let bad = conveyor(&[
        "enqueue",
        "signup",
        "--payload",
        r#"{"user_id": "seven"}"#,
        "--server",
        s,
    ]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("payload/user_id"), "{}", stderr(&bad));
    let good = conveyor(&[
        "enqueue",
        "signup",
        "--payload",
        r#"{"user_id": 7}"#,
        "--server",
        s,
    ]);
    assert!(good.status.success(), "{}", stderr(&good));

    // Bad input: a file that is not JSON, a schema that is not one, an unknown kind.
    std::fs::write(path_in(&dir, "broken.json"), "{not json").unwrap();
    let broken = path_in(&dir, "broken.json");
    let not_json = conveyor(&[
        "kind",
        "set",
        "signup",
        "--schema",
        broken.to_str().unwrap(),
        "--server",
        s,
    ]);
    assert!(!not_json.status.success());
    assert!(
        stderr(&not_json).contains("not valid JSON"),
        "{}",
        stderr(&not_json)
    );
    std::fs::write(path_in(&dir, "bad.json"), r#"{"type": 12}"#).unwrap();
    let bad_schema = path_in(&dir, "bad.json");
    let refused = conveyor(&[
        "kind",
        "set",
        "signup",
        "--schema",
        bad_schema.to_str().unwrap(),
        "--server",
        s,
    ]);
    assert!(!refused.status.success());
    assert!(
        stderr(&refused).contains("field: schema"),
        "{}",
        stderr(&refused)
    );

    let deleted = conveyor(&["kind", "delete", "signup", "--server", s]);
    assert!(deleted.status.success(), "{}", stderr(&deleted));
    let missing = conveyor(&["kind", "show", "signup", "--server", s]);
    assert!(!missing.status.success());
    assert!(stderr(&missing).contains("404"), "{}", stderr(&missing));
}

#[test]
fn schedule_set_takes_an_interval() {
    let dir = temp_dir();
    let file = path_in(&dir, "schedules.toml");
    std::fs::write(
        &file,
        "[schedules.from-file]\nevery = \"5m\"\njob = { kind = \"refresh\" }\n",
    )
    .expect("write schedules file");
    let file_arg = file.display().to_string();
    let server = start_server(&path_in(&dir, "jobs.db"), &["--schedules", &file_arg]);
    let s = server.url.as_str();
    let set = stdout_json(&conveyor(&[
        "schedule", "set", "pulse", "--every", "30s", "--kind", "pulse", "--missed", "catch_up",
        "--server", s, "--json",
    ]));
    assert_eq!(set["every"], "30s", "{set}");
    assert!(set.get("cron").is_none(), "{set}");
    assert_eq!(set["missed"], "catch_up");
    assert!(set["next_run_at"].is_string(), "{set}");
    let shown = conveyor(&["schedule", "show", "pulse", "--server", s]);
    assert!(shown.status.success(), "{}", stderr(&shown));
    let text = String::from_utf8_lossy(&shown.stdout).to_string();
    assert!(text.contains("every 30s"), "{text}");
    let listed = conveyor(&["schedule", "list", "--server", s]);
    let text = String::from_utf8_lossy(&listed.stdout).to_string();
    assert!(text.contains("every 5m"), "the file's schedule: {text}");
    assert!(text.contains("every 30s"), "{text}");
    for bad in ["30", "0s", "abc", "367d"] {
        let refused = conveyor(&[
            "schedule", "set", "pulse", "--every", bad, "--kind", "pulse", "--server", s,
        ]);
        assert!(!refused.status.success(), "{bad} accepted");
        let err = stderr(&refused);
        assert!(err.contains("--every") && err.contains(bad), "{bad}: {err}");
    }
    let both = conveyor(&[
        "schedule",
        "set",
        "pulse",
        "--every",
        "30s",
        "--cron",
        "* * * * *",
        "--kind",
        "k",
        "--server",
        s,
    ]);
    assert!(!both.status.success());
    assert!(stderr(&both).contains("--cron"), "{}", stderr(&both));
    let neither = conveyor(&["schedule", "set", "pulse", "--kind", "k", "--server", s]);
    assert!(!neither.status.success());
    assert!(stderr(&neither).contains("--cron"), "{}", stderr(&neither));
    let zoned = conveyor(&[
        "schedule",
        "set",
        "pulse",
        "--every",
        "30s",
        "--timezone",
        "Europe/Berlin",
        "--kind",
        "k",
        "--server",
        s,
    ]);
    assert!(!zoned.status.success());
    // Unchanged by the refused attempts.
    let again = stdout_json(&conveyor(&[
        "schedule", "show", "pulse", "--server", s, "--json",
    ]));
    assert_eq!(again["every"], "30s");
    assert_eq!(again["due_after"], set["due_after"]);
}

/// `enqueue --ttl-ms/--expires-at/--traceparent` and `queue set --default-ttl-ms`, against a
/// real server: what is stored, and a clear refusal of bad input.
#[test]
fn enqueue_takes_an_expiry_and_a_trace_context_and_queues_a_default_ttl() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let enqueued = stdout_json(&conveyor(&[
        "enqueue",
        "k",
        "--ttl-ms",
        "60000",
        "--traceparent",
        parent,
        "--tracestate",
        "v=1",
        "--server",
        s,
        "--json",
    ]));
    let id = enqueued["id"].as_str().expect("id");
    let job = stdout_json(&conveyor(&["job", "show", id, "--server", s, "--json"]));
    assert!(job["expires_at"].is_string(), "{job}");
    assert_eq!(job["trace"]["traceparent"], parent, "{job}");
    assert_eq!(job["trace"]["tracestate"], "v=1", "{job}");

    let both = conveyor(&[
        "enqueue",
        "k",
        "--ttl-ms",
        "1",
        "--expires-at",
        "2999-01-01T00:00:00Z",
        "--server",
        s,
    ]);
    assert!(!both.status.success());
    let bad = conveyor(&["enqueue", "k", "--traceparent", "nope", "--server", s]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("traceparent"), "{}", stderr(&bad));

    let set = stdout_json(&conveyor(&[
        "queue",
        "set",
        "mail",
        "--default-ttl-ms",
        "30000",
        "--server",
        s,
        "--json",
    ]));
    assert_eq!(set["default_ttl_ms"], 30000, "{set}");
    let enqueued = stdout_json(&conveyor(&[
        "enqueue", "k", "--queue", "mail", "--server", s, "--json",
    ]));
    let job = stdout_json(&conveyor(&[
        "job",
        "show",
        enqueued["id"].as_str().expect("id"),
        "--server",
        s,
        "--json",
    ]));
    assert!(
        job["expires_at"].is_string(),
        "the queue's default applies: {job}"
    );
}

/// Enqueueing to a queue no live worker serves stores the job and warns on stderr (stdout
/// stays the job); once a worker serving it heartbeats, no warning. A server URL without a
/// scheme gets a hint.
#[test]
fn enqueue_warns_when_no_live_worker_serves_the_queue() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    let unserved = conveyor(&[
        "enqueue",
        "mail.send",
        "--queue",
        "mail",
        "--server",
        s,
        "--json",
    ]);
    let job = stdout_json(&unserved);
    assert_eq!(job["state"], "available");
    assert!(
        stderr(&unserved).contains("warning: no live worker serves queue \"mail\""),
        "{}",
        stderr(&unserved)
    );
    let beat = http()
        .post(format!("{s}/v1/workers/heartbeat"))
        .json(
            &json!({"worker_id": "mailer-1", "queues": ["mail"], "concurrency": 2,
            "started_at": "2026-01-01T00:00:00Z"}),
        )
        .send()
        .expect("heartbeat");
    assert!(beat.status().is_success(), "{}", beat.status());
    let served = conveyor(&["enqueue", "mail.send", "--queue", "mail", "--server", s]);
    assert!(served.status.success());
    assert!(!stderr(&served).contains("warning"), "{}", stderr(&served));

    let address = s.trim_start_matches("http://");
    let no_scheme = conveyor(&["enqueue", "mail.send", "--server", address]);
    assert!(!no_scheme.status.success());
    assert!(
        stderr(&no_scheme).contains(&format!("did you mean --server http://{address}")),
        "{}",
        stderr(&no_scheme)
    );
}

/// Logs written into a pipe (or a file) carry no ANSI colour codes.
#[test]
fn logs_into_a_pipe_have_no_colour_codes() {
    use std::io::{BufRead, BufReader};
    let dir = temp_dir();
    let mut child = std::process::Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite://{}", path_in(&dir, "jobs.db").display()))
        .env("CONVEYOR_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn conveyor serve");
    // Every log line, as it comes; the first INFO line is what the test waits for.
    let stderr = child.stderr.take().expect("stderr");
    let (lines, seen) = std::sync::mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let mut logs = Vec::new();
    loop {
        let line = seen
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("an INFO log line within 30 s");
        let info = line.contains("INFO");
        logs.push(line);
        if info {
            break;
        }
    }
    // SIGTERM: a graceful stop that logs on the way out, then the pipe closes.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    child.wait().expect("wait");
    logs.extend(seen.iter());
    reader.join().expect("reader");
    let text = logs.join("\n");
    assert!(!text.contains('\u{1b}'), "colour codes in a pipe: {text:?}");
}

/// `serve --config FILE`: a setting comes from the flag, else its CONVEYOR_* variable, else
/// the file, else the default. A key that is no flag is refused naming it, with exit 2.
#[test]
fn serve_settings_come_from_flag_then_env_then_file() {
    let dir = temp_dir();
    let config = path_in(&dir, "conveyor.toml");
    let db = path_in(&dir, "jobs.db");
    std::fs::write(
        &config,
        format!(
            "listen = \"127.0.0.1:0\"\nstore = \"sqlite://{}\"\nmax_payload_bytes = 1000\n",
            db.display()
        ),
    )
    .expect("write config");
    let config = config.to_str().expect("utf-8 path");
    let big = json!({"kind": "k", "payload": {"blob": "x".repeat(2000)}});
    let status = |server: &Server| {
        http()
            .post(format!("{}/v1/jobs", server.url))
            .json(&big)
            .send()
            .expect("enqueue")
            .status()
            .as_u16()
    };
    let from_file = start_server_with(&["--config", config], &[], &[]);
    assert_eq!(status(&from_file), 413, "the file's 1000-byte limit");
    drop(from_file);
    let from_env = start_server_with(
        &["--config", config],
        &[],
        &[("CONVEYOR_MAX_PAYLOAD_BYTES", "5000")],
    );
    assert_eq!(status(&from_env), 201, "the variable beats the file");
    drop(from_env);
    let from_flag = start_server_with(
        &["--config", config, "--max-payload-bytes", "500"],
        &[],
        &[("CONVEYOR_MAX_PAYLOAD_BYTES", "5000")],
    );
    assert_eq!(status(&from_flag), 413, "the flag beats the variable");
    drop(from_flag);

    let bad = path_in(&dir, "bad.toml");
    std::fs::write(&bad, "max_payload_byts = 5\n").expect("write");
    let refused = conveyor(&["serve", "--config", bad.to_str().expect("utf-8")]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        stderr(&refused).contains("unknown setting `max_payload_byts`"),
        "{}",
        stderr(&refused)
    );
}

#[test]
fn queues_prints_a_plain_table_with_human_durations() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    for _ in 0..3 {
        enqueue(s, json!({"kind": "invoice.send", "queue": "billing"}));
    }
    let output = conveyor(&["queues", "--server", s]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        !output.stdout.contains(&0x1b),
        "no ANSI escape in piped output: {:?}",
        String::from_utf8_lossy(&output.stdout)
    );
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(
        header,
        [
            "QUEUE",
            "AVAILABLE",
            "SCHEDULED",
            "RUNNING",
            "RETRYABLE",
            "DEAD",
            "COMPLETED",
            "CANCELLED",
            "OLDEST",
            "STATE"
        ],
        "{text}"
    );
    let row = lines
        .find(|line| line.starts_with("billing "))
        .unwrap_or_else(|| panic!("no row for the queue in:\n{text}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(
        cells[..8],
        ["billing", "3", "0", "0", "0", "0", "0", "0"],
        "{row}"
    );
    // The oldest job's wait reads as a duration (`850ms`, `1.2s`, `3m 12s`), not raw ms.
    let oldest = cells[8..].join(" ");
    assert!(
        ["ms", "s", "m", "h", "d"]
            .iter()
            .any(|unit| oldest.ends_with(unit))
            && oldest.starts_with(|c: char| c.is_ascii_digit() || c == '<'),
        "OLDEST {oldest:?} in {row}"
    );
    assert_eq!(row, row.trim_end(), "no trailing spaces");
    assert!(
        !text.contains('|') && !text.contains("--"),
        "no borders:\n{text}"
    );
}

/// `conveyor jobs search|list|bulk` against a real server: criteria, a dry run that changes
/// nothing, the bulk cancel, and refusals that name what is missing.
#[test]
fn jobs_are_searched_and_cancelled_in_bulk_from_the_cli() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let s = server.url.as_str();
    let acme_1 = enqueue(
        s,
        json!({"kind": "sync", "tenant": "acme", "payload": {"n": 1}}),
    );
    let acme_2 = enqueue(
        s,
        json!({"kind": "sync", "tenant": "acme", "payload": {"n": 2}}),
    );
    let other = enqueue(
        s,
        json!({"kind": "sync", "tenant": "globex", "payload": {"n": 1}}),
    );
    let found = stdout_json(&conveyor(&[
        "jobs", "search", "--tenant", "acme", "--server", s, "--json",
    ]));
    let ids: Vec<&str> = found["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["id"].as_str())
        .collect();
    assert_eq!(
        ids,
        vec![
            acme_2["id"].as_str().unwrap(),
            acme_1["id"].as_str().unwrap()
        ]
    );
    let by_payload = stdout_json(&conveyor(&[
        "jobs",
        "list",
        "--payload",
        r#"{"n": 1}"#,
        "--server",
        s,
        "--json",
    ]));
    assert_eq!(by_payload["jobs"].as_array().map(Vec::len), Some(2));

    let dry = conveyor(&[
        "jobs",
        "bulk",
        "cancel",
        "--tenant",
        "acme",
        "--dry-run",
        "--server",
        s,
    ]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    assert!(
        String::from_utf8_lossy(&dry.stdout).contains("would cancel 2 job(s)"),
        "{}",
        String::from_utf8_lossy(&dry.stdout)
    );
    assert_eq!(
        get_job(s, acme_1["id"].as_str().unwrap())["state"],
        "available"
    );
    let done = conveyor(&["jobs", "bulk", "cancel", "--tenant", "acme", "--server", s]);
    assert!(
        String::from_utf8_lossy(&done.stdout).contains("cancel: 2 job(s) changed of 2 matched"),
        "{}",
        String::from_utf8_lossy(&done.stdout)
    );
    let listed = conveyor(&["jobs", "list", "--state", "cancelled", "--server", s]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains(acme_1["id"].as_str().unwrap()), "{text}");
    assert!(!text.contains(other["id"].as_str().unwrap()), "{text}");

    let vague = conveyor(&["jobs", "bulk", "cancel", "--server", s]);
    assert!(!vague.status.success());
    assert!(
        stderr(&vague).contains("say which jobs"),
        "{}",
        stderr(&vague)
    );
    let bad = conveyor(&["jobs", "search", "--id-prefix", "zz", "--server", s]);
    assert!(!bad.status.success());
    assert!(stderr(&bad).contains("id_prefix"), "{}", stderr(&bad));
    assert_eq!(
        get_job(s, other["id"].as_str().unwrap())["state"],
        "available"
    );
}
