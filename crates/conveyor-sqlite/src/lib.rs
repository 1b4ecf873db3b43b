//! Conveyor's embedded store: a local SQLite file in WAL mode.
//!
//! Writes go through one writer thread with group commit (see `writer`); reads use a small pool
//! of connections on tokio's blocking threads. In [`Durability::Durable`] mode (the default) every
//! commit is fsync'd before any caller is answered.

mod access;
mod copy;
mod limits;
mod migrate;
mod ops;
mod reads;
mod retention;
mod rows;
mod schedules;
mod stats;
mod unique;
mod workers;
mod workflow;
mod writer;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use conveyor_core::kinds::KindSettings;
use conveyor_core::workflow::{CreatedFlow, FlowListParams, FlowView, SignalOutcome, ValidFlow};
use conveyor_core::{
    AccessStore, Clock, CompleteParams, FailParams, FetchParams, HeartbeatParams, Inserted, Job,
    JobListParams, JobStore, LeadershipStore, LeaseOutcome, LeaseRef, LeaseStore,
    NamedQueueSettings, NewJob, QueueSettings, QueueStats, QueueStore, ReplaySelector,
    RescueParams, RescueReport, ScheduleStore, SnoozeParams, StoreError, StoreHealth, StoreOptions,
    StoreResult, SystemClock, Valid, ValidJob, WorkerStore,
};
use conveyor_core::{
    ApiToken, AuditEntry, AuditListParams, NewAuditEntry, NewSession, NewToken, StoredSession,
    StoredToken, TokenSelector,
};
use conveyor_core::{FireOutcome, FireRequest, Schedule, ScheduleRun, ScheduleView};
use conveyor_core::{FlowStore, KindStore};
use conveyor_core::{
    StaleReport, StaleWorkerParams, StuckJob, StuckParams, WorkerHeartbeat, WorkerInfo,
};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use uuid::Uuid;

/// How long a health probe waits for the writer before calling it not ready.
const HEALTH_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// How commits reach the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// `synchronous=FULL`: each commit is fsync'd before callers are answered. Survives power loss.
    #[default]
    Durable,
    /// `synchronous=NORMAL`: commits reach the OS, fsync happens at checkpoints. Survives a
    /// process crash (`kill -9`) but the last commits can be lost on power loss or kernel panic.
    RelaxedLosesRecentJobsOnPowerLoss,
}

#[derive(Clone)]
pub struct SqliteOptions {
    pub durability: Durability,
    pub store: StoreOptions,
    pub clock: Arc<dyn Clock>,
    /// Read connections kept open.
    pub readers: usize,
    /// Hold an exclusive lock on `<file>.lock` for as long as the store is open, so a second
    /// process (a second `conveyor serve`, say) cannot open the same file: the store keeps
    /// queue settings and counts in its writer's memory and assumes it is the only writer. A
    /// second open is refused with an error naming the holder's pid. Turn off only for tools
    /// that write nothing the writer caches (the token commands).
    pub exclusive: bool,
    /// Run `PRAGMA quick_check` at open and refuse a damaged file (a read of every page: about
    /// a second per few hundred MB). Off: a damaged file opens, and the damage shows in
    /// [`JobStore::health`] once an operation meets it.
    pub integrity_check: bool,
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Durable,
            store: StoreOptions::default(),
            clock: Arc::new(SystemClock),
            readers: 4,
            exclusive: true,
            integrity_check: true,
        }
    }
}

/// The embedded store. Cheap to clone; all clones share one writer thread.
#[derive(Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

struct Inner {
    path: PathBuf,
    ops: Sender<writer::Op>,
    status: Arc<StoreStatus>,
    /// The writer thread, joined by a health probe that finds it gone (so the reason it
    /// recorded on its way out is read after it was written).
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Write transactions the writer has run (see [`SqliteStore::write_rounds`]).
    rounds: Arc<std::sync::atomic::AtomicU64>,
    /// The open lock file whose `flock` marks this process as the file's only user; released
    /// when the last clone of the store is dropped.
    _lock: Option<std::fs::File>,
    readers: Mutex<Vec<Connection>>,
    max_idle_readers: usize,
    wakeup: Arc<Notify>,
    /// Told by the writer of the jobs flows started, after each commit.
    flow_starts: Arc<conveyor_core::FlowStarts>,
    clock: Arc<dyn Clock>,
}

