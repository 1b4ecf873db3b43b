//! Sequences: jobs that share a sequence key run strictly one after another, in the order they
//! were enqueued (priority does not reorder them), while different keys run in parallel.
//!
//! The rule, which both stores apply in the same transaction as the change that triggers it:
//! - A job *holds* its sequence from enqueue until it finishes: while scheduled, available,
//!   running or retryable, and while dead unless the sequence says `"on_dead": "skip"`
//!   ([`holds`]). A retry therefore holds its successors back.
//! - A job enqueued while any job of its key holds the sequence, or waits in it, is stored
//!   `blocked`, numbered after the last ([`JobSequence::no`]); it is never fetched.
//! - When a job that held its sequence stops holding it (completed, cancelled, expired, dead
//!   with `skip`, or a dead job discarded) and no other job of the key holds it, the blocked
//!   job with the lowest number is released: scheduled or available by its `run_at`.
//!
//! Order is by number, never by time: the servers of a cluster may disagree on the time.
//! A leaf: it imports only the job states (the key expressions are parsed where a spec is
//! checked, `crate::validate`, and evaluated where jobs are stamped, `crate::limits`).

use serde::{Deserialize, Serialize};

use crate::state::JobState;

/// What a dead job does to the jobs behind it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDead {
    /// Holds them back until it is replayed (and completes), discarded or cancelled.
    #[default]
    Block,
    /// Lets the next one run: the dead job is set aside.
    Skip,
}

impl OnDead {
    pub fn as_str(self) -> &'static str {
        match self {
            OnDead::Block => "block",
            OnDead::Skip => "skip",
        }
    }
}

/// A sequence as configured on a queue, a kind or a job: `"sequence": "<key expression>"` or
/// `{"key": "<key expression>", "on_dead": "block" | "skip"}`. The key is an expression like a
/// limit's (`tenant`, `kind`, `queue`, `payload.a.b`); a job without a value there is not
/// sequenced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SequenceSpec {
    pub key: String,
    #[serde(default)]
    pub on_dead: OnDead,
}

impl SequenceSpec {
    /// The sequence of `key` (an expression such as `payload.account`), dead jobs blocking.
    pub fn key(key: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            on_dead: OnDead::Block,
        }
    }

    /// The same sequence with `on_dead` as given.
    pub fn on_dead(mut self, on_dead: OnDead) -> Self {
        self.on_dead = on_dead;
        self
    }
}

impl<'de> Deserialize<'de> for SequenceSpec {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Full {
            key: String,
            #[serde(default)]
            on_dead: OnDead,
        }
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Form {
            Key(String),
            Full(Full),
        }
        match Form::deserialize(deserializer).map_err(|_| {
            serde::de::Error::custom(
                "expected a key expression or {\"key\": ..., \"on_dead\": \"block\"|\"skip\"}",
            )
        })? {
            Form::Key(key) => Ok(Self {
                key,
                on_dead: OnDead::Block,
            }),
            Form::Full(Full { key, on_dead }) => Ok(Self { key, on_dead }),
        }
    }
}

/// The sequence a job enters, as stamped at enqueue: the key expression and the job's value
/// there (`payload.account=42`), so jobs anywhere with the same expression and value share it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SequenceKey {
    pub key: String,
    #[serde(default)]
    pub on_dead: OnDead,
}

/// A stored job's place in its sequence.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSequence {
    pub key: String,
    /// Its position: 1 for the first job of the key, each later enqueue one more than the last
    /// job of the key still stored.
    pub no: u64,
    #[serde(default)]
    pub on_dead: OnDead,
}

impl JobSequence {
    /// A job's place as the stores keep it: the key, the number (never negative in a store
    /// that wrote it) and whether a dead job lets the next one run.
    pub fn stored(key: String, no: i64, skip_dead: bool) -> Self {
        Self {
            key,
            no: u64::try_from(no).unwrap_or(0),
            on_dead: if skip_dead {
                OnDead::Skip
            } else {
                OnDead::Block
            },
        }
    }
}

