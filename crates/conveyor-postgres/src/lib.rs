//! Conveyor's shared store: PostgreSQL.
//!
//! Many worker and server processes share one database. Claims use `FOR UPDATE SKIP LOCKED`, so
//! concurrent fetchers never claim a job twice and never wait for each other; every change to a
//! running job is conditional on its lease token. Wake-ups travel between processes over
//! `LISTEN`/`NOTIFY`. Every "now" comes from one [`Clock`] read once per operation: by default the
//! database server's (the module `clock`), which every server of a cluster shares, so no
//! server's own clock error decides a lease or a tick; an injected clock (the conformance
//! suite's manual one) is used as given.
//!
//! Besides the [`Store`] trait, [`PgStore::enqueue_tx`] and [`PgStore::complete_tx`] work inside
//! the application's own transaction: a job enqueued there exists if and only if the
//! application's transaction commits, and a job completed there is completed if and only if the
//! handler's own writes commit.
//!
//! ```no_run
//! # async fn demo() -> Result<(), conveyor_core::StoreError> {
//! use conveyor_postgres::{PgOptions, PgStore};
//! let store = PgStore::connect("postgres://postgres@127.0.0.1:5432/app", PgOptions::default()).await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod access;
mod clock;
mod config;
mod copy;
mod ctx;
mod errors;
mod jobs;
mod kinds;
mod limits;
mod listener;
mod migrate;
mod names;
mod open;
mod ops;
#[cfg(test)]
mod plan_tests;
mod retention;
mod rows;
mod schedules;
mod sql;
mod stats;
mod traits;
mod unique;
mod upkeep;
mod workers;
mod workflow;

pub use migrate::{migrate, SCHEMA_VERSION};
pub use open::{PgOptions, PgStore};
// The store's handles (pool, statements, `ctx()`, `commit`) for the `Store` methods (`traits`,
// `copy`).
pub(crate) use open::*;
