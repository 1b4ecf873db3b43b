//! Shared by the integration tests: a fresh store in a temp dir per harness.

use conveyor_core::ManualClock;
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use std::sync::Arc;

/// A conformance harness on a fresh SQLite file (deleted with the harness), driven by a
/// manual clock.
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
    conveyor_storetest::Harness::new(Arc::new(store), clock).with_cleanup(dir)
}
