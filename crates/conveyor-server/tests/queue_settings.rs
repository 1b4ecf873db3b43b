//! `GET/PUT /v1/queues/{name}` over HTTP: pause and resume, back-pressure with 429 and
//! Retry-After, and bad input.

mod common;

use common::TestServer as Api;
use serde_json::{json, Value};

async fn start() -> Api {
    Api::start().await
}

impl Api {
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value, Option<String>) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string());
        (
            status,
            response.json().await.expect("JSON body"),
            retry_after,
        )
    }
    async fn put(&self, queue: &str, body: Value) -> (u16, Value) {
        let (status, body, _) = self
            .send(
                reqwest::Method::PUT,
                &format!("/v1/queues/{queue}"),
                Some(body),
            )
            .await;
        (status, body)
    }
    async fn enqueue(&self, body: Value) -> (u16, Value, Option<String>) {
        self.send(reqwest::Method::POST, "/v1/jobs", Some(body))
            .await
    }
    async fn queue(&self, name: &str) -> Value {
        let (_, all, _) = self.send(reqwest::Method::GET, "/v1/queues", None).await;
        all["queues"]
            .as_array()
            .unwrap()
            .iter()
            .find(|q| q["name"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    }
}

#[tokio::test]
async fn max_depth_answers_429_with_retry_after_and_stores_nothing_until_drained() {
    let api = start().await;
    let (status, mut settings) = api.put("mail", json!({"max_depth": 3})).await;
    assert_eq!(status, 200);
    // Beside the settings, the queue's scaling signal (tests/scaling.rs).
    let object = settings.as_object_mut().expect("an object");
    assert_eq!(object.remove("desired_workers"), Some(json!(0)));
    assert_eq!(
        object.remove("scale").map(|s| s["backlog"].clone()),
        Some(json!(0))
    );
    // And its circuit breaker's state (conveyor/tests/breakers_cli.rs).
    assert_eq!(
        object.remove("circuit").map(|c| c["state"].clone()),
        Some(json!("closed"))
    );
    assert_eq!(
        settings,
        json!({
            "name": "mail", "paused": false, "max_depth": 3, "max_depth_per_tenant": null,
            "concurrency_limit": null, "per_key_concurrency_limit": null, "rate_limit": null,
            "per_key_rate_limit": null, "weight": null, "completed_retention_secs": null,
            "dead_retention_secs": null, "default_ttl_ms": null, "circuit_breaker": null,
            "limits": [], "sequence": null
        })
    );
    for _ in 0..3 {
        assert_eq!(
            api.enqueue(json!({"kind": "k", "queue": "mail"})).await.0,
            201
        );
    }
    let (status, body, retry_after) = api.enqueue(json!({"kind": "k", "queue": "mail"})).await;
    assert_eq!(status, 429);
    assert_eq!(body["error"]["code"], "queue_full");
    assert_eq!(retry_after.as_deref(), Some("1"));
    let (status, _, _) = api
        .send(
            reqwest::Method::POST,
            "/v1/jobs/batch",
            Some(
                json!({"jobs": [{"kind": "k", "queue": "other"}, {"kind": "k", "queue": "mail"}]}),
            ),
        )
        .await;
    assert_eq!(
        status, 429,
        "a batch touching a full queue is refused whole"
    );
    assert_eq!(api.queue("mail").await["available"], 3);
    assert_eq!(
        api.queue("other").await,
        Value::Null,
        "nothing of the refused batch was stored"
    );

    let (_, fetched, _) = api
        .send(
            reqwest::Method::POST,
            "/v1/fetch",
            Some(json!({"worker_id": "w", "queues": ["mail"]})),
        )
        .await;
    let job = &fetched["jobs"][0];
    let (status, _, _) = api
        .send(
            reqwest::Method::POST,
            &format!("/v1/jobs/{}/complete", job["id"].as_str().unwrap()),
            Some(json!({"lease_token": job["lease_token"]})),
        )
        .await;
    assert_eq!(status, 200);
    assert_eq!(
        api.enqueue(json!({"kind": "k", "queue": "mail"})).await.0,
        201,
        "room again after draining"
    );

    let (status, cleared) = api.put("mail", json!({"max_depth": null})).await;
    assert_eq!(status, 200);
    assert_eq!(cleared["max_depth"], Value::Null);
    assert_eq!(
        api.enqueue(json!({"kind": "k", "queue": "mail"})).await.0,
        201,
        "null cleared the limit"
    );
}

#[tokio::test]
async fn paused_queue_keeps_accepting_jobs_but_fetch_hands_out_none_until_resumed() {
    let api = start().await;
    assert_eq!(api.put("reports", json!({"paused": true})).await.0, 200);
    let (status, job, _) = api.enqueue(json!({"kind": "k", "queue": "reports"})).await;
    assert_eq!(status, 201);
    let fetch = json!({"worker_id": "w", "queues": ["reports"]});
    let (_, fetched, _) = api
        .send(reqwest::Method::POST, "/v1/fetch", Some(fetch.clone()))
        .await;
    assert_eq!(fetched["jobs"], json!([]));
    assert_eq!(api.queue("reports").await["paused"], true);

    let (status, resumed) = api.put("reports", json!({"paused": false})).await;
    assert_eq!((status, resumed["paused"].clone()), (200, json!(false)));
    let (_, fetched, _) = api
        .send(reqwest::Method::POST, "/v1/fetch", Some(fetch))
        .await;
    assert_eq!(fetched["jobs"][0]["id"], job["id"]);
    let (status, got, _) = api
        .send(reqwest::Method::GET, "/v1/queues/reports", None)
        .await;
    assert_eq!((status, got["paused"].clone()), (200, json!(false)));
}

#[tokio::test]
async fn bad_settings_are_refused_naming_the_field_and_change_nothing() {
    let api = start().await;
    assert_eq!(api.put("q", json!({"max_depth": 10})).await.0, 200);
    for (body, field) in [
        (json!({"max_depth": -1}), "max_depth"),
        (json!({"max_depth": 0}), "max_depth"),
        (
            json!({"max_depth_per_tenant": "many"}),
            "max_depth_per_tenant",
        ),
        (json!({"paused": "yes"}), "paused"),
        (json!({"concurrency_limit": 0}), "concurrency_limit"),
        (json!({"concurrency_limit": -2}), "concurrency_limit"),
        (
            json!({"rate_limit": {"count": 20, "period_ms": 0}}),
            "rate_limit.period_ms",
        ),
        (
            json!({"rate_limit": {"count": -1, "period_ms": 1000}}),
            "rate_limit.count",
        ),
        (json!({"rate_limit": {"count": 5}}), "rate_limit.period_ms"),
        (json!({"rate_limit": 20}), "rate_limit"),
        (
            json!({"per_key_rate_limit": {"count": 1, "period_ms": 10, "burst": 3}}),
            "per_key_rate_limit.burst",
        ),
        (
            json!({"rate_limit": {"count": 1, "period_ms": 86_400_001u64}}),
            "rate_limit.period_ms",
        ),
        (
            json!({"per_key_concurrency_limit": -3}),
            "per_key_concurrency_limit",
        ),
        (json!({"weight": 0}), "weight"),
        (json!({"dead_retention_secs": 0}), "dead_retention_secs"),
        (
            json!({"completed_retention_secs": 4_000_000_000u64}),
            "completed_retention_secs",
        ),
        (json!({"weight": 1.5}), "weight"),
        (json!({"colour": "blue"}), "colour"),
    ] {
        let (status, error) = api.put("q", body.clone()).await;
        assert_eq!(status, 400, "{body}");
        assert_eq!(error["error"]["field"], field, "{body}: {error}");
    }
    let (status, error) = api.put("bad%20name", json!({"paused": true})).await;
    assert_eq!(
        (status, error["error"]["field"].clone()),
        (400, json!("name"))
    );
    let (_, unchanged, _) = api.send(reqwest::Method::GET, "/v1/queues/q", None).await;
    assert_eq!(unchanged["max_depth"], 10);
    assert_eq!(unchanged["paused"], false);
}

#[tokio::test]
async fn flow_settings_round_trip_and_null_clears_each() {
    let api = start().await;
    let (status, stored) = api
        .put(
            "mail",
            json!({
                "concurrency_limit": 10,
                "per_key_concurrency_limit": 2,
                "rate_limit": {"count": 20, "period_ms": 1000},
                "per_key_rate_limit": {"count": 5, "period_ms": 60000},
                "weight": 3,
                "completed_retention_secs": 3600
            }),
        )
        .await;
    assert_eq!(status, 200, "{stored}");
    assert_eq!(
        stored["rate_limit"],
        json!({"count": 20, "period_ms": 1000})
    );
    assert_eq!(stored["per_key_concurrency_limit"], 2);
    assert_eq!(stored["weight"], 3);
    assert_eq!(stored["completed_retention_secs"], 3600);
    // A partial update keeps the rest; null clears one.
    let (status, stored) = api
        .put("mail", json!({"rate_limit": null, "weight": 1}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(stored["rate_limit"], Value::Null);
    assert_eq!(stored["weight"], 1);
    assert_eq!(
        stored["per_key_rate_limit"],
        json!({"count": 5, "period_ms": 60000})
    );
    let (_, read, _) = api
        .send(reqwest::Method::GET, "/v1/queues/mail", None)
        .await;
    assert_eq!(read, stored);
}
