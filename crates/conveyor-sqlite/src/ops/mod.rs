//! The operations, one file per noun (`insert`, `leases`, `queues`, `admin`, `leadership`, and
//! `reads` for the read-only ones); the writes run on the writer thread inside a group-commit
//! round.
//! Every change to a running job is conditional on `state = 'running' AND lease_token = ?`.

use chrono::{DateTime, Utc};
use conveyor_core::clock;
use conveyor_core::{
    CompleteParams, ErrorRecord, FailParams, FetchParams, HeartbeatParams, Inserted, Job, JobState,
    Lease, LeaseOutcome, LeaseRef, NewJob, QueueSettings, RateLimit, ReplaySelector, RescueParams,
    RescueReport, SnoozeParams, StoreError, StoreResult,
};
use rusqlite::{params, OptionalExtension};
use uuid::Uuid;

use crate::backend;
use crate::limits;
use crate::rows::{self, millis, COLUMNS};
use crate::unique;
use crate::workflow;
use crate::writer::WriteCtx;
use conveyor_core::workflow::FlowEvent;

mod admin;
mod insert;
mod leadership;
mod leases;
mod queues;
pub(crate) mod reads;

pub(crate) use admin::*;
pub(crate) use insert::*;
pub(crate) use leadership::*;
pub(crate) use leases::*;
pub(crate) use queues::*;

fn json_text<T: serde::Serialize>(value: &T, field: &str) -> StoreResult<String> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::backend(format!("cannot serialize {field}: {e}")))
}

pub(crate) fn job_by_id(ctx: &WriteCtx<'_>, id: &str) -> StoreResult<Option<Job>> {
    ctx.conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"))
        .and_then(|mut stmt| stmt.query_row(params![id], rows::job).optional())
        .map_err(backend)
}
