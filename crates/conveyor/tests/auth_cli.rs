//! `conveyor token`, `conveyor audit`, `--token` on the client commands, and `serve`'s refusal to
//! listen beyond loopback without access control: the real binary as child processes.

mod common;

use common::{http, path_in, start_server, temp_dir, Proc, BIN};
use reqwest::StatusCode;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

/// Runs `conveyor ARGS` to completion, with no token or store inherited from the environment.
fn conveyor(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .env("CONVEYOR_LOG", "warn")
        .env_remove("CONVEYOR_TOKEN")
        .env_remove("CONVEYOR_STORE")
        .env_remove("CONVEYOR_AUTH")
        .stdin(Stdio::null());
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run conveyor")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// `conveyor token create`: the secret, which is all of stdout.
fn create_token(store: &str, role: &str, name: &str) -> String {
    let output = conveyor(
        &[
            "token", "create", "--role", role, "--name", name, "--store", store,
        ],
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let out = stdout(&output);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "only the secret on stdout: {out:?}");
    assert!(lines[0].starts_with("cv_"), "{out:?}");
    assert!(stderr(&output).contains(name), "{}", stderr(&output));
    lines[0].to_string()
}

fn get_status(url: &str, token: Option<&str>) -> StatusCode {
    let mut request = http().get(url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    request.send().expect("GET").status()
}

#[test]
fn created_token_works_against_serve_auth_until_revoked() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let store = format!("sqlite://{}", db.display());
    let admin = create_token(&store, "admin", "ops");
    let producer = create_token(&store, "producer", "app");
    assert_ne!(admin, producer);

    let server = start_server(&db, &["--auth"]);
    let queues = format!("{}/v1/queues", server.url);
    assert_eq!(get_status(&queues, None), StatusCode::UNAUTHORIZED);
    assert_eq!(get_status(&queues, Some(&admin)), StatusCode::OK);
    assert_eq!(get_status(&queues, Some(&producer)), StatusCode::FORBIDDEN);
    assert_eq!(
        get_status(&format!("{}/healthz", server.url), None),
        StatusCode::OK
    );

    // The client commands send --token, or CONVEYOR_TOKEN.
    let output = conveyor(&["queues", "--server", &server.url], &[]);
    assert!(!output.status.success(), "no token: refused");
    assert!(
        stderr(&output).contains("401") && stderr(&output).contains("--token"),
        "{}",
        stderr(&output)
    );
    let output = conveyor(&["queues", "--server", &server.url, "--token", &admin], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let output = conveyor(
        &["enqueue", "mail", "--server", &server.url, "--json"],
        &[("CONVEYOR_TOKEN", &producer)],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let job: serde_json::Value = serde_json::from_str(&stdout(&output)).expect("job JSON");
    let id = job["id"].as_str().expect("id").to_string();
    let output = conveyor(
        &[
            "job",
            "show",
            &id,
            "--server",
            &server.url,
            "--token",
            &producer,
        ],
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));

    // The audit log shows who did what: the CLI's token creations and the producer's enqueue.
    let output = conveyor(
        &[
            "audit",
            "--server",
            &server.url,
            "--token",
            &admin,
            "--json",
        ],
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let page: serde_json::Value = serde_json::from_str(&stdout(&output)).expect("audit JSON");
    let entries = page["entries"].as_array().expect("entries");
    assert_eq!(entries[0]["action"], "job.enqueue");
    assert_eq!(entries[0]["actor"], "app");
    assert_eq!(entries[0]["job_ids"][0], id.as_str());
    let creations: Vec<&serde_json::Value> = entries
        .iter()
        .filter(|e| e["action"] == "token.create")
        .collect();
    assert_eq!(creations.len(), 2);
    assert!(
        creations
            .iter()
            .all(|e| e["actor"].as_str().is_some_and(|a| a.starts_with("cli:"))),
        "{creations:?}"
    );
    let output = conveyor(
        &["audit", "--server", &server.url, "--token", &producer],
        &[],
    );
    assert!(!output.status.success(), "the audit log is for admins");
    assert!(stderr(&output).contains("403"), "{}", stderr(&output));

    // Revoked while the server runs: refused from the next request on.
    let output = conveyor(&["token", "revoke", "app", "--store", &store], &[]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stdout(&output).contains("app"), "{}", stdout(&output));
    assert_eq!(
        get_status(&format!("{}/v1/jobs/{id}", server.url), Some(&producer)),
        StatusCode::UNAUTHORIZED
    );
    let output = conveyor(&["token", "revoke", "app", "--store", &store], &[]);
    assert!(!output.status.success(), "nothing left to revoke");
    assert!(
        stderr(&output).contains("no active token"),
        "{}",
        stderr(&output)
    );
}

#[test]
fn token_list_never_shows_secrets() {
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    let first = create_token(&store, "worker", "runner-1");
    let second = create_token(&store, "admin", "ops");
    let output = conveyor(&["token", "revoke", "runner-1", "--store", &store], &[]);
    assert!(output.status.success(), "{}", stderr(&output));

    let table = conveyor(&["token", "list", "--store", &store], &[]);
    assert!(table.status.success(), "{}", stderr(&table));
    let json = conveyor(&["token", "list", "--store", &store, "--json"], &[]);
    assert!(json.status.success(), "{}", stderr(&json));
    for output in [&table, &json] {
        let text = format!("{}{}", stdout(output), stderr(output));
        for secret in [&first, &second] {
            let random_part = secret.rsplit('_').next().expect("secret part");
            assert!(!text.contains(random_part), "a secret is listed: {text}");
        }
        assert!(text.contains("runner-1") && text.contains("ops"), "{text}");
    }
    let listed: serde_json::Value = serde_json::from_str(&stdout(&json)).expect("JSON");
    let listed = listed.as_array().expect("array");
    assert_eq!(listed.len(), 2);
    assert_eq!(listed[0]["name"], "runner-1");
    assert_eq!(listed[0]["role"], "worker");
    assert!(listed[0]["revoked_at"].is_string(), "{listed:?}");
    assert!(listed[1]["revoked_at"].is_null(), "{listed:?}");
    assert!(
        listed.iter().all(|t| t.get("secret_hash").is_none()),
        "{listed:?}"
    );

    let output = conveyor(
        &["token", "create", "--role", "root", "--store", &store],
        &[],
    );
    assert!(!output.status.success());
    assert!(stderr(&output).contains("role"), "{}", stderr(&output));
}

#[test]
fn serve_refuses_a_public_address_without_access_control() {
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    let child = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "0.0.0.0:0",
            "--auth=false",
            "--store",
            &store,
        ])
        .env("CONVEYOR_LOG", "warn")
        .env_remove("CONVEYOR_AUTH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn serve");
    // Killed on drop if it did not exit by itself.
    let mut proc = Proc { child };
    let status = proc.wait_exit(Duration::from_secs(30));
    assert!(!status.success(), "serve must not start");
    let mut message = String::new();
    if let Some(mut err) = proc.child.stderr.take() {
        std::io::Read::read_to_string(&mut err, &mut message).expect("stderr");
    }
    assert!(
        message.contains("refusing to listen on 0.0.0.0:0 without access control")
            && message.contains("--insecure-no-auth"),
        "{message}"
    );
    assert!(
        !path_in(&dir, "jobs.db").exists(),
        "refused before opening the store"
    );
}

#[test]
fn serve_turns_access_control_on_for_a_public_address() {
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "0.0.0.0:0", "--store", &store])
        .env("CONVEYOR_LOG", "warn")
        .env_remove("CONVEYOR_AUTH")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn serve");
    let stdout = child.stdout.take().expect("stdout");
    let _proc = Proc { child };
    let mut first = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut first)
        .expect("listen line");
    assert!(first.contains("auth: on"), "{first}");
    let port = first
        .split_whitespace()
        .find_map(|word| word.strip_prefix("http://0.0.0.0:"))
        .unwrap_or_else(|| panic!("no address in {first:?}"))
        .to_string();
    // Only ever reached over loopback.
    let base = format!("http://127.0.0.1:{port}");
    assert_eq!(
        get_status(&format!("{base}/v1/queues"), None),
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(get_status(&format!("{base}/healthz"), None), StatusCode::OK);
}

