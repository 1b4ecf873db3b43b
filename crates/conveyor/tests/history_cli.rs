//! History across processes: two `conveyor serve` on one PostgreSQL schema each count the work
//! their workers do; one server's counts reach the store when it is asked (`GET /v1/stats`),
//! the other's when it shuts down gracefully; `conveyor stats` shows the sum, as a table and
//! as JSON; a restarted server on a SQLite file still has yesterday's minutes; bad flags are
//! refused.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

fn work(server: &str, queue: &str, n: usize, fail: bool) {
    let answer: Value = http()
        .post(format!("{server}/v1/fetch"))
        .json(&json!({"worker_id": "history-test", "queues": [queue], "max": n}))
        .send()
        .expect("fetch")
        .json()
        .expect("fetch JSON");
    let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(jobs.len(), n, "{answer}");
    let outcomes: Vec<Value> = jobs
        .iter()
        .map(|job| {
            json!({"id": job["id"], "lease_token": job["lease_token"],
                   "error": {"message": "boom"}, "retry": "never"})
        })
        .collect();
    let body = if fail {
        json!({ "fail": outcomes })
    } else {
        json!({ "complete": outcomes.iter().map(|o| json!({"id": o["id"], "lease_token": o["lease_token"]})).collect::<Vec<_>>() })
    };
    let status = http()
        .post(format!("{server}/v1/ack"))
        .json(&body)
        .send()
        .expect("ack")
        .status();
    assert!(status.is_success(), "{status}");
}

fn stats_json(server: &str, extra: &[&str]) -> Value {
    let mut args = vec!["stats", "--server", server, "--json"];
    args.extend_from_slice(extra);
    let out = conveyor(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stats JSON")
}

#[test]
fn two_servers_add_up_to_one_history_shown_by_conveyor_stats() {
    let schema = Schema::fresh("conveyor_history");
    let one = start_server_at(&schema.url(), &[]);
    let mut two = start_server_at(&schema.url(), &[]);
    let (a, b) = (one.url.clone(), two.url.clone());

    for n in 0..3 {
        enqueue(&a, json!({"kind": "mail", "payload": {"n": n}}));
    }
    for n in 0..2 {
        enqueue(
            &b,
            json!({"kind": "resize", "queue": "img", "payload": {"n": n}}),
        );
    }
    work(&a, "default", 3, false);
    work(&b, "img", 2, true);

    // Server one flushes on being asked; two's counts are still only in its memory.
    let first = stats_json(&a, &[]);
    assert_eq!(first["totals"]["completed"], 3, "{first}");
    assert_eq!(first["totals"]["dead"], 0, "{first}");

    // A graceful stop writes what it counted.
    two.proc.sigterm();
    assert!(two.proc.wait_exit(Duration::from_secs(30)).success());
    let both = stats_json(&a, &["--since", "2h", "--step", "5m"]);
    let totals = &both["totals"];
    assert_eq!(totals["enqueued"], 5, "{both}");
    assert_eq!(totals["started"], 5, "{both}");
    assert_eq!(totals["completed"], 3, "{both}");
    assert_eq!(
        (totals["failed"].clone(), totals["dead"].clone()),
        (json!(2), json!(2))
    );
    assert_eq!(both["step_s"], 300);
    let kinds = both["kinds"].as_array().expect("kinds");
    assert_eq!(kinds.len(), 2, "{both}");
    let resize = kinds
        .iter()
        .find(|k| k["kind"] == "resize")
        .expect("resize");
    assert_eq!(resize["failure_rate"], 1.0);

    let only = stats_json(&a, &["--queue", "img"]);
    assert_eq!(only["totals"]["completed"], 0);
    assert_eq!(only["totals"]["dead"], 2);

    // The table, for people.
    let out = conveyor(&["stats", "--server", &a]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for word in [
        "QUEUE", "RUN P95", "WAIT P50", "mail", "resize", "100.0%", "all",
    ] {
        assert!(text.contains(word), "{word:?} missing from:\n{text}");
    }
}

#[test]
fn history_outlives_a_restart_and_bad_flags_are_refused() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let mut server = start_server(&db, &[]);
    enqueue(&server.url, json!({"kind": "mail"}));
    work(&server.url, "default", 1, false);
    server.proc.sigterm();
    assert!(server.proc.wait_exit(Duration::from_secs(30)).success());

    let again = start_server(&db, &[]);
    let report = stats_json(&again.url, &["--since", "1d"]);
    assert_eq!(report["totals"]["completed"], 1, "{report}");

    for (args, expect) in [
        (vec!["--since", "yesterday"], "--since"),
        (vec!["--from", "noon"], "--from"),
        (vec!["--step", "90"], "step"),
        (vec!["--kind", "bad kind"], "kind"),
    ] {
        let mut all = vec!["stats", "--server", again.url.as_str()];
        all.extend(args.iter().copied());
        let out = conveyor(&all);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(expect), "{args:?}: {err}");
    }
}

