//! Shared configuration (`ConfigStore`): named JSON documents by collection.

use conveyor_core::StoreError;
use serde_json::json;

use crate::kit::Harness;

/// Documents round-trip by collection and name with the store's clock as `updated_at`; put
/// replaces, list is by name within one collection only, delete removes; bad names and a NUL
/// in a document are refused naming the field, leaving what was stored.
pub async fn config_documents_round_trip_by_collection(h: &Harness) {
    let store = &h.store;
    assert_eq!(
        store.config_get("sources", "orders").await.expect("get"),
        None
    );
    let first = json!({"type": "redis_stream", "stream": "orders", "nested": {"n": [1, 2]}});
    let stored = store
        .config_put("sources", "orders", first.clone())
        .await
        .expect("put");
    assert_eq!(stored.document, first);
    assert_eq!(stored.updated_at, h.now());
    store
        .config_put("sources", "audit", json!({"type": "amqp"}))
        .await
        .expect("put");
    store
        .config_put("hooks", "orders", json!({"scheme": "github"}))
        .await
        .expect("another collection");

    h.advance(std::time::Duration::from_secs(5));
    let replaced = json!({"type": "redis_stream", "stream": "orders-2"});
    store
        .config_put("sources", "orders", replaced.clone())
        .await
        .expect("replace");
    let got = store
        .config_get("sources", "orders")
        .await
        .expect("get")
        .expect("stored");
    assert_eq!(got.document, replaced);
    assert_eq!(got.updated_at, h.now());
    let names: Vec<String> = store
        .config_list("sources")
        .await
        .expect("list")
        .into_iter()
        .map(|entry| entry.name)
        .collect();
    assert_eq!(names, ["audit", "orders"]);

    for (collection, name, field) in [("sources", "no spaces", "name"), ("", "x", "collection")] {
        match store.config_put(collection, name, json!({})).await {
            Err(StoreError::Invalid(error)) => assert_eq!(error.field, field),
            other => panic!("{collection:?}/{name:?}: {other:?}"),
        }
    }
    match store
        .config_put("sources", "orders", json!({"url": "a\u{0}b"}))
        .await
    {
        Err(StoreError::Invalid(error)) => assert!(error.field.starts_with("document"), "{error}"),
        other => panic!("a NUL was stored: {other:?}"),
    }
    assert_eq!(
        store
            .config_get("sources", "orders")
            .await
            .expect("get")
            .map(|entry| entry.document),
        Some(replaced)
    );

    assert!(store
        .config_delete("sources", "orders")
        .await
        .expect("delete"));
    assert!(!store
        .config_delete("sources", "orders")
        .await
        .expect("again"));
    assert_eq!(
        store.config_get("sources", "orders").await.expect("get"),
        None
    );
    assert!(store
        .config_get("hooks", "orders")
        .await
        .expect("get")
        .is_some());
}
