//! The driver's errors as [`StoreError`]s, kept as their cause.

use conveyor_core::StoreError;

pub(crate) fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::backend_caused("sqlite", e)
}
