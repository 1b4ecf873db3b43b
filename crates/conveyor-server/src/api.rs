//! The HTTP API's answers as Rust types, shared by the server (which serializes them) and by
//! Rust clients such as the `conveyor` CLI (which deserializes them), so both sides read one
//! definition and a renamed or retyped field fails to compile instead of reading as `null`.
//! `docs/openapi.yaml` describes the same shapes; `scripts/contract.sh` checks the running
//! server against it.
//!
//! Every type here round-trips: what the server writes, [`serde_json::from_value`] reads back.

use chrono::{DateTime, Utc};
use conveyor_core::schedule::{JobTemplate, MissedKind, OverlapPolicy, ScheduleRun};
use conveyor_core::{ApiToken, AuditEntry, Job, QueueStats, StuckJob, WorkerInfo};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use uuid::Uuid;

/// Every error answer: `{"error": {"code", "field", "message"}}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorResponse {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// Machine-readable: `invalid`, `not_found`, `lease_lost`, `queue_full`, ...
    pub code: String,
    /// The input at fault (`priority`, `jobs[3].kind`, `body`), when one is.
    pub field: Option<String>,
    pub message: String,
    /// With `schema_rejects_queued_jobs`: how many queued jobs the schema would reject.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub would_fail: Option<u64>,
}

/// The answer to `POST /v1/jobs`: the job as `GET /v1/jobs/{id}` would show it to the caller
/// (sensitive fields redacted), or, for a duplicate of a job the caller may not read (another
/// producer's, found through a shared idempotency key or unique spec), only its id: the
/// deduplication still holds, but nothing of the other producer's job is revealed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnqueuedJob {
    Readable {
        #[serde(flatten)]
        job: Box<Job>,
        duplicate: bool,
        /// The job a debounced or throttled enqueue folded into (this one).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        debounced_into: Option<Uuid>,
    },
    Foreign {
        id: Uuid,
        duplicate: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        debounced_into: Option<Uuid>,
    },
}

impl EnqueuedJob {
    pub fn id(&self) -> Uuid {
        match self {
            EnqueuedJob::Readable { job, .. } => job.id,
            EnqueuedJob::Foreign { id, .. } => *id,
        }
    }

    pub fn duplicate(&self) -> bool {
        match self {
            EnqueuedJob::Readable { duplicate, .. } | EnqueuedJob::Foreign { duplicate, .. } => {
                *duplicate
            }
        }
    }
}

/// The answer to `POST /v1/jobs/batch`: ids in request order, and which were duplicates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchResponse {
    pub ids: Vec<Uuid>,
    pub duplicates: Vec<bool>,
    /// Only when an enqueue of the batch was debounced or throttled: per job, the job it folded
    /// into (its id in `ids`), else null.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub debounced_into: Vec<Option<Uuid>>,
}

/// `{jobs, next}` (`GET /v1/jobs`, `GET /v1/dead`): `next` is the cursor for the following page
/// (the last id) when this page is full, else null.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobPage {
    pub jobs: Vec<Job>,
    pub next: Option<Uuid>,
}

/// `GET /v1/queues`: counts per queue and state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuesResponse {
    pub queues: Vec<QueueStats>,
    /// Every circuit breaker configured or away from closed, queues' and kinds'.
    #[serde(default)]
    pub breakers: Vec<conveyor_core::BreakerView>,
}

/// `GET /v1/breakers`: every circuit breaker configured or stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BreakersResponse {
    pub breakers: Vec<conveyor_core::BreakerView>,
}

/// `POST /v1/dead/replay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplayResponse {
    pub replayed: u64,
}

/// `DELETE /v1/dead/{id}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscardResponse {
    pub discarded: bool,
}

/// `GET /v1/workers`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkersResponse {
    pub workers: Vec<WorkerInfo>,
}

/// `GET /v1/jobs/stuck`: running jobs past their stuck threshold, longest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StuckResponse {
    pub jobs: Vec<StuckJob>,
}

/// `{entries, next}` (`GET /v1/audit`): `next` is the `before` cursor for the following page
/// when this one is full, else null.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPage {
    pub entries: Vec<AuditEntry>,
    pub next: Option<i64>,
}

/// `POST /v1/tokens`: a new token with its secret, the only answer that ever carries it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreatedToken {
    #[serde(flatten)]
    pub token: ApiToken,
    pub secret: String,
}

