//! The batched worker protocol over HTTP: `/v1/ack`, acknowledgements carried by `/v1/fetch`,
//! `/v1/heartbeat` for many leases, `kinds` on fetch, and HTTP workers registered from their
//! fetches. A real SQLite store, the router on a loopback port, reqwest as the client.

mod common;

use common::TestServer as Api;
use conveyor_storetest::eventually::eventually;
use reqwest::StatusCode;
use serde_json::{json, Value};

async fn start() -> Api {
    Api::start().await
}

impl Api {
    async fn enqueue(&self, kind: &str) -> String {
        let (status, job) = self.post_json("/v1/jobs", json!({"kind": kind})).await;
        assert_eq!(status, StatusCode::CREATED, "{job}");
        job["id"].as_str().expect("id").to_string()
    }

    async fn fetch(&self, body: Value) -> Value {
        let (status, answer) = self.post_json("/v1/fetch", body).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        answer
    }

    async fn state_of(&self, id: &str) -> String {
        self.get_json(&format!("/v1/jobs/{id}")).await.1["state"]
            .as_str()
            .expect("state")
            .to_string()
    }
}

fn lease(job: &Value) -> Value {
    json!({"id": job["id"], "lease_token": job["lease_token"]})
}

/// One result per item, in order; a lost lease or an unknown id never fails the others.
#[tokio::test]
async fn ack_answers_each_item_and_one_lost_lease_fails_none_of_the_others() {
    let api = start().await;
    for _ in 0..3 {
        api.enqueue("work").await;
    }
    let fetched = api
        .fetch(json!({"worker_id": "w1", "queues": ["default"], "max": 3}))
        .await;
    let jobs = fetched["jobs"].as_array().expect("jobs").clone();
    assert_eq!(jobs.len(), 3);
    assert_eq!(fetched["acks"], json!([]));
    let unknown = "01a22c7f-266e-7712-9f18-cae1a4103178";
    let (status, answer) = api
        .post_json(
            "/v1/ack",
            json!({
                "complete": [
                    {"id": jobs[0]["id"], "lease_token": jobs[0]["lease_token"], "result": {"n": 1}},
                    {"id": jobs[1]["id"], "lease_token": "2b0f6c4e-0000-4000-8000-000000000000"},
                    {"id": unknown, "lease_token": jobs[1]["lease_token"]},
                ],
                "fail": [
                    {"id": jobs[2]["id"], "lease_token": jobs[2]["lease_token"],
                     "error": {"class": "ValueError", "message": "Traceback: boom"}, "retry": "never"},
                ],
            }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let statuses: Vec<(&str, &str)> = answer["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|r| {
            (
                r["id"].as_str().unwrap_or(""),
                r["status"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let id = |i: usize| jobs[i]["id"].as_str().expect("id");
    assert_eq!(
        statuses,
        vec![
            (id(0), "ok"),
            (id(1), "lease_lost"),
            (unknown, "not_found"),
            (id(2), "ok")
        ]
    );
    assert_eq!(api.state_of(id(0)).await, "completed");
    assert_eq!(api.state_of(id(1)).await, "running");
    let dead = api.get_json(&format!("/v1/jobs/{}", id(2))).await.1;
    assert_eq!(dead["state"], "dead");
    assert_eq!(dead["errors"][0]["class"], "ValueError");
}

/// A malformed item fails the whole request, naming it, and nothing is applied.
#[tokio::test]
async fn a_malformed_item_is_a_400_naming_it_and_nothing_is_applied() {
    let api = start().await;
    api.enqueue("work").await;
    let job = api
        .fetch(json!({"worker_id": "w1", "queues": ["default"]}))
        .await["jobs"][0]
        .clone();
    for (body, field) in [
        (
            json!({"complete": [lease(&job), {"id": job["id"], "lease_token": "nope"}]}),
            "complete[1].lease_token",
        ),
        (
            json!({"complete": [lease(&job)],
                   "fail": [{"id": job["id"], "lease_token": job["lease_token"],
                             "error": {"message": "x"}, "retry": "after"}]}),
            "fail[0].retry_after_ms",
        ),
        (
            json!({"complete": [{"id": job["id"], "lease_token": job["lease_token"],
                                 "result": {"s": "a\u{0}b"}}]}),
            "complete[0].result/s",
        ),
    ] {
        let (status, answer) = api.post_json("/v1/ack", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert_eq!(answer["error"]["field"], field, "{answer}");
        assert_eq!(
            api.state_of(job["id"].as_str().expect("id")).await,
            "running"
        );
    }
}

/// A fetch hands back finished work and takes new work in one round trip.
#[tokio::test]
async fn fetch_applies_the_acknowledgements_it_carries_before_claiming() {
    let api = start().await;
    let first = api.enqueue("work").await;
    let job = api
        .fetch(json!({"worker_id": "w1", "queues": ["default"]}))
        .await["jobs"][0]
        .clone();
    let second = api.enqueue("work").await;
    let answer = api
        .fetch(json!({"worker_id": "w1", "queues": ["default"],
                      "complete": [{"id": job["id"], "lease_token": job["lease_token"], "result": 7}]}))
        .await;
    assert_eq!(answer["acks"], json!([{"id": first, "status": "ok"}]));
    assert_eq!(answer["jobs"][0]["id"], json!(second));
    assert_eq!(
        api.get_json(&format!("/v1/jobs/{first}")).await.1["result"],
        7
    );
}

/// Many leases renewed at once, each answered; a lost one says so.
#[tokio::test]
async fn heartbeat_renews_many_leases_and_names_the_lost_ones() {
    let api = start().await;
    api.enqueue("work").await;
    api.enqueue("work").await;
    let jobs = api
        .fetch(json!({"worker_id": "w1", "queues": ["default"], "max": 2, "lease_ms": 1000}))
        .await["jobs"]
        .as_array()
        .expect("jobs")
        .clone();
    let cancelled = jobs[1]["id"].as_str().expect("id");
    let (status, _) = api
        .post_json(&format!("/v1/jobs/{cancelled}/cancel"), json!({}))
        .await;
    assert_eq!(status, StatusCode::OK);
    let (status, answer) = api
        .post_json(
            "/v1/heartbeat",
            json!({"leases": [lease(&jobs[0]), lease(&jobs[1])], "lease_ms": 60000, "worker_id": "w1"}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results[0]["status"], "ok");
    assert!(
        results[0]["lease_expires_at"].as_str().unwrap_or("")
            > jobs[0]["lease_expires_at"].as_str().unwrap_or("")
    );
    assert_eq!(results[1]["status"], "lease_lost");
    assert!(results[1].get("lease_expires_at").is_none());
}

/// `kinds` restricts the claim; the fetch registers the worker with what it said of itself.
#[tokio::test]
async fn fetch_by_kinds_and_registers_the_worker() {
    let api = start().await;
    let unknown = api.enqueue("new-kind").await;
    let known = api.enqueue("known").await;
    let answer = api
        .fetch(
            json!({"worker_id": "http-w1", "queues": ["default"], "max": 5,
                      "kinds": ["known"], "concurrency": 8, "busy": 1,
                      "host": "box-1", "pid": 4242, "version": "py-0.1"}),
        )
        .await;
    let ids: Vec<&str> = answer["jobs"]
        .as_array()
        .expect("jobs")
        .iter()
        .filter_map(|j| j["id"].as_str())
        .collect();
    assert_eq!(ids, vec![known.as_str()]);
    assert_eq!(api.state_of(&unknown).await, "available");
    let workers = api.get_json("/v1/workers").await.1;
    let worker = workers["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .find(|w| w["id"] == "http-w1")
        .cloned()
        .expect("registered");
    assert_eq!(worker["concurrency"], 8);
    assert_eq!(worker["host"], "box-1");
    assert_eq!(worker["queues"], json!(["default"]));
    assert_eq!(worker["state"], "alive");
}

/// A client that leaves while its fetch is claiming does not strand the jobs: they are
/// released at once (available, the attempt given back), not held until their lease expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jobs_claimed_for_a_client_that_left_are_released() {
    let api = start().await;
    let id = api.enqueue("work").await;
    // The claim happens, then the answer is held back while the client gives up.
    fail::cfg("server_fetch_answer", "1*sleep(800)").expect("failpoint");
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(200))
        .build()
        .expect("client");
    let gave_up = impatient
        .post(format!("{}/v1/fetch", api.base))
        .json(&json!({"worker_id": "w-gone", "queues": ["default"], "lease_ms": 600000}))
        .send()
        .await;
    assert!(gave_up.is_err(), "the client timed out");
    let job = eventually(
        "the job claimed for a client that left to be released",
        || async {
            let job = api.get_json(&format!("/v1/jobs/{id}")).await.1;
            if job["state"] == "available" {
                Ok(job)
            } else {
                Err(job)
            }
        },
    )
    .await;
    assert_eq!(job["attempt"], 0, "the attempt was given back: {job}");
    fail::remove("server_fetch_answer");
    let answer = api
        .fetch(json!({"worker_id": "w2", "queues": ["default"]}))
        .await;
    assert_eq!(answer["jobs"][0]["id"], json!(id));
}
