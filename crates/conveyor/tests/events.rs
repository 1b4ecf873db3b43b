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

fn flows(server: &str) -> Vec<Value> {
    let page: Value = http()
        .get(format!("{server}/v1/flows?limit=100"))
        .send()
        .expect("GET flows")
        .json()
        .expect("flows");
    page["flows"].as_array().cloned().unwrap_or_default()
}

fn event(server: &str, body: Value) -> (u16, Value) {
    send(
        reqwest::Method::POST,
        &format!("{server}/v1/events"),
        Some(body),
    )
}

fn subscribe(server: &str, name: &str, body: Value) -> (u16, Value) {
    send(
        reqwest::Method::PUT,
        &format!("{server}/v1/subscriptions/{name}"),
        Some(body),
    )
}

/// A subscription may make a flow: each step's job takes the event's payload unless it gives
/// its own, and the flow is keyed by the event's id, so the event sent again makes no second.
#[test]
fn a_subscription_with_a_flow_makes_one_flow_per_event() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let steps = json!([
        {"name": "welcome", "job": {"kind": "email.welcome", "queue": "onboard"}},
        {"name": "crm", "job": {"kind": "crm.add", "queue": "onboard", "payload": {"list": "new"}},
         "after": ["welcome"]}
    ]);
    let (status, answer) = subscribe(
        &server.url,
        "onboarding",
        json!({"event": "user.signed_up", "flow": {"name": "onboarding", "steps": steps}}),
    );
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["flow"]["steps"][0]["name"], "welcome", "{answer}");
    // Exactly one of job and flow, named.
    let (status, answer) = subscribe(
        &server.url,
        "both",
        json!({"event": "e", "job": {"kind": "k"}, "flow": {"steps": steps}}),
    );
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("flow")),
        "{answer}"
    );
    let (status, answer) = subscribe(&server.url, "neither", json!({"event": "e"}));
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("job")),
        "{answer}"
    );
    let (status, answer) = subscribe(
        &server.url,
        "cycle",
        json!({"event": "e", "flow": {"steps": [{"name": "a", "job": {"kind": "k"}, "after": ["b"]}]}}),
    );
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("flow.steps[0].after[0]")),
        "{answer}"
    );

    let body = json!({"name": "user.signed_up", "payload": {"user_id": 7}, "id": "signup-7"});
    let (status, first) = event(&server.url, body.clone());
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["jobs"], json!([]), "{first}");
    assert_eq!(first["flows"][0]["subscription"], "onboarding", "{first}");
    assert_eq!(first["flows"][0]["duplicate"], false, "{first}");
    let listed = flows(&server.url);
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["id"], first["flows"][0]["flow_id"]);
    assert_eq!(listed[0]["name"], "onboarding");
    // Its first step runs now, with the event's payload.
    let jobs: Value = http()
        .get(format!("{}/v1/jobs?queue=onboard", server.url))
        .send()
        .expect("GET jobs")
        .json()
        .expect("jobs");
    let jobs = jobs["jobs"].as_array().cloned().unwrap_or_default();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["kind"], "email.welcome");
    assert_eq!(jobs[0]["payload"], json!({"user_id": 7}));

    // The same event again: the same flow, nothing new.
    let (status, again) = event(&server.url, body);
    assert_eq!(status, 202, "{again}");
    assert_eq!(again["flows"][0]["flow_id"], first["flows"][0]["flow_id"]);
    assert_eq!(again["flows"][0]["duplicate"], true, "{again}");
    assert_eq!(flows(&server.url).len(), 1);
    assert_eq!(count(&server.url, "onboard"), 1);
}

