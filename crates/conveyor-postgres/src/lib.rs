//! Conveyor's shared store: PostgreSQL.
//!
//! Many worker and server processes share one database. Claims use `FOR UPDATE SKIP LOCKED`, so
//! concurrent fetchers never claim a job twice and never wait for each other; every change to a
//! running job is conditional on its lease token. Wake-ups travel between processes over
//! `LISTEN`/`NOTIFY`. Every "now" comes from one [`Clock`] read once per operation: by default the
//! database server's (the module `clock`), which every server of a cluster shares, so no
//! server's own clock error decides a lease or a tick; an injected clock (the conformance
//! suite's manual one) is used as given.
//!
//! Besides the [`Store`] trait, [`PgStore::enqueue_tx`] and [`PgStore::complete_tx`] work inside
//! the application's own transaction: a job enqueued there exists if and only if the
//! application's transaction commits, and a job completed there is completed if and only if the
//! handler's own writes commit.
//!
//! ```no_run
//! # async fn demo() -> Result<(), conveyor_core::StoreError> {
//! use conveyor_postgres::{PgOptions, PgStore};
//! let store = PgStore::connect("postgres://postgres@127.0.0.1:5432/app", PgOptions::default()).await?;
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod access;
mod clock;
mod copy;
mod errors;
mod kinds;
mod limits;
mod listener;
mod migrate;
mod names;
mod ops;
#[cfg(test)]
mod plan_tests;
mod retention;
mod rows;
mod schedules;
mod sql;
mod stats;
mod unique;
mod upkeep;
mod workers;
mod workflow;

use async_trait::async_trait;
use chrono::{DateTime, Utc};
use conveyor_core::clock::truncate_to_millis;
use conveyor_core::workflow::{CreatedFlow, FlowListParams, FlowView, SignalOutcome, ValidFlow};
use conveyor_core::FlowStore;
use conveyor_core::{
    AccessStore, Clock, CompleteParams, FailParams, FetchParams, HeartbeatParams, Inserted, Job,
    JobListParams, JobStore, LeadershipStore, LeaseOutcome, LeaseRef, LeaseStore,
    NamedQueueSettings, NewJob, QueueSettings, QueueStats, QueueStore, ReplaySelector,
    RescueParams, RescueReport, ScheduleStore, SnoozeParams, StoreError, StoreOptions, StoreResult,
    SystemClock, Valid, ValidJob, ValidationError, WorkerStore,
};
use conveyor_core::{
    ApiToken, AuditEntry, AuditListParams, NewAuditEntry, NewSession, NewToken, StoredSession,
    StoredToken, TokenSelector,
};
use conveyor_core::{FireOutcome, FireRequest, Schedule, ScheduleRun, ScheduleView};
use conveyor_core::{
    StaleReport, StaleWorkerParams, StuckJob, StuckParams, WorkerHeartbeat, WorkerInfo,
};
use serde_json::Value;
use sqlx::pool::PoolConnection;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{Connection, PgConnection, Postgres, Transaction};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use uuid::Uuid;

pub use migrate::{migrate, SCHEMA_VERSION};

use errors::db;
use ops::Ctx;
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
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    schema: String,
    sql: Sql,
    schedule_sql: schedules::ScheduleSql,
    access_sql: access::AccessSql,
    worker_sql: workers::WorkerSql,
    clock: Arc<dyn Clock>,
    options: StoreOptions,
    wakeup: Arc<Notify>,
    /// Vacuums the jobs table when the server's autovacuum is off, rebuilds bloated indexes
    /// (see `LeadershipStore::storage_maintenance`).
    upkeep: Arc<upkeep::Upkeep>,
    /// Jobs of flows this store handed out (see `ops::FlowJobs`).
    flow_jobs: ops::FlowJobs,
    /// Told of the jobs flows start, after each commit (see `ops::Ctx::flows_committed`).
    flow_starts: Arc<conveyor_core::FlowStarts>,
    /// Held only to stop the listener when the store goes away.
    _listener: listener::ListenerTask,
    /// Keeps `clock` on the database's time when it is (see `clock`); stops with the store.
    _clock_task: Option<clock::ClockTask>,
}