/// `GET /v1/tokens`: every token, revoked ones included, oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenList {
    pub tokens: Vec<ApiToken>,
}

/// A fetched job as a worker needs it (`POST /v1/fetch`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FetchedJob {
    pub id: Uuid,
    pub kind: String,
    pub queue: String,
    pub payload: Value,
    pub attempt: u32,
    pub max_attempts: u32,
    pub timeout_ms: Option<u64>,
    /// Proves the worker holds the job: heartbeats, completions and failures must carry it.
    pub lease_token: Uuid,
    pub lease_expires_at: DateTime<Utc>,
    pub tenant: Option<String>,
    pub tags: Vec<String>,
    /// For a workflow's step: its flow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_id: Option<Uuid>,
    /// For a workflow's step: its name (for a compensation job, the step it compensates).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// For a workflow's step: its completed parents' results by step name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parents: Option<std::collections::BTreeMap<String, Value>>,
    /// When the job expires if not started (it was started: informative for the handler).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<DateTime<Utc>>,
    /// The producer's W3C trace context: run the handler as a child span of it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tracestate: Option<String>,
}

/// `POST /v1/flows`: the new flow (or, with `duplicate`, the flow its idempotency key names) and
/// each job step's job id by name.
pub type CreatedFlow = conveyor_core::workflow::CreatedFlow;

/// `GET /v1/flows`: flows newest first, without steps; `next` is the cursor for the next page.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowPage {
    pub flows: Vec<conveyor_core::workflow::FlowView>,
    pub next: Option<Uuid>,
}

/// `POST /v1/flows/{id}/signal`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SignalResponse {
    /// `delivered` (the waiting step completed) or `stored` (it completes when it begins).
    pub outcome: conveyor_core::workflow::SignalOutcome,
}

/// `POST /v1/fetch`: the claimed jobs, and one result per acknowledgement the fetch carried
/// (completions first), as `/v1/ack` answers them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FetchResponse {
    pub jobs: Vec<FetchedJob>,
    pub acks: Vec<ItemResult>,
    /// What an operator told this worker (`quiet` or `stop`): it gets no jobs until the
    /// command is cleared, and should stop fetching (and with `stop`, exit once drained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<conveyor_core::WorkerCommand>,
}

/// What became of one acknowledged or heartbeated item (`/v1/ack`, `/v1/heartbeat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemStatus {
    Ok,
    LeaseLost,
    NotFound,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ItemResult {
    pub id: Uuid,
    pub status: ItemStatus,
    /// The renewed lease's end (heartbeats that were applied only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_expires_at: Option<DateTime<Utc>>,
}

impl ItemResult {
    pub fn new(id: Uuid, status: ItemStatus) -> Self {
        Self {
            id,
            status,
            lease_expires_at: None,
        }
    }
}

/// `POST /v1/ack` and `POST /v1/heartbeat`: one result per item, in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AckResponse {
    pub results: Vec<ItemResult>,
}

/// A schedule as `GET /v1/schedules/{name}`, `PUT` and the list show it: its definition, then
/// its state. The server writes `conveyor_core::ScheduleView`; this is the same JSON read back
/// (a test checks that every field the server writes is read).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleAnswer {
    pub name: String,
    /// Empty for an interval schedule.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cron: String,
    /// The interval of an interval schedule (`30s`, `1h30m`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<String>,
    pub timezone: String,
    pub job: JobTemplate,
    pub overlap: OverlapPolicy,
    pub missed: MissedKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_catch_up: Option<u32>,
    pub revision: u64,
    pub due_after: DateTime<Utc>,
    pub last_tick: Option<DateTime<Utc>>,
    pub next_run_at: Option<DateTime<Utc>>,
    pub last_run: Option<ScheduleRun>,
    /// The latest runs, newest first (in a single schedule's view; empty in lists).
    pub recent_runs: Vec<ScheduleRun>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// `GET /v1/schedules`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScheduleList {
    pub schedules: Vec<ScheduleAnswer>,
}

/// `GET /v1/schedules/{name}/runs`: the latest runs, newest first.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunList {
    pub runs: Vec<ScheduleRun>,
}

