//! The worker registry: every worker process (the Rust [`Worker`], `conveyor work`, any HTTP
//! worker) reports itself every few seconds, so operators can see who serves which queues, how
//! busy they are, and which ones stopped answering.
//!
//! A worker that stops heartbeating for longer than the stale interval is marked `dead` by the
//! maintenance leader ([`crate::WorkerStore::workers_mark_stale`]), and the jobs it still held are
//! rescued at once, as if their leases had expired, instead of waiting for the leases to run out.
//!
//! [`Worker`]: https://docs.rs/conveyor-worker

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::error::ValidationError;
use crate::lease::RescueReport;
use crate::retry::RetryPolicy;

/// Longest worker id, host name or version string accepted.
pub const MAX_WORKER_FIELD_LEN: usize = 256;
/// Most queues one worker may report serving.
pub const MAX_WORKER_QUEUES: usize = 256;

/// Where a registered worker stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum WorkerState {
    /// Heartbeating.
    Alive,
    /// Said goodbye at a graceful shutdown: not an incident.
    Stopped,
    /// Stopped heartbeating without saying goodbye (crashed, hung, partitioned); marked so by
    /// the maintenance leader, which rescued its jobs.
    Dead,
}

impl WorkerState {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerState::Alive => "alive",
            WorkerState::Stopped => "stopped",
            WorkerState::Dead => "dead",
        }
    }
}

impl fmt::Display for WorkerState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for WorkerState {
    type Err = ValidationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [WorkerState::Alive, WorkerState::Stopped, WorkerState::Dead]
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| {
                ValidationError::new(
                    "state",
                    format!("unknown worker state {s:?}; expected alive, stopped or dead"),
                )
            })
    }
}

/// What an operator asked a worker to do (`POST /v1/workers/{id}/quiet|stop`). Workers learn
/// it from their heartbeat's answer; the server also hands no job to a worker told either.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkerCommand {
    /// Stop fetching; finish the jobs in hand and keep running (and heartbeating).
    Quiet,
    /// Stop fetching, finish the jobs in hand within the drain timeout, then exit.
    Stop,
}

impl WorkerCommand {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkerCommand::Quiet => "quiet",
            WorkerCommand::Stop => "stop",
        }
    }

    /// The stored text back; `None` for anything else (a newer build's command is ignored).
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "quiet" => Some(WorkerCommand::Quiet),
            "stop" => Some(WorkerCommand::Stop),
            _ => None,
        }
    }
}

/// What a worker reports about itself on every heartbeat. A heartbeat fills in what it
/// knows: an empty `host`, `version` or `queues`, a `pid` of `None` or a `concurrency` of 0
/// keep what the store has (a registration refreshed from a fetch, which knows less than the
/// worker's own heartbeat, must not erase it), and `started_at` never moves later while the
/// worker is alive.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerHeartbeat {
    /// The id the worker fetches with (`FetchParams::worker_id`): the registry and the leases
    /// name workers the same way, which is how a dead worker's jobs are found.
    pub id: String,
    pub host: String,
    pub pid: Option<u32>,
    pub queues: Vec<String>,
    /// Job slots (jobs it may run at once, over all its queues).
    pub concurrency: u32,
    /// Slots in use right now.
    pub busy: u32,
    pub version: String,
    pub started_at: DateTime<Utc>,
    /// True on the last heartbeat of a graceful shutdown: the worker is recorded as `stopped`
    /// (never alerted on, never rescued from).
    #[serde(default)]
    pub stopping: bool,
}

/// A registered worker, as the store keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerInfo {
    pub id: String,
    pub host: String,
    pub pid: Option<u32>,
    pub queues: Vec<String>,
    pub concurrency: u32,
    pub busy: u32,
    pub version: String,
    pub started_at: DateTime<Utc>,
    /// The store's time of the latest heartbeat.
    pub last_seen_at: DateTime<Utc>,
    pub state: WorkerState,
    /// When it stopped or was marked dead; `None` while alive.
    pub ended_at: Option<DateTime<Utc>>,
    /// What an operator asked it to do, if anything. Heartbeats keep it, also the last one of a
    /// stop; a worker that registers again after it stopped (or was marked dead) starts
    /// without it, so a restart under the same id is not told again.
    #[serde(default)]
    pub command: Option<WorkerCommand>,
}

