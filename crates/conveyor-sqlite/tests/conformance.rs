//! The store conformance suite, run against a fresh SQLite file per behaviour.

use conveyor_core::ManualClock;
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use std::sync::Arc;

async fn make_harness() -> conveyor_storetest::Harness {
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
    conveyor_storetest::Harness::new(Arc::new(store), clock).with_cleanup(dir)
}

conveyor_storetest::conformance_tests!(make_harness);
