//! Signed inbound webhooks end to end: a real `conveyor serve`, hooks set over the API, and
//! requests signed as GitHub, Stripe and Standard Webhooks sign them. A verified request
//! becomes one job, answered only once stored; a provider's retry finds that job; a bad,
//! missing or stale signature is a 401 that stores nothing and is counted; the secret is never
//! shown.

mod common;

use common::*;
use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;

fn sign(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("key");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().to_vec()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn put_hook(server: &str, name: &str, body: Value) -> (u16, Value) {
    let response = http()
        .put(format!("{server}/v1/hooks/{name}"))
        .json(&body)
        .send()
        .expect("PUT hook");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

fn deliver(server: &str, name: &str, headers: &[(&str, String)], body: &[u8]) -> (u16, Value) {
    let mut request = http()
        .post(format!("{server}/hooks/{name}"))
        .header("content-type", "application/json")
        .body(body.to_vec());
    for (key, value) in headers {
        request = request.header(*key, value);
    }
    let response = request.send().expect("POST hook");
    let status = response.status().as_u16();
    (status, response.json().unwrap_or(Value::Null))
}

fn jobs_in(server: &str, queue: &str) -> Vec<Value> {
    let page: Value = http()
        .get(format!("{server}/v1/jobs?queue={queue}&limit=100"))
        .send()
        .expect("GET jobs")
        .json()
        .expect("jobs");
    page["jobs"].as_array().cloned().unwrap_or_default()
}

fn hook(server: &str, name: &str) -> Value {
    http()
        .get(format!("{server}/v1/hooks/{name}"))
        .send()
        .expect("GET hook")
        .json()
        .expect("hook")
}

#[test]
fn github_deliveries_become_one_job_each_and_bad_signatures_store_nothing() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let secret = "gh-secret-for-tests";
    let (status, answer) = put_hook(
        &server.url,
        "github",
        json!({"scheme": "github", "secret": secret,
               "job": {"kind": {"from": "header:x-github-event"}, "queue": "hooks"}}),
    );
    assert_eq!(status, 201, "{answer}");
    assert_eq!(answer["secret_set"], true);
    assert!(
        answer.get("secret").is_none(),
        "the secret was shown: {answer}"
    );
    assert_eq!(answer["url"], "/hooks/github");

    let body = br#"{"action": "opened", "number": 7}"#;
    let signature = format!("sha256={}", hex(&sign(secret.as_bytes(), &[body])));
    let headers = [
        ("x-hub-signature-256", signature.clone()),
        ("x-github-delivery", "d-1".to_string()),
        ("x-github-event", "pull_request".to_string()),
    ];
    let (status, first) = deliver(&server.url, "github", &headers, body);
    assert_eq!(status, 202, "{first}");
    assert_eq!(first["duplicate"], false);
    // GitHub redelivers with the same delivery id: the same job.
    let (status, again) = deliver(&server.url, "github", &headers, body);
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        (again["job_id"].clone(), again["duplicate"].clone()),
        (first["job_id"].clone(), json!(true))
    );

    let jobs = jobs_in(&server.url, "hooks");
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    assert_eq!(jobs[0]["kind"], "pull_request");
    assert_eq!(jobs[0]["payload"], json!({"action": "opened", "number": 7}));
    assert_eq!(jobs[0]["idempotency_key"], "hook:github:d-1");

    // A wrong secret, a changed body, no signature: 401 each, nothing stored.
    let forged = format!("sha256={}", hex(&sign(b"guess", &[body])));
    let refused = [
        (
            vec![
                ("x-hub-signature-256", forged),
                ("x-github-delivery", "d-2".to_string()),
            ],
            &body[..],
        ),
        (
            vec![
                ("x-hub-signature-256", signature.clone()),
                ("x-github-delivery", "d-3".to_string()),
            ],
            &br#"{"action": "closed", "number": 7}"#[..],
        ),
        (vec![("x-github-delivery", "d-4".to_string())], &body[..]),
    ];
    for (headers, body) in refused {
        let (status, answer) = deliver(&server.url, "github", &headers, body);
        assert_eq!(status, 401, "{answer}");
        assert_eq!(answer["error"]["code"], "bad_signature", "{answer}");
    }
    assert_eq!(jobs_in(&server.url, "hooks").len(), 1);
    let shown = hook(&server.url, "github");
    assert_eq!(
        (
            shown["enqueued"].as_u64(),
            shown["duplicate"].as_u64(),
            shown["refused"].as_u64()
        ),
        (Some(1), Some(1), Some(3)),
        "{shown}"
    );
    let metrics = http()
        .get(format!("{}/metrics", server.url))
        .send()
        .expect("metrics")
        .text()
        .expect("text");
    assert!(
        metrics.contains("conveyor_hook_requests_total{hook=\"github\",outcome=\"refused\"} 3"),
        "{metrics}"
    );

    // Unknown hooks and bad configurations.
    assert_eq!(deliver(&server.url, "nope", &[], body).0, 404);
    let (status, answer) = put_hook(
        &server.url,
        "bad",
        json!({"scheme": "gitlab", "secret": "x", "job": {"kind": "k"}}),
    );
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("scheme")),
        "{answer}"
    );
    // A PUT without a secret keeps the stored one.
    let (status, answer) = put_hook(
        &server.url,
        "github",
        json!({"scheme": "github", "job": {"kind": "gh", "queue": "hooks"}}),
    );
    assert_eq!(status, 200, "{answer}");
    let headers = [
        ("x-hub-signature-256", signature),
        ("x-github-delivery", "d-5".to_string()),
    ];
    assert_eq!(deliver(&server.url, "github", &headers, body).0, 202);
    assert_eq!(
        http()
            .delete(format!("{}/v1/hooks/github", server.url))
            .send()
            .expect("DELETE")
            .status()
            .as_u16(),
        204
    );
    assert_eq!(deliver(&server.url, "github", &headers, body).0, 404);
}