/// An event matching a job subscription and a flow subscription stores both or neither: a
/// refusal of the flow's payload by its kind's schema, or a full queue refusing the job after
/// the flow was made in the same transaction, leaves nothing.
#[test]
fn an_event_stores_its_jobs_and_flows_all_or_none() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let (status, answer) = subscribe(
        &server.url,
        "welcome",
        json!({"event": "user.signed_up", "job": {"kind": "email.welcome", "queue": "mail"}}),
    );
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = subscribe(
        &server.url,
        "onboarding",
        json!({"event": "user.signed_up", "flow": {"steps": [
            {"name": "crm", "job": {"kind": "crm.sync", "queue": "crm"}}
        ]}}),
    );
    assert_eq!(status, 201, "{answer}");
    let (status, answer) = send(
        reqwest::Method::PUT,
        &format!("{}/v1/kinds/crm.sync", server.url),
        Some(json!({"schema": {"type": "object", "required": ["email"]}})),
    );
    assert_eq!(status, 200, "{answer}");

    // The flow's step refused by its kind's schema: neither the job nor the flow.
    let (status, answer) = event(
        &server.url,
        json!({"name": "user.signed_up", "payload": {"user_id": 7}, "id": "s-7"}),
    );
    assert_eq!(status, 400, "{answer}");
    assert!(
        answer["error"]["field"]
            .as_str()
            .is_some_and(|f| f.starts_with("subscriptions.onboarding.flow.steps[0].job")),
        "{answer}"
    );
    assert_eq!(
        (count(&server.url, "mail"), flows(&server.url).len()),
        (0, 0)
    );

    // A full queue refuses the job: the flow made before it in the transaction is undone.
    let (status, answer) = send(
        reqwest::Method::PUT,
        &format!("{}/v1/queues/mail", server.url),
        Some(json!({"max_depth": 1})),
    );
    assert_eq!(status, 200, "{answer}");
    enqueue(&server.url, json!({"kind": "filler", "queue": "mail"}));
    let (status, answer) = event(
        &server.url,
        json!({"name": "user.signed_up", "payload": {"email": "a@example.com"}, "id": "s-8"}),
    );
    assert_eq!(status, 429, "{answer}");
    assert_eq!(
        (count(&server.url, "mail"), flows(&server.url).len()),
        (1, 0)
    );
    assert_eq!(count(&server.url, "crm"), 0);

    // Room again: both, once.
    let (status, answer) = send(
        reqwest::Method::PUT,
        &format!("{}/v1/queues/mail", server.url),
        Some(json!({"max_depth": 10})),
    );
    assert_eq!(status, 200, "{answer}");
    let (status, answer) = event(
        &server.url,
        json!({"name": "user.signed_up", "payload": {"email": "a@example.com"}, "id": "s-8"}),
    );
    assert_eq!(status, 202, "{answer}");
    assert_eq!(
        (
            answer["jobs"].as_array().map(Vec::len),
            answer["flows"].as_array().map(Vec::len)
        ),
        (Some(1), Some(1)),
        "{answer}"
    );
    assert_eq!(
        (count(&server.url, "mail"), flows(&server.url).len()),
        (2, 1)
    );
    assert_eq!(count(&server.url, "crm"), 1);
}

fn hmac_hex(secret: &str, body: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).expect("key");
    mac.update(body);
    mac.finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A hook may emit an event instead of making a job: the provider's event id keys what its
