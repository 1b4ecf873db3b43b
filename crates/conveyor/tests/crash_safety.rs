//! Crash safety with real processes: `kill -9` a server mid-enqueue and a worker mid-job.

mod common;

use common::*;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[test]
fn server_killed_with_sigkill_loses_no_acknowledged_job() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let mut server = start_server(&db, &[]);
    let acked: Arc<Mutex<Vec<String>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|client| {
            let (url, acked, stop) = (server.url.clone(), acked.clone(), stop.clone());
            std::thread::spawn(move || {
                let http = http();
                let mut n = 0;
                while !stop.load(Ordering::SeqCst) {
                    n += 1;
                    let body = json!({"kind": "crash.test", "payload": {"client": client, "n": n}});
                    // Only a 201 is an acknowledgement; errors after the kill are expected.
                    if let Ok(response) = http.post(format!("{url}/v1/jobs")).json(&body).send() {
                        if response.status().as_u16() == 201 {
                            if let Ok(job) = response.json::<Value>() {
                                acked
                                    .lock()
                                    .unwrap()
                                    .push(job["id"].as_str().unwrap().to_string());
                            }
                        }
                    } else {
                        return;
                    }
                }
            })
        })
        .collect();
    eventually_blocking("300 acknowledged enqueues", || {
        (acked.lock().unwrap().len() >= 300).then_some(())
    });
    server.proc.kill_9();
    stop.store(true, Ordering::SeqCst);
    for client in clients {
        client.join().unwrap();
    }
    let acked = acked.lock().unwrap().clone();

    let restarted = start_server(&db, &[]);
    let http = http();
    for id in &acked {
        let response = http
            .get(format!("{}/v1/jobs/{id}", restarted.url))
            .send()
            .unwrap();
        assert_eq!(
            response.status().as_u16(),
            200,
            "acknowledged job {id} is missing after kill -9"
        );
    }
    let queues: Value = http
        .get(format!("{}/v1/queues", restarted.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let available = queues["queues"][0]["available"].as_u64().unwrap();
    assert!(
        available as usize >= acked.len(),
        "{available} stored < {} acknowledged",
        acked.len()
    );
}

#[test]
fn worker_killed_mid_job_reruns_after_lease_expiry_and_its_stale_completion_is_rejected() {
    let dir = temp_dir();
    let server = start_server(
        &path_in(&dir, "jobs.db"),
        &["--maintenance-interval-ms", "100"],
    );
    let job = enqueue(
        &server.url,
        json!({"kind": "slow", "payload": {"x": 1}, "max_attempts": 3}),
    );
    let id = job["id"].as_str().unwrap().to_string();
    let token_file = path_in(&dir, "token");

    let hanging = format!(
        "printf %s \"$CONVEYOR_LEASE_TOKEN\" > {}; exec sleep 60",
        token_file.display()
    );
    let mut first = start_worker(&server.url, &hanging, &["--lease-ms", "1000"]);
    let stale_token = eventually_blocking("the first worker to start the job", || {
        std::fs::read_to_string(&token_file)
            .ok()
            .filter(|t| t.len() == 36)
    });
    first.kill_9();

    let result_file = path_in(&dir, "payload-seen");
    let finishing = format!("cat > {}; echo '{{\"ok\": true}}'", result_file.display());
    let _second = start_worker(&server.url, &finishing, &["--lease-ms", "1000"]);
    let done = eventually_blocking("the job to complete on the second worker", || {
        let job = get_job(&server.url, &id);
        (job["state"] == "completed").then_some(job)
    });
    assert_eq!(done["attempt"], 2);
    assert_eq!(done["errors"][0]["class"], "lease_expired");
    assert_eq!(done["result"], json!({"ok": true}));
    assert_eq!(std::fs::read_to_string(&result_file).unwrap(), r#"{"x":1}"#);

    let late = http()
        .post(format!("{}/v1/jobs/{id}/complete", server.url))
        .json(&json!({"lease_token": stale_token, "result": {"late": true}}))
        .send()
        .unwrap();
    assert_eq!(
        late.status().as_u16(),
        409,
        "a stale completion must be rejected"
    );
    let after = get_job(&server.url, &id);
    assert_eq!(
        after["result"],
        json!({"ok": true}),
        "the stale completion changed nothing"
    );
    assert_eq!(after["attempt"], 2);
}

#[test]
fn sigterm_lets_a_running_job_finish_within_the_drain_timeout() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let job = enqueue(&server.url, json!({"kind": "report"}));
    let id = job["id"].as_str().unwrap().to_string();
    let started = path_in(&dir, "started");
    let release = path_in(&dir, "release");
    // The command runs until the test creates `release`, after shutdown has begun.
    let exec = format!(
        "touch {}; while [ ! -e {} ]; do sleep 0.05; done; echo '{{\"rows\": 3}}'",
        started.display(),
        release.display()
    );
    let mut worker = start_worker(&server.url, &exec, &["--drain-timeout-secs", "30"]);
    eventually_blocking("the job to start", || started.exists().then_some(()));
    worker.sigterm();
    // Shutdown has begun: the worker must not take new work while it drains.
    let later = enqueue(&server.url, json!({"kind": "report"}));
    std::fs::write(&release, b"").unwrap();
    let status = worker.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "worker exited with {status}");
    let done = get_job(&server.url, &id);
    assert_eq!(done["state"], "completed");
    assert_eq!(done["result"], json!({"rows": 3}));
    let untouched = get_job(&server.url, later["id"].as_str().unwrap());
    assert_eq!(untouched["state"], "available");
}

