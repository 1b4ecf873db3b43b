//! The store conformance suite, run against a real PostgreSQL, each behaviour in a fresh schema.

mod common;

use conveyor_core::ManualClock;
use std::sync::Arc;

async fn make_harness() -> conveyor_storetest::Harness {
    let schema = common::fresh_schema();
    let guard = common::DropSchema::new(&schema);
    let clock = Arc::new(ManualClock::default());
    let store = common::connect(&schema, clock.clone()).await;
    conveyor_storetest::Harness::new(Arc::new(store), clock).with_cleanup(guard)
}

conveyor_storetest::conformance_tests!(make_harness);
