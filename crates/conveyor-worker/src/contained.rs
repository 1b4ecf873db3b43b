//! Store calls whose panics become errors, for the loops that must outlive them.

/// A store call whose panic (a bug in a store, an injected fault) becomes an error: the fetch
/// loop, completer and heartbeat task then retry as they do after any store error, instead of
/// dying and leaving the worker fetching jobs it can no longer finish or keep leased.
pub(crate) async fn contained<T>(
    call: impl std::future::Future<Output = conveyor_core::StoreResult<T>>,
) -> conveyor_core::StoreResult<T> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(call).catch_unwind().await {
        Ok(outcome) => outcome,
        Err(panic) => {
            let text = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_string());
            Err(conveyor_core::StoreError::Internal(format!(
                "store call panicked: {text}"
            )))
        }
    }
}
