//! The single writer thread and its group commit.
//!
//! Every state change is a closure sent to one thread that owns the write connection. The thread
//! takes whatever has queued up (up to `MAX_BATCH`), runs each closure inside its own savepoint
//! within one transaction, commits once (one fsync in durable mode), and only then answers every
//! caller. Concurrent enqueues, fetches and completions therefore share one fsync: throughput
//! grows with load while every acknowledgement still follows the commit.

use chrono::{DateTime, Utc};
use conveyor_core::limits::turns::KeyTurns;
use conveyor_core::workflow::FlowGraph;
use conveyor_core::{Clock, JobState, QueueSettings, StoreError, StoreOptions, StoreResult};
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, Notify};
use uuid::Uuid;

use crate::errors::backend;

/// Bound on `WriteCtx::claimed_queues`.
const MAX_CLAIMED_QUEUES: usize = 200_000;
/// Most operations committed together; bounds transaction size and reply latency.
const MAX_BATCH: usize = 512;

/// What an operation sees while it runs inside the round's transaction.
pub(crate) struct WriteCtx<'c> {
    pub conn: &'c Connection,
    pub now: DateTime<Utc>,
    pub options: &'c StoreOptions,
    /// Set by operations that made jobs available, so waiting fetchers are woken after commit.
    pub wake: bool,
    /// Due jobs are promoted at most once per round, however many fetches the round holds.
    pub promoted: bool,
    /// Per-queue state count changes of this round, written just before the commit.
    pub counts: Vec<(String, JobState, i64)>,
    /// Queues of jobs this writer claimed, so completing them needs no extra read for the
    /// counts. A job's queue never changes, so an entry is never wrong, only possibly absent.
    pub claimed_queues: &'c mut HashMap<Uuid, String>,
    /// Every queue's settings, loaded at start and kept in step by `queue_settings_put`, so
    /// the fetch and insert paths check pauses and limits without a read.
    pub settings: &'c mut HashMap<String, QueueSettings>,
    /// Where each queue's tenant round-robin resumes (see `limits`).
    pub cursors: &'c mut Cursors,
    /// Flow graphs as the writer last wrote them (see [`GraphCache`]).
    pub graphs: &'c mut GraphCache,
    /// Set when an operation panicked: the in-memory settings are re-read after the round.
    pub reload_settings: bool,
    /// Whether anyone listens to the jobs flows start (see `conveyor_core::FlowStarts`).
    pub flow_starts_observed: bool,
    /// The jobs flows started in this round, told once it has committed.
    pub flow_started: Vec<conveyor_core::Inserted>,
    /// The named limits, read at most once per round (`turns`).
    pub limit_specs: std::cell::OnceCell<
        std::collections::BTreeMap<String, conveyor_core::limits::named::LimitSpec>,
    >,
    /// The turns of the keyed candidates of the claim being made, for `turns::serve`.
    pub turns_read: HashMap<Uuid, u64>,
    /// What each key (queue, priority, key) was given and the turn served in each (queue,
    /// priority) this round, as written: reads saved for a batch's later jobs. An operation
    /// rolled back may leave a key ahead of what is stored; its later jobs then skip a turn.
    pub turns_given: std::cell::RefCell<HashMap<(String, i32, String), KeyTurns>>,
    pub turns_served: std::cell::RefCell<HashMap<(String, i32), u64>>,
}

/// Per queue, the tenant group served last by a limited fetch (`None`: the group of
/// jobs without a tenant), so the next fetch's round-robin starts after it.
pub(crate) type Cursors = HashMap<String, Option<String>>;

/// The text of a caught panic.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(text) = panic.downcast_ref::<&str>() {
        (*text).to_string()
    } else if let Some(text) = panic.downcast_ref::<String>() {
        text.clone()
    } else {
        "a panic without a message".to_string()
    }
}

