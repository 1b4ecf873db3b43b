//! Fault injection for the fault-injection suite (`conveyor-storetest`'s `faults`): named
//! points where a test can make a store or worker fail or panic (the `fail` crate). In every
//! build without the `fail/failpoints` feature, which only test builds turn on, a point is
//! nothing at all.
//!
//! The points, the same names in every store:
//! - `insert`, `fetch`, `complete`, `fail`, `rescue`, `schedule_fire`: the store operation of
//!   that name, after its work and before its commit where it has a transaction of its own
//!   (SQLite's every operation; PostgreSQL's insert, rescue and firing), else before its
//!   work (PostgreSQL's single-statement fetch, complete and fail);
//! - `sqlite_commit`: the SQLite writer's round commit (every operation of the round fails;
//!   a panic there kills the writer thread, which health reports);
//! - `worker_fetch`, `worker_complete`, `worker_heartbeat`: the Rust worker's calls.

use crate::error::StoreResult;

/// `Err(Backend)` when a test configured `name` to `return`; a panic for `panic`; else `Ok`.
#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
pub fn inject(name: &str) -> StoreResult<()> {
    #[cfg(feature = "failpoints")]
    use crate::error::StoreError;
    fail::fail_point!(name, |detail| Err(StoreError::backend(format!(
        "injected fault at {name}{}",
        detail.map(|d| format!(": {d}")).unwrap_or_default()
    ))));
    Ok(())
}