/// subscriptions make, so a redelivery makes nothing new; an event no subscription takes is
/// accepted and counted.
#[test]
fn a_hook_that_emits_an_event_makes_the_subscribed_jobs_once() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let secret = "crm-secret-for-tests";
    let (status, answer) = send(
        reqwest::Method::PUT,
        &format!("{}/v1/hooks/crm", server.url),
        Some(
            json!({"scheme": "hmac-sha256", "secret": secret, "event_id": "header:x-delivery",
                     "event": {"name": {"from": "header:x-event"}}}),
        ),
    );
    assert_eq!(status, 201, "{answer}");
    assert_eq!(
        answer["event"]["name"]["from"], "header:x-event",
        "{answer}"
    );
    let (status, answer) = send(
        reqwest::Method::PUT,
        &format!("{}/v1/hooks/both", server.url),
        Some(json!({"scheme": "hmac-sha256", "secret": secret,
                     "job": {"kind": "k"}, "event": {"name": "e"}})),
    );
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("event")),
        "{answer}"
    );
    for (name, queue) in [("notify", "mail"), ("sync", "crm")] {
        let (status, answer) = subscribe(
            &server.url,
            name,
            json!({"event": "contact.created", "job": {"kind": format!("{name}.contact"), "queue": queue}}),
        );
        assert_eq!(status, 201, "{answer}");
    }
    let deliver = |event: &str, delivery: &str| {
        let body = json!({"contact": 42}).to_string();
        let response = http()
            .post(format!("{}/hooks/crm", server.url))
            .header("content-type", "application/json")
            .header(
                "x-signature-256",
                format!("sha256={}", hmac_hex(secret, body.as_bytes())),
            )
            .header("x-event", event)
            .header("x-delivery", delivery)
            .body(body)
            .send()
            .expect("POST hook");
        let status = response.status().as_u16();
        (status, response.json::<Value>().unwrap_or(Value::Null))
    };
    let (status, first) = deliver("contact.created", "d-1");
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["event"]["id"], "hook:crm:d-1", "{first}");
    assert_eq!(first["jobs"].as_array().map(Vec::len), Some(2), "{first}");
    assert_eq!(
        (count(&server.url, "mail"), count(&server.url, "crm")),
        (1, 1)
    );
    let job: Value = get_job(
        &server.url,
        first["jobs"][0]["job_id"].as_str().expect("a job id"),
    );
    assert_eq!(job["payload"], json!({"contact": 42}));
    assert_eq!(job["idempotency_key"], "event:hook:crm:d-1:notify");

    // The provider delivers again: nothing new.
    let (status, again) = deliver("contact.created", "d-1");
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["duplicate"], true, "{again}");
    assert_eq!(again["jobs"][0]["job_id"], first["jobs"][0]["job_id"]);
    assert_eq!(
        (count(&server.url, "mail"), count(&server.url, "crm")),
        (1, 1)
    );

    // An event no subscription takes: accepted, nothing made, counted.
    let (status, answer) = deliver("contact.deleted", "d-2");
    assert_eq!(status, 202, "{answer}");
    assert_eq!(answer["jobs"], json!([]), "{answer}");
    let hook: Value = http()
        .get(format!("{}/v1/hooks/crm", server.url))
        .send()
        .expect("GET hook")
        .json()
        .expect("hook");
    assert_eq!(
        (
            hook["enqueued"].as_u64(),
            hook["duplicate"].as_u64(),
            hook["unmatched"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{hook}"
    );
}

/// A Redis stream's entries as events: each entry's body is its event's payload, and every
/// subscription to its name makes one job of it, in the batch's one commit; an entry whose
/// event no subscription takes is acknowledged and counted.
#[test]
fn a_redis_source_that_emits_events_makes_the_subscribed_jobs_once_each() {
    use redis::Commands;
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    let stream = format!("conveyor-test-events-{}-{nanos}", std::process::id());
    let mut redis = redis::Client::open("redis://127.0.0.1:6379")
        .and_then(|client| client.get_connection())
        .expect("Redis on 127.0.0.1:6379");
    struct Delete<'a>(&'a str);
    impl Drop for Delete<'_> {
        fn drop(&mut self) {
            if let Ok(mut redis) =
                redis::Client::open("redis://127.0.0.1:6379").and_then(|c| c.get_connection())
            {
                let _: redis::RedisResult<i64> = redis.del(self.0);
            }
        }
    }
    let _delete = Delete(&stream);
    for (name, queue) in [("bill", "billing"), ("ship", "shipping")] {
        let (status, answer) = subscribe(
            &server.url,
            name,
            json!({"event": "order.placed", "job": {"kind": format!("{name}.order"), "queue": queue}}),
        );
        assert_eq!(status, 201, "{answer}");
    }
    let total = 200u64;
    let mut pipe = redis::pipe();
    for n in 0..total {
        let body = json!({"type": "order.placed", "n": n}).to_string();
        pipe.xadd(&stream, "*", &[("body", body)]).ignore();
    }
    let body = json!({"type": "order.cancelled", "n": total}).to_string();
    pipe.xadd(&stream, "*", &[("body", body)]).ignore();
    let () = pipe.query(&mut redis).expect("XADD");

    let (status, answer) = send(
        reqwest::Method::PUT,
        &format!("{}/v1/sources/orders", server.url),
        Some(
            json!({"type": "redis_stream", "url": "redis://127.0.0.1:6379", "stream": stream,
                     "group": "conveyor", "max_in_flight": 64,
                     "event": {"name": {"from": "body:/type"}}}),
        ),
    );
    assert_eq!(status, 201, "{answer}");
    let source = || -> Value {
        http()
            .get(format!("{}/v1/sources/orders", server.url))
            .send()
            .expect("GET source")
            .json()
            .expect("source")
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let view = source();
        if view["received"].as_u64() == Some(total + 1) && view["unmatched"].as_u64() == Some(1) {
            assert_eq!(view["enqueued"].as_u64(), Some(2 * total), "{view}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the source stalled: {view}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    for queue in ["billing", "shipping"] {
        let mut seen = std::collections::BTreeSet::new();
        let mut after: Option<String> = None;
        loop {
            let mut url = format!("{}/v1/jobs?queue={queue}&limit=500", server.url);
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
                let n = job["payload"]["n"].as_u64().expect("payload n");
                assert!(seen.insert(n), "entry {n} made two {queue} jobs");
                assert!(
                    job["idempotency_key"]
                        .as_str()
                        .is_some_and(|key| key.starts_with("event:source:orders:")),
                    "{job}"
                );
            }
            after = jobs
                .last()
                .and_then(|job| job["id"].as_str())
                .map(String::from);
        }
        assert_eq!(seen, (0..total).collect(), "{queue}: one job per entry");
    }
    // Every entry acknowledged (after its commit), the unmatched one too.
    loop {
        let pending: redis::Value = redis::cmd("XPENDING")
            .arg(&stream)
            .arg("conveyor")
            .query(&mut redis)
            .expect("XPENDING");
        let count = match pending {
            redis::Value::Array(items) => match items.first() {
                Some(redis::Value::Int(n)) => *n,
                other => panic!("XPENDING count: {other:?}"),
            },
            other => panic!("XPENDING: {other:?}"),
        };
        if count == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{count} entries left unacknowledged"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
