//! The store itself: its options, opening it, and the handles every operation goes through.

use conveyor_core::clock::truncate_to_millis;
use conveyor_core::{
    Clock, CompleteParams, Inserted, LeaseOutcome, LeaseRef, NewJob, StoreError, StoreOptions,
    StoreResult, SystemClock, Valid, ValidationError,
};
use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection, Postgres, Transaction};
use std::str::FromStr;
use std::sync::Arc;
use tokio::sync::Notify;

use crate::*;

use ctx::{Ctx, FlowStarted};
use errors::db;
use sql::Sql;

/// Settings of a [`PgStore`].
#[derive(Clone)]
pub struct PgOptions {
    /// The schema holding Conveyor's tables (created by the migrations when missing): one per
    /// independent set of queues. `[a-z_][a-z0-9_]*`, at most 63 characters. Default `conveyor`.
    pub schema: String,
    /// Store-wide settings shared by every backend (idempotency window).
    pub store: StoreOptions,
    /// Where "now" comes from for every job timestamp. The default, [`SystemClock`], stands for
    /// "the database server's clock" (see [`PgStore::clock`](conveyor_core::JobStore::clock));
    /// any other clock is used as given (tests).
    pub clock: Arc<dyn Clock>,
    /// Connections in the store's pool (the wake-up listener has one more of its own).
    pub max_connections: u32,
    /// Apply pending migrations at connect (default). When false, connecting fails unless the
    /// schema is already at [`SCHEMA_VERSION`]: for deployments that migrate separately.
    pub run_migrations: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        Self {
            schema: "conveyor".to_string(),
            store: StoreOptions::default(),
            clock: Arc::new(SystemClock),
            max_connections: 10,
            run_migrations: true,
        }
    }
}

impl std::fmt::Debug for PgOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgOptions")
            .field("schema", &self.schema)
            .field("store", &self.store)
            .field("max_connections", &self.max_connections)
            .field("run_migrations", &self.run_migrations)
            .finish_non_exhaustive()
    }
}

/// The PostgreSQL store. Cheap to clone; clones share one pool and one wake-up listener, which
/// stops when the last clone is dropped.
#[derive(Clone)]
pub struct PgStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) pool: PgPool,
    pub(crate) schema: String,
    pub(crate) sql: Sql,
    pub(crate) schedule_sql: schedules::ScheduleSql,
    pub(crate) access_sql: access::AccessSql,
    pub(crate) worker_sql: workers::WorkerSql,
    pub(crate) kind_sql: kinds::KindsSql,
    pub(crate) breaker_sql: kinds::BreakersSql,
    pub(crate) retention_sql: retention::Retention,
    pub(crate) stats_sql: stats::StatsSql,
    pub(crate) config_sql: crate::config::ConfigSql,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) options: StoreOptions,
    pub(crate) wakeup: Arc<Notify>,
    /// Vacuums the jobs table when the server's autovacuum is off, rebuilds bloated indexes
    /// (see `LeadershipStore::storage_maintenance`).
    pub(crate) upkeep: Arc<upkeep::Upkeep>,
    /// Jobs of flows this store handed out (see `ops::FlowJobs`).
    pub(crate) flow_jobs: ops::FlowJobs,
    /// Told of the jobs flows start, after each commit (see `Ctx::flows_committed`).
    pub(crate) flow_starts: Arc<conveyor_core::FlowStarts>,
    /// Held only to stop the listener when the store goes away.
    pub(crate) _listener: listener::ListenerTask,
    /// Keeps `clock` on the database's time when it is (see `clock`); stops with the store.
    pub(crate) _clock_task: Option<clock::ClockTask>,
}

/// How long a session of the store's pool may sit idle inside a transaction before PostgreSQL
/// ends it (see [`PgStore::connect`]).
pub(crate) const STALLED_TRANSACTION_TIMEOUT: &str = "10s";

