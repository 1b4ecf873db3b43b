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

mod compare;
mod operations;
mod reference;
mod runner;

use compare::*;
pub use operations::*;
use reference::*;
use runner::*;

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
