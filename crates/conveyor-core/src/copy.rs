//! `conveyor store copy`: moving every kind of durable state from one store to another.
//!
//! The rules live here, once: what is copied, in which order, page by page, counting what was
//! read, written and already there. Stores only export pages of their rows and import rows
//! exactly as given ([`CopyStore`]), leaving alone a row whose key they already hold, so a
//! copy run twice (or resumed after a failure) doubles nothing.
//!
//! Records are the store's own content, not a view of it: a payload a decorator encrypted is
//! exported as the ciphertext the store holds and imported as such (decorators forward
//! [`CopyStore`] untouched), and a flow step is exported with the state it has (a step whose
//! completion only its job records is exported completed), so either store reads it as the
//! other did.
//!
//! Not copied, deliberately: browser sessions (short-lived, and bound to the origin's cookie),
//! the worker registry (live processes re-register with the store they run against),
//! maintenance leadership (a lease of the old cluster), per-queue state counts (each store
//! keeps its own, from the jobs imported) and rate-limit start times (a window of seconds).

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::future::Future;
use uuid::Uuid;

use crate::access::{AuditEntry, StoredToken};
use crate::breaker::StoredBreaker;
use crate::error::StoreResult;
use crate::job::{Job, NamedQueueSettings};
use crate::kinds::KindSettings;
use crate::schedule::RunStatus;
use crate::stats::Rollup;
use crate::workflow::{
    CompensationState, FlowFailurePolicy, FlowState, ParentFailurePolicy, StepState,
};

/// A `schedules` row: the definition as stored (JSON, possibly sealed by a decorator) and the
/// scheduler's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleRecord {
    pub name: String,
    pub definition: Value,
    pub revision: u64,
    pub due_after: DateTime<Utc>,
    pub last_tick: Option<DateTime<Utc>>,
    pub last_job_id: Option<Uuid>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A `schedule_runs` row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScheduleRunRecord {
    pub schedule: String,
    pub tick: DateTime<Utc>,
    pub fired_at: DateTime<Utc>,
    pub status: RunStatus,
    pub catch_up: bool,
    pub job_id: Option<Uuid>,
    pub detail: Option<String>,
}

/// A `flows` row with its `flow_steps` rows, by position.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowRecord {
    pub id: Uuid,
    pub name: Option<String>,
    pub state: FlowState,
    pub on_failure: FlowFailurePolicy,
    pub failed_step: Option<String>,
    pub idempotency_key: Option<String>,
    pub tags: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    pub steps: Vec<FlowStepRecord>,
}

/// A `flow_steps` row. `job` and `compensate` are the step's job specs as stored; `error` the
/// step's own error (JSON, `StepError`) when no job says why it failed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowStepRecord {
    pub name: String,
    pub position: i32,
    pub state: StepState,
    pub after: Vec<String>,
    pub on_parent_failure: ParentFailurePolicy,
    pub job_id: Option<Uuid>,
    pub job: Option<Value>,
    pub compensate: Option<Value>,
    pub wait_signal: Option<String>,
    pub wait_timeout_ms: Option<u64>,
    pub wait_deadline: Option<DateTime<Utc>>,
    pub signalled: bool,
    pub result: Option<Value>,
    pub error: Option<Value>,
    pub completed_seq: Option<i64>,
    pub compensation: Option<CompensationState>,
    pub compensation_job_id: Option<Uuid>,
    pub finished_at: Option<DateTime<Utc>>,
}

/// Where a page of history rollups resumes: after this minute, queue and kind.
pub type RollupKey = (DateTime<Utc>, String, String);

/// Where a page of schedule runs resumes: after this schedule and tick.
pub type RunKey = (String, DateTime<Utc>);

/// The store's side of a copy: pages of its rows, and rows imported exactly as given. Every
/// `import_*` stores each record unless a row with its key (id, name, ...) exists, which it
/// leaves alone, and returns how many it stored; a page is imported in one transaction.
/// Exports of small tables return them whole; the others page in key order after `after`.
#[async_trait]
pub trait CopyStore: Send + Sync {
    async fn export_queue_settings(&self) -> StoreResult<Vec<NamedQueueSettings>>;
    async fn import_queue_settings(&self, records: Vec<NamedQueueSettings>) -> StoreResult<u64>;

    async fn export_kinds(&self) -> StoreResult<Vec<KindSettings>>;
    async fn import_kinds(&self, records: Vec<KindSettings>) -> StoreResult<u64>;

    /// Shared configuration (event sources and the like), every collection.
    async fn export_config(&self) -> StoreResult<Vec<crate::config::ConfigEntry>>;
    async fn import_config(&self, records: Vec<crate::config::ConfigEntry>) -> StoreResult<u64>;

    async fn export_breakers(&self) -> StoreResult<Vec<StoredBreaker>>;
    async fn import_breakers(&self, records: Vec<StoredBreaker>) -> StoreResult<u64>;