pub(crate) fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::backend_caused("sqlite", e)
}

/// What health probes need to know that no single call reports.
#[derive(Default)]
struct StoreStatus {
    /// Set when the writer thread ended other than by the store being dropped.
    writer_died: Mutex<Option<String>>,
    /// The first error that showed the file is damaged ("database disk image is malformed").
    damaged: Mutex<Option<String>>,
}

impl StoreStatus {
    /// Remembers an error that shows the file is damaged; such errors never heal by retrying.
    fn note(&self, error: &StoreError) {
        if let StoreError::Backend { .. } = error {
            let message = error.to_string();
            let lower = message.to_ascii_lowercase();
            if lower.contains("malformed") || lower.contains("not a database") {
                if let Ok(mut damaged) = self.damaged.lock() {
                    damaged.get_or_insert(message);
                }
            }
        }
    }

    fn problem(&self) -> Option<String> {
        let died = self.writer_died.lock().ok().and_then(|died| died.clone());
        let damaged = self.damaged.lock().ok().and_then(|damaged| damaged.clone());
        died.map(|why| format!("the SQLite writer thread died ({why}): restart the process"))
            .or_else(|| {
                damaged.map(|why| {
                    format!("the database file is damaged: {why}; restore it from a backup")
                })
            })
    }
}

/// Takes the exclusive lock on `<db>.lock`, or explains who holds it.
fn lock_file(db: &Path) -> StoreResult<std::fs::File> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let mut name = db.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&lock_path)
        .map_err(|e| StoreError::backend(format!("cannot open {}: {e}", lock_path.display())))?;
    // SAFETY: flock on a descriptor this function owns; no memory is shared with the call.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked != 0 {
        let error = std::io::Error::last_os_error();
        if error.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(StoreError::backend(format!(
                "cannot lock {}: {error}",
                lock_path.display()
            )));
        }
        let mut holder = String::new();
        let _ = file.read_to_string(&mut holder);
        let holder = holder.trim();
        let who = if holder.is_empty() {
            "another process".to_string()
        } else {
            format!("another process (pid {holder})")
        };
        return Err(StoreError::backend(format!(
            "{} is in use by {who}: an SQLite store serves one process at a time (stop that \
             one, or point several servers at PostgreSQL instead)",
            db.display()
        )));
    }
    let recorded = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| write!(file, "{}", std::process::id()))
        .and_then(|()| file.flush());
    if let Err(e) = recorded {
        tracing::warn!(error = %e, path = %lock_path.display(), "cannot record our pid in the lock file");
    }
    Ok(file)
}

