//! Payload encryption at rest on real stores: the bytes in the store are not the plaintext,
//! every read returns the plaintext, rotation keeps old jobs readable, unique jobs still work.

mod common;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use common::{pg_base, Schema};
use conveyor::{open_store, NewJob, OpenOptions, PayloadKeys, Store, UniqueSpec};
use serde_json::json;
use std::sync::Arc;

const MARKER: &str = "plaintext-marker-4111-1111";

fn keys(spec: &[(&str, u8)]) -> Option<Arc<PayloadKeys>> {
    let text: Vec<String> = spec
        .iter()
        .map(|(id, byte)| format!("{id}:{}", BASE64.encode([*byte; 32])))
        .collect();
    Some(Arc::new(PayloadKeys::parse(&text.join(",")).expect("keys")))
}

async fn open(url: &str, payload_keys: Option<Arc<PayloadKeys>>) -> Arc<dyn Store> {
    open_store(
        url,
        OpenOptions {
            payload_keys,
            ..OpenOptions::default()
        },
    )
    .await
    .expect("open store")
}

fn secret_job() -> NewJob {
    NewJob::new("charge", json!({"card": MARKER, "amount": 12}))
}

/// The same story on any store URL; returns the ids of (old, new) jobs.
async fn encrypts_and_rotates(url: &str) -> (uuid::Uuid, uuid::Uuid) {
    let old_keys = keys(&[("k1", 1)]);
    let store = open(url, old_keys).await;
    let inserted = store
        .jobs_insert_many(vec![secret_job()])
        .await
        .expect("insert");
    let old_id = inserted[0].job.id;
    assert_eq!(
        inserted[0].job.payload["card"], MARKER,
        "callers see plaintext"
    );
    assert_eq!(
        store
            .job_get(old_id)
            .await
            .expect("get")
            .expect("job")
            .payload["card"],
        MARKER
    );
    drop(store);

    // Without keys the store shows what it holds: an envelope naming the key.
    let plain = open(url, None).await;
    let stored = plain
        .job_get(old_id)
        .await
        .expect("get")
        .expect("job")
        .payload;
    assert!(!stored.to_string().contains(MARKER), "{stored}");
    assert_eq!(stored["key"], "k1");
    drop(plain);

    // Rotation: a new key first, the old one kept for reading.
    let rotated = open(url, keys(&[("k2", 2), ("k1", 1)])).await;
    let old = rotated.job_get(old_id).await.expect("get").expect("job");
    assert_eq!(old.payload["card"], MARKER, "old jobs stay readable");
    let new_id = rotated
        .jobs_insert_many(vec![secret_job()])
        .await
        .expect("insert")[0]
        .job
        .id;
    // Fetching hands the worker the plaintext.
    let fetched = rotated
        .jobs_fetch(conveyor::FetchParams {
            worker_id: "w".to_string(),
            queues: vec!["default".to_string()],
            max: 10,
            lease: std::time::Duration::from_secs(30),
            kinds: None,
            excluded_kinds: Vec::new(),
        })
        .await
        .expect("fetch");
    assert_eq!(fetched.len(), 2);
    assert!(fetched.iter().all(|job| job.payload["card"] == MARKER));
    drop(rotated);
    let plain = open(url, None).await;
    let stored = plain
        .job_get(new_id)
        .await
        .expect("get")
        .expect("job")
        .payload;
    assert_eq!(stored["key"], "k2", "new writes use the newest key");
    (old_id, new_id)
}

/// Unique jobs keep working although the store cannot read the payload.
async fn unique_jobs_still_deduplicate(url: &str) {
    let store = open(url, keys(&[("k1", 1)])).await;
    let unique = |amount: u32| {
        let mut job = NewJob::new("invoice", json!({"customer": "acme", "amount": amount}));
        job.unique = Some(UniqueSpec::by_args(["customer"]));
        job
    };
    let first = store
        .jobs_insert_many(vec![unique(1)])
        .await
        .expect("insert");
    let second = store
        .jobs_insert_many(vec![unique(2)])
        .await
        .expect("insert");
    assert!(!first[0].duplicate);
    assert!(second[0].duplicate, "same customer: a duplicate");
    assert_eq!(second[0].job.id, first[0].job.id);
    let mut other = unique(1);
    other.payload["customer"] = json!("globex");
    assert!(!store.jobs_insert_many(vec![other]).await.expect("insert")[0].duplicate);
}

#[tokio::test]
async fn sqlite_payloads_are_encrypted_at_rest_and_keys_rotate() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("jobs.db");
    let url = format!("sqlite://{}", path.display());
    encrypts_and_rotates(&url).await;
    unique_jobs_still_deduplicate(&url).await;
    // The database files themselves never contain the plaintext. (The closed stores' writer
    // threads may still be removing their -wal and -shm files: one that vanished holds nothing.)
    for entry in std::fs::read_dir(dir.path()).expect("dir") {
        let bytes = match std::fs::read(entry.expect("entry").path()) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
            Err(error) => panic!("read: {error}"),
        };
        assert!(
            !bytes.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()),
            "plaintext found in a database file"
        );
    }
}

#[tokio::test]
async fn postgres_payloads_are_encrypted_at_rest_and_keys_rotate() {
    let schema = Schema::fresh("enc");
    let url = schema.url();
    let (old_id, _) = encrypts_and_rotates(&url).await;
    unique_jobs_still_deduplicate(&url).await;
    // What PostgreSQL holds, read with psql rather than through Conveyor.
    let out = std::process::Command::new("psql")
        .args([
            &pg_base(),
            "-tA",
            "-c",
            &format!(
                "SELECT payload::text FROM {}.jobs WHERE id = '{old_id}'",
                schema.0
            ),
        ])
        .output()
        .expect("psql");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("$conveyor_enc"), "{text}");
    assert!(!text.contains(MARKER));
}