/// A job whose lease expires is rescued by the maintenance leader, and that ended attempt is
/// counted in the history (and the processed counter) as a failure of its queue and kind, then
/// as dead when its last attempt is rescued too (issue 27: rescues were never counted).
#[test]
fn lease_rescues_are_counted_as_failures_in_the_history() {
    let dir = temp_dir();
    let server = start_server(
        &path_in(&dir, "jobs.db"),
        &["--maintenance-interval-ms", "100"],
    );
    let url = &server.url;
    let job = enqueue(
        url,
        json!({"kind": "hangs", "queue": "stuck", "max_attempts": 2}),
    );
    let id = job["id"].as_str().expect("id").to_string();
    for attempt in 1..=2u64 {
        // Claimed under a short lease and never reported: the leader rescues it.
        let answer: Value = eventually_blocking("the job to be claimable", || {
            let answer: Value = http()
                .post(format!("{url}/v1/fetch"))
                .json(&json!({"worker_id": "vanishes", "queues": ["stuck"], "max": 1, "lease_ms": 100}))
                .send()
                .ok()?
                .json()
                .ok()?;
            (answer["jobs"].as_array()?.len() == 1).then_some(answer)
        });
        assert_eq!(answer["jobs"][0]["attempt"], attempt, "{answer}");
        eventually_blocking("the lease to be rescued", || {
            let job = get_job(url, &id);
            (job["state"] != "running").then_some(())
        });
    }
    assert_eq!(get_job(url, &id)["state"], "dead");
    let stats = stats_json(url, &["--queue", "stuck"]);
    let totals = &stats["totals"];
    assert_eq!(totals["started"], 2, "{stats}");
    assert_eq!(
        (totals["failed"].clone(), totals["dead"].clone()),
        (json!(2), json!(1)),
        "both rescued attempts failed, the last one into the dead-letter queue: {stats}"
    );
}

/// Jobs a schedule enqueues are counted as enqueued in the history (issue 27: only enqueues
/// through the server's request path were).
#[test]
fn jobs_enqueued_by_a_schedule_are_counted() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let url = &server.url;
    let status = http()
        .put(format!("{url}/v1/schedules/pulse"))
        .json(&json!({"cron": "* * * * * *", "job": {"kind": "tick", "queue": "cron"}, "overlap": "allow"}))
        .send()
        .expect("put schedule")
        .status();
    assert!(status.is_success(), "{status}");
    let fired = eventually_blocking("two ticks to fire", || {
        let runs: Value = http()
            .get(format!("{url}/v1/schedules/pulse/runs?limit=100"))
            .send()
            .ok()?
            .json()
            .ok()?;
        let enqueued = runs["runs"]
            .as_array()?
            .iter()
            .filter(|run| run["status"] == "enqueued")
            .count();
        (enqueued >= 2).then_some(enqueued)
    });
    // A pass is counted once it ends, just after its runs are stored: look until it has.
    eventually_blocking("the history to count the scheduled jobs", || {
        let stats = stats_json(url, &["--queue", "cron"]);
        let counted = stats["totals"]["enqueued"].as_u64().unwrap_or(0);
        if counted >= fired as u64 {
            Ok(())
        } else {
            Err(format!(
                "{fired} runs enqueued, history counts {counted}: {stats}"
            ))
        }
    });
}