/// The audit log's entries as `GET /v1/audit` lists them (newest first).
fn audit_entries(url: &str, admin: &str) -> Vec<serde_json::Value> {
    let page: serde_json::Value = http()
        .get(format!("{url}/v1/audit?limit=1000"))
        .bearer_auth(admin)
        .send()
        .expect("GET /v1/audit")
        .json()
        .expect("audit JSON");
    page["entries"].as_array().expect("entries").clone()
}

/// Audit retention (issue 27): the maintenance leader deletes entries older than
/// `--retain-audit-secs`, counting them in `conveyor_maintenance_pruned_total{record="audit"}`;
/// `conveyor audit prune --before` deletes the entries written before a moment, on the store,
/// beside the running server; a bad moment is refused naming the flag, and nothing is lost.
#[test]
fn audit_entries_are_pruned_by_retention_and_on_demand() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let store = format!("sqlite://{}", db.display());
    let admin = create_token(&store, "admin", "ops");
    let producer = create_token(&store, "producer", "app");

    // Kept for a day: only `audit prune` removes entries here.
    let server = start_server(&db, &["--auth", "--maintenance-interval-ms", "100"]);
    let enqueue = |url: &str, n: u32| {
        let status = http()
            .post(format!("{url}/v1/jobs"))
            .bearer_auth(&producer)
            .json(&serde_json::json!({"kind": "audit.me", "payload": {"n": n}}))
            .send()
            .expect("enqueue")
            .status();
        assert_eq!(status, StatusCode::CREATED);
    };
    for n in 0..3 {
        enqueue(&server.url, n);
    }
    let before = audit_entries(&server.url, &admin);
    assert_eq!(
        before.len(),
        5,
        "two token creations and three enqueues: {before:?}"
    );
    let newest_at = before[0]["at"].as_str().expect("at").to_string();

    let output = conveyor(
        &["audit", "prune", "--before", "yesterday", "--store", &store],
        &[],
    );
    assert!(!output.status.success(), "a bad moment is refused");
    assert!(stderr(&output).contains("--before"), "{}", stderr(&output));
    assert_eq!(
        audit_entries(&server.url, &admin).len(),
        5,
        "nothing deleted"
    );

    // Entries written before the newest one go; the newest (and any of its millisecond) stay.
    let at = |entry: &serde_json::Value| {
        chrono::DateTime::parse_from_rfc3339(entry["at"].as_str().expect("at")).expect("RFC 3339")
    };
    let cutoff = at(&before[0]);
    let kept: Vec<serde_json::Value> = before.iter().filter(|e| at(e) >= cutoff).cloned().collect();
    let output = conveyor(
        &["audit", "prune", "--before", &newest_at, "--store", &store],
        &[],
    );
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(
        stdout(&output).contains(&format!("deleted {} audit entr", before.len() - kept.len())),
        "{}",
        stdout(&output)
    );
    let left = audit_entries(&server.url, &admin);
    assert_eq!(
        left, kept,
        "only the entries from the newest one's moment on are left"
    );
    drop(server);

    // A one-second retention: the leader prunes what the next enqueues write.
    let server = start_server(
        &db,
        &[
            "--auth",
            "--maintenance-interval-ms",
            "100",
            "--retain-audit-secs",
            "1",
        ],
    );
    for n in 3..6 {
        enqueue(&server.url, n);
    }
    common::eventually_blocking("the audit log to be pruned", || {
        let entries = audit_entries(&server.url, &admin);
        if entries.is_empty() {
            Ok(())
        } else {
            Err(format!("{} entries left", entries.len()))
        }
    });
    let metrics = http()
        .get(format!("{}/metrics", server.url))
        .bearer_auth(&admin)
        .send()
        .expect("metrics")
        .text()
        .expect("metrics text");
    let pruned: f64 = metrics
        .lines()
        .find(|line| line.starts_with("conveyor_maintenance_pruned_total{record=\"audit\"}"))
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no audit prune count in:\n{metrics}"));
    assert!(
        pruned >= 4.0,
        "the retention pruned the old entries and the three new: {pruned}"
    );
}
