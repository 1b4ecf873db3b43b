//! A value a process reads from its store and keeps for a while, shared by every caller: the
//! payload schemas (`kinds::KindRegistry`) and the circuit breakers (`breaker::CircuitBreakers`).

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use conveyor_core::error::StoreResult;

struct Stamped<T> {
    /// `None`: never loaded, or forgotten.
    loaded_at: Option<Instant>,
    value: Arc<T>,
}

/// A value re-read when older than `max_age`; one reload at a time, callers that find it
/// stale wait for that one.
pub(crate) struct Refreshed<T> {
    max_age: Duration,
    current: RwLock<Arc<Stamped<T>>>,
    reloading: tokio::sync::Mutex<()>,
}

impl<T: Default> Refreshed<T> {
    pub(crate) fn new(max_age: Duration) -> Self {
        Self {
            max_age,
            current: RwLock::new(Arc::new(Stamped {
                loaded_at: None,
                value: Arc::new(T::default()),
            })),
            reloading: tokio::sync::Mutex::new(()),
        }
    }

    fn stamped(&self) -> Arc<Stamped<T>> {
        // The cell holds plain data; a panic elsewhere while holding it leaves it usable.
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn store(&self, stamped: Stamped<T>) {
        let stamped = Arc::new(stamped);
        match self.current.write() {
            Ok(mut guard) => *guard = stamped,
            Err(poisoned) => *poisoned.into_inner() = stamped,
        }
    }

    fn fresh(&self, stamped: &Stamped<T>) -> Option<Arc<T>> {
        stamped
            .loaded_at
            .is_some_and(|at| at.elapsed() < self.max_age)
            .then(|| stamped.value.clone())
    }

    /// The value as last loaded (the default before the first load), however old.
    pub(crate) fn last(&self) -> Arc<T> {
        self.stamped().value.clone()
    }

    /// The value, reloaded with `load` first when it is older than `max_age`.
    pub(crate) async fn get<F, Fut>(&self, load: F) -> StoreResult<Arc<T>>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = StoreResult<T>>,
    {
        if let Some(value) = self.fresh(&self.stamped()) {
            return Ok(value);
        }
        let _reload = self.reloading.lock().await;
        // Another caller may have reloaded while this one waited.
        if let Some(value) = self.fresh(&self.stamped()) {
            return Ok(value);
        }
        let value = Arc::new(load().await?);
        self.store(Stamped {
            loaded_at: Some(Instant::now()),
            value: value.clone(),
        });
        Ok(value)
    }

    /// Replaces the value without making it any younger (a change this process made itself).
    pub(crate) fn update(&self, change: impl FnOnce(&T) -> T) {
        let old = self.stamped();
        self.store(Stamped {
            loaded_at: old.loaded_at,
            value: Arc::new(change(&old.value)),
        });
    }

    /// Marks the value stale: the next [`Refreshed::get`] loads it again ([`Refreshed::last`]
    /// still answers it meanwhile).
    pub(crate) fn invalidate(&self) {
        let old = self.stamped();
        self.store(Stamped {
            loaded_at: None,
            value: old.value.clone(),
        });
    }
}