impl SqliteStore {
    /// Opens (creating if needed, with parent directories) the database at `path`, applies the
    /// schema, and starts the writer thread. A corrupt, foreign or unwritable file is an error
    /// naming the path, never a panic.
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> StoreResult<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                StoreError::backend(format!("cannot create directory {}: {e}", parent.display()))
            })?;
        }
        let describe = |e: rusqlite::Error| StoreError::backend(format!("{}: {e}", path.display()));
        let lock = if options.exclusive {
            Some(lock_file(&path)?)
        } else {
            None
        };
        let conn = Connection::open(&path).map_err(describe)?;
        configure_writer(&conn, options.durability).map_err(describe)?;
        if options.integrity_check {
            integrity_check(&conn).map_err(|problem| {
                StoreError::backend(format!(
                    "{}: the database file is damaged ({problem}); restore it from a backup, \
                     or start with --skip-integrity-check to serve what can still be read",
                    path.display()
                ))
            })?;
        }
        migrate::migrate(&conn).map_err(|e| match e {
            StoreError::Backend { message, source } => StoreError::Backend {
                message: format!("{}: {message}", path.display()),
                source,
            },
            other => other,
        })?;

        let wakeup = Arc::new(Notify::new());
        let (sender, receiver) = mpsc::channel();
        let clock = options.clock.clone();
        let store_options = options.store.clone();
        let writer_wakeup = wakeup.clone();
        let flow_starts = Arc::new(conveyor_core::FlowStarts::default());
        let writer_flow_starts = flow_starts.clone();
        let durable = options.durability == Durability::Durable;
        let status = Arc::new(StoreStatus::default());
        let writer_status = status.clone();
        let rounds = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let writer_rounds = rounds.clone();
        let writer = std::thread::Builder::new()
            .name("conveyor-sqlite-writer".into())
            .spawn(move || {
                // Operations' panics are caught inside the writer; this catches any other, so
                // the process says the writer is gone instead of answering `Closed` in silence.
                let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    writer::run_writer(
                        conn,
                        receiver,
                        clock,
                        store_options,
                        writer::Signals {
                            wakeup: writer_wakeup,
                            flow_starts: writer_flow_starts,
                        },
                        durable,
                        writer_rounds,
                    )
                }));
                if let Err(panic) = ran {
                    let message = writer::panic_message(panic.as_ref());
                    tracing::error!(
                        panic = %message,
                        "the SQLite writer thread died: every write now fails; restart the process"
                    );
                    if let Ok(mut died) = writer_status.writer_died.lock() {
                        *died = Some(message);
                    }
                }
            })
            .map_err(|e| StoreError::backend(format!("cannot start writer thread: {e}")))?;

        Ok(Self {
            inner: Arc::new(Inner {
                path,
                ops: sender,
                status,
                writer: Mutex::new(Some(writer)),
                rounds,
                _lock: lock,
                readers: Mutex::new(Vec::new()),
                max_idle_readers: options.readers.max(1),
                wakeup,
                flow_starts,
                clock: options.clock,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
    }

    /// How many write transactions (group-commit rounds) the writer has run since open: what
    /// the store's work costs, e.g. to see that idle long-polls leave it alone.
    pub fn write_rounds(&self) -> u64 {
        self.inner.rounds.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs `work` on the writer thread inside the current group-commit round; resolves after commit.
    async fn write<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut writer::WriteCtx<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.submit(writer::Sync::Durable, work).await
    }

    /// Like `write`, for claims that need not be fsync'd on their own (see `writer::Sync`).
    async fn claim<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut writer::WriteCtx<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.submit(writer::Sync::Claim, work).await
    }

    async fn submit<T, F>(&self, sync: writer::Sync, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut writer::WriteCtx<'_>) -> StoreResult<T> + Send + 'static,
    {
        let (op, reply) = writer::op(sync, work);
        self.inner.ops.send(op).map_err(|_| StoreError::Closed)?;
        let outcome = reply.await.map_err(|_| StoreError::Closed)?;
        if let Err(error) = &outcome {
            self.inner.status.note(error);
        }
        outcome
    }

    /// Runs `work` on a pooled read connection on a blocking thread.
    async fn read<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, DateTime<Utc>) -> StoreResult<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            let pooled = inner.readers.lock().ok().and_then(|mut pool| pool.pop());
            let conn = match pooled {
                Some(conn) => conn,
                None => open_reader(&inner.path).map_err(backend)?,
            };
            let outcome = work(&conn, inner.clock.now());
            if let Ok(mut pool) = inner.readers.lock() {
                if pool.len() < inner.max_idle_readers {
                    pool.push(conn);
                }
            }
            outcome
        })
        .await
        .map_err(|e| StoreError::backend(format!("read task failed: {e}")))?;
        if let Err(error) = &outcome {
            self.inner.status.note(error);
        }
        outcome
    }
}

/// An operation's outcome, unless the fault-injection point `name` fires: it runs after the
/// operation's work, inside its savepoint, so an injected error or panic must undo that work.
fn injected<T>(name: &str, outcome: StoreResult<T>) -> StoreResult<T> {
    let value = outcome?;
    conveyor_core::faults::inject(name)?;
    Ok(value)
}

