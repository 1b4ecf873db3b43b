//! Named limits through the API and the command line, with the real binary on SQLite:
//! `PUT/GET/DELETE /v1/limits/{name}` and `GET /v1/limits`, their refusals (each naming the
//! field), `limits` in queue and kind settings (only defined limits, which then cannot be
//! deleted), `conveyor limit ...`, and who may change limits.

mod common;

use common::*;
use reqwest::Method;
use serde_json::{json, Value};
use std::process::Output;

/// Sends a request (with `token` as bearer when given); the status and the JSON answer
/// (`null` for an empty one).
fn call(method: Method, url: &str, token: Option<&str>, body: Option<Value>) -> (u16, Value) {
    let mut request = http().request(method, url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().expect("request");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

fn send(method: Method, url: &str, body: Option<Value>) -> (u16, Value) {
    call(method, url, None, body)
}

/// The status and the `error.field` of a refused request.
fn refusal(method: Method, url: &str, body: Value) -> (u16, String) {
    let (status, answer) = send(method, url, Some(body));
    assert!((400..500).contains(&status), "{status}: {answer}");
    assert!(answer["error"]["message"].is_string(), "{answer}");
    (
        status,
        answer["error"]["field"].as_str().unwrap_or("").to_string(),
    )
}

fn metrics_text(url: &str) -> String {
    http()
        .get(url)
        .send()
        .expect("metrics")
        .text()
        .expect("text")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `conveyor ARGS --server URL`; its stdout, after checking it succeeded.
fn cli(server: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--server", server]);
    let output = conveyor(&all);
    assert!(
        output.status.success(),
        "conveyor {args:?}: {}",
        stderr(&output)
    );
    stdout(&output)
}

/// Runs `conveyor ARGS --server URL`, expecting it to fail; its stderr.
fn cli_fails(server: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--server", server]);
    let output = conveyor(&all);
    assert!(
        !output.status.success(),
        "conveyor {args:?} succeeded: {}",
        stdout(&output)
    );
    stderr(&output)
}

#[test]
fn limits_round_trip_and_bad_bodies_are_refused_naming_the_field() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let url = |path: &str| format!("{}{path}", server.url);

    let (status, answer) = send(
        Method::PUT,
        &url("/v1/limits/vendor"),
        Some(
            json!({"concurrency": 10, "rate": {"count": 100, "period_ms": 60000}, "key": "tenant"}),
        ),
    );
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["name"], "vendor");
    assert_eq!(answer["concurrency"], 10);
    assert_eq!(answer["rate"], json!({"count": 100, "period_ms": 60000}));
    assert_eq!(answer["key"], "tenant");
    assert!(answer["updated_at"].is_string(), "{answer}");

    // Replaced whole: the rate and the key it no longer gives are gone. An integer may be
    // written with a fraction of zero, as everywhere in the API.
    let (status, answer) = send(
        Method::PUT,
        &url("/v1/limits/vendor"),
        Some(json!({"concurrency": 5.0})),
    );
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["concurrency"], 5);
    assert!(
        answer.get("rate").is_none() && answer.get("key").is_none(),
        "{answer}"
    );
    let (status, answer) = send(
        Method::PUT,
        &url("/v1/limits/per-customer"),
        Some(json!({"rate": {"count": 2, "period_ms": 1000}, "key": "payload.customer.id"})),
    );
    assert_eq!(status, 201, "{answer}");

    let (status, listed) = send(Method::GET, &url("/v1/limits"), None);
    assert_eq!(status, 200, "{listed}");
    let names: Vec<&str> = listed["limits"]
        .as_array()
        .expect("limits")
        .iter()
        .map(|limit| limit["name"].as_str().expect("name"))
        .collect();
    assert_eq!(names, ["per-customer", "vendor"], "{listed}");
    assert_eq!(listed["limits"][0]["key"], "payload.customer.id");

    let (status, shown) = send(Method::GET, &url("/v1/limits/vendor"), None);
    assert_eq!(status, 200, "{shown}");
    assert_eq!(shown["concurrency"], 5);
    assert_eq!(shown["usage"], json!([]), "no job runs under it");
    assert_eq!(shown["in_use"], 0);

    let (status, _) = send(Method::DELETE, &url("/v1/limits/vendor"), None);
    assert_eq!(status, 204);
    let (status, answer) = send(Method::GET, &url("/v1/limits/vendor"), None);
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{answer}"
    );
    let (status, _) = send(Method::DELETE, &url("/v1/limits/vendor"), None);
    assert_eq!(status, 404, "deleted already");

    // Each bad body: a 400 naming the field, and nothing stored.
    let put =
        |name: &str, body: Value| refusal(Method::PUT, &url(&format!("/v1/limits/{name}")), body);
    let bad = "invalid";
    assert_eq!(put(bad, json!({})), (400, "concurrency".into()), "neither");
    assert_eq!(
        put(bad, json!({"key": "tenant"})),
        (400, "concurrency".into())
    );
    assert_eq!(
        put(bad, json!({"concurrency": 0})),
        (400, "concurrency".into())
    );
    assert_eq!(
        put(bad, json!({"concurrency": -1})),
        (400, "concurrency".into())
    );
    assert_eq!(
        put(bad, json!({"concurrency": 1.5})),
        (400, "concurrency".into())
    );
    assert_eq!(
        put(bad, json!({"concurrency": null})),
        (400, "concurrency".into())
    );
    assert_eq!(
        put(bad, json!({"concurrency": 9_223_372_036_854_775_808u64})),
        (400, "concurrency".into()),
        "beyond what a store keeps"
    );
    assert_eq!(
        put(bad, json!({"rate": {"count": 0, "period_ms": 1000}})),
        (400, "rate.count".into())
    );
    assert_eq!(
        put(
            bad,
            json!({"rate": {"count": 1, "period_ms": 10, "burst": 2}})
        ),
        (400, "rate.burst".into())
    );
    assert_eq!(
        put(
            bad,
            json!({"rate": {"count": 1, "period_ms": 86_400_001u64}})
        ),
        (400, "rate.period_ms".into())
    );
    assert_eq!(
        put(bad, json!({"concurrency": 1, "key": "customer"})),
        (400, "key".into())
    );
    assert_eq!(
        put(bad, json!({"concurrency": 1, "key": "payload."})),
        (400, "key".into())
    );
    assert_eq!(
        put(bad, json!({"concurrency": 1, "colour": "red"})),
        (400, "colour".into()),
        "an unknown field"
    );
    assert_eq!(put(bad, json!([1])), (400, "body".into()));
    assert_eq!(
        put("a:b", json!({"concurrency": 1})),
        (400, "name".into()),
        "':' separates a limit's name from its key value"
    );
    assert_eq!(
        refusal(Method::GET, &url("/v1/limits/a:b"), Value::Null),
        (400, "name".into())
    );
    let (status, listed) = send(Method::GET, &url("/v1/limits"), None);
    assert_eq!(status, 200);
    assert_eq!(
        listed["limits"].as_array().map(Vec::len),
        Some(1),
        "{listed}"
    );
}