    /// Tokens with their secrets' hashes (never a secret: the store has none).
    async fn export_tokens(&self) -> StoreResult<Vec<StoredToken>>;
    async fn import_tokens(&self, records: Vec<StoredToken>) -> StoreResult<u64>;

    async fn export_schedules(&self) -> StoreResult<Vec<ScheduleRecord>>;
    async fn import_schedules(&self, records: Vec<ScheduleRecord>) -> StoreResult<u64>;

    async fn export_schedule_runs(
        &self,
        after: Option<RunKey>,
        limit: usize,
    ) -> StoreResult<Vec<ScheduleRunRecord>>;
    /// Runs of a schedule the store does not hold are not stored (counted as not inserted).
    async fn import_schedule_runs(&self, records: Vec<ScheduleRunRecord>) -> StoreResult<u64>;

    /// Flows by id, each with every step.
    async fn export_flows(&self, after: Option<Uuid>, limit: usize)
        -> StoreResult<Vec<FlowRecord>>;
    /// A flow whose id exists is left alone, steps included.
    async fn import_flows(&self, records: Vec<FlowRecord>) -> StoreResult<u64>;

    /// Jobs by id, every column as stored.
    async fn export_jobs(&self, after: Option<Uuid>, limit: usize) -> StoreResult<Vec<Job>>;
    /// As [`crate::JobStore::jobs_import`], on the store itself (a decorator does not seal
    /// what it forwards here: the records are already the store's own).
    async fn import_jobs(&self, records: Vec<Job>) -> StoreResult<u64>;

    /// Audit entries by id (oldest first).
    async fn export_audit(&self, after: Option<i64>, limit: usize) -> StoreResult<Vec<AuditEntry>>;
    /// Entries keep their ids; later appends get ids above every imported one.
    async fn import_audit(&self, records: Vec<AuditEntry>) -> StoreResult<u64>;

    /// History rollups by minute, queue and kind.
    async fn export_rollups(
        &self,
        after: Option<RollupKey>,
        limit: usize,
    ) -> StoreResult<Vec<Rollup>>;
    /// A rollup whose minute, queue and kind exist is left alone (not added to).
    async fn import_rollups(&self, records: Vec<Rollup>) -> StoreResult<u64>;
}

/// The kinds of record a copy moves, in the order it moves them: what a record refers to is
/// copied before it (settings and kinds before the jobs they govern, schedules before their
/// runs, flows before their steps' jobs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    QueueSettings,
    Kinds,
    Breakers,
    Config,
    Tokens,
    Schedules,
    Flows,
    Jobs,
    ScheduleRuns,
    Audit,
    Rollups,
}

impl RecordKind {
    pub const ALL: [RecordKind; 11] = [
        RecordKind::QueueSettings,
        RecordKind::Kinds,
        RecordKind::Breakers,
        RecordKind::Config,
        RecordKind::Tokens,
        RecordKind::Schedules,
        RecordKind::Flows,
        RecordKind::Jobs,
        RecordKind::ScheduleRuns,
        RecordKind::Audit,
        RecordKind::Rollups,
    ];

    /// The name shown in progress lines.
    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::QueueSettings => "queue settings",
            RecordKind::Kinds => "kinds",
            RecordKind::Breakers => "circuit breakers",
            RecordKind::Config => "configuration",
            RecordKind::Tokens => "tokens",
            RecordKind::Schedules => "schedules",
            RecordKind::Flows => "flows",
            RecordKind::Jobs => "jobs",
            RecordKind::ScheduleRuns => "schedule runs",
            RecordKind::Audit => "audit entries",
            RecordKind::Rollups => "history rollups",
        }
    }
}

impl std::fmt::Display for RecordKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a copy did with one kind of record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KindReport {
    pub kind: RecordKind,
    /// Records read from the source.
    pub read: u64,
    /// Records stored in the target (0 in a dry run).
    pub written: u64,
    /// Records the target already held (0 in a dry run, which does not look).
    pub already_there: u64,
}

/// How a copy runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyOptions {
    /// Records read and written per round trip.
    pub page: usize,
    /// Read and count only; write nothing.
    pub dry_run: bool,
}

impl Default for CopyOptions {
    fn default() -> Self {
        Self {
            page: 1000,
            dry_run: false,
        }
    }
}

/// A failed copy: which kind of record, which side, and the store's error.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("reading {kind} from the source store: {source}")]
    Read {
        kind: RecordKind,
        #[source]
        source: crate::StoreError,
    },
    #[error("writing {kind} to the target store: {source}")]
    Write {
        kind: RecordKind,
        #[source]
        source: crate::StoreError,
    },
}