/// `PRAGMA quick_check`: "ok", or the first problems it found.
fn integrity_check(conn: &Connection) -> Result<(), String> {
    let found: Vec<String> = conn
        .prepare("PRAGMA quick_check(5)")
        .and_then(|mut stmt| {
            stmt.query_map([], |row| row.get::<_, String>(0))?
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(|e| e.to_string())?;
    if found.len() == 1 && found[0] == "ok" {
        Ok(())
    } else {
        Err(found.join("; "))
    }
}

fn configure_writer(conn: &Connection, durability: Durability) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |row| row.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(rusqlite::Error::InvalidParameterName(format!(
            "could not switch to WAL journal mode (got {mode})"
        )));
    }
    // Durable mode checkpoints by itself (see writer::SyncControl), never inside an unsynced commit.
    let (synchronous, autocheckpoint) = match durability {
        Durability::Durable => ("FULL", 0),
        Durability::RelaxedLosesRecentJobsOnPowerLoss => ("NORMAL", 1000),
    };
    // Each operation runs in a savepoint (see writer.rs), and every statement that may abort in
    // it in a statement savepoint, both journalled in the sub-journal. temp_store=MEMORY would
    // keep that journal as a list of 1 KiB chunks that each statement's release walks from the
    // start to truncate it (perf: 9 % of the writer in a flow benchmark, growing with the
    // operation); the default keeps one 64 KiB chunk and spills past it to an unsynced temp
    // file, truncated at once. Flow steps +5-12 %, plain drain unchanged (docs/benchmarks.md).
    // The WAL file is reused, never shrunk, unless a limit says so: the soak saw it creep from
    // 8 to 15 MiB over 20 minutes. Past 64 MiB it is truncated back after a checkpoint.
    conn.execute_batch(&format!(
        "PRAGMA synchronous={synchronous}; PRAGMA wal_autocheckpoint={autocheckpoint}; \
         PRAGMA cache_size=-65536; \
         PRAGMA journal_size_limit=67108864;"
    ))?;
    Ok(())
}

fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(conn)
}

#[async_trait]
impl JobStore for SqliteStore {
    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    async fn health(&self) -> StoreHealth {
        if let Some(problem) = self.inner.status.problem() {
            return StoreHealth::broken(problem);
        }
        // A round trip through the writer: answered only by a live writer that can begin and
        // commit a transaction.
        let probe = self.claim(|_| Ok(()));
        match tokio::time::timeout(HEALTH_PROBE_TIMEOUT, probe).await {
            Ok(Ok(())) => StoreHealth::ok(),
            Ok(Err(StoreError::Closed)) => {
                // The writer is gone or going: wait for it to finish so its reason is known.
                let writer = self.inner.writer.lock().ok().and_then(|mut w| w.take());
                if let Some(writer) = writer {
                    let _ = tokio::task::spawn_blocking(move || writer.join()).await;
                }
                StoreHealth::broken(self.inner.status.problem().unwrap_or_else(|| {
                    "the SQLite writer thread has stopped: restart the process".to_string()
                }))
            }
            Ok(Err(error)) => match self.inner.status.problem() {
                Some(problem) => StoreHealth::broken(problem),
                None => StoreHealth::not_ready(format!("the store refused a write: {error}")),
            },
            Err(_) => StoreHealth::not_ready(format!(
                "the SQLite writer did not answer within {} s",
                HEALTH_PROBE_TIMEOUT.as_secs()
            )),
        }
    }

    async fn jobs_insert_valid(&self, jobs: Vec<ValidJob>) -> StoreResult<Vec<Inserted>> {
        let jobs: Vec<NewJob> = jobs.into_iter().map(ValidJob::into_job).collect();
        self.write(move |ctx| injected("insert", ops::insert_many(ctx, jobs)))
            .await
    }

    async fn job_get(&self, id: Uuid) -> StoreResult<Option<Job>> {
        self.read(move |conn, _| reads::job_get(conn, id)).await
    }

    async fn jobs_list(&self, params: JobListParams) -> StoreResult<Vec<Job>> {
        self.read(move |conn, _| reads::jobs_list(conn, &params))
            .await
    }