/// How long a session of the store's pool may sit idle inside a transaction before PostgreSQL
/// ends it (see [`PgStore::connect`]).
const STALLED_TRANSACTION_TIMEOUT: &str = "10s";

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
        Ok(ops::insert_many(tx, &ctx, jobs).await?.inserted)
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
    fn ctx(&self) -> Ctx<'_> {
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
    fn flow_ctx(&self) -> Ctx<'_> {
        let starts = &self.inner.flow_starts;
        Ctx {
            flow_started: starts
                .observed()
                .then(|| Arc::new(ops::FlowStarted::new(starts.clone()))),
            ..self.ctx()
        }
    }

    async fn conn(&self) -> StoreResult<PoolConnection<Postgres>> {
        self.inner
            .pool
            .acquire()
            .await
            .map_err(db("acquire a connection"))
    }

    async fn begin(&self) -> StoreResult<Transaction<'static, Postgres>> {
        self.inner
            .pool
            .begin()
            .await
            .map_err(db("begin transaction"))
    }

    /// Wakes this process's waiting fetchers at once, without waiting for the NOTIFY round trip.
    /// Called only after the change committed.
    fn wake_local(&self, made_available: bool) {
        if made_available {
            self.inner.wakeup.notify_waiters();
        }
    }
}

fn validate_all(jobs: &[NewJob]) -> StoreResult<()> {
    for job in jobs {
        conveyor_core::validate::new_job(job)?;
    }
    Ok(())
}

async fn commit(tx: Transaction<'static, Postgres>) -> StoreResult<()> {
    tx.commit().await.map_err(db("commit"))
}

#[async_trait]
impl JobStore for PgStore {
    fn clock(&self) -> Arc<dyn Clock> {
        self.inner.clock.clone()
    }

    /// Ready when a pooled connection answers within a few seconds and reaches a primary
    /// (a hot standby refuses writes). Never "not live": a lost database is not fixed by
    /// restarting this process, and the pool reconnects by itself.
    async fn health(&self) -> conveyor_core::StoreHealth {
        use conveyor_core::StoreHealth;
        let probe =
            sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()").fetch_one(&self.inner.pool);
        match tokio::time::timeout(std::time::Duration::from_secs(5), probe).await {
            Ok(Ok(false)) => StoreHealth::ok(),
            Ok(Ok(true)) => StoreHealth::not_ready(
                "connected to a PostgreSQL standby (read-only): writes would fail",
            ),
            Ok(Err(error)) => StoreHealth::not_ready(format!("cannot reach PostgreSQL: {error}")),
            Err(_) => StoreHealth::not_ready("PostgreSQL did not answer within 5 s"),
        }
    }

    async fn jobs_insert_valid(&self, jobs: Vec<ValidJob>) -> StoreResult<Vec<Inserted>> {
        let jobs: Vec<NewJob> = jobs.into_iter().map(ValidJob::into_job).collect();
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let mut tx = self.begin().await?;
        let insertion = ops::insert_many(&mut tx, &self.ctx(), jobs).await?;
        conveyor_core::faults::inject("insert")?;
        commit(tx).await?;
        self.wake_local(insertion.made_available);
        Ok(insertion.inserted)
    }

    async fn job_get(&self, id: Uuid) -> StoreResult<Option<Job>> {
        ops::get(&mut *self.conn().await?, &self.inner.sql, id).await
    }

    async fn jobs_list(&self, params: JobListParams) -> StoreResult<Vec<Job>> {
        ops::list(&mut *self.conn().await?, &self.inner.sql, &params).await
    }

