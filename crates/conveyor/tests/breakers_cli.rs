//! Circuit breakers across two `conveyor serve` processes on one PostgreSQL schema: failures
//! reported to one server open the queue's breaker for both (jobs stay queued, enqueues go on),
//! the state shows in `/v1/queues`, `/metrics` and the audit log of the other, an operator
//! closes it through the CLI against the other server; a kind's breaker set through the CLI;
//! bad input refused naming the field.

mod common;

use common::*;
use conveyor_storetest::eventually::eventually_blocking;
use serde_json::{json, Value};

fn fetch(server: &str, max: u32) -> Vec<Value> {
    let answer: Value = http()
        .post(format!("{server}/v1/fetch"))
        .json(&json!({"worker_id": "breaker-test", "queues": ["payments"], "max": max}))
        .send()
        .expect("fetch")
        .json()
        .expect("fetch JSON");
    answer["jobs"].as_array().cloned().unwrap_or_default()
}

fn fail(server: &str, job: &Value) {
    let status = http()
        .post(format!("{server}/v1/ack"))
        .json(&json!({"fail": [{
            "id": job["id"], "lease_token": job["lease_token"],
            "error": {"message": "upstream 503"}
        }]}))
        .send()
        .expect("ack")
        .status();
    assert!(status.is_success(), "{status}");
}

fn circuit(server: &str) -> Value {
    http()
        .get(format!("{server}/v1/queues/payments"))
        .send()
        .expect("GET queue")
        .json::<Value>()
        .expect("queue JSON")["circuit"]
        .clone()
}

#[test]
fn a_breaker_opened_through_one_server_holds_on_the_other_until_closed_by_hand() {
    let schema = Schema::fresh("conveyor_breaker");
    let one = start_server_at(&schema.url(), &[]);
    let two = start_server_at(&schema.url(), &[]);
    let (a, b) = (one.url.as_str(), two.url.as_str());

    let set = conveyor(&[
        "queue",
        "set",
        "payments",
        "--circuit-breaker",
        r#"{"failure_ratio": 0.5, "min_calls": 3, "open_ms": 600000}"#,
        "--server",
        a,
        "--json",
    ]);
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let settings: Value = serde_json::from_slice(&set.stdout).expect("JSON");
    assert_eq!(settings["circuit_breaker"]["min_calls"], 3);
    assert_eq!(settings["circuit"]["state"], "closed");

    for n in 0..10 {
        enqueue(
            a,
            json!({"kind": "charge", "queue": "payments", "payload": {"n": n}}),
        );
    }
    let taken = fetch(a, 3);
    assert_eq!(taken.len(), 3);
    for job in &taken {
        fail(a, job);
    }
    // Counted off the job path: the other server sees the breaker open shortly.
    eventually_blocking("the breaker to open, seen through the other server", || {
        let view = circuit(b);
        (view["state"] == "open").then_some(()).ok_or(view)
    });
    assert!(fetch(b, 10).is_empty(), "open: nothing handed out");
    assert!(fetch(a, 10).is_empty(), "nor by the server that counted");
    enqueue(b, json!({"kind": "charge", "queue": "payments"}));

    let queues: Value = http()
        .get(format!("{b}/v1/queues"))
        .send()
        .expect("queues")
        .json()
        .expect("JSON");
    let breaker = &queues["breakers"][0];
    assert_eq!(
        (
            breaker["scope"].as_str(),
            breaker["name"].as_str(),
            breaker["state"].as_str()
        ),
        (Some("queue"), Some("payments"), Some("open")),
        "{queues}"
    );
    let metrics = http()
        .get(format!("{b}/metrics"))
        .send()
        .expect("metrics")
        .text()
        .expect("text");
    assert!(
        metrics.contains(r#"conveyor_circuit_breaker_state{name="payments",scope="queue"} 2"#),
        "{metrics}"
    );
    let listed = conveyor(&["queues", "--server", b]);
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(
        text.contains("circuit breaker of queue payments: open"),
        "{text}"
    );

    let closed = conveyor(&[
        "queue",
        "circuit",
        "payments",
        "close",
        "--reason",
        "vendor back",
        "--server",
        b,
    ]);
    assert!(
        closed.status.success(),
        "{}",
        String::from_utf8_lossy(&closed.stderr)
    );
    assert!(String::from_utf8_lossy(&closed.stdout).contains("closed (vendor back)"));
    eventually_blocking("jobs to be handed out again by the first server", || {
        let got = fetch(a, 10);
        (!got.is_empty()).then_some(got.len()).ok_or("nothing yet")
    });

    let audit: Value = http()
        .get(format!("{a}/v1/audit?limit=50"))
        .send()
        .expect("audit")
        .json()
        .expect("JSON");
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["target"] == "queue:payments")
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert!(actions.contains(&"breaker.open"), "{audit}");
    assert!(actions.contains(&"breaker.close"), "{audit}");

    // A kind's breaker through the CLI, opened by hand for a while.
    let kind = conveyor(&[
        "kind",
        "set",
        "charge",
        "--circuit-breaker",
        r#"{"min_calls": 5}"#,
        "--server",
        a,
    ]);
    assert!(
        kind.status.success(),
        "{}",
        String::from_utf8_lossy(&kind.stderr)
    );
    let opened = conveyor(&[
        "kind",
        "circuit",
        "charge",
        "open",
        "--open-ms",
        "60000",
        "--server",
        a,
        "--json",
    ]);
    let view: Value = serde_json::from_slice(&opened.stdout).expect("JSON");
    assert_eq!(
        (view["scope"].as_str(), view["state"].as_str()),
        (Some("kind"), Some("open"))
    );
    assert!(view["open_until"].is_string(), "{view}");
    // The server that opened it holds the kind at once; every other within a second.
    assert!(fetch(a, 10).is_empty(), "the kind is held");
    let breakers: Value = http()
        .get(format!("{b}/v1/breakers"))
        .send()
        .expect("breakers")
        .json()
        .expect("JSON");
    let charge = breakers["breakers"]
        .as_array()
        .expect("breakers")
        .iter()
        .find(|v| v["scope"] == "kind" && v["name"] == "charge")
        .cloned()
        .unwrap_or_default();
    assert_eq!(charge["state"], "open", "{breakers}");
    assert_eq!(charge["manual"], true);

    // Bad input: named field, non-zero exit, nothing changed.
    let bad = conveyor(&[
        "queue",
        "set",
        "payments",
        "--circuit-breaker",
        r#"{"failure_ratio": 3}"#,
        "--server",
        a,
    ]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("circuit_breaker.failure_ratio"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let response = http()
        .put(format!("{a}/v1/queues/payments"))
        .json(&json!({"circuit_breaker": {"min_calls": 0}}))
        .send()
        .expect("PUT");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().expect("JSON");
    assert_eq!(
        body["error"]["field"], "circuit_breaker.min_calls",
        "{body}"
    );
    let response = http()
        .post(format!("{a}/v1/queues/payments/circuit/close"))
        .json(&json!({"open_ms": 5}))
        .send()
        .expect("POST");
    assert_eq!(response.status(), 400);
    let body: Value = response.json().expect("JSON");
    assert_eq!(body["error"]["field"], "open_ms", "{body}");
    assert_eq!(circuit(a)["settings"]["min_calls"], 3, "settings untouched");
}
