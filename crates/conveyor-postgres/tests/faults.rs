//! The fault-injection suite (`conveyor_storetest::faults`) against a real PostgreSQL, each
//! behaviour in a fresh schema: errors before commit roll the transaction back, panics unwind
//! through the caller and drop it.

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

conveyor_storetest::fault_tests!(make_harness);