#[test]
fn sigterm_releases_a_job_that_cannot_finish_and_another_worker_runs_it() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let job = enqueue(&server.url, json!({"kind": "long"}));
    let id = job["id"].as_str().unwrap().to_string();
    let started = path_in(&dir, "started");
    let exec = format!("touch {}; exec sleep 60", started.display());
    let mut worker = start_worker(&server.url, &exec, &["--drain-timeout-secs", "0.3"]);
    eventually_blocking("the job to start", || started.exists().then_some(()));
    worker.sigterm();
    let status = worker.wait_exit(Duration::from_secs(30));
    assert!(status.success(), "worker exited with {status}");
    let released = get_job(&server.url, &id);
    assert_eq!(
        released["state"], "available",
        "released at once, not left to lease expiry"
    );
    assert_eq!(released["attempt"], 0);

    let _other = start_worker(&server.url, "cat > /dev/null", &[]);
    let done = eventually_blocking("another worker to complete the job", || {
        let job = get_job(&server.url, &id);
        (job["state"] == "completed").then_some(job)
    });
    assert_eq!(done["attempt"], 1);
    assert_eq!(done["errors"], json!([]));
}

#[test]
fn exec_worker_exit_codes_choose_retry_or_permanent_failure() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let retry = enqueue(
        &server.url,
        json!({"kind": "exit", "payload": {"code": 75}, "max_attempts": 2}),
    );
    let permanent = enqueue(
        &server.url,
        json!({"kind": "exit", "payload": {"code": 65}, "max_attempts": 5}),
    );
    let other = enqueue(
        &server.url,
        json!({"kind": "exit", "payload": {"code": 3}, "max_attempts": 1}),
    );
    // Reads the exit code from the payload and reports something on stderr.
    let exec = "code=$(sed 's/[^0-9]//g'); echo \"failing with $code\" >&2; exit $code";
    let _worker = start_worker(&server.url, exec, &["--concurrency", "3"]);
    let dead = |job: &Value| {
        let id = job["id"].as_str().unwrap().to_string();
        eventually_blocking("the job to reach the dead-letter queue", || {
            let job = get_job(&server.url, &id);
            (job["state"] == "dead").then_some(job)
        })
    };
    let permanent = dead(&permanent);
    assert_eq!(permanent["attempt"], 1);
    assert_eq!(permanent["errors"][0]["class"], "permanent");
    assert!(permanent["errors"][0]["message"]
        .as_str()
        .unwrap()
        .contains("failing with 65"));
    let other = dead(&other);
    assert_eq!(other["errors"][0]["class"], "exit_status");
    // Exit 75 retries with the server's default backoff (about 1 s) until attempts run out.
    let retried = dead(&retry);
    assert_eq!(retried["attempt"], 2);
    assert_eq!(retried["errors"][0]["class"], "error");
    assert_eq!(retried["errors"][1]["class"], "error");
}
