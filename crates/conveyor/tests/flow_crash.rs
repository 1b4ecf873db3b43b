//! Workflows under `kill -9`, with real processes on both stores: a server and its worker are
//! killed mid-run, restarted, and every flow still completes with every step run after its
//! parents, each fan-in callback started once its members were all done, and no step run more
//! often than its job's attempts say.

mod common;

use common::*;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::time::Duration;

const FLOWS: usize = 12;
const MEMBERS: usize = 4;

/// Each flow: `prepare`, then `MEMBERS` members after it, then `join` after all of them.
fn flow_body(n: usize) -> Value {
    let mut steps =
        vec![json!({"name": "prepare", "job": {"kind": "flow.step", "payload": {"flow": n}}})];
    for m in 0..MEMBERS {
        steps.push(json!({"name": format!("m{m}"), "job": {"kind": "flow.step", "payload": {"flow": n}}, "after": ["prepare"]}));
    }
    steps.push(json!({
        "name": "join",
        "job": {"kind": "flow.step", "payload": {"flow": n}},
        "after": (0..MEMBERS).map(|m| format!("m{m}")).collect::<Vec<_>>()
    }));
    json!({"name": format!("crash-{n}"), "steps": steps})
}

fn run_flows_through_kills(store_url: &str, dir: &tempfile::TempDir) {
    let extra = ["--maintenance-interval-ms", "100"];
    let mut server = start_server_at(store_url, &extra);
    let http = http();
    let mut flows = Vec::new();
    for n in 0..FLOWS {
        let response = http
            .post(format!("{}/v1/flows", server.url))
            .json(&flow_body(n))
            .send()
            .expect("POST flow");
        assert_eq!(response.status().as_u16(), 201);
        let created: Value = response.json().expect("created");
        flows.push(created["id"].as_str().expect("id").to_string());
    }
    // Each run appends "flow-id step" to the log, then answers how many parents it was given.
    let log = path_in(dir, "runs.log");
    let exec = format!(
        "cat > /dev/null; echo \"$CONVEYOR_FLOW_ID $CONVEYOR_STEP\" >> {log}; sleep 0.02; \
         printf '{{\"parents\": %s}}' \"$CONVEYOR_PARENTS\"",
        log = log.display()
    );
    let worker_args = ["--lease-ms", "1500", "--concurrency", "4"];
    let mut worker = start_worker(&server.url, &exec, &worker_args);
    eventually_blocking("a quarter of the steps to run", || {
        let runs = std::fs::read_to_string(&log).unwrap_or_default();
        (runs.lines().count() >= FLOWS * (MEMBERS + 2) / 4).then_some(())
    });
    // Both die at once, mid-run: jobs are held, callbacks may be due.
    server.proc.kill_9();
    worker.kill_9();

    let server = start_server_at(store_url, &extra);
    let _worker = start_worker(&server.url, &exec, &worker_args);
    for id in &flows {
        let flow: Value = eventually_blocking_within(
            &format!("flow {id} to complete after the restart"),
            Duration::from_secs(60),
            || {
                let flow: Value = http
                    .get(format!("{}/v1/flows/{id}?wait_ms=1000", server.url))
                    .send()
                    .ok()?
                    .json()
                    .ok()?;
                (flow["state"] != "running").then_some(flow)
            },
        );
        assert_eq!(flow["state"], "completed", "{flow}");
        let join = flow["steps"]
            .as_array()
            .and_then(|steps| steps.iter().find(|s| s["name"] == "join"))
            .expect("join step");
        let given = join["result"]["parents"]
            .as_object()
            .expect("join's parents");
        assert_eq!(
            given.len(),
            MEMBERS,
            "the callback got every member's result: {join}"
        );
    }

    // Order and counts from the log of every run.
    let runs = std::fs::read_to_string(&log).expect("log");
    let mut at: HashMap<(String, String), Vec<usize>> = HashMap::new();
    for (line_no, line) in runs.lines().enumerate() {
        if let Some((flow, step)) = line.split_once(' ') {
            at.entry((flow.to_string(), step.to_string()))
                .or_default()
                .push(line_no);
        }
    }
    for id in &flows {
        let runs_of = |step: &str| {
            at.get(&(id.clone(), step.to_string()))
                .cloned()
                .unwrap_or_default()
        };
        let first_join = *runs_of("join").first().expect("join ran");
        let first_member = (0..MEMBERS)
            .filter_map(|m| runs_of(&format!("m{m}")).first().copied())
            .min()
            .expect("members ran");
        assert!(
            runs_of("prepare").last().is_some_and(|&p| p < first_member),
            "flow {id}: no member started before prepare finished"
        );
        for m in 0..MEMBERS {
            let last = *runs_of(&format!("m{m}")).last().expect("member ran");
            assert!(
                last < first_join,
                "flow {id}: join started before m{m} finished"
            );
        }
        // A step runs again only when an attempt was cut short: never more than its attempts.
        let flow: Value = http
            .get(format!("{}/v1/flows/{id}", server.url))
            .send()
            .expect("GET flow")
            .json()
            .expect("flow");
        for step in flow["steps"].as_array().expect("steps") {
            let name = step["name"].as_str().expect("name");
            let attempts = step["attempts"].as_u64().expect("attempts") as usize;
            assert!(
                runs_of(name).len() <= attempts,
                "flow {id} step {name} ran {} times in {attempts} attempts",
                runs_of(name).len()
            );
        }
    }
}

#[test]
fn flows_survive_kill_9_of_server_and_worker_on_sqlite() {
    let dir = temp_dir();
    let db = path_in(&dir, "flows.db");
    run_flows_through_kills(&format!("sqlite://{}", db.display()), &dir);
}

#[test]
fn flows_survive_kill_9_of_server_and_worker_on_postgres() {
    let dir = temp_dir();
    let schema = Schema::fresh("flow_crash");
    run_flows_through_kills(&schema.url(), &dir);
}
