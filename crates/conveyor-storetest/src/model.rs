//! Model-based testing: random sequences of job operations, applied both to a store and to a
//! small in-memory reference model of the rules, compared after every step.
//!
//! The operations are the ones a producer, a worker, an operator and the maintenance loop
//! perform: enqueue (idempotency keys, delays, priorities, attempt limits), fetch, heartbeat,
//! complete, fail (backoff, a given time, never), snooze, release, cancel, dead-letter replay
//! and discard, moving the clock, rescuing expired leases, promoting due jobs, and restarting
//! the store (closed and reopened on the same database; the worker side either forgets its
//! leases, as a crashed worker does, or keeps them, as an HTTP worker outliving a server
//! restart does).
//!
//! After every step the runner compares what the operation answered (ids, duplicates, lease
//! outcomes, errors, counts) and then every job's observable state (state, attempt, run_at,
//! timestamps, lease and its expiry, error history), the queue counts and the next due time.
//! Any difference fails the case; proptest then shrinks the sequence and the panic message
//! shows the smallest one found, step by step, with what the model expected and what the store
//! did.
//!
//! The rules the model holds the stores to (docs/architecture.md, the `Store` trait, and the
//! conformance suite):
//! - enqueue: a key held by a job returns the latest job that holds it, `duplicate: true`;
//!   unfinished jobs always hold their key, completed ones for 24 h after they finished, dead
//!   and cancelled ones never; a batch counts as inserted one by one. A `run_at` in the future
//!   makes the job `scheduled`, else `available` (a past `run_at` is kept).
//! - fetch: due `scheduled`/`retryable` jobs are promoted first; then available jobs of the
//!   named queues by priority (higher first), run_at, then age; each claim counts an attempt,
//!   sets `started_at` and a fresh lease of 30 s.
//! - heartbeat, complete, fail, snooze, release apply only while the job is `running` under
//!   that very token (an expired lease still holds until the rescuer takes it); fail appends
//!   `{attempt, at, class}` and goes `retryable` at the plan's time (`At` clamped to now) while
//!   attempts remain, else `dead`; snooze and release give the attempt back.
//! - cancel: unknown ids are `NotFound`, finished jobs a `Conflict` naming their state, others
//!   `cancelled` (a running job's lease revoked). Replay: dead jobs to `available` now with
//!   attempt 0, history kept; discard deletes dead jobs only.
//! - rescue: every running job whose lease expired (`expires_at <= now`) fails with
//!   `lease_expired` under a 2 s, 4 s, ... backoff; promote makes due jobs available.
//!
//! Everything the model predicts is determined: backoff policies have no jitter, every rescue
//! takes all expired leases, and ties in claim order are broken by creation order (ids are
//! UUIDv7, generated in order within a process).
//!
//! Besides random sequences, every store runs [`known_sequences`]: rules the random cases
//! reach only rarely, and divergences found before.
//!
//! A store crate runs it from a plain (not async) test, with a [`ModelBackend`] that makes a
//! fresh database per case and opens a store on it with the given clock:
//!
//! ```ignore
//! #[test]
//! fn store_matches_the_model() {
//!     conveyor_storetest::model::run_model(MyBackend, conveyor_storetest::model::ModelSettings::from_env());
//! }
//! ```
//!
//! The stores must use the default [`conveyor_core::StoreOptions`] (a 24 h idempotency window
//! for completed jobs).

use chrono::{DateTime, Utc};
use conveyor_core::{
    Clock, CompleteParams, ErrorRecord, FailParams, FetchParams, HeartbeatParams, Job,
    JobListParams, JobState, LeaseOutcome, LeaseRef, ManualClock, NewJob, QueueStats,
    ReplaySelector, RescueParams, RetryPlan, RetryPolicy, SnoozeParams, Store, StoreError,
    StoreResult,
};
use conveyor_core::{JobStore, LeadershipStore, LeaseStore, QueueStore};
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestCaseError, TestError, TestRunner};
use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// The queues the generated jobs go to.
pub const QUEUES: [&str; 2] = ["q1", "q2"];
/// The kinds the generated jobs have (dead-letter replay can select by kind).
pub const KINDS: [&str; 2] = ["k1", "k2"];
/// How many distinct idempotency keys the generated jobs draw from.
pub const KEYS: usize = 3;

const WORKER: &str = "model-worker";
/// Every fetch leases its jobs this long.
const LEASE_MS: i64 = 30_000;
/// The default `StoreOptions::completed_idempotency_window`.
const IDEMPOTENCY_WINDOW_MS: i64 = 24 * 3600 * 1000;
/// Failures with `RetryPlan::Backoff` use `fixed_exponential(1 s, 1 h)`.
const FAIL_BACKOFF_MS: u64 = 1_000;
/// The rescuer uses `fixed_exponential(2 s, 1 h)`.
const RESCUE_BACKOFF_MS: u64 = 2_000;
const BACKOFF_MAX_MS: u64 = 3_600_000;
/// One store call taking longer than this fails the case (a hang, not a slow machine).
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// The store side: how a store crate plugs in
// ---------------------------------------------------------------------------------------------

/// Makes databases and opens stores on them, for [`run_model`].
pub trait ModelBackend: Send + Sync {
    /// One case's database (a temporary directory, a schema and the guard that drops it):
    /// created empty by [`ModelBackend::create`], dropped after the case, after its store was
    /// closed.
    type Db: Send + Sync;
    type Store: Store;

    /// A fresh, empty database.
    fn create(&self) -> impl Future<Output = Self::Db> + Send;

    /// Opens a store on `db` that reads "now" from `clock`: at the start of a case, and again
    /// after each restart (on the same data). Opening may be retried for a few seconds while
    /// it fails (a closed store may release its database asynchronously).
    fn open(
        &self,
        db: &Self::Db,
        clock: Arc<ManualClock>,
    ) -> impl Future<Output = StoreResult<Self::Store>> + Send;

    /// Shuts a store down before it is reopened or its database dropped. The default drops it;
    /// a store with a close or shutdown method should call it.
    fn close(&self, store: Self::Store) -> impl Future<Output = ()> + Send {
        async move { drop(store) }
    }
}

/// How many cases to run and how long they are.
#[derive(Debug, Clone)]
pub struct ModelSettings {
    /// Random sequences tried (`PROPTEST_CASES`, default 64).
    pub cases: u32,
    /// Longest sequence (`CONVEYOR_MODEL_MAX_OPS`, default 48).
    pub max_ops: usize,
    /// The seed (`PROPTEST_RNG_SEED`; random by default and printed on failure, so a failing
    /// run can be repeated).
    pub seed: u64,
    /// Most shrinking steps after a failure (`PROPTEST_MAX_SHRINK_ITERS`, default 2048).
    pub max_shrink_iters: u32,
    /// Longest time spent shrinking, in ms (`PROPTEST_MAX_SHRINK_TIME`, default 120000).
    pub max_shrink_time_ms: u32,
}

impl ModelSettings {
    pub fn from_env() -> Self {
        fn var<T: std::str::FromStr>(name: &str) -> Option<T> {
            std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
        }
        Self {
            cases: var("PROPTEST_CASES").unwrap_or(64),
            max_ops: var("CONVEYOR_MODEL_MAX_OPS").unwrap_or(48).max(1),
            seed: var("PROPTEST_RNG_SEED").unwrap_or_else(rand_seed),
            max_shrink_iters: var("PROPTEST_MAX_SHRINK_ITERS").unwrap_or(2048),
            max_shrink_time_ms: var("PROPTEST_MAX_SHRINK_TIME").unwrap_or(120_000),
        }
    }
}