/// Whether a job of a sequence in `state` holds it: its successors may not start.
pub fn holds(state: JobState, on_dead: OnDead) -> bool {
    match state {
        JobState::Scheduled | JobState::Available | JobState::Running | JobState::Retryable => true,
        JobState::Dead => on_dead == OnDead::Block,
        JobState::Completed | JobState::Cancelled | JobState::Expired | JobState::Blocked => false,
    }
}

/// [`holds`] as an SQL condition on a `jobs` row whose columns are named with `prefix` (`""`,
/// `"j."`, `"OLD."`); the same text in both stores' dialects.
pub fn holds_sql(prefix: &str) -> String {
    format!(
        "({prefix}state IN ('scheduled', 'available', 'running', 'retryable') \
         OR ({prefix}state = 'dead' AND NOT {prefix}sequence_skip_dead))"
    )
}

/// Whether a new job of the key must wait behind this row: it holds the sequence or already
/// waits in it (`blocked`).
pub fn waits_sql(prefix: &str) -> String {
    format!("({prefix}state = 'blocked' OR {})", holds_sql(prefix))
}

/// The states of the rows the rule reads (every state but the finished ones that never hold):
/// stores index exactly these (`jobs_sequence_open`).
pub const OPEN_STATES: [JobState; 6] = [
    JobState::Blocked,
    JobState::Scheduled,
    JobState::Available,
    JobState::Running,
    JobState::Retryable,
    JobState::Dead,
];

/// The state a released job takes, as an SQL expression on its row given the parameter that
/// holds "now": scheduled while its `run_at` is ahead, else available.
pub fn released_state_sql(now: &str) -> String {
    format!("CASE WHEN run_at > {now} THEN 'scheduled' ELSE 'available' END")
}

/// The stamped key of an expression and the job's value there.
pub fn sequence_key(expression: &str, value: &str) -> String {
    format!("{expression}={value}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_holds_and_a_dead_job_holds_unless_skipped() {
        assert!(holds(JobState::Retryable, OnDead::Skip));
        assert!(holds(JobState::Running, OnDead::Block));
        assert!(holds(JobState::Dead, OnDead::Block));
        assert!(!holds(JobState::Dead, OnDead::Skip));
        for state in [JobState::Completed, JobState::Cancelled, JobState::Expired] {
            assert!(!holds(state, OnDead::Block), "{state}");
        }
        assert!(!holds(JobState::Blocked, OnDead::Block));
    }

    #[test]
    fn the_sql_lists_the_same_holding_states() {
        let holds_text = holds_sql("");
        let waits_text = waits_sql("");
        for state in JobState::ALL {
            let quoted = format!("'{}'", state.as_str());
            let by_rule = holds(state, OnDead::Skip);
            // Dead is the one state whose holding depends on the row's `on_dead`.
            if state == JobState::Dead {
                assert!(holds_text.contains(&quoted) && holds(state, OnDead::Block) && !by_rule);
            } else {
                assert_eq!(holds_text.contains(&quoted), by_rule, "{state}");
                let waits = waits_text.contains(&quoted);
                assert_eq!(waits, by_rule || state == JobState::Blocked, "{state}");
            }
            let open = holds(state, OnDead::Block) || state == JobState::Blocked;
            assert_eq!(OPEN_STATES.contains(&state), open, "{state}");
        }
        assert!(holds_sql("OLD.").contains("NOT OLD.sequence_skip_dead"));
    }

    #[test]
    fn a_spec_reads_as_a_key_or_an_object() {
        let short: SequenceSpec = serde_json::from_str(r#""payload.account""#).unwrap();
        assert_eq!(short.key, "payload.account");
        assert_eq!(short.on_dead, OnDead::Block);
        let full: SequenceSpec =
            serde_json::from_str(r#"{"key": "tenant", "on_dead": "skip"}"#).unwrap();
        assert_eq!(full.on_dead, OnDead::Skip);
        assert!(serde_json::from_str::<SequenceSpec>(r#"{"key": "tenant", "x": 1}"#).is_err());
        assert!(serde_json::from_str::<SequenceSpec>("3").is_err());
    }
}
