//! Conveyor's embedded store: a local SQLite file in WAL mode.
//!
//! Writes go through one writer thread with group commit (see `writer`); reads use a small pool
//! of connections on tokio's blocking threads. In [`Durability::Durable`] mode (the default) every
//! commit is fsync'd before any caller is answered.

mod access;
mod flow;
mod ops;
mod reads;
mod retention;
mod rows;
mod schedules;
mod unique;
mod workers;
mod writer;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use conveyor_core::{
    ApiToken, AuditEntry, AuditListParams, NewAuditEntry, NewSession, NewToken, StoredSession,
    StoredToken, TokenSelector,
};
use conveyor_core::{
    Clock, CompleteParams, FailParams, FetchParams, HeartbeatParams, Inserted, Job, JobListParams,
    LeaseOutcome, LeaseRef, NamedQueueSettings, NewJob, QueueSettings, QueueStats, ReplaySelector,
    RescueParams, RescueReport, SnoozeParams, Store, StoreError, StoreOptions, StoreResult,
    SystemClock,
};
use conveyor_core::{FireOutcome, FireRequest, Schedule, ScheduleRun, ScheduleView};
use conveyor_core::{
    StaleReport, StaleWorkerParams, StuckJob, StuckParams, WorkerHeartbeat, WorkerInfo,
};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;
use uuid::Uuid;

const SCHEMA_VERSION: i64 = 10;
const SCHEMA: &str = include_str!("schema.sql");

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
}

impl Default for SqliteOptions {
    fn default() -> Self {
        Self {
            durability: Durability::Durable,
            store: StoreOptions::default(),
            clock: Arc::new(SystemClock),
            readers: 4,
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
    readers: Mutex<Vec<Connection>>,
    max_idle_readers: usize,
    wakeup: Arc<Notify>,
    clock: Arc<dyn Clock>,
}

pub(crate) fn backend(e: rusqlite::Error) -> StoreError {
    StoreError::Backend(e.to_string())
}

impl SqliteStore {
    /// Opens (creating if needed, with parent directories) the database at `path`, applies the
    /// schema, and starts the writer thread. A corrupt, foreign or unwritable file is an error
    /// naming the path, never a panic.
    pub fn open(path: impl AsRef<Path>, options: SqliteOptions) -> StoreResult<Self> {
        let path = path.as_ref().to_path_buf();
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| {
                StoreError::Backend(format!("cannot create directory {}: {e}", parent.display()))
            })?;
        }
        let describe = |e: rusqlite::Error| StoreError::Backend(format!("{}: {e}", path.display()));
        let conn = Connection::open(&path).map_err(describe)?;
        configure_writer(&conn, options.durability).map_err(describe)?;
        migrate(&conn).map_err(|e| match e {
            StoreError::Backend(msg) => StoreError::Backend(format!("{}: {msg}", path.display())),
            other => other,
        })?;

        let wakeup = Arc::new(Notify::new());
        let (sender, receiver) = mpsc::channel();
        let clock = options.clock.clone();
        let store_options = options.store.clone();
        let writer_wakeup = wakeup.clone();
        let durable = options.durability == Durability::Durable;
        std::thread::Builder::new()
            .name("conveyor-sqlite-writer".into())
            .spawn(move || {
                writer::run_writer(conn, receiver, clock, store_options, writer_wakeup, durable)
            })
            .map_err(|e| StoreError::Backend(format!("cannot start writer thread: {e}")))?;

        Ok(Self {
            inner: Arc::new(Inner {
                path,
                ops: sender,
                readers: Mutex::new(Vec::new()),
                max_idle_readers: options.readers.max(1),
                wakeup,
                clock: options.clock,
            }),
        })
    }

    pub fn path(&self) -> &Path {
        &self.inner.path
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
        reply.await.map_err(|_| StoreError::Closed)?
    }