#[test]
fn settings_name_only_defined_limits_which_then_cannot_be_deleted() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let url = |path: &str| format!("{}{path}", server.url);

    // Nothing defined yet: naming a limit is refused, naming its place in the list.
    assert_eq!(
        refusal(
            Method::PUT,
            &url("/v1/queues/calls"),
            json!({"limits": ["vendor"]})
        ),
        (400, "limits[0]".into())
    );
    assert_eq!(
        refusal(
            Method::PUT,
            &url("/v1/kinds/sync"),
            json!({"limits": ["vendor"]})
        ),
        (400, "limits[0]".into())
    );
    let (status, _) = send(
        Method::PUT,
        &url("/v1/limits/vendor"),
        Some(json!({"concurrency": 2})),
    );
    assert_eq!(status, 201);
    assert_eq!(
        refusal(
            Method::PUT,
            &url("/v1/queues/calls"),
            json!({"limits": ["vendor", "nope"]})
        ),
        (400, "limits[1]".into())
    );
    assert_eq!(
        refusal(
            Method::PUT,
            &url("/v1/queues/calls"),
            json!({"limits": ["vendor", "vendor"]})
        ),
        (400, "limits[1]".into()),
        "each at most once"
    );
    assert_eq!(
        refusal(
            Method::PUT,
            &url("/v1/queues/calls"),
            json!({"limits": "vendor"})
        ),
        (400, "limits".into())
    );
    assert_eq!(
        refusal(Method::PUT, &url("/v1/kinds/sync"), json!({"limits": [7]})),
        (400, "limits[0]".into())
    );

    // Named: shown back, and kept by a change of other settings.
    let (status, queue) = send(
        Method::PUT,
        &url("/v1/queues/calls"),
        Some(json!({"limits": ["vendor"]})),
    );
    assert_eq!(status, 200, "{queue}");
    assert_eq!(queue["limits"], json!(["vendor"]));
    let (status, queue) = send(
        Method::PUT,
        &url("/v1/queues/calls"),
        Some(json!({"paused": true})),
    );
    assert_eq!(status, 200, "{queue}");
    assert_eq!(queue["limits"], json!(["vendor"]));
    let (_, queue) = send(Method::GET, &url("/v1/queues/calls"), None);
    assert_eq!(queue["limits"], json!(["vendor"]), "{queue}");
    let (status, kind) = send(
        Method::PUT,
        &url("/v1/kinds/sync"),
        Some(json!({"limits": ["vendor"]})),
    );
    assert_eq!(status, 200, "{kind}");
    assert_eq!(kind["limits"], json!(["vendor"]));
    let (_, kind) = send(
        Method::PUT,
        &url("/v1/kinds/sync"),
        Some(json!({"schema": {"type": "object"}})),
    );
    assert_eq!(kind["limits"], json!(["vendor"]), "{kind}");
    let (_, kind) = send(Method::GET, &url("/v1/kinds/sync"), None);
    assert_eq!(kind["limits"], json!(["vendor"]), "{kind}");

    // In use: the refusal names the queue and the kind.
    let (status, answer) = send(Method::DELETE, &url("/v1/limits/vendor"), None);
    assert_eq!(status, 409, "{answer}");
    assert_eq!(answer["error"]["code"], "limit_in_use");
    let message = answer["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains("queue \"calls\"") && message.contains("kind \"sync\""),
        "{message}"
    );
    let (status, _) = send(
        Method::PUT,
        &url("/v1/queues/calls"),
        Some(json!({"limits": null})),
    );
    assert_eq!(status, 200);
    let (status, answer) = send(Method::DELETE, &url("/v1/limits/vendor"), None);
    assert_eq!(status, 409, "the kind still names it");
    assert!(
        !answer["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("calls"),
        "{answer}"
    );
    let (status, kind) = send(
        Method::PUT,
        &url("/v1/kinds/sync"),
        Some(json!({"limits": []})),
    );
    assert_eq!(status, 200, "{kind}");
    assert!(kind.get("limits").is_none(), "none named: {kind}");
    let (_, queue) = send(Method::GET, &url("/v1/queues/calls"), None);
    assert_eq!(queue["limits"], json!([]), "{queue}");
    let (status, answer) = send(Method::DELETE, &url("/v1/limits/vendor"), None);
    assert_eq!(status, 204, "{answer}");

    // An enqueue takes `limits` too; its names' format is checked at the door.
    assert_eq!(
        refusal(
            Method::POST,
            &url("/v1/jobs"),
            json!({"kind": "sync", "limits": ["a:b"]})
        ),
        (400, "limits[0]".into())
    );
    assert_eq!(
        refusal(
            Method::POST,
            &url("/v1/jobs/batch"),
            json!({"jobs": [{"kind": "sync"}, {"kind": "sync", "limits": ["a:b"]}]})
        ),
        (400, "jobs[1].limits[0]".into())
    );
}