impl PgStore {
    /// Connects to the database at `url` (a `postgres://` URL), applies pending migrations
    /// (unless `options.run_migrations` is false) and starts the wake-up listener.
    pub async fn connect(url: &str, options: PgOptions) -> StoreResult<Self> {
        names::validate_schema(&options.schema)?;
        let connect_options = PgConnectOptions::from_str(url).map_err(|e| {
            ValidationError::new("url", format!("not a usable PostgreSQL URL: {e}"))
        })?;
        // Named by host, port and database only: the URL may carry a password.
        let unreachable = |e: sqlx::Error| {
            StoreError::backend(format!(
                "postgres: cannot connect to {}:{}/{}: {e}",
                connect_options.get_host(),
                connect_options.get_port(),
                connect_options
                    .get_database()
                    .unwrap_or("(default database)"),
            ))
        };
        // One direct connection first: the pool retries a refused connection until its acquire
        // timeout (30 s), but a stopped server or wrong credentials should fail at start, at once.
        PgConnection::connect_with(&connect_options)
            .await
            .map_err(unreachable)?
            .close()
            .await
            .map_err(unreachable)?;
        // No JIT compilation: every statement of the store is a short one, driven by keys or a
        // LIMIT, where compiling costs far more than it saves. On a table without statistics
        // the planner's estimates pass the JIT threshold, and the flow benchmark spent 7 of its
        // 21 s compiling statements that ran in a few milliseconds (docs/benchmarks.md,
        // "Workflows, fifth round"). Pools given to `from_pool` keep their own setting; flow
        // transactions turn it off for themselves either way (`workflow::plan_flow_statements`).
        //
        // A session idle inside a transaction for 10 s has lost its server: a partition or a
        // paused process stalled it between statements (Conveyor's transactions never wait on
        // anything but the database). PostgreSQL ends it, so its row locks (a job mid-commit, a
        // schedule mid-fire) go back to the other servers instead of blocking them until TCP
        // gives up, hours later. Its transaction rolls back: a lost commit, which the caller
        // sees as an error and its lease or retry covers.
        let pool_options = connect_options.clone().options([
            ("jit", "off"),
            (
                "idle_in_transaction_session_timeout",
                STALLED_TRANSACTION_TIMEOUT,
            ),
        ]);
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections.max(1))
            .connect_with(pool_options)
            .await
            .map_err(unreachable)?;
        Self::from_pool(pool, options).await
    }

    /// Builds a store on an existing pool (for applications that already have one);
    /// `options.max_connections` is not used. Migrates and starts the listener as
    /// [`PgStore::connect`] does.
    pub async fn from_pool(pool: PgPool, options: PgOptions) -> StoreResult<Self> {
        names::validate_schema(&options.schema)?;
        if options.run_migrations {
            migrate(&pool, &options.schema).await?;
        } else {
            migrate::check_version(&pool, &options.schema).await?;
        }
        let sql = Sql::new(&options.schema);
        let schedule_sql = schedules::ScheduleSql::new(&options.schema);
        let access_sql = access::AccessSql::new(&options.schema);
        let worker_sql = workers::WorkerSql::new(&options.schema);
        let kind_sql = kinds::KindsSql::new(&options.schema);
        let breaker_sql = kinds::BreakersSql::new(&options.schema);
        let retention_sql = retention::Retention::new(&options.schema);
        let stats_sql = stats::StatsSql::new(&options.schema);
        let config_sql = crate::config::ConfigSql::new(&options.schema);
        let wakeup = Arc::new(Notify::new());
        let listener = listener::start(
            (*pool.connect_options()).clone(),
            sql.channel.clone(),
            wakeup.clone(),
        )
        .await?;
        let upkeep = Arc::new(upkeep::Upkeep::new(&pool, &options.schema).await);
        // The process's wall clock gives way to the database's; an injected clock is kept.
        let (clock, clock_task): (Arc<dyn Clock>, _) = if options.clock.is_system() {
            let (clock, task) = clock::start(&pool).await?;
            (clock, Some(task))
        } else {
            (options.clock, None)
        };
        Ok(Self {
            inner: Arc::new(Inner {
                upkeep,
                pool,
                schema: options.schema,
                sql,
                schedule_sql,
                access_sql,
                worker_sql,
                kind_sql,
                breaker_sql,
                retention_sql,
                stats_sql,
                config_sql,
                clock,
                options: options.store,
                wakeup,
                flow_jobs: ops::FlowJobs::default(),
                flow_starts: Arc::default(),
                _listener: listener,
                _clock_task: clock_task,
            }),
        })
    }

    /// The store's connection pool, e.g. to begin the transactions given to
    /// [`PgStore::enqueue_tx`] and [`PgStore::complete_tx`].
    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    /// The schema holding this store's tables.
    pub fn schema(&self) -> &str {
        &self.inner.schema
    }

    /// The NOTIFY channel on which this store announces jobs that became available.
    pub fn channel(&self) -> &str {
        &self.inner.sql.channel
    }

    /// Enqueues jobs inside the caller's transaction: they exist if and only if `tx` commits,
    /// and waiting fetchers (in every process) are woken when it does. Same rules as
    /// [`JobStore::jobs_insert_many`] (validation, all-or-nothing, idempotency keys).
    ///
    /// Keyed jobs hold a lock per idempotency key until `tx` ends, and jobs of a queue with a
    /// depth limit (see [`QueueStore::queue_settings_put`]) a lock on the queue (or on their tenant's
    /// share of it), which makes other inserts into that queue wait: keep such transactions
    /// short. The depth count assumes `tx` is READ COMMITTED (PostgreSQL's default); under
    /// REPEATABLE READ or SERIALIZABLE it may miss jobs committed since `tx` began. An error
    /// (including `StoreError::QueueFull`) leaves `tx` aborted; roll it back.
    pub async fn enqueue_tx(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        jobs: Vec<NewJob>,
    ) -> StoreResult<Vec<Inserted>> {
        validate_all(&jobs)?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let ctx = self.ctx();
        // No local wake-up here: this commit is the caller's, so the listener delivers it.
        // Turns are not reserved here: the caller's transaction could hold a key's row until
        // it commits. Its keyed jobs get theirs at the next keyed claim.
        let mut unreserved = crate::limits::Reserved::default();
        Ok(ops::insert_many(tx, &ctx, jobs, &mut unreserved)
            .await?
            .inserted)
    }

    /// Completes a running job inside the handler's own transaction: it is completed if and
    /// only if `tx` commits, atomically with the handler's writes. `LeaseLost` (and no change)
    /// when the lease no longer holds, as for [`LeaseStore::jobs_complete_many`].
    pub async fn complete_tx(
        &self,
        tx: &mut Transaction<'_, Postgres>,
        lease: LeaseRef,
        result: Option<Value>,
    ) -> StoreResult<LeaseOutcome> {
        let completion = Valid::completions(vec![CompleteParams { lease, result }])?.into_inner();
        // A job of a flow changes planner settings for the rest of the transaction (see
        // `workflow::plan_flow_statements`): this one is the caller's, so they are put back.
        let planner = workflow::planner_settings(tx).await?;
        let ctx = self.flow_ctx();
        let outcomes = ops::complete_many(tx, &ctx, completion, &self.inner.flow_jobs).await?;
        workflow::restore_planner(tx, &planner).await?;
        ctx.flows_committed();
        outcomes
            .into_iter()
            .next()
            .ok_or_else(|| StoreError::backend("postgres: completion returned no outcome"))
    }

    /// The context of one operation, with "now" read from the clock once.
    pub(crate) fn ctx(&self) -> Ctx<'_> {
        Ctx {
            sql: &self.inner.sql,
            schema: &self.inner.schema,
            now: truncate_to_millis(self.inner.clock.now()),
            options: &self.inner.options,
            deferred_wakeups: None,
            flow_started: None,
        }
    }

    /// `ctx` for an operation that may start jobs of flows, keeping them for the commit when
    /// anyone listens (see `conveyor_core::FlowStarts`).
    pub(crate) fn flow_ctx(&self) -> Ctx<'_> {
        let starts = &self.inner.flow_starts;
        Ctx {
            flow_started: starts
                .observed()
                .then(|| Arc::new(FlowStarted::new(starts.clone()))),
            ..self.ctx()
        }
    }

    pub(crate) async fn conn(&self) -> StoreResult<PoolConnection<Postgres>> {
        self.inner
            .pool
            .acquire()
            .await
            .map_err(db("acquire a connection"))
    }

    /// Reserves turns by key for `jobs` (`limits::reserve_turns`) on a connection of its own,
    /// returned to the pool before the insert's transaction takes one. Nothing when no job
    /// holds a limit key.
    pub(crate) async fn reserve_turns(
        &self,
        ctx: &Ctx<'_>,
        jobs: &[NewJob],
    ) -> StoreResult<crate::limits::Reserved> {
        if jobs.iter().all(|job| job.limit_keys.is_empty()) {
            return Ok(crate::limits::Reserved::default());
        }
        let mut conn = self.conn().await?;
        crate::limits::reserve_turns(&mut conn, ctx, jobs).await
    }

    pub(crate) async fn begin(&self) -> StoreResult<Transaction<'static, Postgres>> {
        self.inner
            .pool
            .begin()
            .await
            .map_err(db("begin transaction"))
    }

    /// Wakes this process's waiting fetchers at once, without waiting for the NOTIFY round trip.
    /// Called only after the change committed.
    pub(crate) fn wake_local(&self, made_available: bool) {
        if made_available {
            self.inner.wakeup.notify_waiters();
        }
    }
}

pub(crate) fn validate_all(jobs: &[NewJob]) -> StoreResult<()> {
    for job in jobs {
        conveyor_core::validate::new_job(job)?;
    }
    Ok(())
}

pub(crate) async fn commit(tx: Transaction<'static, Postgres>) -> StoreResult<()> {
    tx.commit().await.map_err(db("commit"))
}