impl WriteCtx<'_> {
    /// Records that a job of `queue` left state `from` and/or entered state `to`.
    pub fn count_move(&mut self, queue: &str, from: Option<JobState>, to: Option<JobState>) {
        if from == to {
            return;
        }
        if let Some(from) = from {
            self.counts.push((queue.to_string(), from, -1));
        }
        if let Some(to) = to {
            self.counts.push((queue.to_string(), to, 1));
        }
    }

    /// Jobs of `queue` in `states`: the stored counts plus this round's changes not yet written.
    pub fn queue_count(&self, queue: &str, states: &[JobState]) -> StoreResult<u64> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT n FROM queue_state_counts WHERE queue = ?1 AND state = ?2")
            .map_err(backend)?;
        let mut total: i64 = 0;
        for state in states {
            let stored: Option<i64> = stmt
                .query_row(params![queue, state.as_str()], |row| row.get(0))
                .optional()
                .map_err(backend)?;
            total += stored.unwrap_or(0);
        }
        let pending: i64 = self
            .counts
            .iter()
            .filter(|(q, state, _)| q == queue && states.contains(state))
            .map(|(_, _, delta)| delta)
            .sum();
        Ok((total + pending).max(0) as u64)
    }

    /// Applies the round's count changes, summed per (queue, state).
    fn flush_counts(&mut self) -> rusqlite::Result<()> {
        let mut sums: HashMap<(String, JobState), i64> = HashMap::new();
        for (queue, state, delta) in self.counts.drain(..) {
            *sums.entry((queue, state)).or_default() += delta;
        }
        let mut stmt = self.conn.prepare_cached(
            "INSERT INTO queue_state_counts (queue, state, n) VALUES (?1, ?2, ?3) \
             ON CONFLICT (queue, state) DO UPDATE SET n = n + excluded.n",
        )?;
        for ((queue, state), delta) in sums {
            if delta != 0 {
                stmt.execute(rusqlite::params![queue, state.as_str(), delta])?;
            }
        }
        Ok(())
    }
}

/// The graphs of recently changed flows, as the writer last wrote them. Every change to a
/// flow goes through the writer thread, so a cached graph is the stored one; reading it again
/// for every step of a wide flow would cost a row per step per event. Entries of an operation
/// that fails are forgotten (its savepoint undid them), all of them when a round fails. Kept
/// here rather than in `workflow`, which reads and fills it, because the rounds decide when
/// entries are dropped.
#[derive(Default)]
pub(crate) struct GraphCache {
    graphs: HashMap<Uuid, FlowGraph>,
    /// Steps over all of `graphs`.
    steps: usize,
    /// Flows the current operation changed.
    pub(crate) touched: Vec<Uuid>,
    /// The completion being applied: its job and its result as stored, so the step it finishes
    /// takes the result without reading it back (see `completing`).
    pub(crate) completing: Option<(Uuid, Option<String>)>,
    /// Results of the steps the current operation completed, by flow and step, so the steps
    /// they start are handed them without reading them back.
    pub(crate) results: HashMap<(Uuid, String), Option<String>>,
}

/// Most steps kept over all cached graphs (a few hundred bytes each); past it the cache starts
/// afresh (a miss only costs a read).
const MAX_CACHED_STEPS: usize = 200_000;

impl GraphCache {
    pub(crate) fn begin_op(&mut self) {
        self.touched.clear();
        self.completing = None;
        self.results.clear();
    }

    pub(crate) fn forget_op(&mut self) {
        for id in std::mem::take(&mut self.touched) {
            self.take(id);
        }
        self.completing = None;
        self.results.clear();
    }

    pub(crate) fn clear(&mut self) {
        self.graphs.clear();
        self.steps = 0;
        self.touched.clear();
        self.completing = None;
        self.results.clear();
    }

    /// Says that the job `job_id` was just completed with `result` (as stored), for the flow
    /// event that follows in the same operation.
    pub(crate) fn completing(&mut self, job_id: Uuid, result: Option<String>) {
        self.completing = Some((job_id, result));
    }

