//! Wake-ups across processes: a background task LISTENs on the schema's channel and wakes this
//! process's waiting fetchers whenever any process (this one included) commits a change that
//! made jobs available.

use conveyor_core::StoreResult;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

use crate::errors::db;

/// First wait after the listener fails; doubled on each failure in a row, up to the maximum.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// The running listener task; dropping it stops the task (and closes its connection).
pub(crate) struct ListenerTask {
    handle: JoinHandle<()>,
}

impl Drop for ListenerTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Connects, LISTENs on `channel`, and only then spawns the task, so that every notification
/// committed after this returns is seen.
///
/// The listener has a pool of its own (one connection): it holds its connection for as long as
/// it runs, which would otherwise take a slot from the store's pool for good.
pub(crate) async fn start(
    options: PgConnectOptions,
    channel: String,
    wakeup: Arc<Notify>,
) -> StoreResult<ListenerTask> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_with(options)
        .await
        .map_err(db("connect the wake-up listener"))?;
    let mut listener = PgListener::connect_with(&pool)
        .await
        .map_err(db("connect the wake-up listener"))?;
    // The pool is private to the listener and never closed while it runs.
    listener.ignore_pool_close_event(true);
    listener
        .listen(&channel)
        .await
        .map_err(db("LISTEN for wake-ups"))?;
    let handle = tokio::spawn(run(listener, channel, wakeup));
    Ok(ListenerTask { handle })
}

async fn run(mut listener: PgListener, channel: String, wakeup: Arc<Notify>) {
    let mut backoff = MIN_BACKOFF;
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) => {
                tracing::trace!(channel, queue = notification.payload(), "wake-up received");
                backoff = MIN_BACKOFF;
                wakeup.notify_waiters();
            }
            // The connection dropped and was re-established (listening again). Notifications
            // sent in between are lost, so wake every waiter to look for itself.
            Ok(None) => {
                tracing::warn!(
                    channel,
                    "wake-up listener reconnected after losing its connection"
                );
                wakeup.notify_waiters();
            }
            Err(error) => {
                tracing::warn!(
                    channel,
                    %error,
                    retry_in_ms = backoff.as_millis() as u64,
                    "wake-up listener failed; fetchers fall back to polling until it reconnects"
                );
                wakeup.notify_waiters();
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}
