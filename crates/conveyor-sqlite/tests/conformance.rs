//! The store conformance suite, run against a fresh SQLite file per behaviour.

mod common;

use common::make_harness;

conveyor_storetest::conformance_tests!(make_harness);
