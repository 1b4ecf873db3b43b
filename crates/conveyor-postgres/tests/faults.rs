//! The fault-injection suite (`conveyor_storetest::faults`) against a real PostgreSQL, each
//! behaviour in a fresh schema: errors before commit roll the transaction back, panics unwind
//! through the caller and drop it.

mod common;

use common::make_harness;

conveyor_storetest::fault_tests!(make_harness);
