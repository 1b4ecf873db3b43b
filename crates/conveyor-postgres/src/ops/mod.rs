//! The store's operations, one file per noun (`reads`, `insert`, `queues`, `leases`, `admin`,
//! `leadership`), written against `&mut PgConnection` so the same SQL serves both the
//! pooled paths (the `Store` methods) and a caller's own transaction (`enqueue_tx`,
//! `complete_tx`). Semantics follow the SQLite reference store (`conveyor-sqlite/src/ops/`)
//! rule for rule; every change to a running job is conditional on
//! `state = 'running' AND lease_token = $token`.

use chrono::{DateTime, Utc};
use conveyor_core::clock::truncate_to_millis;
use conveyor_core::{
    CompleteParams, ErrorRecord, FailParams, FetchParams, HeartbeatParams, Inserted, Job,
    JobListParams, JobState, LeaseOutcome, LeaseRef, NamedQueueSettings, NewJob, QueueSettings,
    QueueStats, RateLimit, ReplaySelector, RescueParams, RescueReport, SnoozeParams, StoreError,
    StoreOptions, StoreResult, ValidationError,
};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::{corrupt, db};
use crate::names::{depth_lock_key, idempotency_lock_key};
use crate::rows;
use crate::sql::{Sql, COLUMNS};
use crate::unique;
use crate::workflow;
use conveyor_core::workflow::FlowEvent;

mod admin;
mod insert;
mod leadership;
mod leases;
mod queues;
mod reads;

pub(crate) use admin::*;
pub(crate) use insert::*;
pub(crate) use leadership::*;
pub(crate) use leases::*;
pub(crate) use queues::*;
pub(crate) use reads::*;

/// Most due jobs one promotion statement moves, so it stays a short transaction.
pub(crate) const PROMOTE_BATCH: i64 = 1_000;

/// What every operation needs besides its connection. `now` is read from the store's clock once
/// per operation and truncated to the milliseconds the store keeps.
pub(crate) struct Ctx<'a> {
    pub sql: &'a Sql,
    pub schema: &'a str,
    pub now: DateTime<Utc>,
    pub options: &'a StoreOptions,
    /// Where jobs a flow starts (`import_flow_jobs`) leave their queues' wake-ups instead of
    /// sending them in the transaction, for the caller to send once it has committed; `None`
    /// sends them in the transaction (see `complete_flow_jobs`).
    pub deferred_wakeups: Option<&'a std::sync::Mutex<std::collections::BTreeSet<String>>>,
    /// Where the jobs flows start (`import_flow_jobs`) wait for their transaction's commit, to
    /// be told of then (`Ctx::flows_committed`); `None` when nobody listens, or for operations
    /// that start no flow's job.
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

    fn keep(&self, jobs: impl IntoIterator<Item = Job>) {
        self.lock().extend(jobs.into_iter().map(|job| Inserted {
            job,
            duplicate: false,
        }));
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

/// `now + d`, or a validation error naming `field` when the sum leaves the calendar.
fn after(
    now: DateTime<Utc>,
    d: std::time::Duration,
    field: &'static str,
) -> StoreResult<DateTime<Utc>> {
    Ok(truncate_to_millis(conveyor_core::clock::checked_after(
        now, d, field,
    )?))
}

fn to_i32(value: u32, field: &'static str) -> StoreResult<i32> {
    i32::try_from(value).map_err(|_| ValidationError::new(field, "too large").into())
}

/// A lease as a hashable key (`LeaseRef` itself does not implement `Hash`).
type LeaseKey = (Uuid, Uuid);

fn lease_key(lease: &LeaseRef) -> LeaseKey {
    (lease.id, lease.lease_token)
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
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

/// Sums the per-queue counts returned by a statement ending in `notify_changed` (see `sql.rs`).
fn changed_count(rows: &[PgRow]) -> StoreResult<u64> {
    rows.iter().try_fold(0u64, |total, row| {
        let n: i64 = row.try_get("n").map_err(|e| corrupt(e.to_string()))?;
        Ok(total + n.max(0) as u64)
    })
}

// ---------------------------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------------------------
