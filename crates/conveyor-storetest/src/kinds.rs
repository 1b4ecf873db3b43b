//! Settings per job kind: payload schemas kept by the store and enforced by the registry.

use std::sync::Arc;

use conveyor_core::kinds::{KindSchema, KindSettings};
use conveyor_core::{JobOptions, StoreError, TypedJob};
use conveyor_engine::Client;
use conveyor_engine::{queued_violations, KindRegistry};
use serde_json::json;

use crate::kit::{fetch, insert, Harness};

fn settings(kind: &str, schema: Option<serde_json::Value>, version: Option<u32>) -> KindSettings {
    KindSettings {
        kind: kind.to_string(),
        schema,
        version,
        circuit_breaker: None,
        limits: Vec::new(),
        sequence: None,
        batch: None,
        updated_at: chrono::DateTime::UNIX_EPOCH,
    }
}

/// A kind's settings round-trip with the store's clock as `updated_at`; put replaces, list is
/// by name, delete removes; a schema that does not compile and a bad kind name are refused
/// naming the field, leaving what was stored.
pub async fn kind_settings_round_trip_and_refuse_bad_schemas(h: &Harness) {
    let store = &h.store;
    assert_eq!(store.kind_get("email").await.expect("get"), None);
    let schema = json!({"type": "object", "required": ["to"]});
    let stored = store
        .kind_put(settings("email", Some(schema.clone()), Some(1)))
        .await
        .expect("put");
    assert_eq!(stored.schema, Some(schema.clone()));
    assert_eq!(stored.updated_at, h.now());
    store
        .kind_put(settings("audit", None, None))
        .await
        .expect("put a kind without schema");
    let replaced = json!({"type": "object", "required": ["to", "subject"]});
    store
        .kind_put(settings("email", Some(replaced.clone()), Some(2)))
        .await
        .expect("replace");
    let listed = store.kinds_list().await.expect("list");
    let names: Vec<&str> = listed.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!(names, ["audit", "email"]);
    let email = store.kind_get("email").await.expect("get").expect("stored");
    assert_eq!(
        (email.schema, email.version),
        (Some(replaced.clone()), Some(2))
    );

    for (bad, field) in [
        (settings("email", Some(json!({"type": 12})), None), "schema"),
        (settings("email", Some(json!("a string")), None), "schema"),
        (settings("", Some(json!({})), None), "kind"),
    ] {
        match store.kind_put(bad).await {
            Err(StoreError::Invalid(e)) => assert_eq!(e.field, field),
            other => panic!("expected a validation error on {field}, got {other:?}"),
        }
    }
    let email = store.kind_get("email").await.expect("get").expect("kept");
    assert_eq!(
        email.schema,
        Some(replaced),
        "a refused put changes nothing"
    );

    assert!(store.kind_delete("email").await.expect("delete"));
    assert!(!store.kind_delete("email").await.expect("delete again"));
    assert_eq!(store.kind_get("email").await.expect("get"), None);
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Signup {
    user_id: serde_json::Value,
}

impl TypedJob for Signup {
    const KIND: &'static str = "signup";
}

/// The registry enforces a stored schema on the Rust client's enqueues (naming the pointer),
/// sees a schema set through another registry once it is a refresh old, and counts the queued
/// jobs a stricter schema would reject.
pub async fn kind_schema_is_enforced_on_enqueue_and_counts_queued_violations(h: &Harness) {
    let store = &h.store;
    let client = Client::new(store.clone());
    // Jobs queued before any schema: one a later schema rejects.
    client
        .enqueue(Signup { user_id: json!(1) })
        .await
        .expect("no schema yet");
    client
        .enqueue(Signup {
            user_id: json!("x"),
        })
        .await
        .expect("no schema yet");

    let schema = json!({"type": "object", "properties": {"user_id": {"type": "integer"}}});
    let compiled = KindSchema::compile(&schema).expect("compiles");
    let violations = queued_violations(store.as_ref(), "signup", &compiled)
        .await
        .expect("count");
    assert_eq!((violations.checked, violations.failing), (2, 1));
    let (_, why) = violations.first.expect("the failing job is named");
    assert!(why.starts_with("payload/user_id"), "{why}");

    store
        .kind_put(settings("signup", Some(schema), None))
        .await
        .expect("put");
    client.kinds().invalidate();
    match client
        .enqueue_with(
            Signup {
                user_id: json!("seven"),
            },
            JobOptions::default(),
        )
        .await
    {
        Err(StoreError::Invalid(e)) => assert_eq!(e.field, "payload/user_id"),
        other => panic!("expected the schema to refuse the payload, got {other:?}"),
    }
    client
        .enqueue(Signup { user_id: json!(7) })
        .await
        .expect("a matching payload is stored");
    // Other kinds are not checked.
    insert(
        h,
        conveyor_core::NewJob::new("other", json!({"user_id": "free"})),
    )
    .await;

    // A registry that read the kinds before a change sees it once a refresh old.
    let other = Arc::new(KindRegistry::new(store.clone()));
    other
        .check("signup", &json!({"user_id": 1}))
        .await
        .expect("valid");
    store.kind_delete("signup").await.expect("delete");
    crate::eventually::eventually("the other registry sees the schema deleted", || async {
        other
            .check("signup", &json!({"user_id": "x"}))
            .await
            .is_ok()
    })
    .await;

    // The store kept exactly the accepted jobs.
    assert_eq!(fetch(h, &["default"], 10).await.len(), 4);
}