    async fn job_cancel(&self, id: Uuid) -> StoreResult<Job> {
        self.write(move |ctx| ops::cancel(ctx, id)).await
    }

    async fn dead_replay(&self, selector: ReplaySelector) -> StoreResult<u64> {
        self.write(move |ctx| ops::dead_replay(ctx, &selector))
            .await
    }

    async fn jobs_import(&self, jobs: Vec<Job>) -> StoreResult<u64> {
        self.write(move |ctx| ops::import(ctx, jobs)).await
    }

    async fn dead_discard(&self, id: Uuid) -> StoreResult<bool> {
        self.write(move |ctx| ops::dead_discard(ctx, id)).await
    }
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn jobs_fetch_valid(&self, params: Valid<FetchParams>) -> StoreResult<Vec<Job>> {
        self.claim(move |ctx| injected("fetch", ops::fetch(ctx, &params)))
            .await
    }

    async fn jobs_heartbeat_many(
        &self,
        params: Vec<HeartbeatParams>,
    ) -> StoreResult<Vec<Option<DateTime<Utc>>>> {
        self.claim(move |ctx| ops::heartbeat_many(ctx, &params))
            .await
    }

    async fn jobs_complete_valid(
        &self,
        params: Valid<Vec<CompleteParams>>,
    ) -> StoreResult<Vec<LeaseOutcome>> {
        let params = params.into_inner();
        self.write(move |ctx| injected("complete", ops::complete_many(ctx, params)))
            .await
    }

    async fn job_fail_valid(&self, params: Valid<FailParams>) -> StoreResult<Job> {
        let params = params.into_inner();
        self.write(move |ctx| injected("fail", ops::fail(ctx, params)))
            .await
    }

    async fn job_snooze(&self, params: SnoozeParams) -> StoreResult<Job> {
        self.write(move |ctx| ops::snooze(ctx, params)).await
    }

    async fn jobs_release_many(&self, leases: Vec<LeaseRef>) -> StoreResult<u64> {
        self.write(move |ctx| ops::release_many(ctx, &leases)).await
    }

    async fn job_progress(
        &self,
        lease: LeaseRef,
        percent: u8,
        message: Option<String>,
    ) -> StoreResult<()> {
        conveyor_core::Progress::new(percent, message.clone(), Utc::now())?;
        self.write(move |ctx| {
            let progress = conveyor_core::Progress::new(percent, message, ctx.now)?;
            ops::progress(ctx, lease, &progress)
        })
        .await
    }

    fn wakeup(&self) -> Arc<Notify> {
        self.inner.wakeup.clone()
    }

    async fn jobs_next_due(&self, queues: &[String]) -> StoreResult<Option<DateTime<Utc>>> {
        let queues = queues.to_vec();
        self.read(move |conn, _| reads::next_due(conn, &queues))
            .await
    }
}

#[async_trait]
impl FlowStore for SqliteStore {
    async fn flow_create(&self, flow: ValidFlow) -> StoreResult<CreatedFlow> {
        self.write(move |ctx| workflow::create(ctx, flow)).await
    }

    async fn flow_get(&self, id: Uuid) -> StoreResult<Option<FlowView>> {
        self.read(move |conn, _| workflow::view(conn, id)).await
    }

    async fn flows_list(&self, params: FlowListParams) -> StoreResult<Vec<FlowView>> {
        self.read(move |conn, _| workflow::list(conn, &params))
            .await
    }

    async fn flow_cancel(&self, id: Uuid) -> StoreResult<FlowView> {
        self.write(move |ctx| workflow::cancel(ctx, id)).await
    }

    async fn flow_signal_valid(
        &self,
        id: Uuid,
        signal: &str,
        payload: Valid<serde_json::Value>,
    ) -> StoreResult<SignalOutcome> {
        let payload = payload.into_inner();
        let signal = signal.to_string();
        self.write(move |ctx| workflow::signal(ctx, id, &signal, &payload))
            .await
    }

    async fn flows_expire_waits(&self, limit: usize) -> StoreResult<u64> {
        self.write(move |ctx| workflow::expire_waits(ctx, limit))
            .await
    }