/// A secret named by `secret_env` is read from the server's environment: a variable the
/// server lacks is refused at `PUT` (400 naming `secret_env`, nothing stored), and a server
/// that lacks it when a delivery comes answers 503 `hook_unavailable` without storing anything
/// or naming the variable, so the provider retries.
#[test]
fn a_secret_from_the_environment_is_read_there_and_a_missing_one_is_said_so() {
    const VARIABLE: &str = "CONVEYOR_TEST_HOOK_SECRET";
    let dir = temp_dir();
    let store = format!("sqlite://{}", path_in(&dir, "jobs.db").display());
    let args = ["--listen", "127.0.0.1:0", "--store", store.as_str()];
    let mut server = start_server_with(&args, &[], &[(VARIABLE, "env-secret")]);

    let (status, answer) = put_hook(
        &server.url,
        "crm",
        json!({"scheme": "hmac-sha256", "secret_env": "CONVEYOR_TEST_HOOK_UNSET",
               "job": {"kind": "crm.changed", "queue": "hooks"}}),
    );
    assert_eq!(
        (status, answer["error"]["field"].as_str()),
        (400, Some("secret_env")),
        "{answer}"
    );
    assert_eq!(hook(&server.url, "crm")["error"]["code"], "not_found");

    let (status, answer) = put_hook(
        &server.url,
        "crm",
        json!({"scheme": "hmac-sha256", "secret_env": VARIABLE,
               "job": {"kind": "crm.changed", "queue": "hooks"}}),
    );
    assert_eq!(status, 201, "{answer}");
    let body = br#"{"id": 1}"#;
    let signed = [(
        "x-signature-256",
        format!("sha256={}", hex(&sign(b"env-secret", &[body]))),
    )];
    assert_eq!(deliver(&server.url, "crm", &signed, body).0, 202);
    assert_eq!(jobs_in(&server.url, "hooks").len(), 1);

    // The same store, served without the variable.
    server.proc.sigterm();
    server.proc.wait_exit(std::time::Duration::from_secs(30));
    let server = start_server_with(&args, &[], &[]);
    let other = br#"{"id": 2}"#;
    let signed = [(
        "x-signature-256",
        format!("sha256={}", hex(&sign(b"env-secret", &[other]))),
    )];
    let (status, answer) = deliver(&server.url, "crm", &signed, other);
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (503, Some("hook_unavailable")),
        "{answer}"
    );
    assert!(
        !answer.to_string().contains(VARIABLE),
        "the public answer named the variable: {answer}"
    );
    assert_eq!(jobs_in(&server.url, "hooks").len(), 1);
}