    async fn job_cancel(&self, id: Uuid) -> StoreResult<Job> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let flow_id = match ops::cancel(&mut tx, &ctx, id, None).await? {
            ops::CancelOutcome::Cancelled(job) => {
                commit(tx).await?;
                ctx.flows_committed();
                return Ok(*job);
            }
            ops::CancelOutcome::FlowBusy(flow_id) => flow_id,
        };
        // The job's flow is held by another transaction, which may be waiting for the job's
        // row that this one holds: let go of it and start over, taking the flow first.
        tx.rollback().await.map_err(db("roll back cancel"))?;
        ctx.flows_rolled_back();
        let mut tx = self.begin().await?;
        match ops::cancel(&mut tx, &ctx, id, Some(flow_id)).await? {
            ops::CancelOutcome::Cancelled(job) => {
                commit(tx).await?;
                ctx.flows_committed();
                Ok(*job)
            }
            ops::CancelOutcome::FlowBusy(_) => Err(StoreError::backend(format!(
                "postgres: cancel of job {id}: its flow {flow_id} was locked and then not found \
                 locked by this transaction"
            ))),
        }
    }

    async fn dead_replay(&self, selector: ReplaySelector) -> StoreResult<u64> {
        let replayed =
            ops::dead_replay(&mut *self.conn().await?, &self.flow_ctx(), &selector).await?;
        self.wake_local(replayed > 0);
        Ok(replayed)
    }

    async fn dead_discard(&self, id: Uuid) -> StoreResult<bool> {
        ops::dead_discard(&mut *self.conn().await?, &self.inner.sql, id).await
    }

    async fn jobs_import(&self, jobs: Vec<Job>) -> StoreResult<u64> {
        let mut tx = self.begin().await?;
        let (imported, woke) = ops::import(&mut tx, &self.inner.sql, &jobs).await?;
        commit(tx).await?;
        self.wake_local(woke);
        Ok(imported)
    }
}

#[async_trait]
impl LeaseStore for PgStore {
    async fn jobs_fetch_valid(&self, params: Valid<FetchParams>) -> StoreResult<Vec<Job>> {
        conveyor_core::faults::inject("fetch")?;
        let fetched = ops::fetch(&mut *self.conn().await?, &self.ctx(), &params).await?;
        // Promoted jobs may be in queues other fetchers of this process wait on.
        self.wake_local(fetched.promoted > 0);
        self.inner.flow_jobs.remember(&fetched.jobs);
        Ok(fetched.jobs)
    }

    async fn jobs_heartbeat_many(
        &self,
        params: Vec<HeartbeatParams>,
    ) -> StoreResult<Vec<Option<DateTime<Utc>>>> {
        if params.is_empty() {
            return Ok(Vec::new());
        }
        ops::heartbeat_many(&mut *self.conn().await?, &self.ctx(), &params).await
    }

    async fn jobs_complete_valid(
        &self,
        params: Valid<Vec<CompleteParams>>,
    ) -> StoreResult<Vec<LeaseOutcome>> {
        let params = params.into_inner();
        conveyor_core::faults::inject("complete")?;
        ops::complete_many(
            &mut *self.conn().await?,
            &self.flow_ctx(),
            params,
            &self.inner.flow_jobs,
        )
        .await
    }

    async fn job_fail_valid(&self, params: Valid<FailParams>) -> StoreResult<Job> {
        conveyor_core::faults::inject("fail")?;
        let params = params.into_inner();
        ops::fail(&mut *self.conn().await?, &self.flow_ctx(), params).await
    }

    async fn job_snooze(&self, params: SnoozeParams) -> StoreResult<Job> {
        let mut tx = self.begin().await?;
        let (job, woke) = ops::snooze(&mut tx, &self.ctx(), params).await?;
        commit(tx).await?;
        self.wake_local(woke);
        Ok(job)
    }

    async fn jobs_release_many(&self, leases: Vec<LeaseRef>) -> StoreResult<u64> {
        let released = ops::release_many(&mut *self.conn().await?, &self.ctx(), &leases).await?;
        self.wake_local(released > 0);
        Ok(released)
    }

    async fn job_progress(
        &self,
        lease: LeaseRef,
        percent: u8,
        message: Option<String>,
    ) -> StoreResult<()> {
        let ctx = self.ctx();
        let progress = conveyor_core::Progress::new(percent, message, ctx.now)?;
        ops::progress(&mut *self.conn().await?, &ctx, lease, &progress).await
    }

    fn wakeup(&self) -> Arc<Notify> {
        self.inner.wakeup.clone()
    }

    async fn jobs_next_due(&self, queues: &[String]) -> StoreResult<Option<DateTime<Utc>>> {
        ops::next_due(&mut *self.conn().await?, &self.inner.sql, queues).await
    }
}