    fn flow_starts(&self) -> Arc<conveyor_core::FlowStarts> {
        self.inner.flow_starts.clone()
    }

    async fn flows_prune(&self, params: conveyor_core::PruneParams) -> StoreResult<u64> {
        self.write(move |ctx| workflow::prune(ctx, &params)).await
    }
}

#[async_trait]
impl QueueStore for SqliteStore {
    async fn queue_settings_get(&self, queue: &str) -> StoreResult<QueueSettings> {
        let queue = queue.to_string();
        self.read(move |conn, _| {
            Ok(reads::queue_settings(conn)?
                .into_iter()
                .find(|named| named.name == queue)
                .map(|named| named.settings)
                .unwrap_or_default())
        })
        .await
    }

    async fn queue_settings_put_valid(
        &self,
        settings: Valid<NamedQueueSettings>,
    ) -> StoreResult<QueueSettings> {
        let NamedQueueSettings { name, settings } = settings.into_inner();
        self.write(move |ctx| ops::queue_settings_put(ctx, &name, settings))
            .await
    }

    async fn queue_settings_list(&self) -> StoreResult<Vec<NamedQueueSettings>> {
        self.read(|conn, _| reads::queue_settings(conn)).await
    }

    async fn queues_stats(&self) -> StoreResult<Vec<QueueStats>> {
        self.read(reads::queues_stats).await
    }
}

#[async_trait]
impl conveyor_core::BreakerStore for SqliteStore {
    async fn breakers_list(&self) -> StoreResult<Vec<conveyor_core::StoredBreaker>> {
        self.read(|conn, _| reads::breakers(conn, None)).await
    }

    async fn breaker_get(
        &self,
        scope: conveyor_core::BreakerScope,
        name: &str,
    ) -> StoreResult<Option<conveyor_core::StoredBreaker>> {
        let name = name.to_string();
        self.read(move |conn, _| Ok(reads::breakers(conn, Some((scope, &name)))?.pop()))
            .await
    }

    async fn breaker_write_valid(
        &self,
        breaker: Valid<conveyor_core::StoredBreaker>,
    ) -> StoreResult<bool> {
        let record = serde_json::to_string(&breaker.record)
            .map_err(|e| StoreError::backend(format!("cannot serialize a breaker: {e}")))?;
        let scope = breaker.scope.as_str();
        let name = breaker.name.clone();
        let version = i64::try_from(breaker.version)
            .map_err(|_| StoreError::backend("breaker version out of range"))?;
        self.write(move |ctx| {
            let written = if version == 0 {
                ctx.conn
                    .prepare_cached(
                        "INSERT INTO circuit_breakers (scope, name, version, record) \
                         VALUES (?1, ?2, 1, ?3) ON CONFLICT (scope, name) DO NOTHING",
                    )
                    .and_then(|mut stmt| stmt.execute(rusqlite::params![scope, name, record]))
            } else {
                ctx.conn
                    .prepare_cached(
                        "UPDATE circuit_breakers SET version = version + 1, record = ?3 \
                         WHERE scope = ?1 AND name = ?2 AND version = ?4",
                    )
                    .and_then(|mut stmt| {
                        stmt.execute(rusqlite::params![scope, name, record, version])
                    })
            }
            .map_err(backend)?;
            Ok(written == 1)
        })
        .await
    }
}

#[async_trait]
impl conveyor_core::StatsStore for SqliteStore {
    async fn stats_merge(&self, rollups: Vec<conveyor_core::stats::Rollup>) -> StoreResult<()> {
        conveyor_core::stats::validate_rollups(&rollups)?;
        if rollups.is_empty() {
            return Ok(());
        }
        self.write(move |ctx| stats::merge(ctx.conn, rollups)).await
    }

    async fn stats_read(
        &self,
        query: conveyor_core::stats::StatsQuery,
    ) -> StoreResult<Vec<conveyor_core::stats::Rollup>> {
        self.read(move |conn, _| stats::read(conn, &query)).await
    }