    pub(crate) fn take(&mut self, id: Uuid) -> Option<FlowGraph> {
        let graph = self.graphs.remove(&id)?;
        self.steps -= graph.steps.len();
        Some(graph)
    }

    pub(crate) fn keep(&mut self, graph: FlowGraph) {
        if self.steps + graph.steps.len() > MAX_CACHED_STEPS {
            self.graphs.clear();
            self.steps = 0;
        }
        self.steps += graph.steps.len();
        if let Some(old) = self.graphs.insert(graph.id, graph) {
            self.steps -= old.steps.len();
        }
    }
}

pub(crate) trait PendingWrite: Send {
    /// False for claims (fetch, heartbeat) whose loss on power failure only re-delivers a job.
    fn needs_fsync(&self) -> bool;
    fn run(&mut self, ctx: &mut WriteCtx<'_>);
    fn finish(self: Box<Self>, commit: Result<(), String>);
}

pub(crate) type Op = Box<dyn PendingWrite>;

struct Write<T, F> {
    needs_fsync: bool,
    work: Option<F>,
    outcome: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

/// How an operation's commit must reach the disk before its caller is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sync {
    /// fsync'd before the answer (in durable mode): enqueues, completions, failures, admin.
    Durable,
    /// A claim (fetch, heartbeat): rides on the next durable commit's fsync. If power fails
    /// first, the claim is undone and the job is delivered again, which at-least-once allows.
    Claim,
}

pub(crate) fn op<T, F>(sync: Sync, work: F) -> (Op, oneshot::Receiver<StoreResult<T>>)
where
    T: Send + 'static,
    F: FnOnce(&mut WriteCtx<'_>) -> StoreResult<T> + Send + 'static,
{
    let (reply, receiver) = oneshot::channel();
    let write = Write {
        needs_fsync: sync == Sync::Durable,
        work: Some(work),
        outcome: None,
        reply,
    };
    (Box::new(write), receiver)
}

impl<T, F> PendingWrite for Write<T, F>
where
    T: Send + 'static,
    F: FnOnce(&mut WriteCtx<'_>) -> StoreResult<T> + Send + 'static,
{
    fn needs_fsync(&self) -> bool {
        self.needs_fsync
    }

    fn run(&mut self, ctx: &mut WriteCtx<'_>) {
        let Some(work) = self.work.take() else {
            return;
        };
        // A savepoint per operation: one that fails is undone alone, the rest of the round commits.
        if let Err(e) = run_cached(ctx.conn, "SAVEPOINT op") {
            self.outcome = Some(Err(backend(e)));
            return;
        }
        let wake_before = ctx.wake;
        let counts_before = ctx.counts.len();
        let started_before = ctx.flow_started.len();
        ctx.graphs.begin_op();
        // A panicking operation (a bug, or input no validation foresaw) fails alone: its
        // savepoint is rolled back below like any failed operation's, and the writer goes on
        // serving every other caller instead of dying with the thread.
        let outcome = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(ctx))) {
            Ok(outcome) => outcome,
            Err(panic) => {
                let message = panic_message(panic.as_ref());
                tracing::error!(panic = %message, "a store operation panicked; it was undone");
                // It may have left the in-memory settings half-changed: re-read them.
                ctx.reload_settings = true;
                Err(StoreError::Internal(format!(
                    "the operation failed unexpectedly ({message}); nothing was changed"
                )))
            }
        };
        let end = if outcome.is_ok() {
            run_cached(ctx.conn, "RELEASE op")
        } else {
            ctx.wake = wake_before;
            ctx.counts.truncate(counts_before);
            ctx.flow_started.truncate(started_before);
            // The flows it changed are rolled back too: forget their cached graphs.
            ctx.graphs.forget_op();
            run_cached(ctx.conn, "ROLLBACK TO op").and_then(|()| run_cached(ctx.conn, "RELEASE op"))
        };
        self.outcome = Some(match end {
            Ok(()) => outcome,
            Err(e) => Err(backend(e)),
        });
    }

    fn finish(self: Box<Self>, commit: Result<(), String>) {
        let outcome = match commit {
            Ok(()) => self
                .outcome
                .unwrap_or_else(|| Err(StoreError::backend("operation did not run"))),
            Err(message) => Err(StoreError::backend(message)),
        };
        // The caller may have gone away (a cancelled request); the write stands regardless.
        let _ = self.reply.send(outcome);
    }
}

/// Runs a parameterless statement through the statement cache (savepoints run per operation).
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

/// In durable mode the writer switches between `synchronous=FULL` (rounds holding any durable
/// operation) and `synchronous=OFF` (claim-only rounds). Because the WAL is appended in order,
/// a durable commit's fsync also covers every claim committed before it. Automatic
/// checkpoints are off in this mode (one during an unsynced commit would not fsync); the
/// writer checkpoints itself, always under `FULL`.
struct SyncControl {
    durable: bool,
    full: bool,
    rounds_since_checkpoint: u32,
    last_checkpoint: Instant,
}

const CHECKPOINT_EVERY_ROUNDS: u32 = 500;
const CHECKPOINT_EVERY: Duration = Duration::from_secs(1);

impl SyncControl {
    fn set_full(&mut self, conn: &Connection, full: bool) -> rusqlite::Result<()> {
        if self.durable && self.full != full {
            conn.execute_batch(if full {
                "PRAGMA synchronous=FULL"
            } else {
                "PRAGMA synchronous=OFF"
            })?;
            self.full = full;
        }
        Ok(())
    }

