//! The store's operations, one file per noun (`reads`, `insert`, `queues`, `leases`, `admin`,
//! `leadership`), written against `&mut PgConnection` so the same SQL serves both the
//! pooled paths (the `Store` methods) and a caller's own transaction (`enqueue_tx`,
//! `complete_tx`). Semantics follow the SQLite reference store (`conveyor-sqlite/src/ops/`)
//! rule for rule; every change to a running job is conditional on
//! `state = 'running' AND lease_token = $token`.
//!
//! They call down into the flows (`workflow`), the limited claim (`limits`) and unique keys
//! (`unique`), which never call back: what both sides need lives below all of them (the
//! context with its locks and wake-ups in `ctx`, storing jobs as given in `jobs`, decoding rows
//! in `rows`, the statements in `sql`).

use chrono::{DateTime, Utc};
use conveyor_core::clock::truncate_to_millis;
use conveyor_core::{
    CompleteParams, ErrorRecord, FailParams, FetchParams, HeartbeatParams, Inserted, Job,
    JobListParams, JobState, LeaseOutcome, LeaseRef, NamedQueueSettings, NewJob, QueueSettings,
    QueueStats, ReplaySelector, RescueParams, RescueReport, SnoozeParams, StoreError, StoreResult,
};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::str::FromStr;
use uuid::Uuid;

use crate::ctx::{lock_in_order, notify, Ctx};
use crate::errors::{corrupt, db};
use crate::jobs::{store_exactly, to_i32};
use crate::names::{depth_lock_key, fold_lock_key, idempotency_lock_key};
use crate::rows::{self, count_of, limit, settings_of};
use crate::sql::{Sql, COLUMNS};
use crate::unique;
use crate::workflow;
use conveyor_core::sequence::OnDead;
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

/// A lease as a hashable key (`LeaseRef` itself does not implement `Hash`).
type LeaseKey = (Uuid, Uuid);

fn lease_key(lease: &LeaseRef) -> LeaseKey {
    (lease.id, lease.lease_token)
}

/// Sums the per-queue counts returned by a statement ending in `notify_changed` (see `sql.rs`).
fn changed_count(rows: &[PgRow]) -> StoreResult<u64> {
    rows.iter().try_fold(0u64, |total, row| {
        let n: i64 = row.try_get("n").map_err(|e| corrupt(e.to_string()))?;
        Ok(total + n.max(0) as u64)
    })
}
