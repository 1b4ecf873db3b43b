//! Durable steps: a handler marks its side effects as named steps, each step's result is
//! stored with its job when the step finishes, and a later attempt of the same job gets the
//! stored result back instead of running the step again.
//!
//! The rules, which the Rust worker applies here and the Python and TypeScript clients apply
//! the same way (the client conformance suite holds them to it), and which each store checks
//! again when it writes:
//! - Every run of a handler numbers its step calls 1, 2, 3... (`seq`). The call at position
//!   `seq` is the stored record at `seq`, if there is one ([`Journal::next`]): a finished record
//!   answers with its result or error without running, a failed one runs again, and a record
//!   of another name or kind means the handler took another path than the run that stored it
//!   (`nondeterministic`: rerunning the same code would meet the same mismatch, so the job
//!   does not retry).
//! - A name used twice in one run is refused the same way: which of the two a stored result
//!   belongs to could not be told apart after a change of code.
//! - A store accepts a write at the next position, or at the last one when that record failed
//!   and the write runs it again under the same name ([`accept_write`]). A write at the last
//!   position under the stored name, or at an earlier position, is taken as sent again (its
//!   answer lost) and leaves the stored record standing: only the worker, which holds the
//!   stored records, can tell a changed path at an earlier position.
//!
//! A leaf: it imports only the validation checks and the error classes.

use std::collections::HashSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::ValidationError;

/// Most steps one job may record; a handler looping past it is refused its next step.
pub const MAX_JOB_STEPS: u32 = 1000;

/// How many times a job whose steps registered compensations is run to compensate, before it
/// goes dead with [`crate::error_class::COMPENSATION_FAILED`].
pub const MAX_COMPENSATION_RUNS: u32 = 3;

/// What a step record stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepKind {
    /// `ctx.step`: a side effect and its result.
    Step,
    /// `ctx.sleep` and `ctx.sleep_until`.
    Sleep,
    /// `ctx.wait_for_signal`.
    Signal,
    /// `ctx.wait_for_event`.
    Event,
    /// `ctx.invoke`: a child job and its result.
    Invoke,
    /// The compensation of an earlier step, run once the job has failed for good.
    Compensation,
}

impl StepKind {
    pub fn as_str(self) -> &'static str {
        match self {
            StepKind::Step => "step",
            StepKind::Sleep => "sleep",
            StepKind::Signal => "signal",
            StepKind::Event => "event",
            StepKind::Invoke => "invoke",
            StepKind::Compensation => "compensation",
        }
    }

    /// Whether the step suspends its job until something outside it happens.
    pub fn waits(self) -> bool {
        matches!(
            self,
            StepKind::Sleep | StepKind::Signal | StepKind::Event | StepKind::Invoke
        )
    }
}

/// Where a step record stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    /// Finished with a result (a wait: resumed).
    Completed,
    /// Its last run failed; the next attempt runs it again.
    Failed,
    /// A wait not yet resumed; its job is suspended.
    Waiting,
    /// A wait whose deadline came first: it answers with a `timeout` error.
    TimedOut,
    /// A wait of a job cancelled while it waited.
    Cancelled,
}

impl StepState {
    /// Whether a later run gets this record back instead of running the step.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            StepState::Completed | StepState::TimedOut | StepState::Cancelled
        )
    }
}

/// A step's error as recorded: a class (as in a job's history) and a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepError {
    pub class: String,
    pub message: String,
}

/// One stored step of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepRecord {
    /// Its position in every run of the handler, from 1.
    pub seq: u32,
    pub name: String,
    pub kind: StepKind,
    pub state: StepState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StepError>,
    /// Runs of the step so far (a failed step run again counts again).
    pub attempts: u32,
    pub started_at: DateTime<Utc>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_at: Option<DateTime<Utc>>,
}

