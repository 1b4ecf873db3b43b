//! Sensitive payload fields are redacted in every job view people read, never in what a
//! worker fetches.

mod common;

use common::TestServer;
use conveyor_server::ServerConfig;
use serde_json::{json, Value};

#[tokio::test]
async fn sensitive_fields_are_redacted_in_views_but_not_in_fetches() {
    let config = ServerConfig {
        sensitive_fields: vec!["password".to_string(), "number".to_string()],
        ..ServerConfig::default()
    };
    let server = TestServer::start_with(config).await;
    let (base, http) = (server.base.clone(), server.http.clone());
    let payload = json!({"user": "ada", "password": "hunter2", "card": {"number": "4111"}});
    let created: Value = http
        .post(format!("{base}/v1/jobs"))
        .json(&json!({"kind": "signup", "payload": payload, "max_attempts": 1}))
        .send()
        .await
        .expect("enqueue")
        .json()
        .await
        .expect("JSON");
    let id = created["id"].as_str().expect("id").to_string();
    let secret_free = |view: &Value| {
        let text = view.to_string();
        !text.contains("hunter2") && !text.contains("4111")
    };
    let one: Value = http
        .get(format!("{base}/v1/jobs/{id}"))
        .send()
        .await
        .expect("get")
        .json()
        .await
        .expect("JSON");
    assert_eq!(one["payload"]["password"], "[redacted]");
    assert_eq!(one["payload"]["card"]["number"], "[redacted]");
    assert_eq!(one["payload"]["user"], "ada", "other fields are shown");
    let listed: Value = http
        .get(format!("{base}/v1/jobs?kind=signup"))
        .send()
        .await
        .expect("list")
        .json()
        .await
        .expect("JSON");
    assert_eq!(listed["jobs"].as_array().map(Vec::len), Some(1), "{listed}");
    assert_eq!(listed["jobs"][0]["payload"]["password"], "[redacted]");
    assert!(secret_free(&listed), "{listed}");
    // The worker gets the real payload.
    let fetched: Value = http
        .post(format!("{base}/v1/fetch"))
        .json(&json!({"worker_id": "w1", "queues": ["default"], "max": 1}))
        .send()
        .await
        .expect("fetch")
        .json()
        .await
        .expect("JSON");
    let job = &fetched["jobs"][0];
    assert_eq!(job["payload"], payload);
    // Dead, it is still redacted in the dead-letter view.
    let token = job["lease_token"].as_str().expect("token");
    let failed = http
        .post(format!("{base}/v1/jobs/{id}/fail"))
        .json(&json!({"lease_token": token, "error": {"message": "no"}, "retry": "never"}))
        .send()
        .await
        .expect("fail");
    assert!(failed.status().is_success(), "{}", failed.status());
    let dead: Value = http
        .get(format!("{base}/v1/dead"))
        .send()
        .await
        .expect("dead")
        .json()
        .await
        .expect("JSON");
    assert_eq!(dead["jobs"].as_array().map(Vec::len), Some(1));
    assert!(secret_free(&dead), "{dead}");
}
