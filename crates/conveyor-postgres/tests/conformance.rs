//! The store conformance suite, run against a real PostgreSQL, each behaviour in a fresh schema.

mod common;

use common::make_harness;

conveyor_storetest::conformance_tests!(make_harness);
