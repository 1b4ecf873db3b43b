//! `conveyor store copy`: a user who outgrows the embedded store moves every job, with its
//! state and history, to PostgreSQL in one command.

mod common;

use common::*;
use serde_json::{json, Value};
use std::process::Command;

#[test]
fn store_copy_moves_every_job_and_its_history_from_sqlite_to_postgres() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let sqlite = format!("sqlite://{}", db.display());
    let before: Vec<Value>;
    {
        let server = start_server(&db, &[]);
        let s = server.url.as_str();
        for n in 0..25 {
            enqueue(
                s,
                json!({"kind": "copy.me", "payload": {"n": n}, "tags": ["t"], "priority": n % 3}),
            );
        }
        // One dead job with history, one cancelled, one scheduled.
        let http = http();
        let fetched: Value = http
            .post(format!("{s}/v1/fetch"))
            .json(&json!({"worker_id": "w", "queues": ["default"]}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let job = &fetched["jobs"][0];
        let id = job["id"].as_str().unwrap();
        http.post(format!("{s}/v1/jobs/{id}/fail"))
            .json(&json!({"lease_token": job["lease_token"], "retry": "never", "error": {"message": "kept"}}))
            .send()
            .unwrap();
        let cancel = enqueue(s, json!({"kind": "copy.me"}));
        http.post(format!(
            "{s}/v1/jobs/{}/cancel",
            cancel["id"].as_str().unwrap()
        ))
        .send()
        .unwrap();
        enqueue(s, json!({"kind": "later", "delay_ms": 3_600_000}));
        let page: Value = http
            .get(format!("{s}/v1/jobs?limit=500"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        before = page["jobs"].as_array().unwrap().clone();
    }
    assert_eq!(before.len(), 27);

    let schema = Schema::fresh("conveyor_copy");
    let postgres = schema.url();
    let out = Command::new(BIN)
        .args(["store", "copy", "--from", &sqlite, "--to", &postgres])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("copied 27 job(s)"));

    let again = Command::new(BIN)
        .args(["store", "copy", "--from", &sqlite, "--to", &postgres])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("copied 0 job(s)"),
        "a second copy adds nothing"
    );

    let server = start_server_at(&postgres, &[]);
    let page: Value = http()
        .get(format!("{}/v1/jobs?limit=500", server.url))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let after = page["jobs"].as_array().unwrap();
    assert_eq!(
        after, &before,
        "every job arrives with the same fields, state and history"
    );
}
