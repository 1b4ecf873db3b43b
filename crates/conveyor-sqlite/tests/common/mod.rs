//! Shared by the integration tests: a fresh store in a temp dir per harness.

use conveyor_core::{ManualClock, Store};
use conveyor_sqlite::{SqliteOptions, SqliteStore};
use std::sync::Arc;

/// A conformance harness on a fresh SQLite file (deleted with the harness), driven by a
/// manual clock.
#[allow(dead_code)] // each test binary uses its own subset of this module
pub async fn make_harness() -> conveyor_storetest::Harness {
    make_wrapped_harness(|store| store).await
}

/// The same, with the store seen through `wrap` (a decorator under test).
#[allow(dead_code)] // each test binary uses its own subset of this module
pub async fn make_wrapped_harness(
    wrap: impl FnOnce(Arc<dyn Store>) -> Arc<dyn Store>,
) -> conveyor_storetest::Harness {
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
    conveyor_storetest::Harness::new(wrap(Arc::new(store)), clock).with_cleanup(dir)
}