/// Every flow event runs in one transaction that locks the flow first (see `workflow`).
#[async_trait]
impl FlowStore for PgStore {
    async fn flow_create(&self, flow: ValidFlow) -> StoreResult<CreatedFlow> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let created = workflow::create(&mut tx, &ctx, flow).await?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(created)
    }

    async fn flow_get(&self, id: Uuid) -> StoreResult<Option<FlowView>> {
        workflow::view(&mut *self.conn().await?, &self.ctx(), id).await
    }

    async fn flows_list(&self, params: FlowListParams) -> StoreResult<Vec<FlowView>> {
        workflow::list(&mut *self.conn().await?, &self.ctx(), &params).await
    }

    async fn flow_cancel(&self, id: Uuid) -> StoreResult<FlowView> {
        let mut tx = self.begin().await?;
        let flow = workflow::cancel(&mut tx, &self.ctx(), id).await?;
        commit(tx).await?;
        Ok(flow)
    }

    async fn flow_signal_valid(
        &self,
        id: Uuid,
        signal: &str,
        payload: Valid<Value>,
    ) -> StoreResult<SignalOutcome> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let outcome = workflow::signal(&mut tx, &ctx, id, signal, &payload).await?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(outcome)
    }

    async fn flows_expire_waits(&self, limit: usize) -> StoreResult<u64> {
        if limit == 0 {
            return Ok(0);
        }
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let expired = workflow::expire_waits(&mut tx, &ctx, limit).await?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(expired)
    }

    fn flow_starts(&self) -> Arc<conveyor_core::FlowStarts> {
        self.inner.flow_starts.clone()
    }

    async fn flows_prune(&self, params: conveyor_core::PruneParams) -> StoreResult<u64> {
        workflow::prune(&mut *self.conn().await?, &self.ctx(), &params).await
    }
}

#[async_trait]
impl QueueStore for PgStore {
    async fn queues_stats(&self) -> StoreResult<Vec<QueueStats>> {
        ops::queues_stats(&mut *self.conn().await?, &self.ctx()).await
    }

    async fn queue_settings_get(&self, queue: &str) -> StoreResult<QueueSettings> {
        ops::queue_settings_get(&mut *self.conn().await?, &self.inner.sql, queue).await
    }

    async fn queue_settings_put_valid(
        &self,
        settings: Valid<NamedQueueSettings>,
    ) -> StoreResult<QueueSettings> {
        let mut tx = self.begin().await?;
        let (stored, resumed) =
            ops::queue_settings_put(&mut tx, &self.ctx(), &settings.name, &settings.settings)
                .await?;
        commit(tx).await?;
        self.wake_local(resumed);
        Ok(stored)
    }

    async fn queue_settings_list(&self) -> StoreResult<Vec<NamedQueueSettings>> {
        ops::queue_settings_list(&mut *self.conn().await?, &self.inner.sql).await
    }
}

#[async_trait]
impl conveyor_core::KindStore for PgStore {
    async fn kind_put(
        &self,
        settings: conveyor_core::kinds::KindSettings,
    ) -> StoreResult<conveyor_core::kinds::KindSettings> {
        conveyor_core::kinds::validate_settings(&settings)?;
        kinds::put(&mut *self.conn().await?, &self.ctx(), settings).await
    }

    async fn kind_get(
        &self,
        kind: &str,
    ) -> StoreResult<Option<conveyor_core::kinds::KindSettings>> {
        Ok(self
            .kinds_list()
            .await?
            .into_iter()
            .find(|k| k.kind == kind))
    }

    async fn kinds_list(&self) -> StoreResult<Vec<conveyor_core::kinds::KindSettings>> {
        kinds::list(&mut *self.conn().await?, &self.ctx()).await
    }

    async fn kind_delete(&self, kind: &str) -> StoreResult<bool> {
        kinds::delete(&mut *self.conn().await?, &self.ctx(), kind).await
    }
}

#[async_trait]
impl conveyor_core::BreakerStore for PgStore {
    async fn breakers_list(&self) -> StoreResult<Vec<conveyor_core::StoredBreaker>> {
        kinds::breakers_list(&mut *self.conn().await?, &self.ctx()).await
    }

    async fn breaker_get(
        &self,
        scope: conveyor_core::BreakerScope,
        name: &str,
    ) -> StoreResult<Option<conveyor_core::StoredBreaker>> {
        kinds::breaker_get(&mut *self.conn().await?, &self.ctx(), scope, name).await
    }

    async fn breaker_write_valid(
        &self,
        breaker: Valid<conveyor_core::StoredBreaker>,
    ) -> StoreResult<bool> {
        kinds::breaker_write(&mut *self.conn().await?, &self.ctx(), &breaker).await
    }
}