/// Copies every kind of record from `source` to `target` in [`RecordKind::ALL`]'s order,
/// calling `progress` after each kind. Returns the report of every kind.
pub async fn copy_all(
    source: &(impl CopyStore + ?Sized),
    target: &(impl CopyStore + ?Sized),
    options: CopyOptions,
    mut progress: impl FnMut(&KindReport),
) -> Result<Vec<KindReport>, CopyError> {
    let page = options.page.max(1);
    let mut reports = Vec::with_capacity(RecordKind::ALL.len());
    for kind in RecordKind::ALL {
        let mut report = KindReport {
            kind,
            read: 0,
            written: 0,
            already_there: 0,
        };
        let mut tally = Tally {
            kind,
            dry_run: options.dry_run,
            report: &mut report,
        };
        match kind {
            RecordKind::QueueSettings => {
                let records = tally.read(source.export_queue_settings()).await?;
                tally
                    .write(records, |r| target.import_queue_settings(r))
                    .await?;
            }
            RecordKind::Kinds => {
                let records = tally.read(source.export_kinds()).await?;
                tally.write(records, |r| target.import_kinds(r)).await?;
            }
            RecordKind::Breakers => {
                let records = tally.read(source.export_breakers()).await?;
                tally.write(records, |r| target.import_breakers(r)).await?;
            }
            RecordKind::Config => {
                let records = tally.read(source.export_config()).await?;
                tally.write(records, |r| target.import_config(r)).await?;
            }
            RecordKind::Tokens => {
                let records = tally.read(source.export_tokens()).await?;
                tally.write(records, |r| target.import_tokens(r)).await?;
            }
            RecordKind::Schedules => {
                let records = tally.read(source.export_schedules()).await?;
                tally.write(records, |r| target.import_schedules(r)).await?;
            }
            RecordKind::ScheduleRuns => {
                let mut after = None;
                loop {
                    let records = tally
                        .read(source.export_schedule_runs(after.clone(), page))
                        .await?;
                    let Some(last) = records.last() else { break };
                    after = Some((last.schedule.clone(), last.tick));
                    let full = records.len() >= page;
                    tally
                        .write(records, |r| target.import_schedule_runs(r))
                        .await?;
                    if !full {
                        break;
                    }
                }
            }
            RecordKind::Flows => {
                let mut after = None;
                loop {
                    let records = tally.read(source.export_flows(after, page)).await?;
                    let Some(last) = records.last() else { break };
                    after = Some(last.id);
                    let full = records.len() >= page;
                    tally.write(records, |r| target.import_flows(r)).await?;
                    if !full {
                        break;
                    }
                }
            }
            RecordKind::Jobs => {
                let mut after = None;
                loop {
                    let records = tally.read(source.export_jobs(after, page)).await?;
                    let Some(last) = records.last() else { break };
                    after = Some(last.id);
                    let full = records.len() >= page;
                    tally.write(records, |r| target.import_jobs(r)).await?;
                    if !full {
                        break;
                    }
                }
            }
            RecordKind::Audit => {
                let mut after = None;
                loop {
                    let records = tally.read(source.export_audit(after, page)).await?;
                    let Some(last) = records.last() else { break };
                    after = Some(last.id);
                    let full = records.len() >= page;
                    tally.write(records, |r| target.import_audit(r)).await?;
                    if !full {
                        break;
                    }
                }
            }
            RecordKind::Rollups => {
                let mut after = None;
                loop {
                    let records = tally
                        .read(source.export_rollups(after.clone(), page))
                        .await?;
                    let Some(last) = records.last() else { break };
                    after = Some((last.minute, last.queue.clone(), last.kind.clone()));
                    let full = records.len() >= page;
                    tally.write(records, |r| target.import_rollups(r)).await?;
                    if !full {
                        break;
                    }
                }
            }
        }
        progress(&report);
        reports.push(report);
    }
    Ok(reports)
}

/// Counts one kind's reads and writes, and names the kind and side in errors.
struct Tally<'r> {
    kind: RecordKind,
    dry_run: bool,
    report: &'r mut KindReport,
}

impl Tally<'_> {
    async fn read<T>(
        &mut self,
        page: impl Future<Output = StoreResult<Vec<T>>>,
    ) -> Result<Vec<T>, CopyError> {
        let records = page.await.map_err(|source| CopyError::Read {
            kind: self.kind,
            source,
        })?;
        self.report.read += records.len() as u64;
        Ok(records)
    }

    async fn write<T, F, Fut>(&mut self, records: Vec<T>, import: F) -> Result<(), CopyError>
    where
        F: FnOnce(Vec<T>) -> Fut,
        Fut: Future<Output = StoreResult<u64>>,
    {
        if self.dry_run || records.is_empty() {
            return Ok(());
        }
        let offered = records.len() as u64;
        let written = import(records).await.map_err(|source| CopyError::Write {
            kind: self.kind,
            source,
        })?;
        self.report.written += written;
        self.report.already_there += offered.saturating_sub(written);
        Ok(())
    }
}
