//! The HTTP API end to end: a real SQLite store in a temp dir, the router on a loopback port,
//! and reqwest as the client.

mod common;

use common::TestServer as Api;
use conveyor_server::ServerConfig;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

async fn start() -> Api {
    Api::start().await
}

async fn start_with(config: ServerConfig) -> Api {
    Api::start_with(config).await
}

impl Api {
    async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (StatusCode, Value) {
        self.call_json(
            self.http
                .post(self.url(path))
                .header("content-type", "application/json")
                .body(body),
        )
        .await
    }

    /// Enqueues and returns the new job's id.
    async fn enqueue(&self, body: Value) -> String {
        let (status, job) = self.post_json("/v1/jobs", body).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        id_of(&job)
    }

    async fn job(&self, id: &str) -> Value {
        let (status, job) = self.get_json(&format!("/v1/jobs/{id}")).await;
        assert_eq!(status, StatusCode::OK, "{job}");
        job
    }

    /// Fetches exactly one job from `queue` and returns (id, lease_token).
    async fn fetch_one(&self, queue: &str) -> (String, String) {
        let (status, body) = self
            .post_json(
                "/v1/fetch",
                json!({"worker_id": "w1", "queues": [queue], "max": 1}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let jobs = body["jobs"].as_array().expect("jobs array");
        assert_eq!(jobs.len(), 1, "{body}");
        (
            jobs[0]["id"].as_str().expect("id").to_string(),
            jobs[0]["lease_token"].as_str().expect("token").to_string(),
        )
    }

    /// Enqueues a job, fetches it and fails it permanently.
    async fn make_dead(&self, kind: &str, queue: &str) -> String {
        let id = self.enqueue(json!({"kind": kind, "queue": queue})).await;
        let (fetched, token) = self.fetch_one(queue).await;
        assert_eq!(fetched, id);
        let (status, job) = self
            .post_json(
                &format!("/v1/jobs/{id}/fail"),
                json!({"lease_token": token, "error": {"message": "boom"}, "retry": "never"}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{job}");
        assert_eq!(job["state"], "dead");
        id
    }

    async fn all_jobs(&self) -> Vec<Value> {
        let (status, page) = self.get_json("/v1/jobs?limit=500").await;
        assert_eq!(status, StatusCode::OK, "{page}");
        page["jobs"].as_array().expect("jobs").clone()
    }
}

fn id_of(job: &Value) -> String {
    job["id"].as_str().expect("job id").to_string()
}

/// Asserts a JSON error with this status, code and field.
#[track_caller]
fn assert_error(answer: &(StatusCode, Value), status: StatusCode, code: &str, field: Option<&str>) {
    let (got, body) = answer;
    assert_eq!(*got, status, "{body}");
    let error = &body["error"];
    assert_eq!(error["code"], code, "{body}");
    match field {
        Some(field) => assert_eq!(error["field"], field, "{body}"),
        None => assert!(error["field"].is_null(), "{body}"),
    }
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
}

#[tokio::test]
async fn enqueue_then_get() {
    let api = start().await;
    let (status, created) = api
        .post_json(
            "/v1/jobs",
            json!({
                "kind": "send_email",
                "payload": {"to": "a@example.com"},
                "queue": "mail",
                "priority": 5,
                "max_attempts": 3,
                "timeout_ms": 5000,
                "tags": ["welcome", "v2"],
                "tenant": "acme",
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["duplicate"], false);
    assert_eq!(created["state"], "available");
    let id = id_of(&created);

    let job = api.job(&id).await;
    assert_eq!(job["id"], id.as_str());
    assert_eq!(job["kind"], "send_email");
    assert_eq!(job["queue"], "mail");
    assert_eq!(job["payload"], json!({"to": "a@example.com"}));
    assert_eq!(job["priority"], 5);
    assert_eq!(job["max_attempts"], 3);
    assert_eq!(job["timeout_ms"], 5000);
    assert_eq!(job["tags"], json!(["welcome", "v2"]));
    assert_eq!(job["tenant"], "acme");
    assert_eq!(job["attempt"], 0);
    assert_eq!(job["state"], "available");
    assert!(job.get("duplicate").is_none(), "{job}");

    // Defaults, and the two ways of scheduling.
    let (_, minimal) = api.post_json("/v1/jobs", json!({"kind": "k"})).await;
    assert_eq!(minimal["queue"], "default");
    assert_eq!(minimal["payload"], Value::Null);
    assert_eq!(minimal["max_attempts"], 25);
    let (_, delayed) = api
        .post_json("/v1/jobs", json!({"kind": "k", "delay_ms": 3_600_000}))
        .await;
    assert_eq!(delayed["state"], "scheduled", "{delayed}");
    let (_, at) = api
        .post_json(
            "/v1/jobs",
            json!({"kind": "k", "run_at": "2999-01-01T00:00:00+02:00"}),
        )
        .await;
    assert_eq!(at["state"], "scheduled", "{at}");
    assert_eq!(at["run_at"], "2998-12-31T22:00:00Z");

    let missing = api
        .get_json("/v1/jobs/00000000-0000-0000-0000-000000000001")
        .await;
    assert_error(&missing, StatusCode::NOT_FOUND, "not_found", None);
    let bad_id = api.get_json("/v1/jobs/not-a-uuid").await;
    assert_error(
        &bad_id,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("id"),
    );
}

#[tokio::test]
async fn duplicate_idempotency_key_returns_the_existing_job() {
    let api = start().await;
    let body = json!({"kind": "charge", "payload": {"n": 1}, "idempotency_key": "order-42"});
    let (status, first) = api.post_json("/v1/jobs", body.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{first}");
    assert_eq!(first["duplicate"], false);

    let (status, second) = api.post_json("/v1/jobs", body).await;
    assert_eq!(status, StatusCode::OK, "{second}");
    assert_eq!(second["duplicate"], true);
    assert_eq!(second["id"], first["id"]);
    assert_eq!(api.all_jobs().await.len(), 1);

    // In a batch too.
    let (status, batch) = api
        .post_json(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "charge", "idempotency_key": "order-42"}, {"kind": "other"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{batch}");
    assert_eq!(batch["duplicates"], json!([true, false]));
    assert_eq!(batch["ids"][0], first["id"]);
    assert_eq!(api.all_jobs().await.len(), 2);
}

#[tokio::test]
async fn batch_is_all_or_nothing() {
    let api = start().await;
    let bad_kind = api
        .post_json(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "ok"}, {"kind": "not ok!"}, {"kind": "ok"}]}),
        )
        .await;
    assert_error(
        &bad_kind,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("jobs[1].kind"),
    );
    let missing_kind = api
        .post_json(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "ok"}, {"payload": 1}]}),
        )
        .await;
    assert_error(
        &missing_kind,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("jobs[1].kind"),
    );
    let wrong_type = api
        .post_json(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "ok"}, {"kind": "ok"}, {"kind": "ok", "priority": "high"}]}),
        )
        .await;
    assert_error(
        &wrong_type,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("jobs[2].priority"),
    );
    let bad_delay = api
        .post_json(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "ok", "delay_ms": -5}]}),
        )
        .await;
    assert_error(
        &bad_delay,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("jobs[0].delay_ms"),
    );
    let empty = api.post_json("/v1/jobs/batch", json!({"jobs": []})).await;
    assert_error(
        &empty,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("jobs"),
    );
    let no_jobs = api.post_json("/v1/jobs/batch", json!({})).await;
    assert_error(
        &no_jobs,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("jobs"),
    );
    assert!(
        api.all_jobs().await.is_empty(),
        "a rejected batch stored jobs"
    );

    let (status, ok) = api
        .post_json(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "a"}, {"kind": "b", "queue": "q2"}, {"kind": "c"}]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ok}");
    assert_eq!(ok["ids"].as_array().map(Vec::len), Some(3));
    assert_eq!(ok["duplicates"], json!([false, false, false]));
    let b = api.job(ok["ids"][1].as_str().expect("id")).await;
    assert_eq!(b["kind"], "b");
    assert_eq!(b["queue"], "q2");
}

