//! Each attempt's history entry over HTTP: the worker that ran it, when it started and the
//! traceback the worker reported (single fail and the batched ack), as stored.

mod common;

use common::TestServer;
use reqwest::StatusCode;
use serde_json::{json, Value};

async fn send(request: reqwest::RequestBuilder) -> (StatusCode, Value) {
    let response = request.send().await.expect("send");
    let status = response.status();
    (
        status,
        response.json::<Value>().await.unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn a_failed_attempt_keeps_its_worker_start_and_traceback() {
    let server = TestServer::start().await;
    let http = &server.http;
    for _ in 0..2 {
        let (status, _) = send(
            http.post(server.url("/v1/jobs"))
                .json(&json!({"kind": "k"})),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED);
    }
    let (_, fetched) = send(http.post(server.url("/v1/fetch")).json(&json!({
        "worker_id": "py-worker-7", "queues": ["default"], "max": 2
    })))
    .await;
    let jobs = fetched["jobs"].as_array().expect("jobs").clone();
    assert_eq!(jobs.len(), 2);
    let traceback =
        "Traceback (most recent call last):\n  File \"tasks.py\", line 3, in k\nKeyError: 'x'";
    let (status, _) = send(
        http.post(server.url(&format!(
            "/v1/jobs/{}/fail",
            jobs[0]["id"].as_str().unwrap()
        )))
        .json(&json!({"lease_token": jobs[0]["lease_token"],
                "error": {"message": "KeyError: 'x'", "backtrace": traceback}})),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = send(http.post(server.url("/v1/ack")).json(&json!({"fail": [{
        "id": jobs[1]["id"], "lease_token": jobs[1]["lease_token"],
        "error": {"message": "TypeError", "backtrace": "at handler (worker.js:10:5)"}
    }]})))
    .await;
    assert_eq!(status, StatusCode::OK);
    for (job, expected) in jobs.iter().zip([traceback, "at handler (worker.js:10:5)"]) {
        let (_, stored) =
            send(http.get(server.url(&format!("/v1/jobs/{}", job["id"].as_str().unwrap())))).await;
        let attempt = &stored["errors"][0];
        assert_eq!(attempt["backtrace"], expected, "{stored}");
        assert_eq!(attempt["worker_id"], "py-worker-7");
        assert!(attempt["started_at"].is_string(), "{attempt}");
    }
    let (status, body) = send(http.post(server.url("/v1/ack")).json(&json!({"fail": [{
        "id": jobs[1]["id"], "lease_token": jobs[1]["lease_token"],
        "error": {"message": "x", "backtrace": null}
    }]})))
    .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(
        body["error"]["field"]
            .as_str()
            .is_some_and(|f| f.ends_with("backtrace")),
        "{body}"
    );
}
