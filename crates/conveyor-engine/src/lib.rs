//! The services a running process keeps above its store: the part of Conveyor that does I/O
//! but is not a store. Every one reads and writes only through the [`conveyor_core::Store`]
//! traits, so each runs the same on every store; `conveyor-core` stays free of I/O.
//!
//! - [`CircuitBreakers`]: gates fetches on the cluster's breakers, counts finished attempts
//!   and writes the counts in the background.
//! - [`KindRegistry`]: the kinds' settings as last read: payload schemas checked on every
//!   enqueue, and which kinds go out in batches.
//! - [`StatsRecorder`]: per-minute history counts kept in memory and merged into the store.
//! - [`Client`]: the typed producer.
//! - [`fetch_waiting`]: the long-poll behind `POST /v1/fetch` and the worker's fetch loop;
//!   [`batches`]: how a batch fetch picks and claims one batch.
//! - [`WorkerCommands`]: operators' commands to workers, as last read.
//! - [`report::attempt_finished`]: the one place a finished attempt is told to the metrics,
//!   the history and the breakers.

pub mod batches;
pub mod breakers;
pub mod client;
pub mod events;
pub mod kinds;
pub mod limits;
mod refreshed;
pub mod report;
pub mod stats;
pub mod waiting;
pub mod workers;

pub use breakers::CircuitBreakers;
pub use client::Client;
pub use kinds::{queued_violations, KindRegistry, QueuedViolations, QUEUED_STATES};
pub use limits::LimitStamps;
pub use stats::StatsRecorder;
pub use waiting::{fetch_waiting, fetch_waiting_with, Gates, IdleLooks, IDLE_POLL_GROWTH};
pub use workers::WorkerCommands;
