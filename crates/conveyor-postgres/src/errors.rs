//! Mapping sqlx errors onto [`StoreError`], saying which operation failed.

use conveyor_core::StoreError;

/// Wraps an sqlx error from `operation` as a [`StoreError`]. A closed pool means the store was
/// shut down; everything else (lost connection, constraint violation, timeout) is a backend error
/// whose message names the operation, so a log line says what was being attempted.
pub(crate) fn db(operation: &'static str) -> impl Fn(sqlx::Error) -> StoreError {
    move |error| match error {
        sqlx::Error::PoolClosed => StoreError::Closed,
        sqlx::Error::PoolTimedOut => StoreError::backend(format!(
            "postgres: {operation}: timed out waiting for a free connection from the pool"
        )),
        other => StoreError::backend_caused(format!("postgres: {operation}"), other),
    }
}

/// A backend error for a row whose stored value cannot be turned back into a job.
pub(crate) fn corrupt(what: impl std::fmt::Display) -> StoreError {
    StoreError::backend(format!("postgres: unreadable job row: {what}"))
}