    async fn stats_prune(&self, older_than: std::time::Duration) -> StoreResult<u64> {
        self.write(move |ctx| {
            let before = conveyor_core::clock::before(ctx.now, older_than);
            stats::prune(ctx.conn, before - chrono::Duration::minutes(1))
        })
        .await
    }
}

#[async_trait]
impl KindStore for SqliteStore {
    async fn kind_put(&self, settings: KindSettings) -> StoreResult<KindSettings> {
        conveyor_core::kinds::validate_settings(&settings)?;
        self.write(move |ctx| {
            let schema = settings
                .schema
                .as_ref()
                .map(|schema| {
                    serde_json::to_string(schema)
                        .map_err(|e| StoreError::backend(format!("cannot serialize schema: {e}")))
                })
                .transpose()?;
            let breaker = rows::breaker_settings_text(settings.circuit_breaker.as_ref())?;
            ctx.conn
                .prepare_cached(
                    "INSERT INTO kinds (kind, schema, version, updated_at, circuit_breaker) \
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (kind) DO UPDATE SET \
                     schema = excluded.schema, version = excluded.version, \
                     updated_at = excluded.updated_at, \
                     circuit_breaker = excluded.circuit_breaker",
                )
                .and_then(|mut stmt| {
                    stmt.execute(rusqlite::params![
                        settings.kind,
                        schema,
                        settings.version,
                        rows::millis(ctx.now),
                        breaker
                    ])
                })
                .map_err(backend)?;
            Ok(KindSettings {
                updated_at: conveyor_core::clock::from_millis(rows::millis(ctx.now)),
                ..settings
            })
        })
        .await
    }

    async fn kind_get(&self, kind: &str) -> StoreResult<Option<KindSettings>> {
        let kind = kind.to_string();
        self.read(move |conn, _| Ok(reads::kinds(conn)?.into_iter().find(|k| k.kind == kind)))
            .await
    }

    async fn kinds_list(&self) -> StoreResult<Vec<KindSettings>> {
        self.read(|conn, _| reads::kinds(conn)).await
    }

    async fn kind_delete(&self, kind: &str) -> StoreResult<bool> {
        let kind = kind.to_string();
        self.write(move |ctx| {
            let deleted = ctx
                .conn
                .prepare_cached("DELETE FROM kinds WHERE kind = ?1")
                .and_then(|mut stmt| stmt.execute([&kind]))
                .map_err(backend)?;
            Ok(deleted > 0)
        })
        .await
    }
}

#[async_trait]
impl ScheduleStore for SqliteStore {
    async fn schedule_put(&self, schedule: Schedule) -> StoreResult<ScheduleView> {
        self.write(move |ctx| schedules::put(ctx, schedule)).await
    }

    async fn schedule_get(&self, name: &str) -> StoreResult<Option<ScheduleView>> {
        let name = name.to_string();
        self.read(move |conn, now| schedules::get(conn, &name, now))
            .await
    }

    async fn schedules_list(&self) -> StoreResult<Vec<ScheduleView>> {
        self.read(schedules::list).await
    }

    async fn schedule_delete(&self, name: &str) -> StoreResult<bool> {
        let name = name.to_string();
        self.write(move |ctx| schedules::delete(ctx, &name)).await
    }

    async fn schedule_fire(&self, request: FireRequest) -> StoreResult<FireOutcome> {
        self.write(move |ctx| injected("schedule_fire", schedules::fire(ctx, request)))
            .await
    }

    async fn schedule_runs(&self, name: &str, limit: usize) -> StoreResult<Vec<ScheduleRun>> {
        let name = name.to_string();
        self.read(move |conn, _| schedules::runs(conn, &name, limit))
            .await
    }
}

#[async_trait]
impl AccessStore for SqliteStore {
    async fn tokens_insert_valid(&self, token: Valid<NewToken>) -> StoreResult<ApiToken> {
        let token = token.into_inner();
        self.write(move |ctx| access::tokens_insert(ctx, token))
            .await
    }

    async fn tokens_list(&self) -> StoreResult<Vec<ApiToken>> {
        self.read(|conn, _| access::tokens_list(conn)).await
    }