fn rand_seed() -> u64 {
    let id = Uuid::new_v4().as_u128();
    (id >> 64) as u64 ^ id as u64
}

/// Runs `settings.cases` random operation sequences against stores made by `backend` and
/// against the model, panicking with the shrunk sequence on the first divergence. Builds its
/// own tokio runtime: call it from a plain `#[test]`, not from inside a runtime.
pub fn run_model<B: ModelBackend>(backend: B, settings: ModelSettings) {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => panic!("cannot build a tokio runtime for the model test: {e}"),
    };
    let config = Config {
        cases: settings.cases,
        failure_persistence: None,
        max_shrink_iters: settings.max_shrink_iters,
        max_shrink_time: settings.max_shrink_time_ms,
        rng_seed: RngSeed::Fixed(settings.seed),
        ..Config::default()
    };
    let mut runner = TestRunner::new(config);
    let strategy = proptest::collection::vec(op_strategy(), 1..=settings.max_ops);
    let started = std::time::Instant::now();
    let tally = std::sync::Mutex::new(Tally::default());
    let outcome = runner.run(&strategy, |ops| {
        runtime
            .block_on(run_case(&backend, &ops, &tally))
            .map_err(|failure| {
                TestCaseError::fail(format!(
                    "{failure}\n\nthe sequence ({} operations):\n{}",
                    ops.len(),
                    numbered(&ops)
                ))
            })
    });
    match outcome {
        Ok(()) => eprintln!(
            "model: {} cases of up to {} operations agreed with the store in {:.1?} \
             (seed {}); what they did: {}",
            settings.cases,
            settings.max_ops,
            started.elapsed(),
            settings.seed,
            tally
                .lock()
                .map(|t| t.to_string())
                .unwrap_or_else(|_| "(not counted)".into())
        ),
        Err(TestError::Fail(reason, ops)) => panic!(
            "the store diverged from the model (seed {seed}; rerun with \
             PROPTEST_RNG_SEED={seed}); shrunk to {n} operations.\n\n{reason}\n\n\
             The shrunk sequence, as data: {ops:?}",
            seed = settings.seed,
            n = ops.len(),
        ),
        Err(TestError::Abort(reason)) => panic!("the model test was aborted: {reason}"),
    }
}

/// Runs one given sequence (a regression found earlier, say) against a fresh store and the
/// model; `Err` describes the first divergence. Builds its own tokio runtime, like
/// [`run_model`].
pub fn check_sequence<B: ModelBackend>(backend: &B, ops: &[Op]) -> Result<(), String> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot build a tokio runtime: {e}"))?;
    let tally = std::sync::Mutex::new(Tally::default());
    runtime.block_on(run_case(backend, ops, &tally))
}

/// Sequences every store runs on every run, besides the random ones: each pins a rule that
/// random cases reach only rarely, or a divergence found before. Names say what they check.
pub fn known_sequences() -> Vec<(&'static str, Vec<Op>)> {
    let keyed = |key| JobSpec {
        queue: 0,
        kind: 0,
        key: Some(key),
        run_at_ms: None,
        priority: 0,
        max_attempts: 1,
    };
    let lease = LeasePick {
        index: 0,
        stale: false,
        bogus: false,
    };
    let fetch = Op::Fetch {
        queues: QueueSet::One(0),
        max: 1,
    };
    let hours = |h: f64| Op::Advance {
        ms: (h * 3_600_000.0) as u64,
    };
    vec![
        (
            // StoreOptions: "Unfinished jobs always [count as a duplicate]". Job #0 dies, a new
            // job #1 takes its key, #0 is replayed (unfinished again), #1 is cancelled: the key
            // is held by #0 alone, so the last enqueue must answer #0 as a duplicate.
            "an idempotency key held by a replayed job after its newer namesake was cancelled",
            vec![
                Op::Enqueue(vec![keyed(0)]),
                fetch.clone(),
                Op::Fail {
                    lease,
                    plan: Plan::Never,
                },
                Op::Enqueue(vec![keyed(0)]),
                Op::Replay(Replay::Ids {
                    dead: vec![0],
                    other: None,
                }),
                Op::Cancel { job: 1 },
                Op::Enqueue(vec![keyed(0)]),
            ],
        ),
        (
            "a completed job holds its key for 24 hours after it finished",
            vec![
                Op::Enqueue(vec![keyed(1)]),
                hours(1.0),
                fetch.clone(),
                Op::Complete(vec![lease]),
                hours(23.5),
                Op::Enqueue(vec![keyed(1)]),
                hours(1.0),
                Op::Enqueue(vec![keyed(1)]),
            ],
        ),
        (
            "a lease outlives a store restart when its worker does",
            vec![
                Op::Enqueue(vec![keyed(2)]),
                fetch.clone(),
                Op::Restart {
                    worker_survives: true,
                },
                Op::Heartbeat {
                    leases: vec![lease],
                    extend_ms: 30_000,
                },
                Op::Restart {
                    worker_survives: true,
                },
                Op::Complete(vec![lease]),
            ],
        ),
        (
            "an expired lease settles until the rescuer has taken it",
            vec![
                Op::Enqueue(vec![keyed(0), keyed(1)]),
                Op::Fetch {
                    queues: QueueSet::One(0),
                    max: 2,
                },
                Op::Advance { ms: 31_000 },
                Op::Complete(vec![lease]),
                Op::Rescue,
                Op::Complete(vec![LeasePick { index: 1, ..lease }]),
            ],
        ),
    ]
}

