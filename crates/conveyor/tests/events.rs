//! One event, many jobs, end to end: subscriptions set over the API, events sent with the CLI
//! and over HTTP. Every matching subscription makes one job, in one transaction: an event one
//! of whose jobs is refused stores none; an event sent again with its id makes nothing new.

mod common;

use common::*;
use serde_json::{json, Value};

fn send(method: reqwest::Method, url: &str, body: Option<Value>) -> (u16, Value) {
    let mut request = http().request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().expect("request");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

fn count(server: &str, queue: &str) -> usize {
    let page: Value = http()
        .get(format!("{server}/v1/jobs?queue={queue}&limit=100"))
        .send()
        .expect("GET jobs")
        .json()
        .expect("jobs");
    page["jobs"].as_array().map_or(0, Vec::len)
}

fn cli(args: &[&str]) -> String {
    let output = conveyor(args);
    assert!(
        output.status.success(),
        "conveyor {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn an_event_makes_one_job_per_matching_subscription_all_or_none() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let url = |path: &str| format!("{}{path}", server.url);
    let put = reqwest::Method::PUT;
    let (status, answer) = send(
        put.clone(),
        &url("/v1/subscriptions/welcome"),
        Some(json!({"event": "user.signed_up", "job": {"kind": "email.welcome", "queue": "mail"}})),
    );
    assert_eq!(status, 201, "{answer}");
    cli(&[
        "subscription",
        "set",
        "crm",
        "--spec",
        r#"{"event": "user.signed_up", "job": {"kind": "crm.sync", "queue": "crm"}, "filter": {"plan": "pro"}}"#,
        "--server",
        &server.url,
    ]);
    send(
        put.clone(),
        &url("/v1/subscriptions/goodbye"),
        Some(json!({"event": "user.deleted", "job": {"kind": "email.goodbye", "queue": "mail"}})),
    );
    let listed = cli(&["subscription", "list", "--server", &server.url]);
    assert!(
        listed.contains("crm") && listed.contains("{\"plan\":\"pro\"}"),
        "{listed}"
    );
    let (status, answer) = send(
        put,
        &url("/v1/subscriptions/bad"),
        Some(json!({"event": "x", "job": {"kind": "k"}, "filter": 3})),
    );
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("filter")),
        "{answer}"
    );

    // A pro sign-up: two jobs (welcome and crm), not goodbye's.
    let said = cli(&[
        "event",
        "send",
        "user.signed_up",
        "--payload",
        r#"{"plan": "pro", "user_id": 7}"#,
        "--id",
        "signup-7",
        "--server",
        &server.url,
    ]);
    assert!(said.contains("2 job(s)"), "{said}");
    assert_eq!(
        (count(&server.url, "mail"), count(&server.url, "crm")),
        (1, 1)
    );
    // The same event again: nothing new.
    let said = cli(&[
        "event",
        "send",
        "user.signed_up",
        "--payload",
        r#"{"plan": "pro", "user_id": 7}"#,
        "--id",
        "signup-7",
        "--server",
        &server.url,
    ]);
    assert!(said.contains("already made"), "{said}");
    assert_eq!(
        (count(&server.url, "mail"), count(&server.url, "crm")),
        (1, 1)
    );
    // A free sign-up: the filter leaves crm out.
    let (status, answer) = send(
        reqwest::Method::POST,
        &url("/v1/events"),
        Some(json!({"name": "user.signed_up", "payload": {"plan": "free", "user_id": 8}})),
    );
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["jobs"].as_array().map(Vec::len), Some(1), "{answer}");
    assert_eq!(answer["jobs"][0]["subscription"], "welcome");
    assert_eq!(
        (count(&server.url, "mail"), count(&server.url, "crm")),
        (2, 1)
    );

    // All or none: crm's kind now needs an email; a pro sign-up without one stores neither job.
    let (status, answer) = send(
        reqwest::Method::PUT,
        &url("/v1/kinds/crm.sync"),
        Some(json!({"schema": {"type": "object", "required": ["email"]}, "force": true})),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = send(
        reqwest::Method::POST,
        &url("/v1/events"),
        Some(
            json!({"name": "user.signed_up", "payload": {"plan": "pro", "user_id": 9}, "id": "signup-9"}),
        ),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["field"]
            .as_str()
            .is_some_and(|f| f.starts_with("subscriptions.crm")),
        "{answer}"
    );
    assert_eq!(
        (count(&server.url, "mail"), count(&server.url, "crm")),
        (2, 1)
    );
    // No subscription: accepted, nothing made.
    let (status, answer) = send(
        reqwest::Method::POST,
        &url("/v1/events"),
        Some(json!({"name": "nobody.listens"})),
    );
    assert_eq!(
        (status, answer["jobs"].as_array().map(Vec::len)),
        (202, Some(0)),
        "{answer}"
    );
    let (status, answer) = send(
        reqwest::Method::POST,
        &url("/v1/events"),
        Some(json!({"name": "bad name!"})),
    );
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("name")),
        "{answer}"
    );

    assert_eq!(
        send(reqwest::Method::DELETE, &url("/v1/subscriptions/crm"), None).0,
        204
    );
    assert_eq!(
        send(reqwest::Method::GET, &url("/v1/subscriptions/crm"), None).0,
        404
    );
}