/// What [`crate::WorkerStore::workers_mark_stale`] does.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StaleWorkerParams {
    /// Alive workers not heard from for this long are marked `dead`.
    pub older_than: Duration,
    /// Backoff for the rescued jobs' next attempt.
    pub retry: RetryPolicy,
    /// Stopped and dead workers are deleted from the registry this long after they ended.
    pub forget_after: Duration,
}

impl Default for StaleWorkerParams {
    fn default() -> Self {
        Self {
            older_than: Duration::from_secs(120),
            retry: RetryPolicy::default(),
            forget_after: Duration::from_secs(24 * 3600),
        }
    }
}

/// The outcome of one [`crate::WorkerStore::workers_mark_stale`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StaleReport {
    /// Workers marked dead by this call.
    pub workers: Vec<String>,
    /// Their running jobs, moved to `retryable` (or `dead` when out of attempts).
    pub rescued: RescueReport,
}

/// Checks a worker's id, host or version: at most [`MAX_WORKER_FIELD_LEN`] characters (as the
/// API document's `maxLength` counts them), no control characters, and not empty if
/// `required`.
pub fn text(field: &str, value: &str, required: bool) -> Result<(), ValidationError> {
    if required && value.is_empty() {
        return Err(ValidationError::new(field, "must not be empty"));
    }
    if value.chars().count() > MAX_WORKER_FIELD_LEN {
        return Err(ValidationError::new(
            field,
            format!("must be at most {MAX_WORKER_FIELD_LEN} characters"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ValidationError::new(
            field,
            "must not contain control characters",
        ));
    }
    Ok(())
}

/// Checks a heartbeat's fields; errors name the field as the HTTP API spells it.
pub fn heartbeat(beat: &WorkerHeartbeat) -> Result<(), ValidationError> {
    text("worker_id", &beat.id, true)?;
    text("host", &beat.host, false)?;
    text("version", &beat.version, false)?;
    if beat.queues.len() > MAX_WORKER_QUEUES {
        return Err(ValidationError::new(
            "queues",
            format!("at most {MAX_WORKER_QUEUES} queues"),
        ));
    }
    for (index, queue) in beat.queues.iter().enumerate() {
        crate::fields::name(&format!("queues[{index}]"), queue)?;
    }
    Ok(())
}

/// How a heartbeat merges into the registry row it finds, column by column: the one statement
/// of the rule, which each store renders into its own upsert ([`heartbeat_merge_sql`]) so the
/// merge stays one atomic statement with no read first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merge {
    /// The beat's value.
    Take,
    /// The row's value when the beat's is blank (an empty text or list, 0, or NULL): a beat
    /// that leaves a field out keeps what the registry knows.
    KeepWhenBlank(Blank),
    /// While the row is alive, the earlier start; otherwise the beat's (a worker that stopped
    /// or was marked dead and came back has started again).
    EarliestWhileAlive,
    /// Cleared when a worker that was not alive comes back (a `stop` sent to the old process
    /// must not stop the new one); otherwise the row's, which only a command changes.
    ClearOnReturn,
}

/// What a blank value is, per column type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blank {
    Text,
    List,
    Zero,
    Null,
}

/// The registry's columns a heartbeat merges, in the order a store's upsert writes them.
pub const HEARTBEAT_MERGE: [(&str, Merge); 10] = [
    ("host", Merge::KeepWhenBlank(Blank::Text)),
    ("pid", Merge::KeepWhenBlank(Blank::Null)),
    ("queues", Merge::KeepWhenBlank(Blank::List)),
    ("concurrency", Merge::KeepWhenBlank(Blank::Zero)),
    ("busy", Merge::Take),
    ("version", Merge::KeepWhenBlank(Blank::Text)),
    ("started_at", Merge::EarliestWhileAlive),
    ("last_seen_at", Merge::Take),
    ("command", Merge::ClearOnReturn),
    ("state", Merge::Take),
];

/// The SQL spellings that differ between stores.
#[derive(Debug, Clone, Copy)]
pub struct SqlDialect {
    /// A condition true when the list column `{}` is empty.
    pub empty_list: &'static str,
    /// The function giving the least of two values (`LEAST`, `MIN`).
    pub least: &'static str,
}