#[async_trait]
impl conveyor_core::StatsStore for PgStore {
    async fn stats_merge(&self, rollups: Vec<conveyor_core::stats::Rollup>) -> StoreResult<()> {
        conveyor_core::stats::validate_rollups(&rollups)?;
        if rollups.is_empty() {
            return Ok(());
        }
        let mut tx = self.begin().await?;
        stats::merge(&mut tx, &self.inner.sql.history, rollups).await?;
        commit(tx).await
    }

    async fn stats_read(
        &self,
        query: conveyor_core::stats::StatsQuery,
    ) -> StoreResult<Vec<conveyor_core::stats::Rollup>> {
        stats::read(&mut *self.conn().await?, &self.inner.sql.history, &query).await
    }

    async fn stats_prune(&self, older_than: std::time::Duration) -> StoreResult<u64> {
        let before = conveyor_core::clock::before(self.ctx().now, older_than);
        let before = before - chrono::Duration::minutes(1);
        stats::prune(&mut *self.conn().await?, &self.inner.sql.history, before).await
    }
}

#[async_trait]
impl ScheduleStore for PgStore {
    async fn schedule_put(&self, schedule: Schedule) -> StoreResult<ScheduleView> {
        let mut tx = self.begin().await?;
        schedules::put(&mut tx, &self.ctx(), &self.inner.schedule_sql, &schedule).await?;
        commit(tx).await?;
        self.schedule_get(schedule.name()).await?.ok_or_else(|| {
            StoreError::backend(format!(
                "postgres: schedule {:?} was deleted right after being stored",
                schedule.name()
            ))
        })
    }

    async fn schedule_get(&self, name: &str) -> StoreResult<Option<ScheduleView>> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        schedules::get(&mut conn, &self.inner.schedule_sql, name, now).await
    }

    async fn schedules_list(&self) -> StoreResult<Vec<ScheduleView>> {
        let now = self.ctx().now;
        schedules::list(&mut *self.conn().await?, &self.inner.schedule_sql, now).await
    }

    async fn schedule_delete(&self, name: &str) -> StoreResult<bool> {
        schedules::delete(&mut *self.conn().await?, &self.inner.schedule_sql, name).await
    }

    async fn schedule_fire(&self, request: FireRequest) -> StoreResult<FireOutcome> {
        let mut tx = self.begin().await?;
        let fired =
            schedules::fire(&mut tx, &self.ctx(), &self.inner.schedule_sql, &request).await?;
        conveyor_core::faults::inject("schedule_fire")?;
        commit(tx).await?;
        self.wake_local(fired.made_available);
        Ok(fired.outcome)
    }

    async fn schedule_runs(&self, name: &str, limit: usize) -> StoreResult<Vec<ScheduleRun>> {
        let mut conn = self.conn().await?;
        schedules::runs(&mut conn, &self.inner.schedule_sql, name, limit).await
    }
}

#[async_trait]
impl AccessStore for PgStore {
    async fn tokens_insert_valid(&self, token: Valid<NewToken>) -> StoreResult<ApiToken> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        access::tokens_insert(&mut conn, &self.inner.access_sql, now, token.into_inner()).await
    }

    async fn tokens_list(&self) -> StoreResult<Vec<ApiToken>> {
        access::tokens_list(&mut *self.conn().await?, &self.inner.access_sql).await
    }

    async fn token_revoke(&self, selector: TokenSelector) -> StoreResult<Option<ApiToken>> {
        let now = self.ctx().now;
        let mut tx = self.begin().await?;
        let revoked = access::token_revoke(&mut tx, &self.inner.access_sql, now, &selector).await?;
        commit(tx).await?;
        Ok(revoked)
    }

    async fn token_get(&self, id: Uuid) -> StoreResult<Option<StoredToken>> {
        access::token_get(&mut *self.conn().await?, &self.inner.access_sql, id).await
    }

    async fn session_insert(&self, session: NewSession) -> StoreResult<()> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        access::session_insert(&mut conn, &self.inner.access_sql, now, session).await
    }

    async fn session_get(&self, id: Uuid) -> StoreResult<Option<StoredSession>> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        access::session_get(&mut conn, &self.inner.access_sql, now, id).await
    }

    async fn session_delete(&self, id: Uuid) -> StoreResult<bool> {
        access::session_delete(&mut *self.conn().await?, &self.inner.access_sql, id).await
    }

    async fn audit_append(&self, entry: NewAuditEntry) -> StoreResult<AuditEntry> {
        let (now, mut conn) = (self.ctx().now, self.conn().await?);
        access::audit_append(&mut conn, &self.inner.access_sql, now, entry).await
    }

    async fn audit_list(&self, params: AuditListParams) -> StoreResult<Vec<AuditEntry>> {
        access::audit_list(&mut *self.conn().await?, &self.inner.access_sql, &params).await
    }

    async fn audit_prune(
        &self,
        cutoff: conveyor_core::AuditCutoff,
        limit: usize,
    ) -> StoreResult<u64> {
        let before = cutoff.before(self.ctx().now);
        access::audit_prune(
            &mut *self.conn().await?,
            &self.inner.access_sql,
            before,
            limit,
        )
        .await
    }
}

