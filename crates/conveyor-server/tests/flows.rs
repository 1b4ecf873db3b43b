//! Workflows over HTTP: create, run through `/v1/fetch`, results handed on, progress, durable
//! waits and signals, cancellation, the long-poll, bad input and producers' isolation.

mod common;

use common::{auth, TestServer};
use conveyor_core::Role;
use reqwest::StatusCode;
use serde_json::{json, Value};
use std::sync::Arc;

struct Api {
    server: Arc<TestServer>,
    token: Option<String>,
}

impl Api {
    async fn start() -> Self {
        Self {
            server: Arc::new(TestServer::start().await),
            token: None,
        }
    }

    /// The same server, called with `token`.
    fn as_token(&self, token: &str) -> Self {
        Self {
            server: self.server.clone(),
            token: Some(token.to_string()),
        }
    }

    /// Sends `request` with this caller's token, if any.
    async fn send(&self, request: reqwest::RequestBuilder) -> (StatusCode, Value) {
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        self.server.call(request).await
    }

    async fn post(&self, path: &str, body: Value) -> (StatusCode, Value) {
        self.send(self.server.http.post(self.server.url(path)).json(&body))
            .await
    }

    async fn get(&self, path: &str) -> (StatusCode, Value) {
        self.send(self.server.http.get(self.server.url(path))).await
    }