#[tokio::test]
async fn batch_size_is_limited() {
    let api = start_with(ServerConfig {
        max_batch_jobs: 2,
        ..ServerConfig::default()
    })
    .await;
    let too_many = api
        .post_json(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "a"}, {"kind": "a"}, {"kind": "a"}]}),
        )
        .await;
    assert_error(
        &too_many,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("jobs"),
    );
    assert!(api.all_jobs().await.is_empty());
}

#[tokio::test]
async fn bad_enqueue_input_names_the_field_and_stores_nothing() {
    let api = start().await;
    let cases: Vec<(&str, &str)> = vec![
        (r#"{"payload": {"a": 1}}"#, "kind"),
        (r#"{"kind": "a", "priority": "high"}"#, "priority"),
        (r#"{"kind": "a", "priority": 1.5}"#, "priority"),
        (r#"{"kind": "a", "bogus": 1}"#, "bogus"),
        (r#"{"kind": "a", "#, "body"),
        (r#"{"kind": "a"} trailing"#, "body"),
        ("", "body"),
        ("[]", "body"),
        (r#""just a string""#, "body"),
        (r#"{"kind": ""}"#, "kind"),
        (r#"{"kind": "bad kind"}"#, "kind"),
        (r#"{"kind": 7}"#, "kind"),
        (r#"{"kind": "a", "queue": "no/slash"}"#, "queue"),
        (r#"{"kind": "a", "max_attempts": 0}"#, "max_attempts"),
        (r#"{"kind": "a", "max_attempts": -1}"#, "max_attempts"),
        (r#"{"kind": "a", "max_attempts": 100000}"#, "max_attempts"),
        (r#"{"kind": "a", "timeout_ms": 0}"#, "timeout_ms"),
        (r#"{"kind": "a", "delay_ms": -1}"#, "delay_ms"),
        (
            r#"{"kind": "a", "delay_ms": 9223372036854775807}"#,
            "delay_ms",
        ),
        (
            r#"{"kind": "a", "delay_ms": 10, "run_at": "2030-01-01T00:00:00Z"}"#,
            "delay_ms",
        ),
        (r#"{"kind": "a", "run_at": "tomorrow"}"#, "run_at"),
        (r#"{"kind": "a", "run_at": 12345}"#, "run_at"),
        (r#"{"kind": "a", "tags": ["ok", "bad tag"]}"#, "tags"),
        (r#"{"kind": "a", "tags": "ok"}"#, "tags"),
        (r#"{"kind": "a", "tenant": "x y"}"#, "tenant"),
        (r#"{"kind": "a", "idempotency_key": ""}"#, "idempotency_key"),
    ];
    for (body, field) in cases {
        let answer = api.post_raw("/v1/jobs", body).await;
        assert_eq!(
            answer.0,
            StatusCode::BAD_REQUEST,
            "body {body:?} answered {}",
            answer.1
        );
        assert_eq!(
            answer.1["error"]["field"], field,
            "body {body:?} answered {}",
            answer.1
        );
        assert_eq!(answer.1["error"]["code"], "invalid_request");
    }
    assert!(api.all_jobs().await.is_empty(), "a rejected job was stored");
    let (_, queues) = api.get_json("/v1/queues").await;
    assert_eq!(queues["queues"], json!([]));
}

#[tokio::test]
async fn bad_query_and_path_input() {
    let api = start().await;
    let id = api.enqueue(json!({"kind": "a"})).await;
    let cases = [
        ("/v1/jobs?state=bogus", "state"),
        ("/v1/jobs?limit=0", "limit"),
        ("/v1/jobs?limit=501", "limit"),
        ("/v1/jobs?limit=ten", "limit"),
        ("/v1/jobs?after=nope", "after"),
        ("/v1/jobs?queue=bad%20queue", "queue"),
        ("/v1/jobs?stat=dead", "stat"),
        ("/v1/dead?state=dead", "state"),
        ("/v1/dead?limit=0", "limit"),
        ("/v1/jobs/123", "id"),
    ];
    for (path, field) in cases {
        let answer = api.get_json(path).await;
        assert_error(
            &answer,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            Some(field),
        );
    }
    let cancel = api.post_json("/v1/jobs/xyz/cancel", json!({})).await;
    assert_error(
        &cancel,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("id"),
    );
    let discard = api.delete_json("/v1/dead/xyz").await;
    assert_error(
        &discard,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("id"),
    );
    assert_eq!(api.job(&id).await["state"], "available");
}

#[tokio::test]
async fn payload_over_the_limit_is_413() {
    let api = start_with(ServerConfig {
        max_payload_bytes: 1024,
        ..ServerConfig::default()
    })
    .await;
    let big = "x".repeat(2000);
    let single = api
        .post_json("/v1/jobs", json!({"kind": "a", "payload": {"blob": big}}))
        .await;
    assert_error(
        &single,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        Some("payload"),
    );
    let batch = api
        .post_json(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "a"}, {"kind": "a", "payload": big}]}),
        )
        .await;
    assert_error(
        &batch,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        Some("jobs[1].payload"),
    );
    // A payload just under the limit is fine.
    let fits = "y".repeat(1000);
    api.enqueue(json!({"kind": "a", "payload": fits})).await;
    assert_eq!(api.all_jobs().await.len(), 1);
}

#[tokio::test]
async fn body_over_the_overall_limit_is_413_json() {
    let api = start_with(ServerConfig {
        max_payload_bytes: 1024,
        ..ServerConfig::default()
    })
    .await;
    // The overall body limit is max(64 payloads, 1 MiB) = 1 MiB here.
    let body = format!(r#"{{"kind": "a", "payload": "{}"}}"#, "z".repeat(1_100_000));
    let answer = api.post_raw("/v1/jobs", body).await;
    assert_error(
        &answer,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
        Some("body"),
    );
    assert!(api.all_jobs().await.is_empty());
}

#[tokio::test]
async fn fetch_then_complete() {
    let api = start().await;
    let id = api
        .enqueue(json!({"kind": "resize", "payload": {"w": 10}, "tags": ["t"], "tenant": "acme", "timeout_ms": 9000}))
        .await;
    let (status, fetched) = api
        .post_json(
            "/v1/fetch",
            json!({"worker_id": "w1", "queues": ["default"], "max": 10, "lease_ms": 60000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{fetched}");
    let jobs = fetched["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1);
    let job = &jobs[0];
    assert_eq!(job["id"], id.as_str());
    assert_eq!(job["kind"], "resize");
    assert_eq!(job["queue"], "default");
    assert_eq!(job["payload"], json!({"w": 10}));
    assert_eq!(job["attempt"], 1);
    assert_eq!(job["max_attempts"], 25);
    assert_eq!(job["timeout_ms"], 9000);
    assert_eq!(job["tenant"], "acme");
    assert_eq!(job["tags"], json!(["t"]));
    assert!(job["lease_expires_at"].is_string());
    let token = job["lease_token"].as_str().expect("token").to_string();
    assert_eq!(api.job(&id).await["state"], "running");

    // Nothing else to fetch.
    let (_, empty) = api
        .post_json(
            "/v1/fetch",
            json!({"worker_id": "w1", "queues": ["default"]}),
        )
        .await;
    assert_eq!(empty["jobs"], json!([]));

    let (status, done) = api
        .post_json(
            &format!("/v1/jobs/{id}/complete"),
            json!({"lease_token": token, "result": {"ok": true}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{done}");
    assert_eq!(done, json!({"state": "completed"}));
    let job = api.job(&id).await;
    assert_eq!(job["state"], "completed");
    assert_eq!(job["result"], json!({"ok": true}));

    // A second completion finds the lease gone.
    let again = api
        .post_json(
            &format!("/v1/jobs/{id}/complete"),
            json!({"lease_token": token}),
        )
        .await;
    assert_error(&again, StatusCode::CONFLICT, "lease_lost", None);
}

#[tokio::test]
async fn complete_with_the_wrong_token_is_409_and_changes_nothing() {
    let api = start().await;
    let id = api.enqueue(json!({"kind": "a"})).await;
    let (_, token) = api.fetch_one("default").await;
    let wrong = "00000000-0000-0000-0000-000000000000";
    let answer = api
        .post_json(
            &format!("/v1/jobs/{id}/complete"),
            json!({"lease_token": wrong}),
        )
        .await;
    assert_error(&answer, StatusCode::CONFLICT, "lease_lost", None);
    let hb = api
        .post_json(
            &format!("/v1/jobs/{id}/heartbeat"),
            json!({"lease_token": wrong}),
        )
        .await;
    assert_error(&hb, StatusCode::CONFLICT, "lease_lost", None);
    let fail = api
        .post_json(
            &format!("/v1/jobs/{id}/fail"),
            json!({"lease_token": wrong, "error": {"message": "x"}}),
        )
        .await;
    assert_error(&fail, StatusCode::CONFLICT, "lease_lost", None);
    let snooze = api
        .post_json(
            &format!("/v1/jobs/{id}/snooze"),
            json!({"lease_token": wrong, "delay_ms": 1000}),
        )
        .await;
    assert_error(&snooze, StatusCode::CONFLICT, "lease_lost", None);
    let (status, release) = api
        .post_json(
            &format!("/v1/jobs/{id}/release"),
            json!({"lease_token": wrong}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{release}");
    assert_eq!(release, json!({"released": false}));
    let bad_token = api
        .post_json(
            &format!("/v1/jobs/{id}/complete"),
            json!({"lease_token": "nope"}),
        )
        .await;
    assert_error(
        &bad_token,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("lease_token"),
    );

    let job = api.job(&id).await;
    assert_eq!(job["state"], "running");
    assert!(job["lease"]["worker_id"].is_string());
    assert!(
        job["lease"].get("token").is_none(),
        "job views must not reveal the lease token ({token})"
    );
    assert_eq!(job["errors"], json!([]));
    // The right token still works.
    let (status, _) = api
        .post_json(
            &format!("/v1/jobs/{id}/complete"),
            json!({"lease_token": token}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn fail_auto_retries_and_fail_never_is_dead() {
    let api = start().await;
    let id = api.enqueue(json!({"kind": "a", "max_attempts": 5})).await;
    let (_, token) = api.fetch_one("default").await;
    let (status, job) = api
        .post_json(
            &format!("/v1/jobs/{id}/fail"),
            json!({"lease_token": token, "error": {"message": "upstream timed out"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["state"], "retryable");
    assert_eq!(job["errors"][0]["message"], "upstream timed out");
    assert_eq!(job["errors"][0]["class"], "error");
    assert_eq!(job["errors"][0]["attempt"], 1);
    assert_eq!(
        api.job(&id).await["errors"][0]["message"],
        "upstream timed out"
    );

    let dead_id = api.enqueue(json!({"kind": "b", "queue": "q2"})).await;
    let (_, token) = api.fetch_one("q2").await;
    let (status, job) = api
        .post_json(
            &format!("/v1/jobs/{dead_id}/fail"),
            json!({"lease_token": token, "error": {"message": "bad input"}, "retry": "never"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["state"], "dead");
    assert_eq!(job["errors"][0]["class"], "permanent");

    let after_id = api.enqueue(json!({"kind": "c", "queue": "q3"})).await;
    let (_, token) = api.fetch_one("q3").await;
    let (status, job) = api
        .post_json(
            &format!("/v1/jobs/{after_id}/fail"),
            json!({
                "lease_token": token,
                "error": {"message": "429", "class": "rate_limited"},
                "retry": "after",
                "retry_after_ms": 3_600_000,
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["state"], "retryable");
    assert_eq!(job["errors"][0]["class"], "rate_limited");
    let run_at: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(job["run_at"].clone()).expect("run_at");
    let ahead = run_at - chrono::Utc::now();
    assert!(
        ahead > chrono::Duration::minutes(55) && ahead <= chrono::Duration::minutes(61),
        "run_at {run_at}"
    );
}

#[tokio::test]
async fn bad_worker_input_names_the_field_and_changes_nothing() {
    let api = start().await;
    let id = api.enqueue(json!({"kind": "a"})).await;
    let fetch_cases = [
        (json!({"worker_id": "", "queues": ["default"]}), "worker_id"),
        (json!({"queues": ["default"]}), "worker_id"),
        (json!({"worker_id": "w", "queues": []}), "queues"),
        (json!({"worker_id": "w"}), "queues"),
        (
            json!({"worker_id": "w", "queues": ["default", "bad q"]}),
            "queues[1]",
        ),
        (
            json!({"worker_id": "w", "queues": ["default"], "max": 0}),
            "max",
        ),
        (
            json!({"worker_id": "w", "queues": ["default"], "max": 1001}),
            "max",
        ),
        (
            json!({"worker_id": "w", "queues": ["default"], "max": -1}),
            "max",
        ),
        (
            json!({"worker_id": "w", "queues": ["default"], "lease_ms": 10}),
            "lease_ms",
        ),
        (
            json!({"worker_id": "w", "queues": ["default"], "wait_ms": -1}),
            "wait_ms",
        ),
        (
            json!({"worker_id": "w", "queues": ["default"], "extra": 1}),
            "extra",
        ),
    ];
    for (body, field) in fetch_cases {
        let answer = api.post_json("/v1/fetch", body.clone()).await;
        assert_eq!(answer.0, StatusCode::BAD_REQUEST, "{body} → {}", answer.1);
        assert_eq!(answer.1["error"]["field"], field, "{body} → {}", answer.1);
    }
    assert_eq!(api.job(&id).await["state"], "available");

    let (_, token) = api.fetch_one("default").await;
    let fail_cases = [
        (json!({"lease_token": token, "error": {}}), "error.message"),
        (json!({"lease_token": token}), "error"),
        (json!({"error": {"message": "m"}}), "lease_token"),
        (
            json!({"lease_token": token, "error": {"message": "m"}, "retry": "sometimes"}),
            "retry",
        ),
        (
            json!({"lease_token": token, "error": {"message": "m"}, "retry": "after"}),
            "retry_after_ms",
        ),
        (
            json!({"lease_token": token, "error": {"message": "m"}, "retry": "after", "retry_after_ms": -1}),
            "retry_after_ms",
        ),
        (
            json!({"lease_token": token, "error": {"message": "m"}, "retry_after_ms": 10}),
            "retry_after_ms",
        ),
        (
            json!({"lease_token": token, "error": {"message": "m", "class": "bad class"}}),
            "error.class",
        ),
        (
            json!({"lease_token": token, "error": {"message": "m", "stack": "x"}}),
            "error.stack",
        ),
    ];
    for (body, field) in fail_cases {
        let answer = api
            .post_json(&format!("/v1/jobs/{id}/fail"), body.clone())
            .await;
        assert_eq!(answer.0, StatusCode::BAD_REQUEST, "{body} → {}", answer.1);
        assert_eq!(answer.1["error"]["field"], field, "{body} → {}", answer.1);
    }
    let other_cases = [
        (
            "heartbeat",
            json!({"lease_token": token, "lease_ms": 5}),
            "lease_ms",
        ),
        (
            "snooze",
            json!({"lease_token": token, "delay_ms": -1}),
            "delay_ms",
        ),
        ("snooze", json!({"lease_token": token}), "delay_ms"),
        (
            "complete",
            json!({"lease_token": token, "bogus": true}),
            "bogus",
        ),
        ("release", json!({}), "lease_token"),
    ];
    for (action, body, field) in other_cases {
        let answer = api
            .post_json(&format!("/v1/jobs/{id}/{action}"), body.clone())
            .await;
        assert_eq!(
            answer.0,
            StatusCode::BAD_REQUEST,
            "{action} {body} → {}",
            answer.1
        );
        assert_eq!(
            answer.1["error"]["field"], field,
            "{action} {body} → {}",
            answer.1
        );
    }
    let job = api.job(&id).await;
    assert_eq!(job["state"], "running");
    assert_eq!(job["attempt"], 1);
    assert_eq!(job["errors"], json!([]));
    assert!(job["lease"]["worker_id"].is_string());
    assert!(
        job["lease"].get("token").is_none(),
        "job views must not reveal the lease token ({token})"
    );
}

#[tokio::test]
async fn heartbeat_release_and_snooze() {
    let api = start().await;
    let id = api.enqueue(json!({"kind": "a"})).await;
    let (_, token) = api.fetch_one("default").await;
    let before = api.job(&id).await["lease"]["expires_at"].clone();
    let (status, hb) = api
        .post_json(
            &format!("/v1/jobs/{id}/heartbeat"),
            json!({"lease_token": token, "lease_ms": 600_000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{hb}");
    let before: chrono::DateTime<chrono::Utc> = serde_json::from_value(before).expect("expires");
    let after: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(hb["lease_expires_at"].clone()).expect("lease_expires_at");
    assert!(after > before, "{before} → {after}");

    let (status, released) = api
        .post_json(
            &format!("/v1/jobs/{id}/release"),
            json!({"lease_token": token}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(released, json!({"released": true}));
    let job = api.job(&id).await;
    assert_eq!(job["state"], "available");
    assert!(job["lease"].is_null());
    let (_, again) = api
        .post_json(
            &format!("/v1/jobs/{id}/release"),
            json!({"lease_token": token}),
        )
        .await;
    assert_eq!(again, json!({"released": false}));

    let (_, token) = api.fetch_one("default").await;
    let (status, snoozed) = api
        .post_json(
            &format!("/v1/jobs/{id}/snooze"),
            json!({"lease_token": token, "delay_ms": 3_600_000}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{snoozed}");
    assert_eq!(snoozed["state"], "scheduled");
    assert!(snoozed["lease"].is_null());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_fetch_returns_a_job_enqueued_while_it_waits() {
    let api = Arc::new(start().await);
    let started = Instant::now();
    let fetcher = {
        let api = api.clone();
        tokio::spawn(async move {
            api.post_json(
                "/v1/fetch",
                json!({"worker_id": "w1", "queues": ["lp"], "wait_ms": 20_000}),
            )
            .await
        })
    };
    let id = api.enqueue(json!({"kind": "a", "queue": "lp"})).await;
    let (status, fetched) = fetcher.await.expect("fetch task");
    assert_eq!(status, StatusCode::OK, "{fetched}");
    let ids: Vec<&str> = fetched["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["id"].as_str())
        .collect();
    assert_eq!(ids, vec![id.as_str()]);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the fetch waited out its wait_ms instead of returning with the job"
    );

    // With nothing to fetch, a short wait ends empty.
    let (status, empty) = api
        .post_json(
            "/v1/fetch",
            json!({"worker_id": "w1", "queues": ["lp"], "wait_ms": 50}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(empty["jobs"], json!([]));
}

#[tokio::test]
async fn dead_list_replay_and_discard() {
    let api = start().await;
    let a = api.make_dead("ka", "q1").await;
    let b = api.make_dead("kb", "q2").await;
    let c = api.make_dead("kc", "q1").await;
    let d = api.make_dead("kd", "q3").await;
    let alive = api.enqueue(json!({"kind": "ka", "queue": "q1"})).await;

    let (status, dead) = api.get_json("/v1/dead").await;
    assert_eq!(status, StatusCode::OK, "{dead}");
    let mut dead_ids: Vec<String> = dead["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .map(id_of)
        .collect();
    dead_ids.sort();
    let mut expected = vec![a.clone(), b.clone(), c.clone(), d.clone()];
    expected.sort();
    assert_eq!(dead_ids, expected);
    assert!(dead["next"].is_null());
    let (_, q1) = api.get_json("/v1/dead?queue=q1&kind=kc").await;
    assert_eq!(q1["jobs"].as_array().map(Vec::len), Some(1));
    assert_eq!(q1["jobs"][0]["id"], c.as_str());

    // Replay needs an explicit selection.
    let nothing = api.post_json("/v1/dead/replay", json!({})).await;
    assert_error(
        &nothing,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("ids"),
    );
    let not_all = api
        .post_json("/v1/dead/replay", json!({"all": false}))
        .await;
    assert_error(
        &not_all,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("ids"),
    );
    let mixed = api
        .post_json("/v1/dead/replay", json!({"ids": [a], "queue": "q1"}))
        .await;
    assert_error(
        &mixed,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("ids"),
    );
    let bad_id = api
        .post_json("/v1/dead/replay", json!({"ids": [a, "nope"]}))
        .await;
    assert_error(
        &bad_id,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("ids[1]"),
    );
    assert_eq!(
        api.get_json("/v1/dead").await.1["jobs"]
            .as_array()
            .map(Vec::len),
        Some(4)
    );

    let (status, replayed) = api.post_json("/v1/dead/replay", json!({"ids": [a]})).await;
    assert_eq!(status, StatusCode::OK, "{replayed}");
    assert_eq!(replayed, json!({"replayed": 1}));
    let job = api.job(&a).await;
    assert_eq!(job["state"], "available");
    assert_eq!(job["errors"][0]["message"], "boom", "history kept");

    let (_, replayed) = api
        .post_json("/v1/dead/replay", json!({"queue": "q2"}))
        .await;
    assert_eq!(replayed, json!({"replayed": 1}));
    assert_eq!(api.job(&b).await["state"], "available");

    let (status, discarded) = api.delete_json(&format!("/v1/dead/{c}")).await;
    assert_eq!(status, StatusCode::OK, "{discarded}");
    assert_eq!(discarded, json!({"discarded": true}));
    assert_error(
        &api.get_json(&format!("/v1/jobs/{c}")).await,
        StatusCode::NOT_FOUND,
        "not_found",
        None,
    );
    assert_error(
        &api.delete_json(&format!("/v1/dead/{c}")).await,
        StatusCode::NOT_FOUND,
        "not_found",
        None,
    );
    // Only dead jobs can be discarded.
    assert_error(
        &api.delete_json(&format!("/v1/dead/{alive}")).await,
        StatusCode::NOT_FOUND,
        "not_found",
        None,
    );
    assert_eq!(api.job(&alive).await["state"], "available");

    let (_, replayed) = api.post_json("/v1/dead/replay", json!({"all": true})).await;
    assert_eq!(replayed, json!({"replayed": 1}));
    assert_eq!(api.job(&d).await["state"], "available");
    let (_, dead) = api.get_json("/v1/dead").await;
    assert_eq!(dead["jobs"], json!([]));
}

#[tokio::test]
async fn queue_counts() {
    let api = start().await;
    api.enqueue(json!({"kind": "a", "queue": "q1"})).await;
    api.enqueue(json!({"kind": "a", "queue": "q1"})).await;
    api.enqueue(json!({"kind": "a", "queue": "q1", "delay_ms": 3_600_000}))
        .await;
    api.enqueue(json!({"kind": "a", "queue": "q2"})).await;
    let (_, token) = api.fetch_one("q2").await;
    let _ = token;
    api.make_dead("a", "q3").await;

    let (status, body) = api.get_json("/v1/queues").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let queues = body["queues"].as_array().expect("queues");
    let find = |name: &str| {
        queues
            .iter()
            .find(|q| q["name"] == name)
            .unwrap_or_else(|| panic!("queue {name} missing from {body}"))
            .clone()
    };
    let q1 = find("q1");
    assert_eq!(q1["available"], 2);
    assert_eq!(q1["scheduled"], 1);
    assert_eq!(q1["running"], 0);
    assert!(q1["oldest_available_age_ms"].is_u64());
    let q2 = find("q2");
    assert_eq!(q2["available"], 0);
    assert_eq!(q2["running"], 1);
    let q3 = find("q3");
    assert_eq!(q3["dead"], 1);
    for field in [
        "available",
        "scheduled",
        "running",
        "retryable",
        "dead",
        "completed",
        "cancelled",
        "oldest_available_age_ms",
    ] {
        assert!(q3[field].is_u64(), "{field} missing in {q3}");
    }
}

#[tokio::test]
async fn cancel_twice_is_a_conflict() {
    let api = start().await;
    let id = api.enqueue(json!({"kind": "a"})).await;
    let (status, job) = api
        .post_json(&format!("/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["state"], "cancelled");
    let again = api
        .post_json(&format!("/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert_error(&again, StatusCode::CONFLICT, "conflict", None);
    // Cancel needs no body at all.
    let response = api
        .http
        .post(api.url(&format!("/v1/jobs/{id}/cancel")))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), StatusCode::CONFLICT);
    let unknown = api
        .post_json(
            "/v1/jobs/00000000-0000-0000-0000-0000000000aa/cancel",
            json!({}),
        )
        .await;
    assert_error(&unknown, StatusCode::NOT_FOUND, "not_found", None);
    assert_eq!(api.job(&id).await["state"], "cancelled");
}

#[tokio::test]
async fn paging_follows_the_next_cursor() {
    let api = start().await;
    let mut created = Vec::new();
    for n in 0..5 {
        created.push(api.enqueue(json!({"kind": "page", "payload": n})).await);
    }
    api.enqueue(json!({"kind": "other"})).await;

    let mut seen = Vec::new();
    let mut path = "/v1/jobs?kind=page&limit=2".to_string();
    let mut pages = 0;
    loop {
        let (status, page) = api.get_json(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        pages += 1;
        let jobs = page["jobs"].as_array().expect("jobs");
        assert!(jobs.len() <= 2);
        seen.extend(jobs.iter().map(id_of));
        match page["next"].as_str() {
            Some(next) => {
                assert_eq!(next, jobs.last().map(id_of).expect("last").as_str());
                path = format!("/v1/jobs?kind=page&limit=2&after={next}");
            }
            None => break,
        }
        assert!(pages < 10, "paging does not end");
    }
    assert_eq!(pages, 3);
    let mut sorted = seen.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 5, "pages repeated or skipped jobs: {seen:?}");
    created.sort();
    assert_eq!(sorted, created);

    let (_, by_state) = api.get_json("/v1/jobs?state=available&queue=default").await;
    assert_eq!(by_state["jobs"].as_array().map(Vec::len), Some(6));
    assert!(by_state["next"].is_null());
}

#[tokio::test]
async fn health_and_fallbacks_answer_json() {
    let api = start().await;
    for path in ["/healthz", "/readyz", "/livez"] {
        let (status, health) = api.get_json(path).await;
        assert_eq!(status, StatusCode::OK, "{path}");
        assert_eq!(
            health,
            json!({"status": "ok", "live": true, "ready": true}),
            "{path}"
        );
    }

    let unknown = api.get_json("/v2/nothing").await;
    assert_error(&unknown, StatusCode::NOT_FOUND, "not_found", None);
    let response = api
        .http
        .put(api.url("/v1/jobs"))
        .send()
        .await
        .expect("send");
    let wrong_method = Api::read_json(response).await;
    assert_error(
        &wrong_method,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        None,
    );
}

/// Numbers above 2^63-1 were echoed back but silently clamped by SQLite; NUL characters were
/// stored by SQLite and a 503 on PostgreSQL. Both are now a 400 naming the field, and nothing
/// is stored.
#[tokio::test]
async fn out_of_range_numbers_and_nul_characters_are_refused_naming_the_field() {
    let api = start().await;
    let raw = r#"{"kind": "big", "timeout_ms": 18446744073709551615}"#;
    let answer = api.post_raw("/v1/jobs", raw).await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("timeout_ms"),
    );
    let response = api
        .http
        .put(api.url("/v1/queues/big"))
        .header("content-type", "application/json")
        .body(r#"{"max_depth": 18446744073709551615}"#)
        .send()
        .await
        .expect("send");
    let answer = Api::read_json(response).await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("max_depth"),
    );
    let answer = api
        .post_json(
            "/v1/jobs",
            json!({"kind": "nul", "payload": {"name": "a\u{0}b"}}),
        )
        .await;
    assert_error(
        &answer,
        StatusCode::BAD_REQUEST,
        "invalid_request",
        Some("payload/name"),
    );
    let (_, listed) = api.get_json("/v1/jobs").await;
    assert_eq!(listed["jobs"], json!([]), "nothing stored");
}

/// `GET /v1/jobs/{id}?wait_ms=30000` in the background.
fn read_when_finished(api: &Arc<Api>, id: &str) -> tokio::task::JoinHandle<(StatusCode, Value)> {
    let api = api.clone();
    let path = format!("/v1/jobs/{id}?wait_ms=30000");
    tokio::spawn(async move { api.get_json(&path).await })
}

/// `GET /v1/jobs/{id}?wait_ms=`: answers as soon as the job finishes through this server (a
/// completion, a failure to dead, a cancellation), not at the end of the wait.
#[tokio::test]
async fn a_job_read_with_wait_ms_answers_when_the_job_finishes() {
    let api = Arc::new(start().await);
    let id = api
        .enqueue(json!({"kind": "report", "queue": "results"}))
        .await;
    let waiter = read_when_finished(&api, &id);
    let (fetched, token) = api.fetch_one("results").await;
    assert_eq!(fetched, id);
    assert!(!waiter.is_finished(), "answered before the job finished");
    let (status, _) = api
        .post_json(
            &format!("/v1/jobs/{id}/complete"),
            json!({"lease_token": token, "result": {"rows": 3}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, job) = waiter.await.unwrap();
    assert_eq!(status, StatusCode::OK, "{job}");
    assert_eq!(job["state"], "completed", "{job}");
    assert_eq!(job["result"], json!({"rows": 3}));

    // A cancellation finishes a job too.
    let id = api
        .enqueue(json!({"kind": "report", "queue": "results"}))
        .await;
    let waiter = read_when_finished(&api, &id);
    api.post_json(&format!("/v1/jobs/{id}/cancel"), json!({}))
        .await;
    let (_, job) = waiter.await.unwrap();
    assert_eq!(job["state"], "cancelled", "{job}");
}

/// A job finished by another process (here: straight through the store, as an embedded worker
/// or another node would) is seen by the wait's polling; an unfinished one is answered as it is
/// once the wait has passed; a finished one at once.
#[tokio::test]
async fn a_job_read_with_wait_ms_sees_other_processes_and_gives_up_at_the_deadline() {
    let api = Arc::new(start().await);
    let id = api
        .enqueue(json!({"kind": "report", "queue": "elsewhere"}))
        .await;
    let waiter = read_when_finished(&api, &id);
    let mut params = conveyor_core::FetchParams {
        worker_id: "embedded".into(),
        queues: vec!["elsewhere".into()],
        max: 1,
        lease: Duration::from_secs(30),
        kinds: None,
        excluded_kinds: Vec::new(),
    };
    conveyor_core::validate::fetch(&mut params).unwrap();
    let claimed = api.store.jobs_fetch(params).await.unwrap();
    let lease = claimed[0].lease_ref().unwrap();
    api.store
        .jobs_complete_many(vec![conveyor_core::CompleteParams {
            lease,
            result: None,
        }])
        .await
        .unwrap();
    let (_, job) = waiter.await.unwrap();
    assert_eq!(job["state"], "completed", "{job}");
    let started = Instant::now();
    let (status, job) = api.get_json(&format!("/v1/jobs/{id}?wait_ms=30000")).await;
    assert_eq!(
        (status, &job["state"]),
        (StatusCode::OK, &json!("completed"))
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a finished job waited"
    );

    let id = api
        .enqueue(json!({"kind": "report", "queue": "idle"}))
        .await;
    let started = Instant::now();
    let (status, job) = api.get_json(&format!("/v1/jobs/{id}?wait_ms=300")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(job["state"], "available", "{job}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "gave up after {:?}, before the 300 ms asked",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_job_read_refuses_a_bad_wait_naming_the_parameter() {
    let api = start().await;
    let id = api.enqueue(json!({"kind": "report"})).await;
    for (query, field) in [
        ("wait_ms=soon", "wait_ms"),
        ("wait_ms=-5", "wait_ms"),
        ("wait_ms=1.5", "wait_ms"),
        ("wait_ms=99999999999999999999999", "wait_ms"),
        ("timeout=5", "timeout"),
    ] {
        let (status, body) = api.get_json(&format!("/v1/jobs/{id}?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }
    // Nothing changed: the job is still there, unfinished.
    assert_eq!(api.job(&id).await["state"], "available");
}