    fn after_round(&mut self, conn: &Connection) {
        if !self.durable {
            return;
        }
        self.rounds_since_checkpoint += 1;
        if self.rounds_since_checkpoint < CHECKPOINT_EVERY_ROUNDS
            && self.last_checkpoint.elapsed() < CHECKPOINT_EVERY
        {
            return;
        }
        let checkpoint = self
            .set_full(conn, true)
            .and_then(|()| conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())));
        if let Err(error) = checkpoint {
            tracing::warn!(%error, "WAL checkpoint failed; will retry");
        }
        self.rounds_since_checkpoint = 0;
        self.last_checkpoint = Instant::now();
    }
}

/// Moves the stored times that stand for durations by a step of the wall clock, in the round's
/// transaction before its operations: a running job's lease deadline, a live worker's last
/// heartbeat, the maintenance leader's term, the rate windows' starts. Without it a step forward
/// by more than a lease would rescue every running job at once (and mark every worker dead), and
/// a step back would hold a dead worker's jobs for the step's length. Times users gave (`run_at`,
/// `expires_at`, schedule ticks) are wall times and stay where they are.
fn follow_wall_step(conn: &Connection, step: chrono::Duration) -> rusqlite::Result<()> {
    let ms = step.num_milliseconds();
    tracing::warn!(
        step_ms = ms,
        "the wall clock stepped; leases, worker heartbeats, leadership and rate windows move with it"
    );
    for statement in [
        "UPDATE jobs SET lease_expires_at = lease_expires_at + ?1 \
         WHERE state = 'running' AND lease_expires_at IS NOT NULL",
        "UPDATE workers SET last_seen_at = last_seen_at + ?1 WHERE state = 'alive'",
        "UPDATE leadership SET expires_at = expires_at + ?1",
        "UPDATE rate_starts SET started_at = started_at + ?1",
    ] {
        conn.execute(statement, [ms])?;
    }
    Ok(())
}

/// Whom the writer tells, after a commit, of what it changed.
pub(crate) struct Signals {
    /// Woken when jobs became available.
    pub wakeup: Arc<Notify>,
    /// Told of the jobs flows started.
    pub flow_starts: Arc<conveyor_core::FlowStarts>,
}