    async fn token_revoke(&self, selector: TokenSelector) -> StoreResult<Option<ApiToken>> {
        self.write(move |ctx| access::token_revoke(ctx, &selector))
            .await
    }

    async fn token_get(&self, id: Uuid) -> StoreResult<Option<StoredToken>> {
        self.read(move |conn, _| access::token_get(conn, id)).await
    }

    async fn session_insert(&self, session: NewSession) -> StoreResult<()> {
        self.write(move |ctx| access::session_insert(ctx, session))
            .await
    }

    async fn session_get(&self, id: Uuid) -> StoreResult<Option<StoredSession>> {
        self.read(move |conn, now| access::session_get(conn, id, now))
            .await
    }

    async fn session_delete(&self, id: Uuid) -> StoreResult<bool> {
        self.write(move |ctx| access::session_delete(ctx, id)).await
    }

    async fn audit_append(&self, entry: NewAuditEntry) -> StoreResult<AuditEntry> {
        // Committed before the caller is answered, but not fsync'd on its own: the entry rides
        // on the next durable commit's fsync (as claims do), so auditing every enqueue does not
        // add a second fsync to each. A power failure can lose the latest entries.
        self.claim(move |ctx| access::audit_append(ctx, entry))
            .await
    }

    async fn audit_list(&self, params: AuditListParams) -> StoreResult<Vec<AuditEntry>> {
        self.read(move |conn, _| access::audit_list(conn, &params))
            .await
    }

    async fn audit_prune(
        &self,
        cutoff: conveyor_core::AuditCutoff,
        limit: usize,
    ) -> StoreResult<u64> {
        self.write(move |ctx| access::audit_prune(ctx, cutoff, limit))
            .await
    }
}

#[async_trait]
impl WorkerStore for SqliteStore {
    async fn workers_heartbeat(&self, beat: WorkerHeartbeat) -> StoreResult<WorkerInfo> {
        conveyor_core::workers::heartbeat(&beat)?;
        // A heartbeat lost to a power failure is repeated seconds later: no fsync of its own.
        self.claim(move |ctx| workers::heartbeat(ctx, beat)).await
    }

    async fn workers_list(&self) -> StoreResult<Vec<WorkerInfo>> {
        self.read(|conn, _| workers::list(conn)).await
    }

    async fn worker_command(
        &self,
        id: &str,
        command: Option<conveyor_core::WorkerCommand>,
    ) -> StoreResult<Option<WorkerInfo>> {
        let id = id.to_string();
        self.write(move |ctx| workers::command(ctx, &id, command))
            .await
    }

    async fn workers_mark_stale(&self, params: StaleWorkerParams) -> StoreResult<StaleReport> {
        self.write(move |ctx| workers::mark_stale(ctx, &params))
            .await
    }

    async fn jobs_stuck(&self, params: StuckParams) -> StoreResult<Vec<StuckJob>> {
        self.read(move |conn, now| workers::stuck(conn, now, &params))
            .await
    }
}

#[async_trait]
impl LeadershipStore for SqliteStore {
    async fn jobs_rescue_expired(&self, params: RescueParams) -> StoreResult<RescueReport> {
        self.write(move |ctx| injected("rescue", ops::rescue_expired(ctx, &params)))
            .await
    }

    async fn jobs_promote_due(&self) -> StoreResult<u64> {
        self.write(ops::promote_due).await
    }

    async fn leader_try_acquire(
        &self,
        holder: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<bool> {
        let holder = holder.to_string();
        // A lost renewal (power failure) only delays maintenance; no fsync of its own.
        self.claim(move |ctx| ops::leader_try_acquire(ctx, &holder, ttl))
            .await
    }

    async fn leader_release(&self, holder: &str) -> StoreResult<()> {
        let holder = holder.to_string();
        self.write(move |ctx| ops::leader_release(ctx, &holder))
            .await
    }

    async fn jobs_prune(
        &self,
        params: conveyor_core::PruneParams,
    ) -> StoreResult<conveyor_core::PruneReport> {
        self.write(move |ctx| retention::prune(ctx, &params)).await
    }
}
