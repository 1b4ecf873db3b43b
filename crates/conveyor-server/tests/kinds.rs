//! Payload schemas per kind over HTTP: set, read, enforced on every enqueue path (single,
//! batch, flows) with the failing pointer named, refused when queued jobs would not pass
//! unless forced, bad schemas refused, roles, audit.

mod common;

use common::{auth, TestServer};
use conveyor_core::Role;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn first_hundred() -> conveyor_core::JobListParams {
    let mut params = conveyor_core::JobListParams::default();
    params.limit = 100;
    params
}

async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("send");
    let status = response.status();
    (
        status,
        response.json::<Value>().await.unwrap_or(Value::Null),
    )
}

fn signup_schema() -> Value {
    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["user_id"],
        "properties": {
            "user_id": {"type": "integer", "minimum": 1},
            "plan": {"enum": ["free", "pro"]}
        }
    })
}

#[tokio::test]
async fn a_kind_schema_is_enforced_on_every_enqueue_path() {
    let server = TestServer::start().await;
    let http = &server.http;
    let put = |body: Value| http.put(server.url("/v1/kinds/signup")).json(&body);

    let (status, body) = send(put(json!({"schema": signup_schema(), "version": 3}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["kind"], "signup");
    assert_eq!(body["version"], 3);
    assert_eq!(body["schema"], signup_schema());

    let (status, body) = send(http.get(server.url("/v1/kinds"))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["kinds"][0]["kind"], "signup");
    let (status, body) = send(http.get(server.url("/v1/kinds/signup"))).await;
    assert_eq!(
        (status, body["version"].clone()),
        (StatusCode::OK, json!(3))
    );

    // Single enqueue: the failing pointer is the field.
    let enqueue = |payload: Value| {
        http.post(server.url("/v1/jobs"))
            .json(&json!({"kind": "signup", "payload": payload}))
    };
    let (status, body) = send(enqueue(json!({"user_id": "seven"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "payload/user_id");
    let (status, body) = send(enqueue(json!({"plan": "pro"}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        body["error"]["field"], "payload/user_id",
        "a missing property"
    );
    let (status, body) = send(enqueue(json!({"user_id": 1, "plan": "gold"}))).await;
    assert_eq!(body["error"]["field"], "payload/plan", "{status} {body}");
    let (status, _) = send(enqueue(json!({"user_id": 1, "plan": "pro"}))).await;
    assert_eq!(status, StatusCode::CREATED);

    // Batch: all or nothing, the job named by its index.
    let (status, body) = send(
        http.post(server.url("/v1/jobs/batch"))
            .json(&json!({"jobs": [
                {"kind": "signup", "payload": {"user_id": 2}},
                {"kind": "other", "payload": {"anything": true}},
                {"kind": "signup", "payload": {"user_id": 0}},
            ]})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "jobs[2].payload/user_id");

    // Flows: each step's job and compensation.
    let (status, body) = send(http.post(server.url("/v1/flows")).json(&json!({"steps": [
        {"name": "a", "job": {"kind": "other", "payload": {}}},
        {"name": "b", "after": ["a"], "job": {"kind": "signup", "payload": {"user_id": 5}},
         "compensate": {"kind": "signup", "payload": {"user_id": -1}}},
    ]})))
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(
        body["error"]["field"],
        "steps[1].compensate.payload/user_id"
    );

    // Only the one valid job was stored.
    let stored = server.store.jobs_list(first_hundred()).await.expect("list");
    assert_eq!(stored.len(), 1, "{stored:?}");

    // Removing the schema lets anything through again.
    let (status, _) = send(http.delete(server.url("/v1/kinds/signup"))).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = send(enqueue(json!({"user_id": "free-form"}))).await;
    assert_eq!(status, StatusCode::CREATED);
    let (status, body) = send(http.delete(server.url("/v1/kinds/signup"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, _) = send(http.get(server.url("/v1/kinds/signup"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_schema_rejecting_queued_jobs_is_refused_unless_forced() {
    let server = TestServer::start().await;
    let http = &server.http;
    for payload in [json!({"user_id": 1}), json!({"user_id": "x"}), json!({})] {
        let (status, _) = send(
            http.post(server.url("/v1/jobs"))
                .json(&json!({"kind": "signup", "payload": payload})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let put = |body: Value| http.put(server.url("/v1/kinds/signup")).json(&body);
    let (status, body) = send(put(json!({"schema": signup_schema()}))).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "schema_rejects_queued_jobs");
    assert_eq!(body["error"]["field"], "schema");
    assert_eq!(body["error"]["would_fail"], 2);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("2 of the 3"),
        "{body}"
    );
    let (status, _) = send(http.get(server.url("/v1/kinds/signup"))).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "nothing was set");

    let (status, body) = send(put(json!({"schema": signup_schema(), "force": true}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The queued jobs stay as they were.
    let queued = server.store.jobs_list(first_hundred()).await.expect("list");
    assert_eq!(queued.len(), 3);
}

#[tokio::test]
async fn bad_kind_requests_name_the_field() {
    let server = TestServer::start().await;
    let http = &server.http;
    for (body, field) in [
        (json!({"schema": {"type": 12}}), "schema"),
        (json!({"schema": "object"}), "schema"),
        (
            json!({"schema": {"$ref": "https://example.com/remote.json"}}),
            "schema",
        ),
        (json!({"schema": {}, "version": -1}), "version"),
        (json!({"schema": {}, "version": "one"}), "version"),
        (json!({"schema": {}, "force": null}), "force"),
        (json!({"schema": {}, "colour": "red"}), "colour"),
    ] {
        let (status, answer) = send(http.put(server.url("/v1/kinds/signup")).json(&body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        let named = answer["error"]["field"].as_str().unwrap_or("");
        assert!(
            named.starts_with(field),
            "{body}: expected {field}, got {answer}"
        );
    }
    let (status, answer) = send(
        http.put(server.url("/v1/kinds/%20bad%20"))
            .json(&json!({"schema": {}})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
    assert_eq!(answer["error"]["field"], "kind");
    let (_, listed) = send(http.get(server.url("/v1/kinds"))).await;
    assert_eq!(listed["kinds"], json!([]), "nothing stored by bad requests");
}

#[tokio::test]
async fn producers_read_schemas_and_only_admins_set_them() {
    let server = TestServer::start_with_options(Default::default(), auth(true)).await;
    let producer = server.token(Role::Producer, "shop").await;
    let admin = server.token(Role::Admin, "ops").await;
    let http = &server.http;
    let put = |token: &str| {
        http.put(server.url("/v1/kinds/signup"))
            .bearer_auth(token)
            .json(&json!({"schema": signup_schema()}))
    };
    let (status, _) = send(put(&producer)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = send(put(&admin)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = send(
        http.get(server.url("/v1/kinds/signup"))
            .bearer_auth(&producer),
    )
    .await;
    assert_eq!(
        (status, body["kind"].clone()),
        (StatusCode::OK, json!("signup"))
    );
    let (status, body) = send(
        http.post(server.url("/v1/jobs"))
            .bearer_auth(&producer)
            .json(&json!({"kind": "signup", "payload": {"user_id": "x"}})),
    )
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "payload/user_id");
    let (status, audit) = send(
        http.get(server.url("/v1/audit?action=kind.put"))
            .bearer_auth(&admin),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{audit}");
    assert_eq!(audit["entries"][0]["target"], "signup", "{audit}");
}

/// A PUT of the breaker alone keeps the kind's schema and version; a schema sent without a
/// version clears the version, as before.
#[tokio::test]
async fn a_breaker_alone_keeps_the_schema_and_its_version() {
    let server = TestServer::start().await;
    let http = &server.http;
    let put = |body: Value| http.put(server.url("/v1/kinds/signup")).json(&body);
    let (status, _) = send(put(json!({"schema": signup_schema(), "version": 3}))).await;
    assert_eq!(status, StatusCode::OK);
    let (status, body) = send(put(json!({"circuit_breaker": {"min_calls": 5}}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["version"], 3, "{body}");
    assert_eq!(body["schema"], signup_schema());
    assert_eq!(body["circuit_breaker"]["min_calls"], 5);
    let (_, body) = send(put(json!({"schema": signup_schema()}))).await;
    assert_eq!(
        body["version"],
        Value::Null,
        "a new schema without a version has none"
    );
    assert_eq!(
        body["circuit_breaker"]["min_calls"], 5,
        "the breaker is kept"
    );
    let (status, body) = send(put(json!({"circuit_breaker": {"failure_ratio": 0}}))).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["error"]["field"], "circuit_breaker.failure_ratio");
}

/// A kind's batch setting over HTTP: refused field by field, kept across a PUT of something
/// else, removed by null; a plain fetch never gets the kind's jobs, a batch fetch gets them
/// together once the batch is full, and each is acknowledged on its own.
#[tokio::test]
async fn a_batch_kind_goes_out_only_to_batch_fetches() {
    let server = TestServer::start().await;
    let http = &server.http;
    let put = |body: Value| http.put(server.url("/v1/kinds/rows.insert")).json(&body);
    for (body, field) in [
        (json!({"batch": {"max_size": 0}}), "batch.max_size"),
        (json!({"batch": {"max_size": 1001}}), "batch.max_size"),
        (json!({"batch": {"max_size": "ten"}}), "batch.max_size"),
        (
            json!({"batch": {"max_size": 5, "max_wait_ms": 3_600_001}}),
            "batch.max_wait_ms",
        ),
        (
            json!({"batch": {"max_size": 5, "key": "account"}}),
            "batch.key",
        ),
        (json!({"batch": {"max_size": 5, "size": 5}}), "batch.size"),
        (json!({"batch": {}}), "batch.max_size"),
        (json!({"batch": [5]}), "batch"),
    ] {
        let (status, answer) = send(put(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
    }
    let spec = json!({"max_size": 3, "max_wait_ms": 60_000});
    let (status, answer) = send(put(json!({"batch": spec}))).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["batch"], spec);
    let (_, answer) = send(put(json!({"limits": null}))).await;
    assert_eq!(answer["batch"], spec, "kept across a PUT of something else");

    let jobs: Vec<Value> = (1..=4)
        .map(|n| json!({"kind": "rows.insert", "payload": {"n": n}}))
        .collect();
    let (status, _) = send(
        http.post(server.url("/v1/jobs/batch"))
            .json(&json!({ "jobs": jobs })),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let fetch = |extra: Value| {
        let mut body = json!({"worker_id": "w1", "queues": ["default"], "max": 10});
        for (key, value) in extra.as_object().into_iter().flatten() {
            body[key] = value.clone();
        }
        http.post(server.url("/v1/fetch")).json(&body)
    };
    let (_, plain) = send(fetch(json!({}))).await;
    assert_eq!(plain["jobs"], json!([]), "a plain fetch skips batch kinds");
    let (_, named) = send(fetch(json!({"kinds": ["rows.insert"]}))).await;
    assert_eq!(named["jobs"], json!([]), "even when it names the kind");
    let (_, batch) = send(fetch(json!({"batch": true}))).await;
    let claimed = batch["jobs"].as_array().expect("jobs");
    let numbers: Vec<i64> = claimed
        .iter()
        .map(|job| job["payload"]["n"].as_i64().expect("n"))
        .collect();
    assert_eq!(
        numbers,
        vec![1, 2, 3],
        "a full batch of three, in enqueue order"
    );
    // One completes, one fails: each by its own acknowledgement.
    let ack = json!({
        "complete": [{"id": claimed[0]["id"], "lease_token": claimed[0]["lease_token"]}],
        "fail": [{"id": claimed[1]["id"], "lease_token": claimed[1]["lease_token"],
                  "error": {"message": "row 2 refused"}}],
    });
    let (status, answer) = send(http.post(server.url("/v1/ack")).json(&ack)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let state = |id: &Value| {
        let url = server.url(&format!("/v1/jobs/{}", id.as_str().expect("id")));
        async move { send(http.get(url)).await.1 }
    };
    assert_eq!(state(&claimed[0]["id"]).await["state"], "completed");
    let failed = state(&claimed[1]["id"]).await;
    assert_eq!(failed["state"], "retryable");
    assert_eq!(failed["attempt"], 1);
    assert_eq!(state(&claimed[2]["id"]).await["state"], "running");
    // One left, short of a batch: a batch fetch waits for it (here not long enough).
    let (_, rest) = send(fetch(json!({"batch": true, "wait_ms": 50}))).await;
    assert_eq!(rest["jobs"], json!([]));
    let (status, answer) = send(put(json!({"batch": null}))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(answer.get("batch").is_none(), "{answer}");
    let (_, plain) = send(fetch(json!({}))).await;
    assert_eq!(
        plain["jobs"].as_array().map(Vec::len),
        Some(1),
        "no longer a batch kind"
    );
}