/// The usage of a limit's keys, the `in_use` sum and the metric, with a job running under it.
/// Needs the enforcement (jobs stamped at enqueue, usage counted by the store).
#[test]
fn a_limit_shows_the_running_jobs_of_each_key() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let url = |path: &str| format!("{}{path}", server.url);
    let (status, _) = send(
        Method::PUT,
        &url("/v1/limits/vendor"),
        Some(
            json!({"concurrency": 5, "rate": {"count": 100, "period_ms": 60000}, "key": "tenant"}),
        ),
    );
    assert_eq!(status, 201);
    let (status, job) = send(
        Method::POST,
        &url("/v1/jobs"),
        Some(json!({"kind": "call", "queue": "calls", "tenant": "acme", "limits": ["vendor"]})),
    );
    assert_eq!(status, 201, "{job}");
    assert_eq!(job["limit_keys"], json!(["vendor:acme"]), "{job}");
    let (status, batch) = send(
        Method::POST,
        &url("/v1/jobs/batch"),
        Some(
            json!({"jobs": [{"kind": "call", "queue": "calls", "tenant": "zeta", "limits": ["vendor"]}]}),
        ),
    );
    assert_eq!(status, 201, "{batch}");
    let (status, fetched) = send(
        Method::POST,
        &url("/v1/fetch"),
        Some(json!({"worker_id": "w1", "queues": ["calls"], "max": 2})),
    );
    assert_eq!(status, 200, "{fetched}");
    assert_eq!(
        fetched["jobs"].as_array().map(Vec::len),
        Some(2),
        "{fetched}"
    );

    let (status, shown) = send(Method::GET, &url("/v1/limits/vendor"), None);
    assert_eq!(status, 200, "{shown}");
    assert_eq!(
        shown["usage"],
        json!([
            {"key": "acme", "running": 1, "recent_starts": 1},
            {"key": "zeta", "running": 1, "recent_starts": 1},
        ]),
        "{shown}"
    );
    assert_eq!(shown["in_use"], 2);
    let metrics = metrics_text(&url("/metrics"));
    assert!(
        metrics.contains("conveyor_limit_in_use{limit=\"vendor\"} 2"),
        "{metrics}"
    );

    // A job a full key holds back says so; one whose key has room says nothing.
    let (status, _) = send(
        Method::PUT,
        &url("/v1/limits/one-at-a-time"),
        Some(json!({"concurrency": 1, "key": "tenant"})),
    );
    assert_eq!(status, 201);
    let enqueue = |tenant: &str| {
        let (status, job) = send(
            Method::POST,
            &url("/v1/jobs"),
            Some(json!({"kind": "call", "queue": "narrow", "tenant": tenant,
                        "limits": ["one-at-a-time"]})),
        );
        assert_eq!(status, 201, "{job}");
        job["id"].as_str().expect("id").to_string()
    };
    enqueue("acme");
    let (status, fetched) = send(
        Method::POST,
        &url("/v1/fetch"),
        Some(json!({"worker_id": "w1", "queues": ["narrow"], "max": 5})),
    );
    assert_eq!(status, 200, "{fetched}");
    let waiting = enqueue("acme");
    let free = enqueue("zeta");
    let (_, held) = send(Method::GET, &url(&format!("/v1/jobs/{waiting}")), None);
    assert_eq!(
        held["blocked_by"],
        json!([{"limit": "one-at-a-time", "key": "acme", "running": 1, "recent_starts": 0,
                "concurrency": 1}]),
        "{held}"
    );
    let (_, not_held) = send(Method::GET, &url(&format!("/v1/jobs/{free}")), None);
    assert!(not_held.get("blocked_by").is_none(), "{not_held}");
    // A claim now takes zeta's job and holds acme's back: the limit counts it as throttled.
    let (status, fetched) = send(
        Method::POST,
        &url("/v1/fetch"),
        Some(json!({"worker_id": "w1", "queues": ["narrow"], "max": 5})),
    );
    assert_eq!(status, 200, "{fetched}");
    assert_eq!(fetched["jobs"][0]["id"], free, "{fetched}");
    assert_eq!(fetched["jobs"].as_array().map(Vec::len), Some(1));
    let metrics = metrics_text(&url("/metrics"));
    let throttled: u64 = metrics
        .lines()
        .find_map(|line| {
            line.strip_prefix("conveyor_limit_throttled_total{limit=\"one-at-a-time\"} ")
        })
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(throttled >= 1, "{metrics}");
}

