//! Conveyor's embedded store: a local SQLite file in WAL mode.
//!
//! Writes go through one writer thread with group commit (see `writer`); reads use a small pool
//! of connections on tokio's blocking threads. In [`Durability::Durable`] mode (the default) every
//! commit is fsync'd before any caller is answered.

mod access;
mod config;
mod copy;
mod errors;
mod fold;
mod jobs;
mod kinds;
mod limits;
mod migrate;
mod open;
mod ops;
mod retention;
mod rows;
mod schedules;
mod sequence;
mod stats;
mod traits;
mod turns;
mod unique;
mod workers;
mod workflow;
mod writer;

pub use open::{Durability, SqliteOptions, SqliteStore};
// The store's handles (the writer, the readers, `injected`) for the `Store` methods (`traits`).
pub(crate) use open::*;
pub(crate) use ops::reads;