#[test]
fn stripe_and_standard_webhooks_refuse_stale_timestamps_and_dedupe_on_the_event_id() {
    let dir = temp_dir();
    let server = start_server(&path_in(&dir, "jobs.db"), &[]);
    let now = chrono::Utc::now().timestamp();

    let stripe_secret = "whsec_stripe_test";
    let (status, answer) = put_hook(
        &server.url,
        "stripe",
        json!({"scheme": "stripe", "secret": stripe_secret, "job": {"kind": {"from": "body:/type"}, "queue": "payments"}}),
    );
    assert_eq!(status, 201, "{answer}");
    let body = br#"{"id": "evt_42", "type": "invoice.paid"}"#;
    let stripe_header = |at: i64| {
        let stamp = at.to_string();
        format!(
            "t={at},v1={}",
            hex(&sign(
                stripe_secret.as_bytes(),
                &[stamp.as_bytes(), b".", body]
            ))
        )
    };
    let (status, first) = deliver(
        &server.url,
        "stripe",
        &[("stripe-signature", stripe_header(now))],
        body,
    );
    assert_eq!(status, 202, "{first}");
    // Stripe retries sign again with a new time: the event id finds the same job.
    let (status, again) = deliver(
        &server.url,
        "stripe",
        &[("stripe-signature", stripe_header(now + 1))],
        body,
    );
    assert_eq!(
        (status, again["job_id"].clone()),
        (200, first["job_id"].clone())
    );
    let (status, stale) = deliver(
        &server.url,
        "stripe",
        &[("stripe-signature", stripe_header(now - 600))],
        body,
    );
    assert_eq!(status, 401, "{stale}");
    let jobs = jobs_in(&server.url, "payments");
    assert_eq!(jobs.len(), 1);
    assert_eq!(
        (
            jobs[0]["kind"].as_str(),
            jobs[0]["idempotency_key"].as_str()
        ),
        (Some("invoice.paid"), Some("hook:stripe:evt_42"))
    );

    let key = b"a-32-byte-key-for-standard-hooks";
    let secret = format!("whsec_{}", base64_encode(key));
    let (status, answer) = put_hook(
        &server.url,
        "std",
        json!({"scheme": "standard-webhooks", "secret": secret, "job": {"kind": "user.created", "queue": "users"}, "tolerance_secs": 60}),
    );
    assert_eq!(status, 201, "{answer}");
    let body = br#"{"user": 1}"#;
    let signed = |id: &str, at: i64| {
        let stamp = at.to_string();
        let signature = base64_encode(&sign(
            key,
            &[id.as_bytes(), b".", stamp.as_bytes(), b".", body],
        ));
        vec![
            ("webhook-id", id.to_string()),
            ("webhook-timestamp", stamp),
            ("webhook-signature", format!("v1,{signature}")),
        ]
    };
    assert_eq!(
        deliver(&server.url, "std", &signed("msg_1", now), body).0,
        202
    );
    assert_eq!(
        deliver(&server.url, "std", &signed("msg_1", now), body).0,
        200
    );
    assert_eq!(
        deliver(&server.url, "std", &signed("msg_2", now - 120), body).0,
        401
    );
    assert_eq!(
        deliver(&server.url, "std", &signed("msg_3", now + 120), body).0,
        401
    );
    assert_eq!(jobs_in(&server.url, "users").len(), 1);
}

fn base64_encode(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}
