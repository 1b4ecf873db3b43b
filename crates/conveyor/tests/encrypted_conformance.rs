//! The store conformance suite through `EncryptedStore` (over a fresh SQLite file per
//! behaviour): payload encryption must change nothing a store promises.

use base64::Engine;
use conveyor::{EncryptedStore, PayloadKeys};
use conveyor_core::ManualClock;
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use std::sync::Arc;

pub async fn make_harness() -> conveyor_storetest::Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let clock = Arc::new(ManualClock::default());
    let store = SqliteStore::open(
        dir.path().join("jobs.db"),
        SqliteOptions {
            clock: clock.clone(),
            ..SqliteOptions::default()
        },
    )
    .expect("open store");
    let key = base64::engine::general_purpose::STANDARD.encode([7u8; 32]);
    let keys = PayloadKeys::parse(&format!("k1:{key}")).expect("keys");
    let encrypted = EncryptedStore::new(Arc::new(store), Arc::new(keys));
    conveyor_storetest::Harness::new(Arc::new(encrypted), clock).with_cleanup(dir)
}

conveyor_storetest::conformance_tests!(make_harness);
