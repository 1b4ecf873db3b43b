//! Sensitive payload fields are redacted in every job view people read, never in what a
//! worker fetches.

use conveyor_server::{router, ServerConfig};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use serde_json::{json, Value};
use std::sync::Arc;

#[tokio::test]
async fn sensitive_fields_are_redacted_in_views_but_not_in_fetches() {
    let dir = tempfile::tempdir().expect("temp dir");
    let store = SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default())
        .expect("open store");
    let config = ServerConfig {
        sensitive_fields: vec!["password".to_string(), "number".to_string()],
        ..ServerConfig::default()
    };
    let app = router(Arc::new(store), config);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    let http = reqwest::Client::new();
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
