//! What is compared after every step: answers, and every job's observable state.

use super::*;

/// A job as the comparison names it: by creation index, or an id the model does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum JobRef {
    Job(usize),
    Unknown(Uuid),
}

impl fmt::Display for JobRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobRef::Job(i) => write!(f, "#{i}"),
            JobRef::Unknown(id) => write!(f, "unknown job {id}"),
        }
    }
}

/// A lease by the number the model gave it at fetch, or a token the runner never saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseId {
    No(usize),
    Foreign(Uuid),
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Inserted {
    pub(super) job: JobRef,
    pub(super) duplicate: bool,
    pub(super) state: JobState,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Claimed {
    pub(super) job: JobRef,
    pub(super) attempt: u32,
    pub(super) expires_at: Option<DateTime<Utc>>,
}

/// The parts of a returned job that an answer is compared on.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Snap {
    pub(super) job: JobRef,
    pub(super) state: JobState,
    pub(super) attempt: u32,
    pub(super) run_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Refusal {
    NotFound(JobRef),
    Conflict(JobRef, JobState),
    LeaseLost(JobRef),
    /// Any other error: a divergence whatever the model said.
    Other(String),
}

/// What an operation answered.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Outcome {
    Done,
    /// The operation needed a lease or a job and there was none.
    Skipped,
    Enqueued(Vec<Inserted>),
    Fetched(Vec<Claimed>),
    Heartbeats(Vec<Option<DateTime<Utc>>>),
    /// Per completion: applied (true) or lease lost.
    Completed(Vec<bool>),
    Failed(Result<Snap, Refusal>),
    Snoozed(Result<Snap, Refusal>),
    Released(u64),
    Cancelled(Result<Snap, Refusal>),
    Replayed(u64),
    Discarded(bool),
    Rescued {
        retried: Vec<JobRef>,
        dead: Vec<JobRef>,
    },
    Promoted(u64),
    Error(String),
}

/// A stored job as compared after every step.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct View {
    pub(super) job: JobRef,
    pub(super) kind: String,
    pub(super) queue: String,
    pub(super) key: Option<String>,
    pub(super) priority: i32,
    pub(super) max_attempts: u32,
    pub(super) state: JobState,
    pub(super) attempt: u32,
    pub(super) run_at: DateTime<Utc>,
    pub(super) created_at: DateTime<Utc>,
    pub(super) started_at: Option<DateTime<Utc>>,
    pub(super) finished_at: Option<DateTime<Utc>>,
    pub(super) lease: Option<(LeaseId, DateTime<Utc>)>,
    /// (attempt, at, class) of each recorded error, oldest first.
    pub(super) errors: Vec<ErrorView>,
}

/// Per queue: counts by state (in `JobState::ALL` order) and the oldest available job's age.
pub(super) type Stats = BTreeMap<String, ([u64; 7], u64)>;

/// How often each kind of answer came up across a run, to show what the cases exercised.
#[derive(Debug, Default)]
pub(super) struct Tally(pub(super) BTreeMap<&'static str, u64>);

impl Tally {
    pub(super) fn add(&mut self, what: &'static str, n: u64) {
        if n > 0 {
            *self.0.entry(what).or_default() += n;
        }
    }

    /// Counts what an agreed answer shows.
    pub(super) fn record(&mut self, op: &Op, outcome: &Outcome) {
        self.add("steps", 1);
        let count =
            |flags: &[bool], want: bool| flags.iter().filter(|f| **f == want).count() as u64;
        match outcome {
            Outcome::Done => match op {
                Op::Restart {
                    worker_survives: true,
                } => self.add("restart (worker kept leases)", 1),
                Op::Restart { .. } => self.add("restart (worker crashed)", 1),
                _ => self.add("clock moves", 1),
            },
            Outcome::Skipped => self.add("skipped (no lease or job)", 1),
            Outcome::Enqueued(inserted) => {
                let dups: Vec<bool> = inserted.iter().map(|i| i.duplicate).collect();
                self.add("enqueued", count(&dups, false));
                self.add("enqueue duplicates", count(&dups, true));
            }
            Outcome::Fetched(claims) if claims.is_empty() => self.add("fetches of nothing", 1),
            Outcome::Fetched(claims) => self.add("claims", claims.len() as u64),
            Outcome::Heartbeats(beats) => {
                let held: Vec<bool> = beats.iter().map(Option::is_some).collect();
                self.add("heartbeats held", count(&held, true));
                self.add("heartbeats lost", count(&held, false));
            }
            Outcome::Completed(applied) => {
                self.add("completions applied", count(applied, true));
                self.add("completions lost", count(applied, false));
            }
            Outcome::Failed(Ok(snap)) if snap.state == JobState::Dead => {
                self.add("failures to dead", 1)
            }
            Outcome::Failed(Ok(_)) => self.add("failures to retryable", 1),
            Outcome::Failed(Err(_)) => self.add("failures lost", 1),
            Outcome::Snoozed(Ok(_)) => self.add("snoozes", 1),
            Outcome::Snoozed(Err(_)) => self.add("snoozes lost", 1),
            Outcome::Released(n) => self.add("releases", *n),
            Outcome::Cancelled(Ok(_)) => self.add("cancels", 1),
            Outcome::Cancelled(Err(Refusal::Conflict(..))) => self.add("cancel conflicts", 1),
            Outcome::Cancelled(Err(_)) => self.add("cancels not found", 1),
            Outcome::Replayed(n) => self.add("replayed", *n),
            Outcome::Discarded(gone) => self.add(
                if *gone {
                    "discarded"
                } else {
                    "discards refused"
                },
                1,
            ),
            Outcome::Rescued { retried, dead } => {
                self.add("rescued to retryable", retried.len() as u64);
                self.add("rescued to dead", dead.len() as u64);
            }
            Outcome::Promoted(n) => self.add("promoted", *n),
            Outcome::Error(_) => self.add("errors", 1),
        }
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(what, n)| format!("{what} {n}"))
            .collect();
        f.write_str(&parts.join(", "))
    }
}
