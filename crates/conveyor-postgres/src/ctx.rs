//! What every operation runs with: its context ([`Ctx`]) and the transaction-scoped helpers
//! (advisory locks in order, wake-ups) that the operations (`ops`) and the nouns they call
//! (flows, limits, unique keys) share. It names none of them, so the operations call down into
//! the nouns and the nouns never call back up.

use chrono::{DateTime, Utc};
use conveyor_core::{Inserted, Job, StoreOptions, StoreResult};
use sqlx::PgConnection;

use crate::errors::db;
use crate::sql::Sql;

/// What every operation needs besides its connection. `now` is read from the store's clock once
/// per operation and truncated to the milliseconds the store keeps.
pub(crate) struct Ctx<'a> {
    pub sql: &'a Sql,
    pub schema: &'a str,
    pub now: DateTime<Utc>,
    pub options: &'a StoreOptions,
    /// Where jobs a flow starts (`workflow::import_flow_jobs`) leave their queues' wake-ups
    /// instead of sending them in the transaction, for the caller to send once it has
    /// committed; `None` sends them in the transaction (see `ops::complete_flow_jobs`).
    pub deferred_wakeups: Option<&'a std::sync::Mutex<std::collections::BTreeSet<String>>>,
    /// Where the jobs flows start (`workflow::import_flow_jobs`) wait for their transaction's
    /// commit, to be told of then (`Ctx::flows_committed`); `None` when nobody listens, or for
    /// operations that start no flow's job.
    pub flow_started: Option<std::sync::Arc<FlowStarted>>,
}

impl Ctx<'_> {
    /// Tells of the jobs flows started in the transaction just committed (see
    /// `conveyor_core::FlowStarts`). Called after every commit of a transaction that can start
    /// them; in a caller's transaction (`complete_tx`), where the store cannot see the commit,
    /// when the operation returns.
    pub(crate) fn flows_committed(&self) {
        if let Some(started) = &self.flow_started {
            started.committed();
        }
    }

    /// Forgets the jobs flows started in a transaction rolled back.
    pub(crate) fn flows_rolled_back(&self) {
        if let Some(started) = &self.flow_started {
            started.take();
        }
    }
}

/// The jobs flows started in an operation's transaction, kept until it commits.
pub(crate) struct FlowStarted {
    starts: std::sync::Arc<conveyor_core::FlowStarts>,
    pending: std::sync::Mutex<Vec<Inserted>>,
}

impl FlowStarted {
    pub(crate) fn new(starts: std::sync::Arc<conveyor_core::FlowStarts>) -> Self {
        Self {
            starts,
            pending: std::sync::Mutex::default(),
        }
    }

    pub(crate) fn keep(&self, jobs: impl IntoIterator<Item = Job>) {
        self.lock().extend(jobs.into_iter().map(Inserted::new));
    }

    fn take(&self) -> Vec<Inserted> {
        std::mem::take(&mut *self.lock())
    }

    fn committed(&self) {
        self.starts.started(&self.take());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Inserted>> {
        // A push or a take leaves nothing half-done: a poisoned list is still whole.
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Takes the transaction-scoped advisory locks `keys` (in ascending order, each once, so two
/// transactions locking overlapping sets never deadlock). `what` names them in errors.
pub(crate) async fn lock_in_order(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    mut keys: Vec<i64>,
    what: &'static str,
) -> StoreResult<()> {
    if keys.is_empty() {
        return Ok(());
    }
    keys.sort_unstable();
    keys.dedup();
    sqlx::query(ctx.sql.lock_keys.clone())
        .bind(&keys)
        .execute(conn)
        .await
        .map_err(db(what))?;
    Ok(())
}

/// Sends one NOTIFY per queue on the schema's channel, delivered when the transaction commits.
pub(crate) async fn notify(
    conn: &mut PgConnection,
    sql: &Sql,
    queues: &[String],
) -> StoreResult<()> {
    if queues.is_empty() {
        return Ok(());
    }
    sqlx::query(sql.notify.clone())
        .bind(&sql.channel)
        .bind(queues)
        .execute(conn)
        .await
        .map_err(db("notify"))?;
    Ok(())
}