/// Runs every [`known_sequences`] sequence against fresh stores; panics naming each that
/// diverged, with its step-by-step account.
pub fn check_known_sequences<B: ModelBackend>(backend: &B) {
    let failures: Vec<String> = known_sequences()
        .into_iter()
        .filter_map(|(name, ops)| {
            check_sequence(backend, &ops)
                .err()
                .map(|failure| format!("### {name}\n{failure}"))
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} known sequence(s) diverged from the model:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

fn numbered(ops: &[Op]) -> String {
    ops.iter()
        .enumerate()
        .map(|(i, op)| format!("  {i:>2}: {op:?}\n"))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Operations and how they are generated
// ---------------------------------------------------------------------------------------------

/// One job of an enqueue. Indices pick from [`QUEUES`], [`KINDS`] and the keys `key-0`...
#[derive(Debug, Clone)]
pub struct JobSpec {
    pub queue: usize,
    pub kind: usize,
    pub key: Option<usize>,
    /// `run_at` relative to now in ms (`None`: unset, so now).
    pub run_at_ms: Option<i64>,
    pub priority: i32,
    pub max_attempts: u32,
}

/// A lease of the worker side, by position (modulo the length) in the list of leases it
/// believes it still holds, or with `stale` in the list of every lease it was given since its
/// last crash (settled, lost or not). `bogus` keeps the job but replaces the token with one
/// nobody was given.
#[derive(Debug, Clone, Copy)]
pub struct LeasePick {
    pub index: usize,
    pub stale: bool,
    pub bogus: bool,
}

#[derive(Debug, Clone, Copy)]
pub enum Plan {
    /// `RetryPlan::Backoff(fixed_exponential(1 s, 1 h))`.
    Backoff,
    /// `RetryPlan::At(now + ms)`.
    At(i64),
    Never,
}

#[derive(Debug, Clone, Copy)]
pub enum QueueSet {
    One(usize),
    Both,
}

#[derive(Debug, Clone)]
pub enum Replay {
    /// By ids: dead jobs by position among the dead (modulo their number), and `other`, any
    /// job by index (modulo the number of jobs), dead or not.
    Ids {
        dead: Vec<usize>,
        other: Option<usize>,
    },
    Queue(usize),
    Kind(usize),
    /// No filter: every dead job.
    All,
}

#[derive(Debug, Clone)]
pub enum Op {
    Enqueue(Vec<JobSpec>),
    Fetch {
        queues: QueueSet,
        max: usize,
    },
    Heartbeat {
        leases: Vec<LeasePick>,
        extend_ms: u64,
    },
    Complete(Vec<LeasePick>),
    Fail {
        lease: LeasePick,
        plan: Plan,
    },
    /// Snooze until now + ms.
    Snooze {
        lease: LeasePick,
        until_ms: i64,
    },
    Release(Vec<LeasePick>),
    /// Cancel the job at this index (modulo the number of jobs).
    Cancel {
        job: usize,
    },
    /// Cancel an id the store never saw.
    CancelUnknown,
    Replay(Replay),
    /// Discard a job: with `dead`, by position among the dead jobs (when there are any), else
    /// by index among all jobs.
    Discard {
        job: usize,
        dead: bool,
    },
    Advance {
        ms: u64,
    },
    /// `jobs_rescue_expired`, as the maintenance loop runs it.
    Rescue,
    /// `jobs_promote_due`, as the maintenance loop runs it.
    Promote,
    /// Close the store and open a new one on the same database.
    Restart {
        worker_survives: bool,
    },
}

fn job_spec() -> impl Strategy<Value = JobSpec> {
    let run_at = prop_oneof![
        3 => Just(None),
        2 => prop::sample::select(vec![-5_000i64, 0, 1, 1_000, 30_000, 120_000]).prop_map(Some),
    ];
    (
        0..QUEUES.len(),
        0..KINDS.len(),
        prop::option::weighted(0.4, 0..KEYS),
        run_at,
        -1..=1i32,
        1..=3u32,
    )
        .prop_map(
            |(queue, kind, key, run_at_ms, priority, max_attempts)| JobSpec {
                queue,
                kind,
                key,
                run_at_ms,
                priority,
                max_attempts,
            },
        )
}

fn lease_pick() -> impl Strategy<Value = LeasePick> {
    (
        0..64usize,
        prop::bool::weighted(0.2),
        prop::bool::weighted(0.1),
    )
        .prop_map(|(index, stale, bogus)| LeasePick {
            index,
            stale,
            bogus,
        })
}

fn op_strategy() -> impl Strategy<Value = Op> {
    let queues = prop_oneof![
        2 => (0..QUEUES.len()).prop_map(QueueSet::One),
        1 => Just(QueueSet::Both),
    ];
    let plan = prop_oneof![
        3 => Just(Plan::Backoff),
        2 => prop::sample::select(vec![-2_000i64, 0, 3_000, 90_000]).prop_map(Plan::At),
        2 => Just(Plan::Never),
    ];
    let replay = prop_oneof![
        3 => (
            proptest::collection::vec(0..64usize, 0..=2),
            prop::option::weighted(0.3, 0..64usize),
        )
            .prop_map(|(dead, other)| Replay::Ids { dead, other }),
        1 => (0..QUEUES.len()).prop_map(Replay::Queue),
        1 => (0..KINDS.len()).prop_map(Replay::Kind),
        1 => Just(Replay::All),
    ];
    let advance = prop_oneof![
        12 => prop::sample::select(vec![1u64, 999, 1_000, 2_000, 4_000, 15_000, 31_000, 120_000]),
        1 => Just(25 * 3600 * 1000u64),
    ];
    prop_oneof![
        14 => proptest::collection::vec(job_spec(), 1..=3).prop_map(Op::Enqueue),
        16 => (queues, 1..=4usize).prop_map(|(queues, max)| Op::Fetch { queues, max }),
        5 => (
            proptest::collection::vec(lease_pick(), 1..=3),
            prop::sample::select(vec![5_000u64, 30_000, 120_000]),
        )
            .prop_map(|(leases, extend_ms)| Op::Heartbeat { leases, extend_ms }),
        9 => proptest::collection::vec(lease_pick(), 1..=2).prop_map(Op::Complete),
        10 => (lease_pick(), plan).prop_map(|(lease, plan)| Op::Fail { lease, plan }),
        2 => (lease_pick(), prop::sample::select(vec![-1_000i64, 0, 2_000, 60_000]))
            .prop_map(|(lease, until_ms)| Op::Snooze { lease, until_ms }),
        2 => proptest::collection::vec(lease_pick(), 1..=2).prop_map(Op::Release),
        3 => (0..64usize).prop_map(|job| Op::Cancel { job }),
        1 => Just(Op::CancelUnknown),
        5 => replay.prop_map(Op::Replay),
        2 => (0..64usize, prop::bool::weighted(0.7)).prop_map(|(job, dead)| Op::Discard { job, dead }),
        12 => advance.prop_map(|ms| Op::Advance { ms }),
        8 => Just(Op::Rescue),
        3 => Just(Op::Promote),
        3 => prop::bool::weighted(0.3).prop_map(|worker_survives| Op::Restart { worker_survives }),
    ]
}

// ---------------------------------------------------------------------------------------------
// What is compared
// ---------------------------------------------------------------------------------------------

/// A job as the comparison names it: by creation index, or an id the model does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum JobRef {
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
enum LeaseId {
    No(usize),
    Foreign(Uuid),
}

#[derive(Debug, Clone, PartialEq)]
struct Inserted {
    job: JobRef,
    duplicate: bool,
    state: JobState,
}

#[derive(Debug, Clone, PartialEq)]
struct Claimed {
    job: JobRef,
    attempt: u32,
    expires_at: Option<DateTime<Utc>>,
}

/// The parts of a returned job that an answer is compared on.
#[derive(Debug, Clone, PartialEq)]
struct Snap {
    job: JobRef,
    state: JobState,
    attempt: u32,
    run_at: DateTime<Utc>,
}

#[derive(Debug, Clone, PartialEq)]
enum Refusal {
    NotFound(JobRef),
    Conflict(JobRef, JobState),
    LeaseLost(JobRef),
    /// Any other error: a divergence whatever the model said.
    Other(String),
}

/// What an operation answered.
#[derive(Debug, Clone, PartialEq)]
enum Outcome {
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
struct View {
    job: JobRef,
    kind: String,
    queue: String,
    key: Option<String>,
    priority: i32,
    max_attempts: u32,
    state: JobState,
    attempt: u32,
    run_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    lease: Option<(LeaseId, DateTime<Utc>)>,
    /// (attempt, at, class) of each recorded error, oldest first.
    errors: Vec<ErrorView>,
}

/// Per queue: counts by state (in `JobState::ALL` order) and the oldest available job's age.
type Stats = BTreeMap<String, ([u64; 7], u64)>;

/// How often each kind of answer came up across a run, to show what the cases exercised.
#[derive(Debug, Default)]
struct Tally(BTreeMap<&'static str, u64>);

impl Tally {
    fn add(&mut self, what: &'static str, n: u64) {
        if n > 0 {
            *self.0.entry(what).or_default() += n;
        }
    }

    /// Counts what an agreed answer shows.
    fn record(&mut self, op: &Op, outcome: &Outcome) {
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

// ---------------------------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
struct MLease {
    no: usize,
    expires_at: DateTime<Utc>,
}

#[derive(Debug, Clone)]
struct MJob {
    /// The store's id, learned from the enqueue's answer.
    id: Uuid,
    kind: usize,
    queue: usize,
    key: Option<usize>,
    priority: i32,
    max_attempts: u32,
    state: JobState,
    attempt: u32,
    run_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    started_at: Option<DateTime<Utc>>,
    finished_at: Option<DateTime<Utc>>,
    lease: Option<MLease>,
    errors: Vec<ErrorView>,
    /// Discarded from the dead-letter queue: gone from the store.
    deleted: bool,
}

impl MJob {
    fn is_due(&self, now: DateTime<Utc>) -> bool {
        matches!(self.state, JobState::Scheduled | JobState::Retryable) && self.run_at <= now
    }

    /// Whether the job's idempotency key makes a new enqueue with it a duplicate: unfinished
    /// jobs always, completed ones within the window, dead and cancelled ones never.
    fn holds_key(&self, now: DateTime<Utc>) -> bool {
        match self.state {
            JobState::Completed => self
                .finished_at
                .is_some_and(|at| at + ms(IDEMPOTENCY_WINDOW_MS) > now),
            JobState::Dead | JobState::Cancelled => false,
            _ => true,
        }
    }

    fn holds(&self, lease_no: usize) -> bool {
        self.state == JobState::Running && self.lease.as_ref().is_some_and(|l| l.no == lease_no)
    }
}

/// The lease number of a made-up token that no fetch handed out.
const NO_LEASE: usize = usize::MAX;

/// A lease as the model sees a pick: its number, its job, and whether the token is bogus.
#[derive(Debug, Clone, Copy)]
struct PickedLease {
    no: usize,
    job: usize,
    bogus: bool,
}

#[derive(Debug)]
struct Model {
    now: DateTime<Utc>,
    jobs: Vec<MJob>,
    /// Lease number → job index.
    lease_jobs: Vec<usize>,
}

fn ms(n: i64) -> chrono::Duration {
    chrono::Duration::milliseconds(n)
}

/// `fixed_exponential(base, 1 h)` without jitter: base, 2 base, 4 base, ... capped.
fn backoff_ms(base: u64, attempt: u32) -> i64 {
    let doubling = attempt.saturating_sub(1).min(40);
    let delay = base.saturating_mul(1u64 << doubling).min(BACKOFF_MAX_MS);
    delay as i64
}

fn state_index(state: JobState) -> usize {
    JobState::ALL
        .iter()
        .position(|s| *s == state)
        .unwrap_or_default()
}

impl Model {
    fn new(now: DateTime<Utc>) -> Self {
        Self {
            now,
            jobs: Vec::new(),
            lease_jobs: Vec::new(),
        }
    }

    fn job_ref(&self, index: usize) -> JobRef {
        JobRef::Job(index)
    }

    /// Inserts the batch as if one by one; new jobs get the next indices (ids come later).
    fn enqueue(&mut self, specs: &[JobSpec]) -> Vec<Inserted> {
        let now = self.now;
        let mut out = Vec::with_capacity(specs.len());
        for spec in specs {
            if let Some(key) = spec.key {
                // The documented rule: a key held by a job (the latest that holds it) returns
                // that job.
                let holder =
                    self.jobs.iter().enumerate().rev().find(|(_, job)| {
                        !job.deleted && job.key == Some(key) && job.holds_key(now)
                    });
                if let Some((index, job)) = holder {
                    out.push(Inserted {
                        job: JobRef::Job(index),
                        duplicate: true,
                        state: job.state,
                    });
                    continue;
                }
            }
            let run_at = spec.run_at_ms.map_or(now, |offset| now + ms(offset));
            let state = if run_at > now {
                JobState::Scheduled
            } else {
                JobState::Available
            };
            self.jobs.push(MJob {
                id: Uuid::nil(),
                kind: spec.kind,
                queue: spec.queue,
                key: spec.key,
                priority: spec.priority,
                max_attempts: spec.max_attempts,
                state,
                attempt: 0,
                run_at,
                created_at: now,
                started_at: None,
                finished_at: None,
                lease: None,
                errors: Vec::new(),
                deleted: false,
            });
            out.push(Inserted {
                job: JobRef::Job(self.jobs.len() - 1),
                duplicate: false,
                state,
            });
        }
        out
    }

    fn promote(&mut self) -> u64 {
        let now = self.now;
        let mut promoted = 0;
        for job in self.jobs.iter_mut().filter(|j| !j.deleted && j.is_due(now)) {
            job.state = JobState::Available;
            promoted += 1;
        }
        promoted
    }

    /// Promotes due jobs, then claims up to `max` available jobs of `queues` by priority
    /// (higher first), run_at, then age. Returns the claims with their new lease numbers.
    fn fetch(&mut self, queues: &[usize], max: usize) -> Vec<(Claimed, usize)> {
        self.promote();
        let mut candidates: Vec<usize> = (0..self.jobs.len())
            .filter(|&i| {
                let job = &self.jobs[i];
                !job.deleted && job.state == JobState::Available && queues.contains(&job.queue)
            })
            .collect();
        candidates.sort_by(|&a, &b| {
            let (ja, jb) = (&self.jobs[a], &self.jobs[b]);
            jb.priority
                .cmp(&ja.priority)
                .then(ja.run_at.cmp(&jb.run_at))
                .then(a.cmp(&b))
        });
        candidates.truncate(max);
        let now = self.now;
        let mut out = Vec::with_capacity(candidates.len());
        for index in candidates {
            let no = self.lease_jobs.len();
            self.lease_jobs.push(index);
            let job = &mut self.jobs[index];
            job.state = JobState::Running;
            job.attempt += 1;
            job.started_at = Some(now);
            let expires_at = now + ms(LEASE_MS);
            job.lease = Some(MLease { no, expires_at });
            out.push((
                Claimed {
                    job: JobRef::Job(index),
                    attempt: job.attempt,
                    expires_at: Some(expires_at),
                },
                no,
            ));
        }
        out
    }

    /// The job held under `lease`, unless the lease is bogus or lost.
    fn held(&mut self, lease: PickedLease) -> Option<&mut MJob> {
        let job = &mut self.jobs[lease.job];
        (!lease.bogus && !job.deleted && job.holds(lease.no)).then_some(job)
    }

    fn heartbeat(&mut self, leases: &[PickedLease], extend_ms: u64) -> Vec<Option<DateTime<Utc>>> {
        let expires_at = self.now + ms(extend_ms as i64);
        leases
            .iter()
            .map(|&lease| {
                let job = self.held(lease)?;
                if let Some(held) = job.lease.as_mut() {
                    held.expires_at = expires_at;
                }
                Some(expires_at)
            })
            .collect()
    }

    fn complete(&mut self, leases: &[PickedLease]) -> Vec<bool> {
        let now = self.now;
        leases
            .iter()
            .map(|&lease| match self.held(lease) {
                Some(job) => {
                    job.state = JobState::Completed;
                    job.finished_at = Some(now);
                    job.lease = None;
                    true
                }
                None => false,
            })
            .collect()
    }

    /// Records a failed attempt: `retryable` at `retry_at` while attempts remain, else `dead`.
    fn record_failure(
        job: &mut MJob,
        now: DateTime<Utc>,
        class: &str,
        retry_at: Option<DateTime<Utc>>,
    ) {
        job.errors.push((job.attempt, now, class.to_string(), None));
        job.lease = None;
        match retry_at {
            Some(at) if job.attempt < job.max_attempts => {
                job.state = JobState::Retryable;
                job.run_at = at;
            }
            _ => {
                job.state = JobState::Dead;
                job.finished_at = Some(now);
            }
        }
    }

    fn snap(&self, index: usize) -> Snap {
        let job = &self.jobs[index];
        Snap {
            job: JobRef::Job(index),
            state: job.state,
            attempt: job.attempt,
            run_at: job.run_at,
        }
    }

    fn fail(&mut self, lease: PickedLease, plan: Plan) -> Result<Snap, Refusal> {
        let now = self.now;
        let Some(job) = self.held(lease) else {
            return Err(Refusal::LeaseLost(JobRef::Job(lease.job)));
        };
        let retry_at = match plan {
            Plan::Backoff => Some(now + ms(backoff_ms(FAIL_BACKOFF_MS, job.attempt))),
            Plan::At(offset) => Some((now + ms(offset)).max(now)),
            Plan::Never => None,
        };
        Self::record_failure(job, now, conveyor_core::error_class::ERROR, retry_at);
        Ok(self.snap(lease.job))
    }

    fn snooze(&mut self, lease: PickedLease, until_ms: i64) -> Result<Snap, Refusal> {
        let now = self.now;
        let Some(job) = self.held(lease) else {
            return Err(Refusal::LeaseLost(JobRef::Job(lease.job)));
        };
        let until = (now + ms(until_ms)).max(now);
        job.state = if until > now {
            JobState::Scheduled
        } else {
            JobState::Available
        };
        job.run_at = until;
        job.attempt = job.attempt.saturating_sub(1);
        job.lease = None;
        Ok(self.snap(lease.job))
    }

    fn release(&mut self, leases: &[PickedLease]) -> u64 {
        let mut released = 0;
        for &lease in leases {
            if let Some(job) = self.held(lease) {
                job.state = JobState::Available;
                job.attempt = job.attempt.saturating_sub(1);
                job.lease = None;
                released += 1;
            }
        }
        released
    }

    fn cancel(&mut self, index: usize) -> Result<Snap, Refusal> {
        let now = self.now;
        let job = &mut self.jobs[index];
        if job.deleted {
            return Err(Refusal::NotFound(JobRef::Job(index)));
        }
        if job.state.is_finished() {
            return Err(Refusal::Conflict(JobRef::Job(index), job.state));
        }
        job.state = JobState::Cancelled;
        job.finished_at = Some(now);
        job.lease = None;
        Ok(self.snap(index))
    }

    fn replay(&mut self, selected: impl Fn(usize, &MJob) -> bool) -> u64 {
        let now = self.now;
        let mut replayed = 0;
        for (index, job) in self.jobs.iter_mut().enumerate() {
            if !job.deleted && job.state == JobState::Dead && selected(index, job) {
                // The failure that ended the run is marked with the replay's time.
                if let Some(last) = job.errors.last_mut() {
                    last.3 = Some(now);
                }
                job.state = JobState::Available;
                job.attempt = 0;
                job.run_at = now;
                job.finished_at = None;
                replayed += 1;
            }
        }
        replayed
    }

    fn discard(&mut self, index: usize) -> bool {
        let job = &mut self.jobs[index];
        if job.deleted || job.state != JobState::Dead {
            return false;
        }
        job.deleted = true;
        true
    }

    fn rescue(&mut self) -> (Vec<JobRef>, Vec<JobRef>) {
        let now = self.now;
        let (mut retried, mut dead) = (Vec::new(), Vec::new());
        for (index, job) in self.jobs.iter_mut().enumerate() {
            let expired = job.state == JobState::Running
                && job.lease.as_ref().is_some_and(|l| l.expires_at <= now);
            if job.deleted || !expired {
                continue;
            }
            let retry_at = now + ms(backoff_ms(RESCUE_BACKOFF_MS, job.attempt));
            Self::record_failure(
                job,
                now,
                conveyor_core::error_class::LEASE_EXPIRED,
                Some(retry_at),
            );
            if job.state == JobState::Dead {
                dead.push(JobRef::Job(index));
            } else {
                retried.push(JobRef::Job(index));
            }
        }
        (retried, dead)
    }

    fn views(&self) -> Vec<View> {
        self.jobs
            .iter()
            .enumerate()
            .filter(|(_, job)| !job.deleted)
            .map(|(index, job)| View {
                job: self.job_ref(index),
                kind: KINDS[job.kind].to_string(),
                queue: QUEUES[job.queue].to_string(),
                key: job.key.map(key_name),
                priority: job.priority,
                max_attempts: job.max_attempts,
                state: job.state,
                attempt: job.attempt,
                run_at: job.run_at,
                created_at: job.created_at,
                started_at: job.started_at,
                finished_at: job.finished_at,
                lease: job
                    .lease
                    .as_ref()
                    .map(|l| (LeaseId::No(l.no), l.expires_at)),
                errors: job.errors.clone(),
            })
            .collect()
    }

    fn stats(&self) -> Stats {
        let mut stats = Stats::new();
        for job in self.jobs.iter().filter(|j| !j.deleted) {
            let entry = stats
                .entry(QUEUES[job.queue].to_string())
                .or_insert(([0; 7], 0));
            entry.0[state_index(job.state)] += 1;
            if job.state == JobState::Available {
                let age = (self.now - job.run_at).num_milliseconds().max(0) as u64;
                entry.1 = entry.1.max(age);
            }
        }
        stats.retain(|_, (counts, _)| counts.iter().any(|n| *n > 0));
        stats
    }

    fn next_due(&self) -> Option<DateTime<Utc>> {
        self.jobs
            .iter()
            .filter(|j| !j.deleted && matches!(j.state, JobState::Scheduled | JobState::Retryable))
            .map(|j| j.run_at)
            .min()
    }
}

fn key_name(key: usize) -> String {
    format!("key-{key}")
}

// ---------------------------------------------------------------------------------------------
// The runner: one case, the store and the model side by side
// ---------------------------------------------------------------------------------------------

struct Runner<'b, B: ModelBackend> {
    backend: &'b B,
    clock: Arc<ManualClock>,
    store: Option<B::Store>,
    model: Model,
    /// Lease number → the lease the store handed out.
    leases: Vec<Option<LeaseRef>>,
    tokens: HashMap<Uuid, usize>,
    /// Lease numbers the worker side was given since its last crash.
    known: Vec<usize>,
    /// Those it believes it still holds: not yet settled, and not reported lost to it.
    held: Vec<usize>,
    /// The lease numbers the current operation picked.
    last_picked: Option<Vec<usize>>,
    ids: HashMap<Uuid, usize>,
    log: Vec<String>,
}

/// Runs one sequence on a fresh database; `Err` describes the first divergence.
async fn run_case<B: ModelBackend>(
    backend: &B,
    ops: &[Op],
    tally: &std::sync::Mutex<Tally>,
) -> Result<(), String> {
    let db = backend.create().await;
    let clock = Arc::new(ManualClock::default());
    let store = open_with_retry(backend, &db, clock.clone()).await?;
    let mut runner = Runner {
        backend,
        model: Model::new(clock.now()),
        clock,
        store: Some(store),
        leases: Vec::new(),
        tokens: HashMap::new(),
        known: Vec::new(),
        held: Vec::new(),
        last_picked: None,
        ids: HashMap::new(),
        log: Vec::new(),
    };
    let mut outcome = Ok(());
    let mut seen = Tally::default();
    for (step, op) in ops.iter().enumerate() {
        if let Err(divergence) = runner.step(&db, op, &mut seen).await {
            outcome = Err(format!(
                "step {step} ({op:?}) diverged:\n{divergence}\n\nthe steps up to it:\n{}",
                runner.log.join("\n")
            ));
            break;
        }
    }
    if let Some(store) = runner.store.take() {
        backend.close(store).await;
    }
    drop(db);
    if outcome.is_ok() {
        if let Ok(mut total) = tally.lock() {
            for (what, n) in seen.0 {
                total.add(what, n);
            }
        }
    }
    outcome
}

async fn open_with_retry<B: ModelBackend>(
    backend: &B,
    db: &B::Db,
    clock: Arc<ManualClock>,
) -> Result<B::Store, String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match backend.open(db, clock.clone()).await {
            Ok(store) => return Ok(store),
            Err(_) if std::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => return Err(format!("cannot open the store: {e}")),
        }
    }
}

async fn timed<T>(what: &str, work: impl Future<Output = T>) -> Result<T, String> {
    tokio::time::timeout(STEP_TIMEOUT, work)
        .await
        .map_err(|_| format!("{what} did not answer within {STEP_TIMEOUT:?}"))
}

fn compare<T: PartialEq + fmt::Debug>(what: &str, expected: &T, actual: &T) -> Result<(), String> {
    if expected == actual {
        Ok(())
    } else {
        Err(format!(
            "{what}:\n  model expected: {expected:?}\n  store answered: {actual:?}"
        ))
    }
}

impl<B: ModelBackend> Runner<'_, B> {
    fn store(&self) -> &B::Store {
        // Only `restart` takes the store out, and it always puts one back or fails the case.
        self.store.as_ref().expect("the runner holds an open store")
    }

    fn job_ref(&self, id: Uuid) -> JobRef {
        self.ids
            .get(&id)
            .map_or(JobRef::Unknown(id), |&i| JobRef::Job(i))
    }

    fn refusal(&self, error: StoreError) -> Refusal {
        match error {
            StoreError::NotFound(id) => Refusal::NotFound(self.job_ref(id)),
            StoreError::Conflict { id, state, .. } => Refusal::Conflict(self.job_ref(id), state),
            StoreError::LeaseLost(id) => Refusal::LeaseLost(self.job_ref(id)),
            other => Refusal::Other(other.to_string()),
        }
    }

    fn snap(&self, job: &Job) -> Snap {
        Snap {
            job: self.job_ref(job.id),
            state: job.state,
            attempt: job.attempt,
            run_at: job.run_at,
        }
    }

    /// Resolves lease picks against the worker's lists; `None` when it was given no lease.
    /// A worker side without leases (none fetched since its last crash) tries made-up tokens
    /// on existing jobs instead; `None` when there are no jobs either.
    fn pick(&mut self, picks: &[LeasePick]) -> Option<Vec<(PickedLease, LeaseRef)>> {
        if self.known.is_empty() {
            self.last_picked = None;
            return picks
                .iter()
                .map(|pick| {
                    let job = self.pick_job(pick.index)?;
                    let picked = PickedLease {
                        no: NO_LEASE,
                        job,
                        bogus: true,
                    };
                    let lease = LeaseRef {
                        id: self.model.jobs[job].id,
                        lease_token: Uuid::new_v4(),
                    };
                    Some((picked, lease))
                })
                .collect();
        }
        picks
            .iter()
            .map(|pick| {
                let list = if pick.stale || self.held.is_empty() {
                    &self.known
                } else {
                    &self.held
                };
                let no = list[pick.index % list.len()];
                let lease = self.leases[no]?;
                let lease = if pick.bogus {
                    LeaseRef {
                        id: lease.id,
                        lease_token: Uuid::new_v4(),
                    }
                } else {
                    lease
                };
                let picked = PickedLease {
                    no,
                    job: self.model.lease_jobs[no],
                    bogus: pick.bogus,
                };
                Some((picked, lease))
            })
            .collect::<Option<Vec<_>>>()
            .inspect(|picked| {
                self.last_picked = Some(picked.iter().map(|(p, _)| p.no).collect());
            })
    }

    /// The worker side stops counting on the leases it settled or was told it lost.
    fn forget_settled(&mut self, outcome: &Outcome) {
        let Some(picked) = self.last_picked.take() else {
            return;
        };
        let forget: Vec<usize> = match outcome {
            Outcome::Heartbeats(beats) => picked
                .iter()
                .zip(beats)
                .filter(|(_, beat)| beat.is_none())
                .map(|(no, _)| *no)
                .collect(),
            Outcome::Completed(_)
            | Outcome::Failed(_)
            | Outcome::Snoozed(_)
            | Outcome::Released(_) => picked,
            _ => Vec::new(),
        };
        self.held.retain(|no| !forget.contains(no));
    }

    /// The dead job at position `index` (modulo their number) among the dead.
    fn pick_dead(&self, index: usize) -> Option<usize> {
        let dead: Vec<usize> = (0..self.model.jobs.len())
            .filter(|&i| {
                let job = &self.model.jobs[i];
                !job.deleted && job.state == JobState::Dead
            })
            .collect();
        (!dead.is_empty()).then(|| dead[index % dead.len()])
    }

    fn pick_job(&self, index: usize) -> Option<usize> {
        (!self.model.jobs.is_empty()).then(|| index % self.model.jobs.len())
    }

    async fn step(&mut self, db: &B::Db, op: &Op, seen: &mut Tally) -> Result<(), String> {
        let (expected, actual, described) = self.apply(db, op).await?;
        self.log.push(format!(
            "  {:>2}: {described} -> {actual:?}",
            self.log.len()
        ));
        compare("the operation's answer", &expected, &actual)?;
        seen.record(op, &expected);
        self.forget_settled(&expected);
        self.check_state().await
    }

    /// Applies `op` to the model and the store: (expected, actual, the op as resolved).
    async fn apply(&mut self, db: &B::Db, op: &Op) -> Result<(Outcome, Outcome, String), String> {
        let described = format!("{op:?}");
        match op {
            Op::Enqueue(specs) => {
                let expected = self.model.enqueue(specs);
                let jobs: Vec<NewJob> = specs.iter().map(|s| new_job(s, self.model.now)).collect();
                let answer = timed("enqueue", self.store().jobs_insert_many(jobs)).await?;
                let actual = match answer {
                    Ok(inserted) => {
                        // New jobs take their ids from the store, position by position.
                        for (want, got) in expected.iter().zip(&inserted) {
                            if let (JobRef::Job(index), false, false) =
                                (want.job, want.duplicate, got.duplicate)
                            {
                                if self.model.jobs[index].id.is_nil() {
                                    self.model.jobs[index].id = got.job.id;
                                    self.ids.insert(got.job.id, index);
                                }
                            }
                        }
                        Outcome::Enqueued(
                            inserted
                                .iter()
                                .map(|i| Inserted {
                                    job: self.job_ref(i.job.id),
                                    duplicate: i.duplicate,
                                    state: i.job.state,
                                })
                                .collect(),
                        )
                    }
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((Outcome::Enqueued(expected), actual, described))
            }
            Op::Fetch { queues, max } => {
                let queue_ids: Vec<usize> = match queues {
                    QueueSet::One(q) => vec![*q],
                    QueueSet::Both => (0..QUEUES.len()).collect(),
                };
                let claims = self.model.fetch(&queue_ids, *max);
                // A slot per lease number the model gave out, filled from the store's answer.
                self.leases.resize(self.model.lease_jobs.len(), None);
                let params = FetchParams {
                    worker_id: WORKER.to_string(),
                    queues: queue_ids.iter().map(|&q| QUEUES[q].to_string()).collect(),
                    max: *max,
                    lease: Duration::from_millis(LEASE_MS as u64),
                    kinds: None,
                    excluded_kinds: Vec::new(),
                };
                let answer = timed("fetch", self.store().jobs_fetch(params)).await?;
                let actual = match answer {
                    Ok(jobs) => {
                        for job in &jobs {
                            let Some(lease) = &job.lease else { continue };
                            // The lease number the model gave this job's claim, if it claimed it.
                            let claimed =
                                claims.iter().find(|(c, _)| c.job == self.job_ref(job.id));
                            if let Some((_, no)) = claimed {
                                let lease_ref = LeaseRef {
                                    id: job.id,
                                    lease_token: lease.token,
                                };
                                self.leases[*no] = Some(lease_ref);
                                self.tokens.insert(lease.token, *no);
                                self.known.push(*no);
                                self.held.push(*no);
                            }
                        }
                        Outcome::Fetched(
                            jobs.iter()
                                .map(|job| Claimed {
                                    job: self.job_ref(job.id),
                                    attempt: job.attempt,
                                    expires_at: job.lease.as_ref().map(|l| l.expires_at),
                                })
                                .collect(),
                        )
                    }
                    Err(e) => Outcome::Error(e.to_string()),
                };
                let expected = Outcome::Fetched(claims.into_iter().map(|(c, _)| c).collect());
                Ok((expected, actual, described))
            }
            Op::Heartbeat { leases, extend_ms } => {
                let Some(picked) = self.pick(leases) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let model_leases: Vec<PickedLease> = picked.iter().map(|(p, _)| *p).collect();
                let expected = Outcome::Heartbeats(self.model.heartbeat(&model_leases, *extend_ms));
                let params = picked
                    .iter()
                    .map(|(_, lease)| HeartbeatParams {
                        lease: *lease,
                        extend_by: Duration::from_millis(*extend_ms),
                    })
                    .collect();
                let actual =
                    match timed("heartbeat", self.store().jobs_heartbeat_many(params)).await? {
                        Ok(beats) => Outcome::Heartbeats(beats),
                        Err(e) => Outcome::Error(e.to_string()),
                    };
                Ok((expected, actual, described))
            }
            Op::Complete(leases) => {
                let Some(picked) = self.pick(leases) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let model_leases: Vec<PickedLease> = picked.iter().map(|(p, _)| *p).collect();
                let expected = Outcome::Completed(self.model.complete(&model_leases));
                let params = picked
                    .iter()
                    .map(|(_, lease)| CompleteParams {
                        lease: *lease,
                        result: None,
                    })
                    .collect();
                let actual =
                    match timed("complete", self.store().jobs_complete_many(params)).await? {
                        Ok(outcomes) => Outcome::Completed(
                            outcomes
                                .iter()
                                .map(|o| *o == LeaseOutcome::Applied)
                                .collect(),
                        ),
                        Err(e) => Outcome::Error(e.to_string()),
                    };
                Ok((expected, actual, described))
            }
            Op::Fail { lease, plan } => {
                let Some(picked) = self.pick(std::slice::from_ref(lease)) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let (model_lease, lease_ref) = picked[0];
                let now = self.model.now;
                let expected = Outcome::Failed(self.model.fail(model_lease, *plan));
                let retry = match plan {
                    Plan::Backoff => RetryPlan::Backoff(RetryPolicy::fixed_exponential(
                        Duration::from_millis(FAIL_BACKOFF_MS),
                        Duration::from_millis(BACKOFF_MAX_MS),
                    )),
                    Plan::At(offset) => RetryPlan::At(now + ms(*offset)),
                    Plan::Never => RetryPlan::Never,
                };
                let params = FailParams {
                    lease: lease_ref,
                    class: conveyor_core::error_class::ERROR.to_string(),
                    message: "model failure".to_string(),
                    retry,
                    backtrace: None,
                };
                let answer = timed("fail", self.store().job_fail(params)).await?;
                let actual = Outcome::Failed(match answer {
                    Ok(job) => Ok(self.snap(&job)),
                    Err(e) => Err(self.refusal(e)),
                });
                Ok((expected, actual, described))
            }
            Op::Snooze { lease, until_ms } => {
                let Some(picked) = self.pick(std::slice::from_ref(lease)) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let (model_lease, lease_ref) = picked[0];
                let until = self.model.now + ms(*until_ms);
                let expected = Outcome::Snoozed(self.model.snooze(model_lease, *until_ms));
                let params = SnoozeParams {
                    lease: lease_ref,
                    until,
                };
                let answer = timed("snooze", self.store().job_snooze(params)).await?;
                let actual = Outcome::Snoozed(match answer {
                    Ok(job) => Ok(self.snap(&job)),
                    Err(e) => Err(self.refusal(e)),
                });
                Ok((expected, actual, described))
            }
            Op::Release(leases) => {
                let Some(picked) = self.pick(leases) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("{described} on {}", describe_leases(&picked));
                let model_leases: Vec<PickedLease> = picked.iter().map(|(p, _)| *p).collect();
                let expected = Outcome::Released(self.model.release(&model_leases));
                let refs = picked.iter().map(|(_, lease)| *lease).collect();
                let actual = match timed("release", self.store().jobs_release_many(refs)).await? {
                    Ok(n) => Outcome::Released(n),
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((expected, actual, described))
            }
            Op::Cancel { job } => {
                let Some(index) = self.pick_job(*job) else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("Cancel #{index}");
                let expected = Outcome::Cancelled(self.model.cancel(index));
                let id = self.model.jobs[index].id;
                let answer = timed("cancel", self.store().job_cancel(id)).await?;
                let actual = Outcome::Cancelled(match answer {
                    Ok(job) => Ok(self.snap(&job)),
                    Err(e) => Err(self.refusal(e)),
                });
                Ok((expected, actual, described))
            }
            Op::CancelUnknown => {
                let id = Uuid::now_v7();
                let expected = Outcome::Cancelled(Err(Refusal::NotFound(JobRef::Unknown(id))));
                let answer = timed("cancel", self.store().job_cancel(id)).await?;
                let actual = Outcome::Cancelled(match answer {
                    Ok(job) => Ok(self.snap(&job)),
                    Err(e) => Err(self.refusal(e)),
                });
                Ok((expected, actual, described))
            }
            Op::Replay(replay) => {
                let (selector, expected, described) = match replay {
                    Replay::Ids { dead, other } => {
                        let indices: Vec<usize> = dead
                            .iter()
                            .filter_map(|p| self.pick_dead(*p))
                            .chain(other.and_then(|p| self.pick_job(p)))
                            .collect();
                        if indices.is_empty() {
                            return Ok((Outcome::Skipped, Outcome::Skipped, described));
                        }
                        let selector = ReplaySelector {
                            ids: Some(indices.iter().map(|&i| self.model.jobs[i].id).collect()),
                            ..Default::default()
                        };
                        let expected = self.model.replay(|i, _| indices.contains(&i));
                        (
                            selector,
                            expected,
                            format!("Replay ids {}", describe_jobs(&indices)),
                        )
                    }
                    Replay::Queue(q) => {
                        let selector = ReplaySelector {
                            queue: Some(QUEUES[*q].to_string()),
                            ..Default::default()
                        };
                        (selector, self.model.replay(|_, j| j.queue == *q), described)
                    }
                    Replay::Kind(k) => {
                        let selector = ReplaySelector {
                            kind: Some(KINDS[*k].to_string()),
                            ..Default::default()
                        };
                        (selector, self.model.replay(|_, j| j.kind == *k), described)
                    }
                    Replay::All => (
                        ReplaySelector::default(),
                        self.model.replay(|_, _| true),
                        described,
                    ),
                };
                let actual = match timed("replay", self.store().dead_replay(selector)).await? {
                    Ok(n) => Outcome::Replayed(n),
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((Outcome::Replayed(expected), actual, described))
            }
            Op::Discard { job, dead } => {
                let picked = if *dead {
                    self.pick_dead(*job).or_else(|| self.pick_job(*job))
                } else {
                    self.pick_job(*job)
                };
                let Some(index) = picked else {
                    return Ok((Outcome::Skipped, Outcome::Skipped, described));
                };
                let described = format!("Discard #{index}");
                let expected = Outcome::Discarded(self.model.discard(index));
                let id = self.model.jobs[index].id;
                let actual = match timed("discard", self.store().dead_discard(id)).await? {
                    Ok(gone) => Outcome::Discarded(gone),
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((expected, actual, described))
            }
            Op::Advance { ms: by } => {
                self.clock.advance(Duration::from_millis(*by));
                self.model.now += ms(*by as i64);
                Ok((Outcome::Done, Outcome::Done, described))
            }
            Op::Rescue => {
                let (mut retried, mut dead) = self.model.rescue();
                retried.sort();
                dead.sort();
                let expected = Outcome::Rescued { retried, dead };
                let params = RescueParams {
                    limit: 10_000,
                    retry: RetryPolicy::fixed_exponential(
                        Duration::from_millis(RESCUE_BACKOFF_MS),
                        Duration::from_millis(BACKOFF_MAX_MS),
                    ),
                };
                let actual = match timed("rescue", self.store().jobs_rescue_expired(params)).await?
                {
                    Ok(report) => {
                        let mut retried: Vec<JobRef> =
                            report.retried.iter().map(|id| self.job_ref(*id)).collect();
                        let mut dead: Vec<JobRef> =
                            report.dead.iter().map(|id| self.job_ref(*id)).collect();
                        retried.sort();
                        dead.sort();
                        Outcome::Rescued { retried, dead }
                    }
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((expected, actual, described))
            }
            Op::Promote => {
                let expected = Outcome::Promoted(self.model.promote());
                let actual = match timed("promote", self.store().jobs_promote_due()).await? {
                    Ok(n) => Outcome::Promoted(n),
                    Err(e) => Outcome::Error(e.to_string()),
                };
                Ok((expected, actual, described))
            }
            Op::Restart { worker_survives } => {
                if let Some(store) = self.store.take() {
                    timed("closing the store", self.backend.close(store)).await?;
                }
                let store = timed(
                    "reopening the store",
                    open_with_retry(self.backend, db, self.clock.clone()),
                )
                .await??;
                self.store = Some(store);
                if !worker_survives {
                    // A crashed worker's leases are gone with it.
                    self.known.clear();
                    self.held.clear();
                }
                Ok((Outcome::Done, Outcome::Done, described))
            }
        }
    }

    /// Compares every job, the queue counts and the next due time with the model.
    async fn check_state(&self) -> Result<(), String> {
        let listed = timed(
            "jobs_list",
            self.store().jobs_list({
                let mut params = JobListParams::default();
                params.limit = 100_000;
                params
            }),
        )
        .await?
        .map_err(|e| format!("jobs_list failed: {e}"))?;
        let mut actual: Vec<View> = listed.iter().map(|job| self.view(job)).collect();
        actual.sort_by_key(|v| v.job);
        let expected = self.model.views();
        if expected != actual {
            let mut lines = Vec::new();
            let by_job = |views: &[View]| -> BTreeMap<JobRef, View> {
                views.iter().map(|v| (v.job, v.clone())).collect()
            };
            let (want, got) = (by_job(&expected), by_job(&actual));
            for job in want
                .keys()
                .chain(got.keys())
                .collect::<std::collections::BTreeSet<_>>()
            {
                match (want.get(job), got.get(job)) {
                    (Some(w), Some(g)) if w == g => {}
                    (Some(w), Some(g)) => lines.push(format!(
                        "  job {job} ({} in the model): {}",
                        w.state,
                        view_diff(w, g).join("; ")
                    )),
                    (w, g) => lines.push(format!(
                        "  job {job}:\n    model expected: {w:?}\n    store has:      {g:?}"
                    )),
                }
            }
            return Err(format!(
                "the stored jobs differ (now = {}):\n{}",
                self.model.now,
                lines.join("\n")
            ));
        }

        let stats = timed("queues_stats", self.store().queues_stats())
            .await?
            .map_err(|e| format!("queues_stats failed: {e}"))?;
        compare("queue stats", &self.model.stats(), &stats_of(&stats))?;

        let queues: Vec<String> = QUEUES.iter().map(|q| q.to_string()).collect();
        let next_due = timed("jobs_next_due", self.store().jobs_next_due(&queues))
            .await?
            .map_err(|e| format!("jobs_next_due failed: {e}"))?;
        compare("next due run_at", &self.model.next_due(), &next_due)
    }

    fn view(&self, job: &Job) -> View {
        View {
            job: self.job_ref(job.id),
            kind: job.kind.clone(),
            queue: job.queue.clone(),
            key: job.idempotency_key.clone(),
            priority: job.priority,
            max_attempts: job.max_attempts,
            state: job.state,
            attempt: job.attempt,
            run_at: job.run_at,
            created_at: job.created_at,
            started_at: job.started_at,
            finished_at: job.finished_at,
            lease: job.lease.as_ref().map(|l| {
                let id = self
                    .tokens
                    .get(&l.token)
                    .map_or(LeaseId::Foreign(l.token), |&no| LeaseId::No(no));
                (id, l.expires_at)
            }),
            errors: job.errors.iter().map(error_view).collect(),
        }
    }
}

/// The fields in which two views of one job differ.
fn view_diff(model: &View, store: &View) -> Vec<String> {
    let mut out = Vec::new();
    macro_rules! fields {
        ($($field:ident),*) => {$(
            if model.$field != store.$field {
                out.push(format!(
                    "{}: model {:?}, store {:?}",
                    stringify!($field),
                    model.$field,
                    store.$field
                ));
            }
        )*};
    }
    fields!(
        kind,
        queue,
        key,
        priority,
        max_attempts,
        state,
        attempt,
        run_at,
        created_at,
        started_at,
        finished_at,
        lease,
        errors
    );
    out
}

/// What the model checks of a history entry: attempt, time, class, and replay mark.
type ErrorView = (u32, DateTime<Utc>, String, Option<DateTime<Utc>>);

fn error_view(e: &ErrorRecord) -> ErrorView {
    (e.attempt, e.at, e.class.clone(), e.replayed_at)
}

fn stats_of(stats: &[QueueStats]) -> Stats {
    stats
        .iter()
        .map(|s| {
            let counts = [
                s.scheduled,
                s.available,
                s.running,
                s.retryable,
                s.completed,
                s.dead,
                s.cancelled,
            ];
            (s.name.clone(), (counts, s.oldest_available_age_ms))
        })
        .filter(|(_, (counts, _))| counts.iter().any(|n| *n > 0))
        .collect()
}

fn new_job(spec: &JobSpec, now: DateTime<Utc>) -> NewJob {
    let mut job = NewJob::new(KINDS[spec.kind], serde_json::json!({}));
    job.queue = QUEUES[spec.queue].to_string();
    job.idempotency_key = spec.key.map(key_name);
    job.run_at = spec.run_at_ms.map(|offset| now + ms(offset));
    job.priority = spec.priority;
    job.max_attempts = spec.max_attempts;
    job
}

fn describe_leases(picked: &[(PickedLease, LeaseRef)]) -> String {
    picked
        .iter()
        .map(|(p, _)| {
            if p.no == NO_LEASE {
                format!("a made-up token on #{}", p.job)
            } else {
                format!(
                    "lease {} of #{}{}",
                    p.no,
                    p.job,
                    if p.bogus { " (bogus token)" } else { "" }
                )
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_jobs(indices: &[usize]) -> String {
    indices
        .iter()
        .map(|i| format!("#{i}"))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_matches_the_core_policy_without_jitter() {
        let policy = RetryPolicy::fixed_exponential(
            Duration::from_millis(FAIL_BACKOFF_MS),
            Duration::from_millis(BACKOFF_MAX_MS),
        );
        for attempt in 1..=30 {
            assert_eq!(
                backoff_ms(FAIL_BACKOFF_MS, attempt),
                policy.delay(attempt).as_millis() as i64,
                "attempt {attempt}"
            );
        }
    }
}