#[async_trait]
impl WorkerStore for PgStore {
    async fn workers_heartbeat(&self, beat: WorkerHeartbeat) -> StoreResult<WorkerInfo> {
        conveyor_core::workers::heartbeat(&beat)?;
        let (ctx, mut conn) = (self.ctx(), self.conn().await?);
        workers::heartbeat(&mut conn, &ctx, &self.inner.worker_sql, &beat).await
    }

    async fn workers_list(&self) -> StoreResult<Vec<WorkerInfo>> {
        workers::list(&mut *self.conn().await?, &self.inner.worker_sql).await
    }

    async fn worker_command(
        &self,
        id: &str,
        command: Option<conveyor_core::WorkerCommand>,
    ) -> StoreResult<Option<WorkerInfo>> {
        workers::command(
            &mut *self.conn().await?,
            &self.inner.worker_sql,
            id,
            command,
        )
        .await
    }

    async fn workers_mark_stale(&self, params: StaleWorkerParams) -> StoreResult<StaleReport> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let sql = &self.inner.worker_sql;
        let report = workers::mark_stale(&mut tx, &ctx, sql, &params).await?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(report)
    }

    async fn jobs_stuck(&self, params: StuckParams) -> StoreResult<Vec<StuckJob>> {
        let (ctx, mut conn) = (self.ctx(), self.conn().await?);
        workers::stuck(&mut conn, &ctx, &self.inner.worker_sql, &params).await
    }
}

#[async_trait]
impl LeadershipStore for PgStore {
    async fn storage_maintenance(&self) -> StoreResult<()> {
        self.inner.upkeep.run_if_due(&self.inner.pool).await
    }

    async fn jobs_rescue_expired(&self, params: RescueParams) -> StoreResult<RescueReport> {
        let ctx = self.flow_ctx();
        let mut tx = self.begin().await?;
        let report = ops::rescue_expired(&mut tx, &ctx, &params).await?;
        conveyor_core::faults::inject("rescue")?;
        commit(tx).await?;
        ctx.flows_committed();
        Ok(report)
    }

    async fn jobs_promote_due(&self) -> StoreResult<u64> {
        let mut conn = self.conn().await?;
        let ctx = self.flow_ctx();
        // Expiry first: a job expiring now is not made available. Batches keep each statement
        // short; a short batch means nothing expiring is left.
        while ops::expire_due(&mut conn, &ctx).await? >= ops::EXPIRE_BATCH as u64 {}
        // Batches keep each statement short; a short batch means nothing due is left.
        let mut promoted = 0;
        loop {
            let batch = ops::promote_due(&mut conn, &ctx, ops::PROMOTE_BATCH).await?;
            promoted += batch;
            if batch < ops::PROMOTE_BATCH as u64 {
                break;
            }
        }
        self.wake_local(promoted > 0);
        Ok(promoted)
    }

    async fn jobs_prune(
        &self,
        params: conveyor_core::PruneParams,
    ) -> StoreResult<conveyor_core::PruneReport> {
        retention::prune(&mut *self.conn().await?, &self.ctx(), &params).await
    }

    async fn leader_try_acquire(&self, holder: &str, ttl: Duration) -> StoreResult<bool> {
        ops::leader_try_acquire(&mut *self.conn().await?, &self.ctx(), holder, ttl).await
    }

    async fn leader_release(&self, holder: &str) -> StoreResult<()> {
        ops::leader_release(&mut *self.conn().await?, &self.inner.sql, holder).await
    }
}
