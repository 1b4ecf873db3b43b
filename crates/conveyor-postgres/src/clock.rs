//! The database server's clock, by which every server of a cluster decides time.
//!
//! Every time decision of this store (lease expiry and renewal, rescue, stale workers, due
//! jobs, expiry, schedule ticks, rate windows, retention, leadership) compares times that
//! different servers wrote. Read from each server's own wall clock, one server's error becomes
//! a wrong decision on another: a leader 90 s fast rescues a live lease within a second of its
//! claim, and the job runs twice. So the store reads time from the one clock every server
//! shares, the database server's, as River, Oban and graphile-worker do.
//!
//! Reading `now()` inside each statement would be exact, but many decisions are made in Rust
//! from a time (backoff, windows, the values bound into statements), and a `SELECT now()`
//! before each operation would add a round trip to every claim and completion. Instead the
//! store reads `clock_timestamp()` at connect and every [`REFRESH`] after, and carries it
//! forward on this machine's steady clock ([`conveyor_core::clock::steady`]), which no step of
//! the local wall clock moves. The error is half the reading's round trip (the best of
//! [`READINGS`]) plus the steady clock's drift over one refresh: well under a millisecond on a
//! LAN, and the local wall clock never enters. A step of the database server's own clock
//! reaches the store at the next refresh.

use chrono::{DateTime, Utc};
use conveyor_core::clock::steady;
use conveyor_core::{AnchoredClock, StoreResult};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

use crate::errors::db;

/// How often the database's clock is read again.
pub(crate) const REFRESH: Duration = Duration::from_secs(2);
/// Readings per refresh; the one with the shortest round trip is kept.
pub(crate) const READINGS: usize = 3;

/// The refreshing task; dropping it stops the task.
pub(crate) struct ClockTask {
    handle: JoinHandle<()>,
}

impl Drop for ClockTask {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

/// Reads the database's clock (failing if it cannot, as connecting does) and starts refreshing it.
pub(crate) async fn start(pool: &PgPool) -> StoreResult<(Arc<AnchoredClock>, ClockTask)> {
    let (at, read_at) = read(pool).await.map_err(db("read the database's clock"))?;
    let clock = Arc::new(AnchoredClock::new(at, read_at));
    let handle = tokio::spawn(refresh(pool.clone(), clock.clone()));
    Ok((clock, ClockTask { handle }))
}

async fn refresh(pool: PgPool, clock: Arc<AnchoredClock>) {
    let mut failing = false;
    loop {
        tokio::time::sleep(REFRESH).await;
        match read(&pool).await {
            Ok((at, read_at)) => {
                clock.set(at, read_at);
                failing = false;
            }
            // The clock goes on from its last reading; said once per outage, not every refresh.
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(%error, "cannot read the database's clock; going on from the last reading");
            }
            Err(_) => {}
        }
    }
}

/// The database's `clock_timestamp()` and the steady instant it corresponds to: the middle of
/// the round trip with the shortest of [`READINGS`] round trips on one connection.
async fn read(pool: &PgPool) -> Result<(DateTime<Utc>, Duration), sqlx::Error> {
    let mut conn = pool.acquire().await?;
    let mut best: Option<(Duration, DateTime<Utc>, Duration)> = None;
    for _ in 0..READINGS {
        let sent = steady();
        let at: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&mut *conn)
            .await?;
        let trip = steady().saturating_sub(sent);
        if best.is_none_or(|(shortest, _, _)| trip < shortest) {
            best = Some((trip, at, sent + trip / 2));
        }
    }
    best.map(|(_, at, read_at)| (at, read_at))
        .ok_or_else(|| sqlx::Error::Protocol("no reading of the database's clock".into()))
}