    /// Fetches one job from `queue`: the fetched job as the worker sees it.
    async fn fetch_one(&self, queue: &str) -> Value {
        let (status, body) = self
            .post(
                "/v1/fetch",
                json!({"worker_id": "w1", "queues": [queue], "max": 1}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let jobs = body["jobs"].as_array().expect("jobs");
        assert_eq!(jobs.len(), 1, "one job from {queue}: {body}");
        jobs[0].clone()
    }

    async fn complete(&self, job: &Value, result: Value) {
        let id = job["id"].as_str().expect("id");
        let (status, body) = self
            .post(
                &format!("/v1/jobs/{id}/complete"),
                json!({"lease_token": job["lease_token"], "result": result}),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
}

fn step(name: &str, kind: &str, after: &[&str]) -> Value {
    json!({"name": name, "job": {"kind": kind, "queue": "flows", "payload": {"step": name}}, "after": after})
}

#[tokio::test]
async fn a_flow_runs_over_http_handing_on_results_with_progress_and_a_signal() {
    let api = Arc::new(Api::start().await);
    let (status, created) = api
        .post(
            "/v1/flows",
            json!({
                "name": "publish",
                "steps": [
                    step("draft", "write", &[]),
                    {"name": "approval", "wait": {"signal": "approved", "timeout_ms": 60000}, "after": ["draft"]},
                    step("post", "publish", &["draft", "approval"]),
                ]
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let flow_id = created["id"].as_str().expect("id").to_string();
    let draft_id = created["steps"]["draft"].as_str().expect("draft's job id");
    assert!(
        created["steps"].get("approval").is_none(),
        "a wait has no job: {created}"
    );

    // A producer waits for the whole flow while it runs.
    let waiter = {
        let api = api.clone();
        let flow_id = flow_id.clone();
        tokio::spawn(async move { api.get(&format!("/v1/flows/{flow_id}?wait_ms=20000")).await })
    };

    let draft = api.fetch_one("flows").await;
    assert_eq!(draft["id"], draft_id);
    assert_eq!(draft["flow_id"], flow_id.as_str());
    assert_eq!(draft["step"], "draft");
    assert_eq!(draft["parents"], json!({}));
    let (status, body) = api
        .post(
            &format!("/v1/jobs/{draft_id}/progress"),
            json!({"lease_token": draft["lease_token"], "progress": 50, "message": "half"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, flow) = api.get(&format!("/v1/flows/{flow_id}")).await;
    assert_eq!(flow["steps"][0]["progress"]["percent"], 50, "{flow}");
    assert_eq!(flow["steps"][0]["progress"]["message"], "half");
    api.complete(&draft, json!({"text": "hello"})).await;

    let (_, flow) = api.get(&format!("/v1/flows/{flow_id}")).await;
    assert_eq!(flow["state"], "running");
    assert_eq!(flow["steps"][1]["state"], "waiting", "{flow}");
    assert!(!waiter.is_finished(), "the flow is not finished yet");
    let (status, body) = api
        .post(
            &format!("/v1/flows/{flow_id}/signal"),
            json!({"signal": "approved", "payload": {"by": "ana"}}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "delivered");

    let post = api.fetch_one("flows").await;
    assert_eq!(post["step"], "post");
    assert_eq!(
        post["parents"],
        json!({"draft": {"text": "hello"}, "approval": {"by": "ana"}})
    );
    api.complete(&post, json!("posted")).await;

    let (status, flow) = waiter.await.expect("waiter");
    assert_eq!(status, StatusCode::OK, "{flow}");
    assert_eq!(flow["state"], "completed", "{flow}");
    assert_eq!(flow["steps"][2]["result"], "posted");
    assert_eq!(flow["step_counts"]["completed"], 3);

    let (status, page) = api.get("/v1/flows?state=completed&name=publish").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["flows"][0]["id"], flow_id.as_str());
}

#[tokio::test]
async fn bad_flows_are_refused_naming_the_field_and_nothing_is_stored() {
    let api = Api::start().await;
    let cases = [
        (json!({"steps": []}), "steps"),
        (
            json!({"steps": [step("a", "k", &[]), step("a", "k", &[])]}),
            "steps[1].name",
        ),
        (
            json!({"steps": [step("a", "k", &[]), step("b", "k", &["ghost"])]}),
            "steps[1].after[0]",
        ),
        (
            json!({"steps": [step("a", "k", &["c"]), step("b", "k", &["a"]), step("c", "k", &["b"])]}),
            "steps[0].after",
        ),
        (
            json!({"steps": [{"name": "a", "job": {"kind": "k"}, "wait": {"signal": "s"}}]}),
            "steps[0]",
        ),
        (
            json!({"steps": [{"name": "a", "job": {"kind": ""}}]}),
            "steps[0].job.kind",
        ),
        (
            json!({"steps": [{"name": "a", "job": {"kind": "k", "idempotency_key": "x"}}]}),
            "steps[0].job.idempotency_key",
        ),
        (
            json!({"steps": [{"name": "a", "job": {"kind": "k"}, "compensate": {"kind": "u", "delay_ms": -1}}]}),
            "steps[0].compensate.delay_ms",
        ),
        (
            json!({"steps": [{"name": "a", "wait": {"signal": "s", "timeout_ms": 0}}]}),
            "steps[0].wait.timeout_ms",
        ),
        (
            json!({"steps": [step("a", "k", &[])], "on_failure": "explode"}),
            "on_failure",
        ),
        (
            json!({"steps": [step("a", "k", &[])], "colour": 1}),
            "colour",
        ),
    ];
    for (body, field) in cases {
        let (status, answer) = api.post("/v1/flows", body.clone()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body} -> {answer}");
        assert_eq!(answer["error"]["field"], field, "{body} -> {answer}");
    }
    let (_, page) = api.get("/v1/flows").await;
    assert_eq!(page["flows"], json!([]), "nothing stored: {page}");
    let (_, jobs) = api.get("/v1/jobs").await;
    assert_eq!(jobs["jobs"], json!([]), "no job stored: {jobs}");

    let missing = uuid::Uuid::now_v7();
    let (status, body) = api.get(&format!("/v1/flows/{missing}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    let (status, body) = api.get("/v1/flows/not-a-uuid").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "id");
    let (status, body) = api.get("/v1/flows?state=sleeping").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "state");

    let (_, created) = api
        .post(
            "/v1/flows",
            json!({"steps": [{"name": "w", "wait": {"signal": "go"}}]}),
        )
        .await;
    let id = created["id"].as_str().expect("id");
    let (status, body) = api
        .post(&format!("/v1/flows/{id}/signal"), json!({"signal": "stop"}))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "signal");
    let (status, body) = api
        .post(
            &format!("/v1/jobs/{missing}/progress"),
            json!({"lease_token": missing, "progress": 101}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["field"], "progress");
}

#[tokio::test]
async fn cancelling_a_flow_over_http_cancels_its_steps_once() {
    let api = Api::start().await;
    let (_, created) = api
        .post(
            "/v1/flows",
            json!({"steps": [step("a", "k", &[]), step("b", "k", &["a"])]}),
        )
        .await;
    let id = created["id"].as_str().expect("id");
    let a = api.fetch_one("flows").await;
    let (status, flow) = api.post(&format!("/v1/flows/{id}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{flow}");
    assert_eq!(flow["state"], "cancelled");
    assert_eq!(flow["steps"][0]["state"], "cancelled");
    assert_eq!(flow["steps"][1]["state"], "cancelled");
    let (status, body) = api
        .post(
            &format!("/v1/jobs/{}/complete", a["id"].as_str().expect("id")),
            json!({"lease_token": a["lease_token"]}),
        )
        .await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "the running step lost its lease: {body}"
    );
    let (status, body) = api.post(&format!("/v1/flows/{id}/cancel"), json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
}

#[tokio::test]
async fn a_producer_sees_only_its_own_flows() {
    let server = TestServer::start_with_options(Default::default(), auth(true)).await;
    let alice = server.token(Role::Producer, "alice").await;
    let bob = server.token(Role::Producer, "bob").await;
    let admin = server.token(Role::Admin, "ops").await;
    let api = Api {
        server: Arc::new(server),
        token: None,
    };
    let (alice, bob, admin) = (
        api.as_token(&alice),
        api.as_token(&bob),
        api.as_token(&admin),
    );
    let (status, created) = alice
        .post(
            "/v1/flows",
            json!({"steps": [{"name": "w", "wait": {"signal": "go"}}, step("a", "k", &["w"])]}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    let id = created["id"].as_str().expect("id");
    let (status, _) = alice.get(&format!("/v1/flows/{id}")).await;
    assert_eq!(status, StatusCode::OK);
    for (status, body) in [
        bob.get(&format!("/v1/flows/{id}")).await,
        bob.post(&format!("/v1/flows/{id}/signal"), json!({"signal": "go"}))
            .await,
        bob.post(&format!("/v1/flows/{id}/cancel"), json!({})).await,
    ] {
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "another producer's flow: {body}"
        );
    }
    let (status, _) = bob.get("/v1/flows").await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "listing every flow is for operators"
    );
    let (status, page) = admin.get("/v1/flows").await;
    assert_eq!(status, StatusCode::OK, "{page}");
    assert_eq!(page["flows"].as_array().map(Vec::len), Some(1));
    let (status, body) = alice
        .post(
            &format!("/v1/flows/{id}/signal"),
            json!({"signal": "go", "payload": 1}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The step's job carries alice's owner tag, so she can read it and bob cannot.
    let job_id = created["steps"]["a"].as_str().expect("a's job");
    let (status, _) = alice.get(&format!("/v1/jobs/{job_id}")).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = bob.get(&format!("/v1/jobs/{job_id}")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}
