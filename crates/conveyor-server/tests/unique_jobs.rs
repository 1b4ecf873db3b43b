//! Unique jobs over HTTP: `unique` on `POST /v1/jobs` and `/v1/jobs/batch`, answered like an
//! idempotency key (200 with `duplicate: true`), and 400s naming the field at fault.

mod common;

use common::TestServer as Server;
use serde_json::json;

#[tokio::test]
async fn unique_enqueue_returns_the_existing_job_as_a_duplicate() {
    let server = Server::start().await;
    let (status, first) = server
        .post_json(
            "/v1/jobs",
            json!({"kind": "sync", "payload": {"user": 7, "opts": {"a": 1, "b": 2}}, "unique": {}}),
        )
        .await;
    assert_eq!(status, 201, "{first}");
    assert_eq!(first["duplicate"], false);
    let key = first["unique_key"].as_str().expect("the job shows its key");
    assert_eq!(key.len(), 64);

    // The same payload with its keys in another order.
    let (status, again) = server
        .post_json(
            "/v1/jobs",
            json!({"kind": "sync", "payload": {"opts": {"b": 2, "a": 1}, "user": 7}, "unique": {}}),
        )
        .await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(again["duplicate"], true);
    assert_eq!(again["id"], first["id"]);

    // Unique by one field, in any queue, while queued, running or completed, for an hour.
    let by_user = json!({
        "args": ["user"], "by_queue": false, "period_ms": 3_600_000,
        "states": ["available", "running", "completed"]
    });
    let (status, mail) = server
        .post_json(
            "/v1/jobs",
            json!({"kind": "mail", "queue": "a", "payload": {"user": 1, "n": 1}, "unique": by_user}),
        )
        .await;
    assert_eq!(status, 201, "{mail}");
    let (status, again) = server
        .post_json(
            "/v1/jobs",
            json!({"kind": "mail", "queue": "b", "payload": {"user": 1, "n": 2}, "unique": by_user}),
        )
        .await;
    assert_eq!(
        (status.as_u16(), &again["id"]),
        (200, &mail["id"]),
        "{again}"
    );

    // A plain job is not unique and shows no key.
    let (status, plain) = server
        .post_json("/v1/jobs", json!({"kind": "sync", "payload": {"user": 7}}))
        .await;
    assert_eq!(status, 201);
    assert!(plain.get("unique_key").is_none(), "{plain}");

    // In a batch, the second of an identity is reported as a duplicate.
    let job = json!({"kind": "batch", "payload": {"n": 1}, "unique": {"args": ["n"]}});
    let (status, batch) = server
        .post_json("/v1/jobs/batch", json!({"jobs": [job, job]}))
        .await;
    assert_eq!(status, 201, "{batch}");
    assert_eq!(batch["duplicates"], json!([false, true]));
    assert_eq!(batch["ids"][0], batch["ids"][1]);
}

#[tokio::test]
async fn bad_unique_specs_are_400s_naming_the_field() {
    let server = Server::start().await;
    let cases = [
        (json!({"args": []}), "unique.args"),
        (json!({"args": [""]}), "unique.args"),
        (json!({"args": "user"}), "unique.args"),
        (json!({"period_ms": 0}), "unique.period_ms"),
        (json!({"period_ms": -5}), "unique.period_ms"),
        (json!({"states": ["queued"]}), "unique.states"),
        (json!({"states": []}), "unique.states"),
        (json!({"by_queue": "yes"}), "unique.by_queue"),
        (json!({"bogus": 1}), "unique.bogus"),
        (json!(true), "unique"),
    ];
    for (unique, field) in cases {
        let (status, answer) = server
            .post_json(
                "/v1/jobs",
                json!({"kind": "k", "payload": {}, "unique": unique}),
            )
            .await;
        assert_eq!(status, 400, "{unique} → {answer}");
        assert_eq!(answer["error"]["field"], field, "{unique} → {answer}");
    }
    let (status, answer) = server
        .post_json(
            "/v1/jobs/batch",
            json!({"jobs": [{"kind": "k"}, {"kind": "k", "unique": {"states": ["nope"]}}]}),
        )
        .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["field"], "jobs[1].unique.states");
}