/// What a run does at a step call.
#[derive(Debug, Clone, PartialEq)]
pub enum Replay<'a> {
    /// A record at this position finished in an earlier run: answer with it, do not run.
    Stored(&'a StepRecord),
    /// Run the step (nothing stored here yet, or its last run failed).
    Run,
    /// A wait stored here has not resumed: the job suspends again.
    StillWaiting(&'a StepRecord),
}

/// The handler took another path than the run that stored its steps: at `seq` it called
/// `got`, where the stored record (or an earlier call of the same run) is `expected`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("nondeterministic step at position {seq}: the handler called {got:?} where {expected}")]
pub struct Nondeterministic {
    pub seq: u32,
    pub expected: String,
    pub got: String,
}

/// The steps one run of a handler has reached, against those stored by earlier runs.
#[derive(Debug, Clone, Default)]
pub struct Journal {
    stored: Vec<StepRecord>,
    /// The position of the last call made by this run (0 before the first).
    position: u32,
    names: HashSet<String>,
}

impl Journal {
    /// The journal of a new run over a job's stored steps (in any order).
    pub fn new(mut stored: Vec<StepRecord>) -> Self {
        stored.sort_by_key(|record| record.seq);
        Self {
            stored,
            position: 0,
            names: HashSet::new(),
        }
    }

    /// The position the next call takes.
    pub fn next_seq(&self) -> u32 {
        self.position + 1
    }

    /// The stored records, by position.
    pub fn stored(&self) -> &[StepRecord] {
        &self.stored
    }

    /// Takes the next position for a call of step `name` of `kind`, and says whether to run it.
    pub fn next(&mut self, name: &str, kind: StepKind) -> Result<Replay<'_>, Nondeterministic> {
        let seq = self.next_seq();
        if self.names.contains(name) {
            return Err(Nondeterministic {
                seq,
                expected: format!("a step other than {name:?}, which this run already called"),
                got: name.to_string(),
            });
        }
        let stored = self
            .stored
            .binary_search_by_key(&seq, |record| record.seq)
            .ok();
        if let Some(index) = stored {
            let record = &self.stored[index];
            if record.name != name || record.kind != kind {
                return Err(Nondeterministic {
                    seq,
                    expected: format!("the stored {} {:?}", record.kind.as_str(), record.name),
                    got: name.to_string(),
                });
            }
        }
        self.position = seq;
        self.names.insert(name.to_string());
        Ok(match stored.map(|index| &self.stored[index]) {
            None => Replay::Run,
            Some(record) if record.state.is_final() => Replay::Stored(record),
            Some(record) if record.state == StepState::Waiting => Replay::StillWaiting(record),
            Some(_) => Replay::Run,
        })
    }
}

/// The last stored step of a job, as a store reads it before a write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepHead<'a> {
    pub seq: u32,
    pub name: &'a str,
    pub state: StepState,
}

/// A step record a worker asks to store.
#[derive(Debug, Clone, PartialEq)]
pub struct StepWrite {
    pub seq: u32,
    pub name: String,
    pub kind: StepKind,
    pub state: StepState,
    pub result: Option<Value>,
    pub error: Option<StepError>,
}

impl StepWrite {
    /// Refuses what no store may hold: a position outside 1..=[`MAX_JOB_STEPS`], a bad name, a
    /// completed step without a result's place or a failed one without an error, or a state a
    /// worker does not write (waits are recorded by suspending).
    pub fn validate(&self) -> Result<(), ValidationError> {
        if self.seq == 0 || self.seq > MAX_JOB_STEPS {
            return Err(ValidationError::new(
                "seq",
                format!("must be from 1 to {MAX_JOB_STEPS} (a job records at most {MAX_JOB_STEPS} steps)"),
            ));
        }
        crate::fields::name("name", &self.name)?;
        match self.state {
            StepState::Completed if self.error.is_some() => Err(ValidationError::new(
                "error",
                "a completed step has a result, not an error",
            )),
            StepState::Failed if self.error.is_none() => Err(ValidationError::new(
                "error",
                "a failed step needs its error",
            )),
            StepState::Failed if self.result.is_some() => Err(ValidationError::new(
                "result",
                "a failed step has an error, not a result",
            )),
            StepState::Completed | StepState::Failed => {
                if let Some(result) = &self.result {
                    crate::fields::json_without_nul("result", result)?;
                }
                if let Some(error) = &self.error {
                    crate::fields::name("error.class", &error.class)?;
                }
                Ok(())
            }
            other => Err(ValidationError::new(
                "state",
                format!(
                    "a worker writes a step as completed or failed, not {:?}",
                    other
                ),
            )),
        }
    }
}

/// What a store does with a [`StepWrite`], given the job's last stored step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteVerdict {
    /// A new record at the next position.
    Insert,
    /// The failed record at the last position, run again: it is replaced (and its attempts
    /// counted on).
    Rerun,
    /// The same step is stored already (a write sent again after its answer was lost): the
    /// stored record stands.
    AlreadyRecorded,
    Nondeterministic(Nondeterministic),
}

/// Whether `write` may be stored after `head`, the job's last stored step (none yet).
pub fn accept_write(head: Option<StepHead<'_>>, write: &StepWrite) -> WriteVerdict {
    let last = head.map_or(0, |head| head.seq);
    match head {
        _ if write.seq == last + 1 => WriteVerdict::Insert,
        Some(head) if write.seq == head.seq && head.name == write.name => {
            if head.state == StepState::Failed {
                WriteVerdict::Rerun
            } else {
                WriteVerdict::AlreadyRecorded
            }
        }
        Some(head) if write.seq == head.seq => WriteVerdict::Nondeterministic(Nondeterministic {
            seq: write.seq,
            expected: format!("the stored step {:?}", head.name),
            got: write.name.clone(),
        }),
        _ if write.seq <= last => WriteVerdict::AlreadyRecorded,
        _ => WriteVerdict::Nondeterministic(Nondeterministic {
            seq: write.seq,
            expected: format!("position {} next (the job's steps end at {last})", last + 1),
            got: write.name.clone(),
        }),
    }
}

