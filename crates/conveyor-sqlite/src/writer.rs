//! The single writer thread and its group commit.
//!
//! Every state change is a closure sent to one thread that owns the write connection. The thread
//! takes whatever has queued up (up to `MAX_BATCH`), runs each closure inside its own savepoint
//! within one transaction, commits once (one fsync in durable mode), and only then answers every
//! caller. Concurrent enqueues, fetches and completions therefore share one fsync: throughput
//! grows with load while every acknowledgement still follows the commit.

use chrono::{DateTime, Utc};
use conveyor_core::{Clock, JobState, StoreError, StoreOptions, StoreResult};
use rusqlite::Connection;
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, TryRecvError};
use std::sync::Arc;
use tokio::sync::{oneshot, Notify};

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

pub(crate) trait PendingWrite: Send {
    fn run(&mut self, ctx: &mut WriteCtx<'_>);
    fn finish(self: Box<Self>, commit: Result<(), String>);
}

pub(crate) type Op = Box<dyn PendingWrite>;

struct Write<T, F> {
    work: Option<F>,
    outcome: Option<StoreResult<T>>,
    reply: oneshot::Sender<StoreResult<T>>,
}

pub(crate) fn op<T, F>(work: F) -> (Op, oneshot::Receiver<StoreResult<T>>)
where
    T: Send + 'static,
    F: FnOnce(&mut WriteCtx<'_>) -> StoreResult<T> + Send + 'static,
{
    let (reply, receiver) = oneshot::channel();
    let write = Write {
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
    fn run(&mut self, ctx: &mut WriteCtx<'_>) {
        let Some(work) = self.work.take() else {
            return;
        };
        // A savepoint per operation: one that fails is undone alone, the rest of the round commits.
        if let Err(e) = run_cached(ctx.conn, "SAVEPOINT op") {
            self.outcome = Some(Err(crate::backend(e)));
            return;
        }
        let wake_before = ctx.wake;
        let counts_before = ctx.counts.len();
        let outcome = work(ctx);
        let end = if outcome.is_ok() {
            run_cached(ctx.conn, "RELEASE op")
        } else {
            ctx.wake = wake_before;
            ctx.counts.truncate(counts_before);
            run_cached(ctx.conn, "ROLLBACK TO op").and_then(|()| run_cached(ctx.conn, "RELEASE op"))
        };
        self.outcome = Some(match end {
            Ok(()) => outcome,
            Err(e) => Err(crate::backend(e)),
        });
    }

    fn finish(self: Box<Self>, commit: Result<(), String>) {
        let outcome = match commit {
            Ok(()) => self
                .outcome
                .unwrap_or_else(|| Err(StoreError::Backend("operation did not run".into()))),
            Err(message) => Err(StoreError::Backend(message)),
        };
        // The caller may have gone away (a cancelled request); the write stands regardless.
        let _ = self.reply.send(outcome);
    }
}

/// Runs a parameterless statement through the statement cache (savepoints run per operation).
fn run_cached(conn: &Connection, sql: &str) -> rusqlite::Result<()> {
    conn.prepare_cached(sql)?.execute([]).map(|_| ())
}

pub(crate) fn run_writer(
    conn: Connection,
    ops: Receiver<Op>,
    clock: Arc<dyn Clock>,
    options: StoreOptions,
    wakeup: Arc<Notify>,
) {
    let mut batch: Vec<Op> = Vec::with_capacity(MAX_BATCH);
    while let Ok(first) = ops.recv() {
        batch.push(first);
        while batch.len() < MAX_BATCH {
            match ops.try_recv() {
                Ok(op) => batch.push(op),
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            }
        }
        let mut ctx = WriteCtx {
            conn: &conn,
            now: clock.now(),
            options: &options,
            wake: false,
            promoted: false,
            counts: Vec::new(),
        };
        let commit = match conn.execute_batch("BEGIN IMMEDIATE") {
            Ok(()) => {
                for op in batch.iter_mut() {
                    op.run(&mut ctx);
                }
                let committed = ctx
                    .flush_counts()
                    .and_then(|()| conn.execute_batch("COMMIT"));
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
        if let Err(message) = &commit {
            tracing::error!(error = %message, ops = batch.len(), "sqlite write round failed");
        }
        for op in batch.drain(..) {
            op.finish(commit.clone());
        }
        if wake {
            wakeup.notify_waiters();
        }
    }
}
