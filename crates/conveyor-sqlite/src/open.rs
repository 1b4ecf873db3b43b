//! The store itself: its options, opening it, and the handles every operation goes through.

use chrono::{DateTime, Utc};
use conveyor_core::{Clock, StoreError, StoreOptions, StoreResult, SystemClock};
use rusqlite::{Connection, OpenFlags};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

use crate::*;
use errors::backend;

/// How long a health probe waits for the writer before calling it not ready.
pub(crate) const HEALTH_PROBE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) path: PathBuf,
    pub(crate) ops: Sender<writer::Op>,
    pub(crate) status: Arc<StoreStatus>,
    /// The writer thread, joined by a health probe that finds it gone (so the reason it
    /// recorded on its way out is read after it was written).
    pub(crate) writer: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Write transactions the writer has run (see [`SqliteStore::write_rounds`]).
    pub(crate) rounds: Arc<std::sync::atomic::AtomicU64>,
    /// The open lock file whose `flock` marks this process as the file's only user; released
    /// when the last clone of the store is dropped.
    pub(crate) _lock: Option<std::fs::File>,
    pub(crate) readers: Mutex<Vec<Connection>>,
    pub(crate) max_idle_readers: usize,
    pub(crate) wakeup: Arc<Notify>,
    /// Told by the writer of the jobs flows started, after each commit.
    pub(crate) flow_starts: Arc<conveyor_core::FlowStarts>,
    pub(crate) clock: Arc<dyn Clock>,
}

/// What health probes need to know that no single call reports.
#[derive(Default)]
pub(crate) struct StoreStatus {
    /// Set when the writer thread ended other than by the store being dropped.
    pub(crate) writer_died: Mutex<Option<String>>,
    /// The first error that showed the file is damaged ("database disk image is malformed").
    pub(crate) damaged: Mutex<Option<String>>,
}

impl StoreStatus {
    /// Remembers an error that shows the file is damaged; such errors never heal by retrying.
    pub(crate) fn note(&self, error: &StoreError) {
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

    pub(crate) fn problem(&self) -> Option<String> {
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
pub(crate) fn lock_file(db: &Path) -> StoreResult<std::fs::File> {
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
    pub(crate) async fn write<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut writer::WriteCtx<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.submit(writer::Sync::Durable, work).await
    }

    /// Like `write`, for claims that need not be fsync'd on their own (see `writer::Sync`).
    pub(crate) async fn claim<T, F>(&self, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut writer::WriteCtx<'_>) -> StoreResult<T> + Send + 'static,
    {
        self.submit(writer::Sync::Claim, work).await
    }

    pub(crate) async fn submit<T, F>(&self, sync: writer::Sync, work: F) -> StoreResult<T>
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
    pub(crate) async fn read<T, F>(&self, work: F) -> StoreResult<T>
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
pub(crate) fn injected<T>(name: &str, outcome: StoreResult<T>) -> StoreResult<T> {
    let value = outcome?;
    conveyor_core::faults::inject(name)?;
    Ok(value)
}

/// `PRAGMA quick_check`: "ok", or the first problems it found.
pub(crate) fn integrity_check(conn: &Connection) -> Result<(), String> {
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

/// Statements the writer keeps prepared: more than the fixed set it runs.
const WRITER_STATEMENTS: usize = 256;

pub(crate) fn configure_writer(conn: &Connection, durability: Durability) -> rusqlite::Result<()> {
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    // The writer runs every statement through the statement cache. rusqlite keeps 16, fewer
    // than a round's statements once a fetch goes through limits (promotions, expiries, the
    // claim, the key reads, savepoints): least recently used, so every round prepared several
    // again (perf: 5-8 % of the writer in a drain). The statements are a fixed set.
    conn.set_prepared_statement_cache_capacity(WRITER_STATEMENTS);
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
    // it in a statement savepoint, both journalled in the sub-journal (the first change of each
    // page copies the page there). temp_store=MEMORY keeps that journal in memory; SQLite's
    // default keeps 64 KiB (16 pages) there and spills the rest to a temporary file created
    // for the round, which any claim or enqueue spread over the table exceeds. Measured both
    // ways twice (2026-12-01 and 2026-12-05, docs/benchmarks.md): the file won when flow steps
    // rewrote wide rows, and lost 12-19 % of the writer to the file's writes once claims took
    // turns across keys and rows grew (plain drain +15-35 %, keyed drain +14 %, flow steps
    // +10-24 % with memory). Raising SQLite's spill threshold instead
    // (SQLITE_CONFIG_STMTJRNL_SPILL, 256 KiB) failed the keyed drain: the journal's later spill
    // to its file came out short and SQLite answered SQLITE_FULL.
    // The WAL file is reused, never shrunk, unless a limit says so: the soak saw it creep from
    // 8 to 15 MiB over 20 minutes. Past 64 MiB it is truncated back after a checkpoint.
    conn.execute_batch(&format!(
        "PRAGMA synchronous={synchronous}; PRAGMA wal_autocheckpoint={autocheckpoint}; \
         PRAGMA cache_size=-65536; PRAGMA temp_store=MEMORY; \
         PRAGMA journal_size_limit=67108864;"
    ))?;
    Ok(())
}

pub(crate) fn open_reader(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(conn)
}