/// How a wait resolves when its time comes before anything resumes it: a sleep has done what
/// it was for; a signal, event or child job that did not come is a `timeout` the handler can
/// catch.
pub fn wake_resolution(kind: StepKind) -> (StepState, Option<StepError>) {
    match kind {
        StepKind::Sleep | StepKind::Step | StepKind::Compensation => (StepState::Completed, None),
        StepKind::Signal | StepKind::Event | StepKind::Invoke => (
            StepState::TimedOut,
            Some(StepError {
                class: crate::error_class::TIMEOUT.to_string(),
                message: format!("the {} wait timed out", kind.as_str()),
            }),
        ),
    }
}

/// What a job whose attempt failed for good does: with compensations pending and runs to
/// spare, it runs again to compensate; otherwise it goes dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinalFailure {
    Dead,
    Compensate,
    /// Compensations were still pending after [`MAX_COMPENSATION_RUNS`] runs: dead, with
    /// class [`crate::error_class::COMPENSATION_FAILED`].
    CompensationFailed,
}

/// The [`FinalFailure`] of a job with `pending` compensations after `runs` compensating runs.
pub fn final_failure(pending: u32, runs: u32) -> FinalFailure {
    match (pending, runs) {
        (0, _) => FinalFailure::Dead,
        (_, runs) if runs < MAX_COMPENSATION_RUNS => FinalFailure::Compensate,
        _ => FinalFailure::CompensationFailed,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn record(seq: u32, name: &str, kind: StepKind, state: StepState) -> StepRecord {
        StepRecord {
            seq,
            name: name.to_string(),
            kind,
            state,
            result: (state == StepState::Completed).then(|| json!({"seq": seq})),
            error: (state == StepState::Failed).then(|| StepError {
                class: "error".to_string(),
                message: "boom".to_string(),
            }),
            attempts: 1,
            started_at: DateTime::<Utc>::UNIX_EPOCH,
            finished_at: Some(DateTime::<Utc>::UNIX_EPOCH),
        }
    }

    fn write(seq: u32, name: &str, state: StepState) -> StepWrite {
        StepWrite {
            seq,
            name: name.to_string(),
            kind: StepKind::Step,
            state,
            result: (state == StepState::Completed).then(|| json!(1)),
            error: (state == StepState::Failed).then(|| StepError {
                class: "error".to_string(),
                message: "boom".to_string(),
            }),
        }
    }

    #[test]
    fn a_run_gets_finished_steps_back_and_runs_the_rest() {
        let mut journal = Journal::new(vec![
            record(2, "ship", StepKind::Step, StepState::Failed),
            record(1, "charge", StepKind::Step, StepState::Completed),
        ]);
        match journal.next("charge", StepKind::Step) {
            Ok(Replay::Stored(record)) => assert_eq!(record.result, Some(json!({"seq": 1}))),
            other => panic!("the finished step answers from the store: {other:?}"),
        }
        assert_eq!(journal.next("ship", StepKind::Step), Ok(Replay::Run));
        assert_eq!(journal.next("notify", StepKind::Step), Ok(Replay::Run));
        assert_eq!(journal.next_seq(), 4);
    }

    #[test]
    fn timed_out_and_waiting_records_are_told_apart() {
        let mut journal = Journal::new(vec![
            record(1, "approval", StepKind::Signal, StepState::TimedOut),
            record(2, "cool-off", StepKind::Sleep, StepState::Waiting),
        ]);
        assert!(matches!(
            journal.next("approval", StepKind::Signal),
            Ok(Replay::Stored(record)) if record.state == StepState::TimedOut
        ));
        assert!(matches!(
            journal.next("cool-off", StepKind::Sleep),
            Ok(Replay::StillWaiting(_))
        ));
    }

    #[test]
    fn another_path_than_the_stored_one_is_nondeterministic() {
        let mut journal = Journal::new(vec![record(
            1,
            "charge",
            StepKind::Step,
            StepState::Completed,
        )]);
        let refused = journal.next("refund", StepKind::Step).unwrap_err();
        assert_eq!(refused.seq, 1);
        assert_eq!(refused.got, "refund");
        assert!(refused.expected.contains("charge"), "{refused}");

        let mut journal = Journal::new(vec![record(
            1,
            "charge",
            StepKind::Step,
            StepState::Completed,
        )]);
        assert!(
            journal.next("charge", StepKind::Sleep).is_err(),
            "the same name as another kind"
        );
    }

    #[test]
    fn a_name_used_twice_in_one_run_is_refused() {
        let mut journal = Journal::default();
        assert_eq!(journal.next("fetch-page", StepKind::Step), Ok(Replay::Run));
        let refused = journal.next("fetch-page", StepKind::Step).unwrap_err();
        assert_eq!(refused.seq, 2);
        assert_eq!(journal.next_seq(), 2, "a refused call takes no position");
    }

    #[test]
    fn a_store_takes_the_next_position_or_reruns_the_failed_last() {
        assert_eq!(
            accept_write(None, &write(1, "charge", StepState::Completed)),
            WriteVerdict::Insert
        );
        let failed = StepHead {
            seq: 1,
            name: "charge",
            state: StepState::Failed,
        };
        assert_eq!(
            accept_write(Some(failed), &write(1, "charge", StepState::Completed)),
            WriteVerdict::Rerun
        );
        assert_eq!(
            accept_write(Some(failed), &write(2, "ship", StepState::Completed)),
            WriteVerdict::Insert,
            "a failed step's successor (its failure was caught by the handler)"
        );
        let done = StepHead {
            state: StepState::Completed,
            ..failed
        };
        assert_eq!(
            accept_write(Some(done), &write(1, "charge", StepState::Completed)),
            WriteVerdict::AlreadyRecorded
        );
        assert!(matches!(
            accept_write(Some(done), &write(1, "refund", StepState::Completed)),
            WriteVerdict::Nondeterministic(n) if n.seq == 1 && n.got == "refund"
        ));
        assert!(matches!(
            accept_write(Some(done), &write(3, "late", StepState::Completed)),
            WriteVerdict::Nondeterministic(n) if n.expected.contains("position 2")
        ));
        assert!(matches!(
            accept_write(None, &write(2, "skipped-one", StepState::Completed)),
            WriteVerdict::Nondeterministic(_)
        ));
    }

    #[test]
    fn writes_a_store_cannot_hold_are_refused_naming_the_field() {
        let field = |w: StepWrite| w.validate().unwrap_err().field;
        assert_eq!(field(write(0, "charge", StepState::Completed)), "seq");
        assert_eq!(
            field(write(MAX_JOB_STEPS + 1, "charge", StepState::Completed)),
            "seq"
        );
        assert_eq!(field(write(1, "", StepState::Completed)), "name");
        assert_eq!(field(write(1, "has space", StepState::Completed)), "name");
        assert_eq!(field(write(1, "wait", StepState::Waiting)), "state");
        let mut no_error = write(1, "charge", StepState::Failed);
        no_error.error = None;
        assert_eq!(field(no_error), "error");
        let mut nul = write(1, "charge", StepState::Completed);
        nul.result = Some(json!("a\u{0}b"));
        assert_eq!(field(nul), "result");
        assert!(write(1, "charge", StepState::Failed).validate().is_ok());
        assert!(write(MAX_JOB_STEPS, "charge", StepState::Completed)
            .validate()
            .is_ok());
    }

    #[test]
    fn waits_resolve_at_their_deadline_by_kind() {
        assert_eq!(
            wake_resolution(StepKind::Sleep),
            (StepState::Completed, None)
        );
        for kind in [StepKind::Signal, StepKind::Event, StepKind::Invoke] {
            let (state, error) = wake_resolution(kind);
            assert_eq!(state, StepState::TimedOut);
            assert_eq!(
                error.map(|e| e.class),
                Some(crate::error_class::TIMEOUT.to_string())
            );
        }
    }

    #[test]
    fn a_final_failure_compensates_while_runs_remain() {
        assert_eq!(final_failure(0, 0), FinalFailure::Dead);
        assert_eq!(final_failure(2, 0), FinalFailure::Compensate);
        assert_eq!(
            final_failure(1, MAX_COMPENSATION_RUNS - 1),
            FinalFailure::Compensate
        );
        assert_eq!(
            final_failure(1, MAX_COMPENSATION_RUNS),
            FinalFailure::CompensationFailed
        );
    }

    #[test]
    fn records_read_back_as_the_wire_names_them() {
        let stored = record(1, "charge", StepKind::Step, StepState::TimedOut);
        let text = serde_json::to_value(&stored).unwrap();
        assert_eq!(text["kind"], "step");
        assert_eq!(text["state"], "timed_out");
        assert_eq!(
            serde_json::from_value::<StepRecord>(text).unwrap(),
            stored,
            "a record survives the wire"
        );
    }
}