/// The `SET` list of a heartbeat's `ON CONFLICT (id) DO UPDATE`, for a row named `row` (the
/// table or its alias) and the proposed row named `excluded`, from [`HEARTBEAT_MERGE`];
/// `ended_at` follows `state`.
pub fn heartbeat_merge_sql(row: &str, dialect: SqlDialect) -> String {
    let mut set: Vec<String> = HEARTBEAT_MERGE
        .iter()
        .map(|(column, merge)| {
            let new = format!("excluded.{column}");
            let old = format!("{row}.{column}");
            let value = match merge {
                Merge::Take => new,
                Merge::KeepWhenBlank(Blank::Null) => format!("COALESCE({new}, {old})"),
                Merge::KeepWhenBlank(Blank::Text) => {
                    format!("CASE WHEN {new} = '' THEN {old} ELSE {new} END")
                }
                Merge::KeepWhenBlank(Blank::Zero) => {
                    format!("CASE WHEN {new} = 0 THEN {old} ELSE {new} END")
                }
                Merge::KeepWhenBlank(Blank::List) => format!(
                    "CASE WHEN {} THEN {old} ELSE {new} END",
                    dialect.empty_list.replace("{}", &new)
                ),
                Merge::EarliestWhileAlive => format!(
                    "CASE WHEN {row}.state = 'alive' THEN {}({old}, {new}) ELSE {new} END",
                    dialect.least
                ),
                Merge::ClearOnReturn => format!(
                    "CASE WHEN {row}.state <> 'alive' AND excluded.state = 'alive' \
                     THEN NULL ELSE {old} END"
                ),
            };
            format!("{column} = {value}")
        })
        .collect();
    set.push("ended_at = excluded.ended_at".to_string());
    set.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_heartbeat_merge_renders_each_rule_in_each_dialect() {
        let sqlite = heartbeat_merge_sql(
            "workers",
            SqlDialect {
                empty_list: "{} = '[]'",
                least: "MIN",
            },
        );
        assert!(sqlite.contains(
            "host = CASE WHEN excluded.host = '' THEN workers.host ELSE excluded.host END"
        ));
        assert!(sqlite.contains("pid = COALESCE(excluded.pid, workers.pid)"));
        assert!(sqlite.contains(
            "queues = CASE WHEN excluded.queues = '[]' THEN workers.queues ELSE excluded.queues END"
        ));
        assert!(sqlite.contains(
            "started_at = CASE WHEN workers.state = 'alive' \
             THEN MIN(workers.started_at, excluded.started_at) ELSE excluded.started_at END"
        ));
        assert!(sqlite.contains("busy = excluded.busy,"));
        assert!(sqlite.ends_with("state = excluded.state, ended_at = excluded.ended_at"));
        let postgres = heartbeat_merge_sql(
            "w",
            SqlDialect {
                empty_list: "cardinality({}) = 0",
                least: "LEAST",
            },
        );
        assert!(postgres.contains(
            "queues = CASE WHEN cardinality(excluded.queues) = 0 THEN w.queues ELSE excluded.queues END"
        ));
        assert!(postgres.contains("LEAST(w.started_at, excluded.started_at)"));
        assert!(postgres.contains(
            "command = CASE WHEN w.state <> 'alive' AND excluded.state = 'alive' \
             THEN NULL ELSE w.command END"
        ));
        // Every column a beat writes is merged, once.
        for column in [
            "host",
            "pid",
            "queues",
            "concurrency",
            "busy",
            "version",
            "started_at",
            "last_seen_at",
            "command",
            "state",
            "ended_at",
        ] {
            assert_eq!(
                format!(", {postgres}")
                    .matches(&format!(", {column} = "))
                    .count(),
                1,
                "{column}"
            );
        }
    }

    fn beat() -> WorkerHeartbeat {
        WorkerHeartbeat {
            id: "w1".into(),
            host: "h".into(),
            pid: Some(1),
            queues: vec!["default".into()],
            concurrency: 4,
            busy: 0,
            version: "0.1.0".into(),
            started_at: Utc::now(),
            stopping: false,
        }
    }

    #[test]
    fn heartbeat_fields_are_checked() {
        assert!(heartbeat(&beat()).is_ok());
        let mut empty = beat();
        empty.id.clear();
        assert_eq!(heartbeat(&empty).unwrap_err().field, "worker_id");
        let mut bad_queue = beat();
        bad_queue.queues.push("no spaces".into());
        assert_eq!(heartbeat(&bad_queue).unwrap_err().field, "queues[1]");
        let mut control = beat();
        control.host = "a\nb".into();
        assert_eq!(heartbeat(&control).unwrap_err().field, "host");
    }

    #[test]
    fn worker_states_round_trip() {
        for state in [WorkerState::Alive, WorkerState::Stopped, WorkerState::Dead] {
            assert_eq!(state.as_str().parse::<WorkerState>().unwrap(), state);
        }
        assert!("zombie".parse::<WorkerState>().is_err());
    }
}