    /// Runs `work` on a pooled read connection on a blocking thread.
    async fn read<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection, DateTime<Utc>) -> StoreResult<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || {
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
        .map_err(|e| StoreError::Backend(format!("read task failed: {e}")))?
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
    // Savepoint sub-journals in memory: each operation runs in a savepoint (see writer.rs).
    conn.execute_batch(&format!(
        "PRAGMA synchronous={synchronous}; PRAGMA wal_autocheckpoint={autocheckpoint}; \
         PRAGMA temp_store=MEMORY; PRAGMA cache_size=-65536;"
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

/// Adds each of `columns` that `table` lacks; nothing when the table does not exist yet (the
/// schema then creates it whole).
fn add_missing_columns(
    conn: &Connection,
    table: &str,
    columns: &[(&str, &str)],
) -> StoreResult<()> {
    let existing: Vec<String> = conn
        .prepare(&format!("SELECT name FROM pragma_table_info('{table}')"))
        .and_then(|mut stmt| {
            stmt.query_map([], |row| row.get(0))?
                .collect::<Result<Vec<String>, _>>()
        })
        .map_err(backend)?;
    if existing.is_empty() {
        return Ok(());
    }
    for (column, sql_type) in columns {
        if !existing.iter().any(|name| name == column) {
            conn.execute_batch(&format!(
                "ALTER TABLE {table} ADD COLUMN {column} {sql_type}"
            ))
            .map_err(backend)?;
        }
    }
    Ok(())
}

fn migrate(conn: &Connection) -> StoreResult<()> {
    let version: i64 = conn
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .map_err(backend)?;
    if version > SCHEMA_VERSION {
        return Err(StoreError::Backend(format!(
            "database schema version {version} is newer than this Conveyor understands \
             ({SCHEMA_VERSION}); upgrade Conveyor"
        )));
    }
    if (1..SCHEMA_VERSION).contains(&version) {
        // Columns added to tables that an older version created: IF NOT EXISTS in the schema
        // cannot add columns, so older databases get them here.
        add_missing_columns(
            conn,
            "queue_settings",
            &[
                ("concurrency_limit", "INTEGER"),
                ("per_key_concurrency_limit", "INTEGER"),
                ("rate_count", "INTEGER"),
                ("rate_period_ms", "INTEGER"),
                ("per_key_rate_count", "INTEGER"),
                ("per_key_rate_period_ms", "INTEGER"),
                ("weight", "INTEGER"),
                ("completed_retention_secs", "INTEGER"),
                ("dead_retention_secs", "INTEGER"),
            ],
        )?;
        // Version 6: unique jobs.
        add_missing_columns(conn, "jobs", &[("unique_key", "TEXT")])?;
    }
    if version < SCHEMA_VERSION {
        conn.execute_batch(&format!(
            "BEGIN IMMEDIATE; {SCHEMA} PRAGMA user_version={SCHEMA_VERSION}; COMMIT;"
        ))
        .map_err(backend)?;
    }
    // Touch the table so a file that is not a Conveyor database fails here, at start.
    conn.query_row("SELECT COUNT(*) FROM jobs WHERE id = ''", [], |row| {
        row.get::<_, i64>(0)
    })
    .map_err(backend)?;
    Ok(())
}

#[async_trait]
impl Store for SqliteStore {
    async fn jobs_insert_many(&self, jobs: Vec<NewJob>) -> StoreResult<Vec<Inserted>> {
        for job in &jobs {
            conveyor_core::validate::new_job(job)?;
        }
        self.write(move |ctx| ops::insert_many(ctx, jobs)).await
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

    async fn jobs_fetch(&self, params: FetchParams) -> StoreResult<Vec<Job>> {
        if params.max == 0 || params.queues.is_empty() {
            return Ok(Vec::new());
        }
        self.claim(move |ctx| ops::fetch(ctx, &params)).await
    }

    async fn jobs_heartbeat_many(
        &self,
        params: Vec<HeartbeatParams>,
    ) -> StoreResult<Vec<Option<DateTime<Utc>>>> {
        self.claim(move |ctx| ops::heartbeat_many(ctx, &params))
            .await
    }

    async fn jobs_complete_many(
        &self,
        params: Vec<CompleteParams>,
    ) -> StoreResult<Vec<LeaseOutcome>> {
        self.write(move |ctx| ops::complete_many(ctx, params)).await
    }

    async fn job_fail(&self, params: FailParams) -> StoreResult<Job> {
        self.write(move |ctx| ops::fail(ctx, params)).await
    }

    async fn job_snooze(&self, params: SnoozeParams) -> StoreResult<Job> {
        self.write(move |ctx| ops::snooze(ctx, params)).await
    }

    async fn jobs_release_many(&self, leases: Vec<LeaseRef>) -> StoreResult<u64> {
        self.write(move |ctx| ops::release_many(ctx, &leases)).await
    }

    async fn jobs_rescue_expired(&self, params: RescueParams) -> StoreResult<RescueReport> {
        self.write(move |ctx| ops::rescue_expired(ctx, &params))
            .await
    }

    async fn jobs_promote_due(&self) -> StoreResult<u64> {
        self.write(ops::promote_due).await
    }

    async fn dead_replay(&self, selector: ReplaySelector) -> StoreResult<u64> {
        self.write(move |ctx| ops::dead_replay(ctx, &selector))
            .await
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

    async fn queue_settings_put(
        &self,
        queue: &str,
        settings: QueueSettings,
    ) -> StoreResult<QueueSettings> {
        conveyor_core::validate::name("queue", queue)?;
        conveyor_core::validate::queue_settings(&settings)?;
        let queue = queue.to_string();
        self.write(move |ctx| ops::queue_settings_put(ctx, &queue, settings))
            .await
    }

    async fn jobs_prune(
        &self,
        params: conveyor_core::PruneParams,
    ) -> StoreResult<conveyor_core::PruneReport> {
        self.write(move |ctx| retention::prune(ctx, &params)).await
    }

    async fn queue_settings_list(&self) -> StoreResult<Vec<NamedQueueSettings>> {
        self.read(|conn, _| reads::queue_settings(conn)).await
    }

    async fn jobs_import(&self, jobs: Vec<Job>) -> StoreResult<u64> {
        self.write(move |ctx| ops::import(ctx, jobs)).await
    }

    async fn dead_discard(&self, id: Uuid) -> StoreResult<bool> {
        self.write(move |ctx| ops::dead_discard(ctx, id)).await
    }

    async fn queues_stats(&self) -> StoreResult<Vec<QueueStats>> {
        self.read(reads::queues_stats).await
    }

    fn wakeup(&self) -> Arc<Notify> {
        self.inner.wakeup.clone()
    }

    async fn jobs_next_due(&self, queues: &[String]) -> StoreResult<Option<DateTime<Utc>>> {
        let queues = queues.to_vec();
        self.read(move |conn, _| reads::next_due(conn, &queues))
            .await
    }

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
        self.write(move |ctx| schedules::fire(ctx, request)).await
    }

    async fn schedule_runs(&self, name: &str, limit: usize) -> StoreResult<Vec<ScheduleRun>> {
        let name = name.to_string();
        self.read(move |conn, _| schedules::runs(conn, &name, limit))
            .await
    }

    async fn tokens_insert(&self, token: NewToken) -> StoreResult<ApiToken> {
        conveyor_core::validate::name("name", &token.name)?;
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

    async fn workers_heartbeat(&self, beat: WorkerHeartbeat) -> StoreResult<WorkerInfo> {
        conveyor_core::workers::heartbeat(&beat)?;
        // A heartbeat lost to a power failure is repeated seconds later: no fsync of its own.
        self.claim(move |ctx| workers::heartbeat(ctx, beat)).await
    }

    async fn workers_list(&self) -> StoreResult<Vec<WorkerInfo>> {
        self.read(|conn, _| workers::list(conn)).await
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