pub(crate) fn run_writer(
    conn: Connection,
    ops: Receiver<Op>,
    clock: Arc<dyn Clock>,
    options: StoreOptions,
    signals: Signals,
    durable: bool,
    rounds: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut sync = SyncControl {
        durable,
        full: true,
        rounds_since_checkpoint: 0,
        last_checkpoint: Instant::now(),
    };
    let mut batch: Vec<Op> = Vec::with_capacity(MAX_BATCH);
    let mut claimed_queues = HashMap::new();
    let mut settings = load_settings(&conn);
    let mut cursors = Cursors::new();
    let mut graphs = GraphCache::default();
    // Only the process's own wall clock steps; a clock given on purpose (tests) moves as told.
    let mut steps = clock
        .is_system()
        .then(|| conveyor_core::WallSteps::new(Duration::from_secs(1)));
    while let Ok(first) = ops.recv() {
        // Entries of jobs that left `running` other than by completion are not removed one by
        // one; dropping the cache now and then bounds it (a miss only costs a read).
        if claimed_queues.len() > MAX_CLAIMED_QUEUES {
            claimed_queues.clear();
        }
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        rounds.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let needs_fsync = batch.iter().any(|op| op.needs_fsync());
        let now = clock.now();
        let step = steps.as_mut().and_then(|steps| steps.look(now));
        let mut ctx = WriteCtx {
            conn: &conn,
            now,
            options: &options,
            wake: false,
            promoted: false,
            counts: Vec::new(),
            claimed_queues: &mut claimed_queues,
            settings: &mut settings,
            cursors: &mut cursors,
            graphs: &mut graphs,
            reload_settings: false,
            flow_starts_observed: signals.flow_starts.observed(),
            flow_started: Vec::new(),
            limit_specs: std::cell::OnceCell::new(),
            turns_read: HashMap::new(),
            turns_given: Default::default(),
            turns_served: Default::default(),
        };
        let begin = sync
            .set_full(&conn, needs_fsync)
            .and_then(|()| conn.execute_batch("BEGIN IMMEDIATE"))
            .and_then(|()| step.map_or(Ok(()), |step| follow_wall_step(&conn, step)));
        let commit = match begin {
            Ok(()) => {
                for op in batch.iter_mut() {
                    op.run(&mut ctx);
                }
                let committed = conveyor_core::faults::inject("sqlite_commit")
                    .map_err(|e| e.to_string())
                    .and_then(|()| {
                        ctx.flush_counts()
                            .and_then(|()| conn.execute_batch("COMMIT"))
                            .map_err(|e| e.to_string())
                    });
                match committed {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        let _ = conn.execute_batch("ROLLBACK");
                        Err(format!("commit failed: {e}"))
                    }
                }
            }
            Err(e) => Err(format!("could not begin a write transaction: {e}")),
        };
        let wake = ctx.wake && commit.is_ok();
        let reload_settings = ctx.reload_settings;
        // Told before the callers are answered, so a caller that sees its completion applied
        // finds the steps it started counted.
        if commit.is_ok() {
            signals.flow_starts.started(&ctx.flow_started);
        }
        if let Err(message) = &commit {
            tracing::error!(error = %message, ops = batch.len(), "sqlite write round failed");
        }
        if commit.is_err() || reload_settings {
            // A settings change may have been rolled back with the round: re-read them.
            settings = load_settings(&conn);
            // So may any flow's change.
            graphs.clear();
        }
        for op in batch.drain(..) {
            op.finish(commit.clone());
        }
        if wake {
            signals.wakeup.notify_waiters();
        }
        sync.after_round(&conn);
    }
}

/// Every queue's settings as stored; empty (all defaults) if they cannot be read.
pub(crate) fn load_settings(conn: &Connection) -> HashMap<String, QueueSettings> {
    match crate::rows::queue_settings(conn) {
        Ok(all) => all
            .into_iter()
            .map(|named| (named.name, named.settings))
            .collect(),
        Err(error) => {
            tracing::error!(%error, "cannot read queue settings; using defaults");
            HashMap::new()
        }
    }
}
