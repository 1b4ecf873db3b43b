//! The scaling signal over HTTP: `GET /v1/queues/{name}/scale`, the `desired_workers` of
//! `GET /v1/queues/{name}`, and the `queue_desired_workers` metric, from a real store.

mod common;

use common::TestServer;
use conveyor_core::{CompleteParams, FetchParams, NewJob, WorkerHeartbeat};
use conveyor_storetest::eventually::eventually;
use reqwest::StatusCode;
use serde_json::Value;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_signal_sizes_workers_to_the_backlog_at_the_measured_rate() {
    let server = TestServer::start().await;
    let store = &server.store;
    let jobs = (0..300)
        .map(|i| {
            let mut job = NewJob::new("mail.send", serde_json::json!({ "i": i }));
            job.queue = "mail".to_string();
            job
        })
        .collect();
    store.jobs_insert_many(jobs).await.expect("insert");

    // Nothing measured yet: a backlog asks for at least one worker.
    let (status, signal) = server.get("/v1/queues/mail/scale").await;
    assert_eq!(status, StatusCode::OK, "{signal}");
    assert_eq!(signal["backlog"], 300);
    assert_eq!(signal["finished_per_s"], Value::Null);
    assert_eq!(signal["desired_workers"], 1);

    // Two workers serve the queue; jobs finish.
    for id in ["w1", "w2"] {
        store
            .workers_heartbeat(WorkerHeartbeat {
                id: id.to_string(),
                host: "test".to_string(),
                pid: None,
                queues: vec!["mail".to_string()],
                concurrency: 10,
                busy: 0,
                version: "test".to_string(),
                started_at: chrono::Utc::now(),
                stopping: false,
            })
            .await
            .expect("heartbeat");
    }
    let finish = |n: usize| async move {
        let claimed = store
            .jobs_fetch(FetchParams {
                worker_id: "w1".to_string(),
                queues: vec!["mail".to_string()],
                max: n,
                lease: Duration::from_secs(60),
                kinds: None,
                excluded_kinds: Vec::new(),
            })
            .await
            .expect("fetch");
        let done = claimed
            .iter()
            .filter_map(|job| job.lease_ref())
            .map(|lease| CompleteParams {
                lease,
                result: None,
            })
            .collect();
        store.jobs_complete_many(done).await.expect("complete");
    };
    finish(50).await;
    // A rate needs two readings at least a second apart: read until one is measured.
    let measured = eventually("a measured throughput", || async {
        finish(5).await;
        let (_, signal) = server.get("/v1/queues/mail/scale?target_s=10").await;
        signal["finished_per_s"]
            .as_f64()
            .filter(|r| *r > 0.0)
            .map(|_| signal)
    })
    .await;
    assert_eq!(measured["workers"], 2);
    assert_eq!(measured["target_s"], 10.0);
    let backlog = measured["backlog"].as_f64().expect("backlog");
    let per_worker = measured["rate_per_worker"]
        .as_f64()
        .expect("rate per worker");
    let rate = measured["finished_per_s"].as_f64().expect("rate");
    assert!((per_worker - rate / 2.0).abs() < 1e-9, "{measured}");
    let expected = (backlog / (per_worker * 10.0)).ceil().max(1.0);
    assert_eq!(
        measured["desired_workers"].as_f64(),
        Some(expected),
        "{measured}"
    );

    // The queue's view and the metric carry it too.
    let (status, view) = server.get("/v1/queues/mail").await;
    assert_eq!(status, StatusCode::OK);
    assert!(view["desired_workers"].as_u64().is_some(), "{view}");
    assert_eq!(view["scale"]["queue"], "mail");
    assert_eq!(view["name"], "mail", "the settings are still there: {view}");
    let metrics = server
        .http
        .get(server.url("/metrics"))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("text");
    assert!(
        metrics.contains("conveyor_queue_desired_workers{queue=\"mail\"}"),
        "{metrics}"
    );
}

#[tokio::test]
async fn bad_scale_requests_name_the_parameter() {
    let server = TestServer::start().await;
    for (path, field) in [
        ("/v1/queues/mail/scale?target_s=0", "target_s"),
        ("/v1/queues/mail/scale?target_s=abc", "target_s"),
        ("/v1/queues/mail/scale?target_s=NaN", "target_s"),
        ("/v1/queues/mail/scale?colour=red", "colour"),
        ("/v1/queues/%20/scale", "name"),
    ] {
        let (status, body) = server.get(path).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["error"]["field"], field, "{path}: {body}");
    }
    // An empty queue needs no worker.
    let (status, signal) = server.get("/v1/queues/idle/scale").await;
    assert_eq!(
        (status, signal["desired_workers"].clone()),
        (StatusCode::OK, 0.into())
    );
}