#[test]
fn the_cli_sets_lists_shows_and_deletes_limits() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let url = server.url.as_str();

    let said = cli(
        url,
        &[
            "limit",
            "set",
            "api",
            "--concurrency",
            "3",
            "--rate",
            "100/1m",
            "--key",
            "payload.customer",
        ],
    );
    assert!(
        said.contains("limit api set: concurrency 3, 100 per 1m, key payload.customer"),
        "{said}"
    );
    let said = cli(url, &["limit", "set", "burst", "--rate", "10/1s"]);
    assert!(said.contains("10 per 1s, one key"), "{said}");
    let listed = cli(url, &["limit", "list"]);
    assert!(listed.starts_with("NAME"), "{listed}");
    assert!(
        listed.lines().any(|line| line.starts_with("api")
            && line.contains("100 per 1m")
            && line.contains("payload.customer")),
        "{listed}"
    );
    assert!(
        listed.lines().any(|line| line.starts_with("burst")),
        "{listed}"
    );
    let shown = cli(url, &["limit", "show", "api"]);
    assert!(
        shown.contains("limit api (concurrency 3") && shown.contains("0 running"),
        "{shown}"
    );
    let shown: Value =
        serde_json::from_str(&cli(url, &["limit", "show", "api", "--json"])).expect("JSON");
    assert_eq!(shown["rate"], json!({"count": 100, "period_ms": 60000}));
    assert_eq!(shown["in_use"], 0);

    // Bad input: a message and a non-zero exit, before anything is sent or from the server.
    let complaint = cli_fails(url, &["limit", "set", "x", "--rate", "5"]);
    assert!(complaint.contains("COUNT/PERIOD"), "{complaint}");
    let complaint = cli_fails(url, &["limit", "set", "x", "--rate", "0/1s"]);
    assert!(complaint.contains("must be positive"), "{complaint}");
    let complaint = cli_fails(
        url,
        &[
            "limit",
            "set",
            "x",
            "--concurrency",
            "1",
            "--key",
            "customer",
        ],
    );
    assert!(complaint.contains("payload.<field>"), "{complaint}");
    let complaint = cli_fails(url, &["limit", "set", "x", "--key", "tenant"]);
    assert!(complaint.contains("--concurrency"), "neither: {complaint}");
    let complaint = cli_fails(url, &["limit", "set", "a:b", "--concurrency", "1"]);
    assert!(
        complaint.contains("400") && complaint.contains("[field: name]"),
        "{complaint}"
    );
    let listed = cli(url, &["limit", "list", "--json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&listed).expect("JSON")["limits"]
            .as_array()
            .map(Vec::len),
        Some(2),
        "nothing more stored: {listed}"
    );

    // Queues and kinds name limits with --limits; a limit they name is not deleted.
    let said = cli(url, &["queue", "set", "calls", "--limits", "api,burst"]);
    assert!(said.contains("limits api, burst"), "{said}");
    let said = cli(url, &["kind", "set", "sync", "--limits", "api"]);
    assert!(said.contains("limits api"), "{said}");
    let complaint = cli_fails(url, &["queue", "set", "calls", "--limits", "nope"]);
    assert!(complaint.contains("[field: limits[0]]"), "{complaint}");
    let complaint = cli_fails(url, &["limit", "delete", "api"]);
    assert!(
        complaint.contains("409 (limit_in_use)")
            && complaint.contains("queue \"calls\"")
            && complaint.contains("kind \"sync\""),
        "{complaint}"
    );
    let said = cli(url, &["queue", "set", "calls", "--limits", "none"]);
    assert!(said.contains("limits none"), "{said}");
    cli(url, &["kind", "set", "sync", "--limits", "none"]);

    let said = cli(url, &["limit", "delete", "api"]);
    assert!(said.contains("limit api deleted"), "{said}");
    let complaint = cli_fails(url, &["limit", "show", "api"]);
    assert!(complaint.contains("404"), "{complaint}");
    let complaint = cli_fails(url, &["limit", "delete", "api"]);
    assert!(complaint.contains("404"), "{complaint}");
    cli(url, &["limit", "delete", "burst"]);
    let listed = cli(url, &["limit", "list"]);
    assert!(listed.contains("no limits"), "{listed}");
}

