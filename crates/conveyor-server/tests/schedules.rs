//! `/v1/schedules` over HTTP: define, read, list, delete, run history, and bad input answered
//! 400 naming the field.

mod common;

use common::TestServer as Api;
use reqwest::Method;
use serde_json::{json, Value};

async fn start() -> Api {
    Api::start().await
}

impl Api {
    async fn send(&self, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut request = self.http.request(method, format!("{}{path}", self.base));
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        let body = if text.is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).expect("JSON body")
        };
        (status, body)
    }

    async fn put(&self, name: &str, body: Value) -> (u16, Value) {
        self.send(Method::PUT, &format!("/v1/schedules/{name}"), Some(body))
            .await
    }

    /// Asserts a 400 naming `field`, and returns the message.
    async fn bad(&self, name: &str, body: Value, field: &str) -> String {
        let (status, answer) = self.put(name, body.clone()).await;
        assert_eq!(status, 400, "{body} -> {answer}");
        assert_eq!(answer["error"]["code"], "invalid_request", "{answer}");
        assert_eq!(answer["error"]["field"], field, "{body} -> {answer}");
        answer["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

#[tokio::test]
async fn define_read_list_and_delete() {
    let api = start().await;
    let (status, created) = api
        .put(
            "nightly-report",
            json!({
                "cron": "0 3 * * *",
                "timezone": "Europe/Berlin",
                "job": {"kind": "report", "payload": {"day": "yesterday"}, "queue": "reports"},
                "overlap": "allow",
                "missed": "catch_up",
                "max_catch_up": 3
            }),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["name"], "nightly-report");
    assert_eq!(created["cron"], "0 3 * * *");
    assert_eq!(created["timezone"], "Europe/Berlin");
    assert_eq!(created["job"]["kind"], "report");
    assert_eq!(created["job"]["queue"], "reports");
    assert_eq!(created["job"]["payload"], json!({"day": "yesterday"}));
    assert_eq!(created["overlap"], "allow");
    assert_eq!(created["missed"], "catch_up");
    assert_eq!(created["max_catch_up"], 3);
    assert!(created["next_run_at"].is_string(), "{created}");
    assert!(created["last_run"].is_null());
    assert_eq!(created["recent_runs"], json!([]));

    // Defaults: UTC, skip and skip.
    let (status, minimal) = api
        .put(
            "every-minute",
            json!({"cron": "* * * * *", "job": {"kind": "ping"}}),
        )
        .await;
    assert_eq!(status, 200, "{minimal}");
    assert_eq!(minimal["timezone"], "UTC");
    assert_eq!(minimal["overlap"], "skip");
    assert_eq!(minimal["missed"], "skip");
    assert_eq!(minimal["job"]["queue"], "default");

    let (status, got) = api
        .send(Method::GET, "/v1/schedules/nightly-report", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(got["name"], "nightly-report");
    let (status, all) = api.send(Method::GET, "/v1/schedules", None).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = all["schedules"]
        .as_array()
        .expect("array")
        .iter()
        .map(|s| s["name"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(names, vec!["every-minute", "nightly-report"]);
    assert!(all["schedules"][0]["next_run_at"].is_string());

    let (status, runs) = api
        .send(Method::GET, "/v1/schedules/every-minute/runs?limit=5", None)
        .await;
    assert_eq!(status, 200);
    assert_eq!(runs["runs"], json!([]));

    let (status, _) = api
        .send(Method::DELETE, "/v1/schedules/every-minute", None)
        .await;
    assert_eq!(status, 204);
    for (method, path) in [
        (Method::GET, "/v1/schedules/every-minute"),
        (Method::DELETE, "/v1/schedules/every-minute"),
        (Method::GET, "/v1/schedules/every-minute/runs"),
    ] {
        let (status, answer) = api.send(method, path, None).await;
        assert_eq!(status, 404, "{path}");
        assert_eq!(answer["error"]["code"], "not_found");
    }
}

#[tokio::test]
async fn bad_input_is_400_naming_the_field() {
    let api = start().await;
    let job = json!({"kind": "k"});
    let message = api
        .bad("s", json!({"cron": "61 * * * *", "job": job}), "cron")
        .await;
    assert!(message.contains("61 * * * *"), "{message}");
    api.bad("s", json!({"cron": "* * * *", "job": job}), "cron")
        .await;
    api.bad("s", json!({"cron": "0 0 30 2 *", "job": job}), "cron")
        .await;
    let message = api
        .bad(
            "s",
            json!({"cron": "* * * * *", "timezone": "Europe/Atlantis", "job": job}),
            "timezone",
        )
        .await;
    assert!(message.contains("Europe/Atlantis"), "{message}");
    api.bad("s", json!({"job": job}), "cron").await;
    api.bad("s", json!({"cron": "* * * * *"}), "job").await;
    api.bad("s", json!({"cron": "* * * * *", "job": {}}), "job.kind")
        .await;
    api.bad(
        "s",
        json!({"cron": "* * * * *", "job": {"kind": "bad kind"}}),
        "job.kind",
    )
    .await;
    api.bad(
        "s",
        json!({"cron": "* * * * *", "job": {"kind": "k", "bogus": 1}}),
        "job.bogus",
    )
    .await;
    api.bad(
        "s",
        json!({"cron": "* * * * *", "job": job, "overlap": "sometimes"}),
        "overlap",
    )
    .await;
    api.bad(
        "s",
        json!({"cron": "* * * * *", "job": job, "missed": "later"}),
        "missed",
    )
    .await;
    api.bad(
        "s",
        json!({"cron": "* * * * *", "job": job, "max_catch_up": 3}),
        "max_catch_up",
    )
    .await;
    api.bad(
        "s",
        json!({"cron": "* * * * *", "job": job, "missed": "catch_up", "max_catch_up": 0}),
        "max_catch_up",
    )
    .await;
    api.bad("bad name", json!({"cron": "* * * * *", "job": job}), "name")
        .await;
    let (status, answer) = api
        .send(Method::GET, "/v1/schedules/s/runs?limit=0", None)
        .await;
    assert_eq!((status, &answer["error"]["field"]), (400, &json!("limit")));
    // Nothing was stored by any of them.
    assert!(api.store.schedules_list().await.expect("list").is_empty());
}

#[tokio::test]
async fn interval_schedules_over_http() {
    let api = start().await;
    let (status, created) = api
        .put(
            "pulse",
            json!({"every": "1h30m", "job": {"kind": "pulse"}, "missed": "catch_up"}),
        )
        .await;
    assert_eq!(status, 200, "{created}");
    assert_eq!(created["every"], "1h30m");
    assert!(created.get("cron").is_none(), "{created}");
    assert_eq!(created["timezone"], "UTC");
    assert_eq!(created["missed"], "catch_up");
    // The first run is one interval after creation (counted in whole seconds).
    let due_after: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(created["due_after"].clone()).expect("due_after");
    let next: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(created["next_run_at"].clone()).expect("next_run_at");
    let gap = next - due_after;
    assert!(
        gap > chrono::Duration::seconds(5_399) && gap <= chrono::Duration::seconds(5_400),
        "{created}"
    );
    let (status, got) = api.send(Method::GET, "/v1/schedules/pulse", None).await;
    assert_eq!(status, 200);
    assert_eq!(got["every"], "1h30m");
    assert_eq!(got["next_run_at"], created["next_run_at"]);
    // `timezone: UTC` is accepted with every (it is the default).
    let (status, utc) = api
        .put(
            "pulse",
            json!({"every": "1h30m", "timezone": "UTC", "job": {"kind": "pulse"}}),
        )
        .await;
    assert_eq!(status, 200, "{utc}");
    assert_eq!(
        utc["due_after"], created["due_after"],
        "same interval, same anchor"
    );
}

#[tokio::test]
async fn bad_interval_input_is_400_naming_the_field() {
    let api = start().await;
    let job = json!({"kind": "k"});
    let message = api
        .bad(
            "s",
            json!({"cron": "* * * * *", "every": "30s", "job": job}),
            "every",
        )
        .await;
    assert!(message.contains("not both"), "{message}");
    let message = api.bad("s", json!({"job": job}), "cron").await;
    assert!(message.contains("every"), "{message}");
    api.bad("s", json!({"cron": "", "every": "30s", "job": job}), "cron")
        .await;
    api.bad("s", json!({"cron": "", "job": job}), "cron").await;
    for bad in ["0s", "abc", "30", "", "5ms", "367d"] {
        let message = api
            .bad("s", json!({"every": bad, "job": job}), "every")
            .await;
        assert!(message.contains(&format!("{bad:?}")), "{message}");
    }
    api.bad("s", json!({"every": 30, "job": job}), "every")
        .await;
    let message = api
        .bad(
            "s",
            json!({"every": "30s", "timezone": "Europe/Berlin", "job": job}),
            "timezone",
        )
        .await;
    assert!(message.contains("cron"), "{message}");
    assert!(api.store.schedules_list().await.expect("list").is_empty());
}

/// Pause, resume and trigger over HTTP: pausing shows in the view (no next run) and in the
/// audit log; a trigger enqueues the schedule's job at once, tagged `manual`; unknown names
/// are 404.
#[tokio::test]
async fn schedules_pause_resume_and_trigger_over_http() {
    let server = Api::start().await;
    let http = &server.http;
    let put = http
        .put(server.url("/v1/schedules/nightly"))
        .json(&serde_json::json!({"cron": "0 3 * * *", "job": {"kind": "report", "queue": "reports", "payload": {"n": 1}}}))
        .send()
        .await
        .expect("put");
    assert_eq!(put.status(), reqwest::StatusCode::OK);
    let post = |path: &str| {
        http.post(server.url(path))
            .json(&serde_json::json!({}))
            .send()
    };

    let paused: serde_json::Value = post("/v1/schedules/nightly/pause")
        .await
        .expect("pause")
        .json()
        .await
        .expect("json");
    assert_eq!(paused["paused"], true, "{paused}");
    assert!(paused["next_run_at"].is_null(), "{paused}");
    let again: serde_json::Value = post("/v1/schedules/nightly/pause")
        .await
        .expect("pause")
        .json()
        .await
        .expect("json");
    assert_eq!(
        again["revision"], paused["revision"],
        "pausing twice changes nothing"
    );

    let triggered = post("/v1/schedules/nightly/trigger")
        .await
        .expect("trigger");
    assert_eq!(triggered.status(), reqwest::StatusCode::CREATED);
    let run: serde_json::Value = triggered.json().await.expect("json");
    assert_eq!(run["queue"], "reports");
    let id: uuid::Uuid = run["id"].as_str().expect("id").parse().expect("uuid");
    let job = server
        .store
        .job_get(id)
        .await
        .expect("get")
        .expect("the job");
    assert_eq!(job.kind, "report");
    assert_eq!(job.payload, serde_json::json!({"n": 1}));
    assert!(
        job.tags.contains(&"schedule:nightly".to_string())
            && job.tags.contains(&"manual".to_string()),
        "{:?}",
        job.tags
    );

    let resumed: serde_json::Value = post("/v1/schedules/nightly/resume")
        .await
        .expect("resume")
        .json()
        .await
        .expect("json");
    assert!(
        resumed.get("paused").is_none() || resumed["paused"] == false,
        "{resumed}"
    );
    assert!(resumed["next_run_at"].is_string(), "{resumed}");

    for path in [
        "/v1/schedules/nope/pause",
        "/v1/schedules/nope/resume",
        "/v1/schedules/nope/trigger",
    ] {
        assert_eq!(
            post(path).await.expect("post").status(),
            reqwest::StatusCode::NOT_FOUND,
            "{path}"
        );
    }
    let audit = server
        .store
        .audit_list(conveyor_core::AuditListParams::default())
        .await
        .expect("audit");
    let actions: Vec<String> = audit
        .iter()
        .map(|e| format!("{} {}", e.action, e.detail.clone().unwrap_or_default()))
        .collect();
    assert!(
        actions.iter().any(|a| a == "schedule.put paused"),
        "{actions:?}"
    );
    assert!(
        actions.iter().any(|a| a == "schedule.put resumed"),
        "{actions:?}"
    );
    assert!(
        actions
            .iter()
            .any(|a| a.starts_with("schedule.trigger job=")),
        "{actions:?}"
    );
}
