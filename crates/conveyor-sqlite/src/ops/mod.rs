//! The operations, one file per noun (`insert`, `leases`, `queues`, `admin`, `leadership`, and
//! `reads` for the read-only ones); the writes run on the writer thread inside a group-commit
//! round.
//! Every change to a running job is conditional on `state = 'running' AND lease_token = ?`.
//!
//! They call down into the flows (`workflow`), the limited claim (`limits`) and unique keys
//! (`unique`), which never call back: what both sides need lives below all of them (the
//! round's context in `writer`, single jobs in `jobs`, mapping rows in `rows`).

use chrono::{DateTime, Utc};
use conveyor_core::clock;
use conveyor_core::{
    CompleteParams, ErrorRecord, FailParams, FetchParams, HeartbeatParams, Inserted, Job, JobState,
    Lease, LeaseOutcome, LeaseRef, NewJob, QueueSettings, RateLimit, ReplaySelector, RescueParams,
    RescueReport, SnoozeParams, StoreError, StoreResult,
};
use rusqlite::{params, OptionalExtension};
use uuid::Uuid;

use crate::errors::backend;
use crate::jobs::{cancel_unhooked, insert_row, job_by_id};
use crate::limits;
use crate::rows::{self, json_text, millis, COLUMNS};
use crate::sequence;
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
