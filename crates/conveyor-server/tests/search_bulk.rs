//! Searching jobs over HTTP (`GET /v1/jobs` with id prefix, tag, tenant, time range, payload,
//! cursor) and bulk actions (`POST /v1/jobs/bulk`: dry run, cancel, retry, discard), with bad
//! input answered 400 naming the field and nothing changed.

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

async fn enqueue(server: &TestServer, body: Value) -> String {
    let (status, job) = send(server.http.post(server.url("/v1/jobs")).json(&body)).await;
    assert_eq!(status, StatusCode::CREATED, "{job}");
    job["id"].as_str().expect("id").to_string()
}

fn ids(page: &Value) -> Vec<String> {
    page["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(|j| j["id"].as_str().expect("id").to_string())
        .collect()
}

#[tokio::test]
async fn jobs_are_searched_and_acted_on_in_bulk() {
    let server = TestServer::start().await;
    let http = &server.http;
    let a = enqueue(
        &server,
        json!({"kind": "signup", "payload": {"user": {"id": 7}}, "tags": ["vip"], "tenant": "acme"}),
    )
    .await;
    let b = enqueue(
        &server,
        json!({"kind": "signup", "payload": {"user": {"id": 8}}, "tenant": "acme"}),
    )
    .await;
    let c = enqueue(
        &server,
        json!({"kind": "invoice", "payload": {"user": {"id": 7}}}),
    )
    .await;
    let search = |query: &str| http.get(server.url(&format!("/v1/jobs?{query}")));

    let (status, page) = send(search("tag=vip")).await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(ids(&page), vec![a.clone()]);
    let (_, page) = send(search("tenant=acme")).await;
    assert_eq!(ids(&page), vec![b.clone(), a.clone()]);
    let filter = urlencoding(r#"{"user":{"id":7}}"#);
    let (_, page) = send(search(&format!("payload={filter}"))).await;
    assert_eq!(ids(&page), vec![c.clone(), a.clone()]);
    let (_, page) = send(search(&format!("id_prefix={}", &a[..13].to_uppercase()))).await;
    assert!(ids(&page).contains(&a), "{page}");
    let (_, page) = send(search("created_after=2000-01-01T00:00:00Z&kind=invoice")).await;
    assert_eq!(ids(&page), vec![c.clone()]);
    let (_, page) = send(search("created_before=2000-01-01T00:00:00Z")).await;
    assert!(ids(&page).is_empty());
    let (_, first) = send(search("limit=2")).await;
    assert_eq!(first["next"], json!(b), "{first}");
    let (_, rest) = send(search(&format!("limit=2&cursor={b}"))).await;
    assert_eq!(ids(&rest), vec![a.clone()]);

    for (query, field) in [
        ("id_prefix=xyz", "id_prefix"),
        ("id_prefix=0123456789", "id_prefix"),
        ("payload=%5B1%5D", "payload"),
        ("payload=nope", "payload"),
        ("created_after=yesterday", "created_after"),
        ("tag=", "tag"),
    ] {
        let (status, body) = send(search(query)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }

    // Bulk: a dry run counts and changes nothing.
    let bulk = |body: Value| http.post(server.url("/v1/jobs/bulk")).json(&body);
    let (status, dry) = send(bulk(
        json!({"filter": {"tenant": "acme"}, "action": "cancel",
        "dry_run": true}),
    ))
    .await;
    assert_eq!(status, StatusCode::OK, "{dry}");
    assert_eq!(
        (
            dry["matched"].clone(),
            dry["eligible"].clone(),
            dry["applied"].clone()
        ),
        (json!(2), json!(2), json!(0))
    );
    let (_, page) = send(search("state=available")).await;
    assert_eq!(ids(&page).len(), 3, "the dry run changed nothing");
    let (_, done) = send(bulk(
        json!({"filter": {"tenant": "acme"}, "action": "cancel"}),
    ))
    .await;
    assert_eq!(done["applied"], 2, "{done}");
    let (_, page) = send(search("state=cancelled")).await;
    assert_eq!(ids(&page), vec![b.clone(), a.clone()]);
    // Retry and discard apply to dead or expired jobs only: cancelled ones are not eligible.
    let (_, none) = send(bulk(json!({"ids": [a, c], "action": "retry"}))).await;
    assert_eq!(
        (none["matched"].clone(), none["eligible"].clone()),
        (json!(2), json!(0))
    );
    let (_, audit) = send(http.get(server.url("/v1/audit?action=job.cancel"))).await;
    let entry = &audit["entries"][0];
    assert_eq!(entry["job_count"], 2, "{audit}");

    for (body, field) in [
        (json!({"action": "cancel"}), "filter"),
        (json!({"filter": {}, "action": "cancel"}), "filter"),
        (
            json!({"filter": {"tenant": "acme"}, "ids": [c], "action": "cancel"}),
            "ids",
        ),
        (json!({"ids": [], "action": "cancel"}), "ids"),
        (
            json!({"filter": {"state": "sleeping"}, "action": "cancel"}),
            "filter.state",
        ),
        (
            json!({"filter": {"queue": "q"}, "action": "explode"}),
            "action",
        ),
    ] {
        let (status, answer) = send(bulk(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}: {answer}");
        assert_eq!(answer["error"]["field"], field, "{body}: {answer}");
    }
    let (_, page) = send(search("state=available")).await;
    assert_eq!(ids(&page), vec![c], "bad requests changed nothing");
}

fn urlencoding(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}
