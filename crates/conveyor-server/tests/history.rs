//! `GET /v1/stats`: the per-minute history, recorded on the server's (injected) clock from the
//! jobs its HTTP workers take and finish, kept in a real SQLite store.

mod common;

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use common::TestServer;
use conveyor_core::{ManualClock, Role};
use conveyor_server::{RouterOptions, ServerConfig};
use reqwest::StatusCode;
use serde_json::{json, Value};

fn at(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap()
        .with_timezone(&Utc)
}

/// `POST path`, which must succeed: its body (`Value::Null` if not JSON).
async fn post_ok(server: &TestServer, path: &str, body: Value) -> Value {
    let (status, answer) = server.post(path, body).await;
    assert!(status.is_success(), "{path}: {status}");
    answer
}

/// Takes one job of `queue` and reports `outcome` for it: "complete", "fail" (will retry) or
/// "permanent" (dead).
async fn work_one(server: &TestServer, queue: &str, outcome: &str) {
    let fetched = post_ok(
        server,
        "/v1/fetch",
        json!({"worker_id": "w", "queues": [queue], "max": 1}),
    )
    .await;
    let job = &fetched["jobs"][0];
    let id = job["id"].as_str().expect("a job to take");
    let token = job["lease_token"].clone();
    match outcome {
        "complete" => {
            post_ok(
                server,
                &format!("/v1/jobs/{id}/complete"),
                json!({"lease_token": token}),
            )
            .await
        }
        "fail" => {
            post_ok(
                server,
                &format!("/v1/jobs/{id}/fail"),
                json!({"lease_token": token, "error": {"message": "flaky"}}),
            )
            .await
        }
        _ => {
            post_ok(
                server,
                &format!("/v1/jobs/{id}/fail"),
                json!({"lease_token": token, "error": {"message": "bad"}, "retry": "never"}),
            )
            .await
        }
    };
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_counts_each_minute_by_queue_and_kind_on_the_servers_clock() {
    let clock = Arc::new(ManualClock::new(at("2026-12-01T10:00:30Z")));
    let server = TestServer::start_with_options(
        ServerConfig::default(),
        RouterOptions {
            clock: clock.clone(),
            ..RouterOptions::default()
        },
    )
    .await;
    post_ok(
        &server,
        "/v1/jobs/batch",
        json!({"jobs": [{"kind": "mail"}, {"kind": "mail"}, {"kind": "mail"},
                        {"kind": "resize", "queue": "img"}]}),
    )
    .await;
    work_one(&server, "default", "complete").await;
    work_one(&server, "default", "complete").await;
    work_one(&server, "default", "fail").await;
    clock.advance(Duration::from_secs(120));
    work_one(&server, "img", "permanent").await;

    let (status, report) = server
        .get_json("/v1/stats?from=2026-12-01T09:55:00Z&to=2026-12-01T10:05:00Z&step=1m")
        .await;
    assert_eq!(status, StatusCode::OK, "{report}");
    assert_eq!(report["step_s"], 60);
    let totals = &report["totals"];
    assert_eq!(
        [
            &totals["enqueued"],
            &totals["started"],
            &totals["completed"],
            &totals["failed"],
            &totals["retried"],
            &totals["dead"]
        ],
        [
            &json!(4),
            &json!(4),
            &json!(2),
            &json!(2),
            &json!(1),
            &json!(1)
        ],
        "{totals}"
    );
    assert_eq!(totals["failure_rate"], 0.5);
    assert!(totals["run_time"]["p95_ms"].is_number(), "{totals}");
    assert!(totals["queue_wait"]["p50_ms"].is_number(), "{totals}");
    let series = report["series"].as_array().expect("series");
    assert_eq!(series.len(), 10, "every minute, empty ones too");
    let point = |minute: &str| {
        series
            .iter()
            .find(|p| p["at"] == minute)
            .unwrap_or_else(|| panic!("no point at {minute}: {report}"))
    };
    assert_eq!(point("2026-12-01T10:00:00Z")["completed"], 2);
    assert_eq!(point("2026-12-01T10:00:00Z")["enqueued"], 4);
    assert_eq!(point("2026-12-01T10:02:00Z")["dead"], 1);
    assert_eq!(point("2026-12-01T09:58:00Z")["completed"], 0);
    let kinds = report["kinds"].as_array().expect("kinds");
    assert_eq!(kinds.len(), 2, "{kinds:?}");
    let mail = kinds.iter().find(|k| k["kind"] == "mail").expect("mail");
    assert_eq!(mail["queue"], "default");
    assert_eq!(mail["completed"], 2);
    assert_eq!(mail["throughput_per_min"], 0.2);

    // Filters, and a step of five minutes.
    let (_, only_mail) = server
        .get_json("/v1/stats?from=2026-12-01T09:55:00Z&to=2026-12-01T10:05:00Z&kind=mail&step=300")
        .await;
    assert_eq!(only_mail["totals"]["completed"], 2);
    assert_eq!(only_mail["totals"]["dead"], 0);
    assert_eq!(only_mail["series"].as_array().map(Vec::len), Some(2));
    let (_, img) = server
        .get_json("/v1/stats?queue=img&from=2026-12-01T09:00:00Z")
        .await;
    assert_eq!(
        img["totals"]["dead"], 1,
        "default `to` is the server's now: {img}"
    );

    // Kept in the store, not only in this process.
    let rows = server
        .store
        .stats_read(conveyor_core::stats::StatsQuery {
            from: at("2026-12-01T10:00:00Z"),
            to: at("2026-12-01T10:03:00Z"),
            queue: None,
            kind: None,
        })
        .await
        .expect("read the store");
    assert_eq!(rows.len(), 3, "(minute, queue, kind) rows: {rows:?}");
}

#[tokio::test]
async fn bad_history_requests_are_400_naming_the_field() {
    let server = TestServer::start().await;
    for (query, field) in [
        ("step=90", "step"),
        ("step=5w", "step"),
        ("from=yesterday", "from"),
        ("from=2026-12-02T00:00:00Z&to=2026-12-01T00:00:00Z", "from"),
        (
            "from=2026-01-01T00:00:00Z&to=2026-12-01T00:00:00Z&step=60",
            "step",
        ),
        ("queue=no%20spaces", "queue"),
        ("kind=", "kind"),
        ("range=1h", "range"),
    ] {
        let (status, body) = server.get_json(&format!("/v1/stats?{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["field"], field, "{query}: {body}");
    }
}

#[tokio::test]
async fn viewers_read_history_and_producers_do_not() {
    let server = TestServer::start_with_options(ServerConfig::default(), common::auth(true)).await;
    let viewer = server.token(Role::Viewer, "viewer").await;
    let producer = server.token(Role::Producer, "producer").await;
    let status = |token: String| {
        let request = server
            .http
            .get(server.url("/v1/stats"))
            .bearer_auth(token)
            .send();
        async move { request.await.expect("get").status() }
    };
    assert_eq!(status(viewer).await, StatusCode::OK);
    assert_eq!(status(producer).await, StatusCode::FORBIDDEN);
}
