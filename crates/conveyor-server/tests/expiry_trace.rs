//! Expiry (`expires_at`, `ttl_ms`, a queue's `default_ttl_ms`) and trace context
//! (`traceparent`/`tracestate` fields and headers) over HTTP, against a real store.

mod common;

use common::TestServer;
use reqwest::StatusCode;
use serde_json::{json, Value};

const PARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_takes_its_expiry_and_trace_context_and_the_worker_gets_them() {
    let server = TestServer::start().await;
    // The trace context from the headers, as a producer's HTTP instrumentation sends it.
    let response = server
        .http
        .post(server.url("/v1/jobs"))
        .header("traceparent", PARENT)
        .header("tracestate", "vendor=abc")
        .json(&json!({"kind": "mail", "ttl_ms": 60000}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.expect("json");
    let id = created["id"].as_str().expect("id").to_string();
    let job: Value = server
        .http
        .get(server.url(&format!("/v1/jobs/{id}")))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("json");
    assert!(job["expires_at"].is_string(), "{job}");
    assert_eq!(job["trace"]["traceparent"], PARENT);
    assert_eq!(job["trace"]["tracestate"], "vendor=abc");
    let (status, fetched) = server
        .post(
            "/v1/fetch",
            json!({"worker_id": "w", "queues": ["default"], "max": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{fetched}");
    let handed = &fetched["jobs"][0];
    assert_eq!(handed["traceparent"], PARENT);
    assert_eq!(handed["tracestate"], "vendor=abc");
    assert_eq!(handed["expires_at"], job["expires_at"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_traceparent_header_is_ignored_not_refused() {
    let server = TestServer::start().await;
    let response = server
        .http
        .post(server.url("/v1/jobs"))
        .header("traceparent", "01-something-a-newer-version-sends")
        .json(&json!({"kind": "mail"}))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::CREATED);
    let created: Value = response.json().await.expect("json");
    let job = server
        .store
        .job_get(created["id"].as_str().expect("id").parse().expect("uuid"))
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(job.trace, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_expiry_and_trace_input_is_refused_naming_the_field() {
    let server = TestServer::start().await;
    let cases = [
        (
            json!({"kind": "k", "ttl_ms": 1000, "expires_at": "2999-01-01T00:00:00Z"}),
            "ttl_ms",
        ),
        (json!({"kind": "k", "ttl_ms": 0}), "ttl_ms"),
        (
            json!({"kind": "k", "expires_at": "2001-01-01T00:00:00Z"}),
            "expires_at",
        ),
        (json!({"kind": "k", "expires_at": "tomorrow"}), "expires_at"),
        (
            json!({"kind": "k", "delay_ms": 60000, "ttl_ms": 1000}),
            "expires_at",
        ),
        (json!({"kind": "k", "traceparent": "00-abc"}), "traceparent"),
        (
            json!({"kind": "k", "traceparent": PARENT, "tracestate": "a=\u{7}"}),
            "tracestate",
        ),
        // Without a traceparent a tracestate is dropped, but bad input is still refused.
        (json!({"kind": "k", "tracestate": "a=\u{84}"}), "tracestate"),
    ];
    for (body, field) in cases {
        let (status, error) = server.post("/v1/jobs", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {error}");
        assert_eq!(error["error"]["field"], field, "{body} -> {error}");
    }
    let (status, error) = server
        .post(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "k"}, {"kind": "k", "traceparent": "nope"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["field"], "jobs[1].traceparent", "{error}");
    // Nothing of the refused requests was stored.
    let listed: Value = server
        .http
        .get(server.url("/v1/jobs?limit=10"))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("json");
    assert_eq!(listed["jobs"], json!([]), "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_default_ttl_is_set_over_http_and_applies_to_enqueues() {
    let server = TestServer::start().await;
    let put = |body: Value| {
        let server = &server;
        async move {
            let response = server
                .http
                .put(server.url("/v1/queues/mail"))
                .json(&body)
                .send()
                .await
                .expect("send");
            let status = response.status();
            (
                status,
                response.json::<Value>().await.unwrap_or(Value::Null),
            )
        }
    };
    let (status, error) = put(json!({"default_ttl_ms": 0})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert_eq!(error["error"]["field"], "default_ttl_ms");
    let (status, settings) = put(json!({"default_ttl_ms": 60000})).await;
    assert_eq!(status, StatusCode::OK, "{settings}");
    assert_eq!(settings["default_ttl_ms"], 60000);
    let (status, created) = server
        .post("/v1/jobs", json!({"kind": "k", "queue": "mail"}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let job = server
        .store
        .job_get(created["id"].as_str().expect("id").parse().expect("uuid"))
        .await
        .expect("get")
        .expect("stored");
    let ttl = job.expires_at.expect("an expiry") - job.created_at;
    assert_eq!(ttl.num_milliseconds(), 60000);
}
