//! The operations a case is made of, and how they are generated.

use super::*;

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

pub(super) fn job_spec() -> impl Strategy<Value = JobSpec> {
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

pub(super) fn lease_pick() -> impl Strategy<Value = LeasePick> {
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

pub(super) fn op_strategy() -> impl Strategy<Value = Op> {
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