/// `conveyor token create --role ROLE` on the store; the secret it prints.
fn token(store: &str, role: &str) -> String {
    let output = conveyor(&[
        "token", "create", "--role", role, "--name", role, "--store", store,
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    stdout(&output).trim().to_string()
}

#[test]
fn only_admins_change_limits() {
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let store = format!("sqlite://{}", db.display());
    let admin = token(&store, "admin");
    let viewer = token(&store, "viewer");
    let producer = token(&store, "producer");
    let server = start_server(&db, &["--auth"]);
    let limit = format!("{}/v1/limits/vendor", server.url);
    let body = json!({"concurrency": 3});

    for who in [&viewer, &producer] {
        let (status, answer) = call(Method::PUT, &limit, Some(who), Some(body.clone()));
        assert_eq!(status, 403, "{answer}");
    }
    let (status, _) = call(Method::PUT, &limit, None, Some(body.clone()));
    assert_eq!(status, 401);
    let (status, answer) = call(Method::PUT, &limit, Some(&admin), Some(body));
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = call(Method::GET, &limit, Some(&viewer), None);
    assert_eq!(status, 200, "viewers read: {answer}");
    let (status, _) = call(Method::GET, &limit, Some(&producer), None);
    assert_eq!(status, 403);
    let (status, _) = call(Method::DELETE, &limit, Some(&viewer), None);
    assert_eq!(status, 403);
    let (status, _) = call(Method::DELETE, &limit, Some(&admin), None);
    assert_eq!(status, 204);
}