/// `GET /healthz`, `/livez`, `/readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok`, or `unavailable` (not ready: stop routing here) or `failing` (not live: restart).
    pub status: String,
    /// The process can go on serving (or recover by itself); false: restart it.
    pub live: bool,
    /// The store accepts writes and the server is not shutting down.
    pub ready: bool,
    /// Whether this node leads maintenance (lease rescue, promotion); absent when it runs none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<bool>,
    /// What is wrong, when not ok.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use conveyor_core::NewJob;
    use serde_json::json;

    fn round_trip<T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug>(
        value: T,
    ) {
        let written = serde_json::to_value(&value).expect("serializes");
        let read: T = serde_json::from_value(written.clone())
            .unwrap_or_else(|e| panic!("{written} does not read back: {e}"));
        assert_eq!(read, value);
    }

    fn job() -> Job {
        let new = NewJob::new("send_email", json!({"to": "a@example.com"}));
        let now = chrono::Utc::now();
        let mut job: Job = serde_json::from_value(json!({
            "id": Uuid::now_v7(), "kind": new.kind, "queue": new.queue, "payload": new.payload,
            "priority": 0, "run_at": now, "attempt": 0, "max_attempts": 25, "timeout_ms": null,
            "idempotency_key": null, "tags": [], "tenant": null, "state": "available",
            "errors": [], "result": null, "created_at": now, "started_at": null,
            "finished_at": null,
        }))
        .expect("a job as the API shows it");
        job.tags.push("t1".to_string());
        job
    }

    #[test]
    fn answers_read_back_as_written() {
        round_trip(EnqueuedJob::Readable {
            job: Box::new(job()),
            duplicate: true,
            debounced_into: None,
        });
        round_trip(EnqueuedJob::Foreign {
            id: Uuid::now_v7(),
            duplicate: true,
            debounced_into: Some(Uuid::now_v7()),
        });
        round_trip(JobPage {
            jobs: vec![job()],
            next: Some(Uuid::now_v7()),
        });
        round_trip(ErrorResponse {
            error: ErrorDetail {
                code: "invalid".into(),
                field: Some("jobs[3].kind".into()),
                message: "must not be empty".into(),
                would_fail: None,
            },
        });
        round_trip(Health {
            status: "ok".into(),
            live: true,
            ready: true,
            leader: None,
            problem: None,
        });
    }

    #[test]
    fn a_schedule_view_as_the_server_writes_it_reads_as_a_schedule_answer() {
        use conveyor_core::schedule::{Schedule, ScheduleSpec, ScheduleView};
        use conveyor_core::MissedPolicy;
        let spec = ScheduleSpec::new("0 3 * * *", JobTemplate::new("report", json!({"n": 1})))
            .timezone("Europe/Berlin")
            .missed(MissedPolicy::CatchUp { max: 3 });
        let now = chrono::Utc::now();
        let view = ScheduleView {
            schedule: Schedule::from_spec("nightly", spec).unwrap(),
            revision: 7,
            due_after: now,
            last_tick: Some(now),
            next_run_at: Some(now),
            last_run: None,
            recent_runs: Vec::new(),
            created_at: now,
            updated_at: now,
        };
        let written = serde_json::to_value(&view).unwrap();
        let answer: ScheduleAnswer = serde_json::from_value(written.clone())
            .unwrap_or_else(|e| panic!("{written} does not read as a ScheduleAnswer: {e}"));
        assert_eq!(answer.name, "nightly");
        assert_eq!(answer.timezone, "Europe/Berlin");
        assert_eq!(answer.missed, MissedKind::CatchUp);
        assert_eq!(answer.max_catch_up, Some(3));
        assert_eq!(answer.revision, 7);
        // Nothing the server writes is dropped on the way: written again, it is the same JSON.
        assert_eq!(serde_json::to_value(&answer).unwrap(), written);
    }

    #[test]
    fn a_duplicate_of_a_foreign_job_reads_as_foreign_and_a_readable_one_as_readable() {
        let foreign: EnqueuedJob =
            serde_json::from_value(json!({"id": Uuid::nil(), "duplicate": true})).unwrap();
        assert!(matches!(foreign, EnqueuedJob::Foreign { .. }));
        assert!(foreign.duplicate());
        let mut readable = serde_json::to_value(job()).unwrap();
        readable["duplicate"] = json!(false);
        let readable: EnqueuedJob = serde_json::from_value(readable).unwrap();
        assert!(matches!(readable, EnqueuedJob::Readable { .. }));
        assert!(!readable.duplicate());
    }
}