/// Every job a flow starts is counted as enqueued, in the history and in the metrics, by queue
/// and kind (issue 27): the first steps, started when the flow is created, and the later ones,
/// which the store starts inside their parents' completions, where no request enqueues them.
#[test]
fn jobs_started_by_flows_are_counted_as_enqueued() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let url = &server.url;
    let queue = "flow-history";
    let step = |name: &str, kind: &str, after: &[&str]| json!({"name": name, "job": {"kind": kind, "queue": queue}, "after": after});
    let chain = json!({"name": "chain", "steps": [
        step("a", "chain", &[]), step("b", "chain", &["a"]), step("c", "chain", &["b"]),
    ]});
    let fan_out = json!({"name": "fan-out", "steps": [
        step("split", "split", &[]),
        step("m0", "member", &["split"]),
        step("m1", "member", &["split"]),
        step("m2", "member", &["split"]),
    ]});
    let steps = 7;
    let mut flows = Vec::new();
    for flow in [&chain, &fan_out] {
        let response = http()
            .post(format!("{url}/v1/flows"))
            .json(flow)
            .send()
            .expect("POST /v1/flows");
        assert_eq!(response.status().as_u16(), 201);
        let created: Value = response.json().expect("created flow");
        flows.push(created["id"].as_str().expect("flow id").to_string());
    }

    // Run every step as it becomes available (a long-poll waits for the next one).
    let mut ran = 0;
    while ran < steps {
        let answer: Value = http()
            .post(format!("{url}/v1/fetch"))
            .json(
                &json!({"worker_id": "flow-history", "queues": [queue], "max": 10,
                          "wait_ms": 5000}),
            )
            .send()
            .expect("fetch")
            .json()
            .expect("fetch JSON");
        let jobs = answer["jobs"].as_array().cloned().unwrap_or_default();
        assert!(!jobs.is_empty(), "a step must be runnable after {ran} ran");
        ran += jobs.len();
        let complete: Vec<Value> = jobs
            .iter()
            .map(|job| json!({"id": job["id"], "lease_token": job["lease_token"]}))
            .collect();
        let status = http()
            .post(format!("{url}/v1/ack"))
            .json(&json!({ "complete": complete }))
            .send()
            .expect("ack")
            .status();
        assert!(status.is_success(), "{status}");
    }
    assert_eq!(ran, steps, "each step ran once");
    for id in &flows {
        let flow: Value = http()
            .get(format!("{url}/v1/flows/{id}"))
            .send()
            .expect("GET flow")
            .json()
            .expect("flow JSON");
        assert_eq!(flow["state"], "completed", "{flow}");
    }

    let stats = stats_json(url, &["--queue", queue]);
    assert_eq!(
        stats["totals"]["enqueued"], steps,
        "one enqueue per step: {stats}"
    );
    assert_eq!(stats["totals"]["completed"], steps, "{stats}");
    for (kind, count) in [("chain", 3), ("split", 1), ("member", 3)] {
        let by_kind = stats_json(url, &["--queue", queue, "--kind", kind]);
        assert_eq!(by_kind["totals"]["enqueued"], count, "{kind}: {by_kind}");
    }
    let metrics = http()
        .get(format!("{url}/metrics"))
        .send()
        .expect("GET /metrics")
        .text()
        .expect("metrics text");
    let enqueued: f64 = metrics
        .lines()
        .filter(|line| {
            line.starts_with("conveyor_jobs_enqueued_total{")
                && line.contains(&format!("queue=\"{queue}\""))
        })
        .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(enqueued, steps as f64, "{metrics}");
}
