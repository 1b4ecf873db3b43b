//! The store's operations, written against `&mut PgConnection` so the same SQL serves both the
//! pooled paths (the `Store` methods) and a caller's own transaction (`enqueue_tx`,
//! `complete_tx`). Semantics follow the SQLite reference store (`conveyor-sqlite/src/ops.rs`)
//! rule for rule; every change to a running job is conditional on
//! `state = 'running' AND lease_token = $token`.

use chrono::{DateTime, Utc};
use conveyor_core::clock::truncate_to_millis;
use conveyor_core::{
    CompleteParams, ErrorRecord, FailParams, FetchParams, HeartbeatParams, Inserted, Job,
    JobListParams, JobState, LeaseOutcome, LeaseRef, NamedQueueSettings, NewJob, QueueSettings,
    QueueStats, RateLimit, ReplaySelector, RescueParams, RescueReport, SnoozeParams, StoreError,
    StoreOptions, StoreResult, ValidationError,
};
use serde_json::Value;
use sqlx::postgres::PgRow;
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::str::FromStr;
use uuid::Uuid;

use crate::errors::{corrupt, db};
use crate::names::{depth_lock_key, idempotency_lock_key};
use crate::rows;
use crate::sql::{Sql, COLUMNS};
use crate::unique;

/// Most due jobs one promotion statement moves, so it stays a short transaction.
pub(crate) const PROMOTE_BATCH: i64 = 1_000;

/// What every operation needs besides its connection. `now` is read from the store's clock once
/// per operation and truncated to the milliseconds the store keeps.
pub(crate) struct Ctx<'a> {
    pub sql: &'a Sql,
    pub schema: &'a str,
    pub now: DateTime<Utc>,
    pub options: &'a StoreOptions,
}

/// `now + d`, or a validation error naming `field` when the sum leaves the calendar.
fn after(
    now: DateTime<Utc>,
    d: std::time::Duration,
    field: &'static str,
) -> StoreResult<DateTime<Utc>> {
    Ok(truncate_to_millis(conveyor_core::clock::checked_after(
        now, d, field,
    )?))
}

fn to_i32(value: u32, field: &'static str) -> StoreResult<i32> {
    i32::try_from(value).map_err(|_| ValidationError::new(field, "too large").into())
}

/// A lease as a hashable key (`LeaseRef` itself does not implement `Hash`).
type LeaseKey = (Uuid, Uuid);

fn lease_key(lease: &LeaseRef) -> LeaseKey {
    (lease.id, lease.lease_token)
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Sends one NOTIFY per queue on the schema's channel, delivered when the transaction commits.
async fn notify(conn: &mut PgConnection, sql: &Sql, queues: &[String]) -> StoreResult<()> {
    if queues.is_empty() {
        return Ok(());
    }
    sqlx::query(sql.notify.clone())
        .bind(&sql.channel)
        .bind(queues)
        .execute(conn)
        .await
        .map_err(db("notify"))?;
    Ok(())
}

/// Sums the per-queue counts returned by a statement ending in `notify_changed` (see `sql.rs`).
fn changed_count(rows: &[PgRow]) -> StoreResult<u64> {
    rows.iter().try_fold(0u64, |total, row| {
        let n: i64 = row.try_get("n").map_err(|e| corrupt(e.to_string()))?;
        Ok(total + n.max(0) as u64)
    })
}

// ---------------------------------------------------------------------------------------------
// Reads
// ---------------------------------------------------------------------------------------------

pub(crate) async fn get(conn: &mut PgConnection, sql: &Sql, id: Uuid) -> StoreResult<Option<Job>> {
    let row = sqlx::query(sql.get.clone())
        .bind(id)
        .fetch_optional(conn)
        .await
        .map_err(db("get job"))?;
    row.as_ref().map(rows::job).transpose()
}

pub(crate) async fn list(
    conn: &mut PgConnection,
    sql: &Sql,
    params: &JobListParams,
) -> StoreResult<Vec<Job>> {
    // Only the filters given become conditions, so each combination gets a plan that can use
    // the primary key (for the cursor) and the partial indexes.
    let mut text = format!("SELECT {COLUMNS} FROM {} WHERE TRUE", sql.jobs);
    let mut placeholders = 0;
    let mut condition = |column: &str| {
        placeholders += 1;
        format!(" AND {column} ${placeholders}")
    };
    let mut binds: Vec<Bind<'_>> = Vec::new();
    if let Some(queue) = &params.queue {
        text.push_str(&condition("queue ="));
        binds.push(Bind::Text(queue));
    }
    if let Some(state) = params.state {
        text.push_str(&condition("state ="));
        binds.push(Bind::Text(state.as_str()));
    }
    if let Some(kind) = &params.kind {
        text.push_str(&condition("kind ="));
        binds.push(Bind::Text(kind));
    }
    if let Some(after) = params.after {
        text.push_str(&condition("id <"));
        binds.push(Bind::Id(after));
    }
    placeholders += 1;
    text.push_str(&format!(" ORDER BY id DESC LIMIT ${placeholders}"));
    let mut query = sqlx::query(AssertSqlSafe(text));
    for bind in binds {
        query = match bind {
            Bind::Text(value) => query.bind(value),
            Bind::Id(value) => query.bind(value),
        };
    }
    let found = query
        .bind(limit(params.limit))
        .fetch_all(conn)
        .await
        .map_err(db("list jobs"))?;
    rows::jobs(&found)
}

/// A parameter of a statement assembled at run time.
enum Bind<'a> {
    Text(&'a str),
    Id(Uuid),
}

pub(crate) async fn queues_stats(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
) -> StoreResult<Vec<QueueStats>> {
    let found = sqlx::query(ctx.sql.stats.clone())
        .fetch_all(&mut *conn)
        .await
        .map_err(db("queue stats"))?;
    let paused: Vec<String> = sqlx::query_scalar(ctx.sql.paused_queues.clone())
        .fetch_all(conn)
        .await
        .map_err(db("read paused queues"))?;
    let mut by_queue: BTreeMap<String, QueueStats> = BTreeMap::new();
    for row in &found {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let queue: String = row.try_get("queue").map_err(read)?;
        let state: String = row.try_get("state").map_err(read)?;
        let n: i64 = row.try_get("n").map_err(read)?;
        let oldest: Option<DateTime<Utc>> = row.try_get("oldest_run_at").map_err(read)?;
        let stats = by_queue.entry(queue.clone()).or_insert_with(|| QueueStats {
            name: queue,
            ..QueueStats::default()
        });
        stats.add(
            JobState::from_str(&state).map_err(corrupt)?,
            n.max(0) as u64,
        );
        if let Some(oldest) = oldest {
            stats.oldest_available_age_ms = (ctx.now - oldest).num_milliseconds().max(0) as u64;
        }
    }
    // A paused queue without jobs has no line: stats are about jobs.
    for queue in paused {
        if let Some(stats) = by_queue.get_mut(&queue) {
            stats.paused = true;
        }
    }
    Ok(by_queue.into_values().collect())
}

pub(crate) async fn next_due(
    conn: &mut PgConnection,
    sql: &Sql,
    queues: &[String],
) -> StoreResult<Option<DateTime<Utc>>> {
    if queues.is_empty() {
        return Ok(None);
    }
    sqlx::query_scalar(sql.next_due.clone())
        .bind(queues)
        .fetch_optional(conn)
        .await
        .map_err(db("next due"))
}

// ---------------------------------------------------------------------------------------------
// Insert and idempotency
// ---------------------------------------------------------------------------------------------

/// Whether `job` still holds its idempotency key at `now` (see `StoreOptions`).
fn holds_key(job: &Job, now: DateTime<Utc>, options: &StoreOptions) -> bool {
    match job.state {
        JobState::Completed => job.finished_at.is_some_and(|finished| {
            conveyor_core::clock::after(finished, options.completed_idempotency_window) > now
        }),
        JobState::Dead | JobState::Cancelled => false,
        _ => true,
    }
}

/// Where each job of a batch ends up.
enum Slot {
    /// Inserted as a new job with this id.
    New(Uuid),
    /// A duplicate of a job inserted earlier in the same batch.
    SameBatch(Uuid),
    /// A duplicate of the stored job holding this key.
    Stored(String),
    /// A duplicate of the stored job holding the unique key of the batch's job at this position.
    StoredUnique(usize),
}

/// The new jobs of a batch, column by column, for one `INSERT ... SELECT FROM unnest(...)`.
#[derive(Default)]
struct Columns {
    ids: Vec<Uuid>,
    kinds: Vec<String>,
    queues: Vec<String>,
    payloads: Vec<Json<Value>>,
    priorities: Vec<i32>,
    run_ats: Vec<DateTime<Utc>>,
    max_attempts: Vec<i32>,
    timeouts: Vec<Option<i64>>,
    keys: Vec<Option<String>>,
    tags: Vec<Json<Vec<String>>>,
    tenants: Vec<Option<String>>,
    states: Vec<&'static str>,
    unique_keys: Vec<Option<String>>,
}

/// The outcome of an insert: one result per job, and whether any job became available.
pub(crate) struct Insertion {
    pub inserted: Vec<Inserted>,
    pub made_available: bool,
}

/// Inserts validated jobs. Must run inside a transaction: the idempotency locks are
/// transaction-scoped, and the batch must be all-or-nothing.
///
/// Keyed jobs first take an advisory lock per key (in ascending key order, so concurrent batches
/// cannot deadlock), then look for a job holding the key. A concurrent insert of the same key
/// waits on the lock until the first commits, and then finds its job: exactly one job per key.
/// Unique jobs do the same with their unique keys (locked in the same sorted acquisition), after
/// the idempotency key, which keeps precedence (see `unique`).
///
/// Depth limits count only the jobs the batch really adds: duplicates of stored jobs do not
/// take up room, so resubmitting an accepted job succeeds even when its queue is full.
pub(crate) async fn insert_many(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    jobs: Vec<NewJob>,
) -> StoreResult<Insertion> {
    let keys: BTreeSet<&str> = jobs
        .iter()
        .filter_map(|job| job.idempotency_key.as_deref())
        .collect();
    let unique_keys = unique::keys(&jobs);
    let mut lock_keys: Vec<i64> = keys
        .iter()
        .map(|key| idempotency_lock_key(ctx.schema, key))
        .chain(unique::lock_keys(ctx.schema, &unique_keys))
        .collect();
    if !lock_keys.is_empty() {
        lock_keys.sort_unstable();
        lock_keys.dedup();
        sqlx::query(ctx.sql.lock_keys.clone())
            .bind(&lock_keys)
            .execute(&mut *conn)
            .await
            .map_err(db("lock idempotency and unique keys"))?;
    }
    let mut stored: HashMap<String, Job> = HashMap::new();
    if !keys.is_empty() {
        let keys: Vec<&str> = keys.into_iter().collect();
        // The newest job that still holds each key: an older job made unfinished again (a
        // replayed dead job) holds it even when a newer one with the key has finished.
        let window_start =
            conveyor_core::clock::before(ctx.now, ctx.options.completed_idempotency_window);
        let found = sqlx::query(ctx.sql.idempotent_matches.clone())
            .bind(&keys)
            .bind(window_start)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("find idempotency keys"))?;
        for job in rows::jobs(&found)? {
            if holds_key(&job, ctx.now, ctx.options) {
                if let Some(key) = job.idempotency_key.clone() {
                    stored.insert(key, job);
                }
            }
        }
    }

    let stored_unique = unique::stored_matches(&mut *conn, ctx, &jobs, &unique_keys).await?;

    let mut slots = Vec::with_capacity(jobs.len());
    let mut batch_keys: HashMap<String, Uuid> = HashMap::new();
    // The jobs this batch adds, with their initial states, by unique key (latest last).
    let mut batch_unique: HashMap<String, Vec<(Uuid, JobState)>> = HashMap::new();
    let mut columns = Columns::default();
    for (index, (new, unique_key)) in jobs.into_iter().zip(unique_keys).enumerate() {
        if let Some(key) = &new.idempotency_key {
            if stored.contains_key(key) {
                slots.push(Slot::Stored(key.clone()));
                continue;
            }
            if let Some(id) = batch_keys.get(key) {
                slots.push(Slot::SameBatch(*id));
                continue;
            }
        }
        if let (Some(spec), Some(key)) = (&new.unique, &unique_key) {
            // The latest job holding the key wins: one this batch added (created now, so inside
            // any window) whose state the spec counts, else the stored one.
            let in_batch = batch_unique
                .get(key)
                .and_then(|added| added.iter().rev().find(|(_, state)| spec.blocks_in(*state)));
            if let Some((id, _)) = in_batch {
                slots.push(Slot::SameBatch(*id));
                continue;
            }
            if stored_unique.contains_key(&index) {
                slots.push(Slot::StoredUnique(index));
                continue;
            }
        }
        let id = Uuid::now_v7();
        if let Some(key) = &new.idempotency_key {
            batch_keys.insert(key.clone(), id);
        }
        // A past run_at is kept (it orders the job among others) but makes the job available.
        let run_at = truncate_to_millis(new.run_at.unwrap_or(ctx.now));
        let state = if run_at > ctx.now {
            JobState::Scheduled
        } else {
            JobState::Available
        };
        columns.ids.push(id);
        columns.kinds.push(new.kind);
        columns.queues.push(new.queue);
        columns.payloads.push(Json(new.payload));
        columns.priorities.push(new.priority);
        columns.run_ats.push(run_at);
        columns
            .max_attempts
            .push(to_i32(new.max_attempts, "max_attempts")?);
        columns.timeouts.push(
            new.timeout_ms
                .map(|ms| i64::try_from(ms).unwrap_or(i64::MAX)),
        );
        columns.keys.push(new.idempotency_key);
        columns.tags.push(Json(new.tags));
        columns.tenants.push(new.tenant);
        columns.states.push(state.as_str());
        if let Some(key) = &unique_key {
            batch_unique
                .entry(key.clone())
                .or_default()
                .push((id, state));
        }
        columns.unique_keys.push(unique_key);
        slots.push(Slot::New(id));
    }

    let mut created: HashMap<Uuid, Job> = HashMap::new();
    if !columns.ids.is_empty() {
        // Optimistically as if no queue of the batch had a depth limit: the statement checks,
        // and inserts nothing when one has. Only then are limits read, locked and counted.
        let queues: BTreeSet<&str> = columns.queues.iter().map(String::as_str).collect();
        let queues: Vec<&str> = queues.into_iter().collect();
        let mut found = bind_columns(ctx.sql.insert_unlimited.clone(), &columns, ctx.now)
            .bind(&queues)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("insert jobs"))?;
        if found.is_empty() {
            check_depth_limits(&mut *conn, ctx, &columns, &queues).await?;
            found = bind_columns(ctx.sql.insert.clone(), &columns, ctx.now)
                .fetch_all(&mut *conn)
                .await
                .map_err(db("insert jobs"))?;
        }
        for job in rows::jobs(&found)? {
            created.insert(job.id, job);
        }
    }
    let woken: BTreeSet<String> = created
        .values()
        .filter(|job| job.state == JobState::Available)
        .map(|job| job.queue.clone())
        .collect();
    let woken: Vec<String> = woken.into_iter().collect();
    notify(conn, ctx.sql, &woken).await?;

    let mut inserted = Vec::with_capacity(slots.len());
    for slot in slots {
        let (job, duplicate) = match slot {
            Slot::Stored(key) => (stored.get(&key), true),
            Slot::StoredUnique(index) => (stored_unique.get(&index), true),
            Slot::New(id) => (created.get(&id), false),
            Slot::SameBatch(id) => (created.get(&id), true),
        };
        let job = job.cloned().ok_or_else(|| {
            StoreError::Backend("postgres: an inserted job was not returned".to_string())
        })?;
        inserted.push(Inserted { job, duplicate });
    }
    Ok(Insertion {
        inserted,
        made_available: !woken.is_empty(),
    })
}

/// The insert statement `text` with the batch's columns bound as `$1` to `$14`.
fn bind_columns<'q>(
    text: sqlx::SqlStr,
    columns: &'q Columns,
    now: DateTime<Utc>,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    sqlx::query(text)
        .bind(&columns.ids)
        .bind(&columns.kinds)
        .bind(&columns.queues)
        .bind(&columns.payloads)
        .bind(&columns.priorities)
        .bind(&columns.run_ats)
        .bind(&columns.max_attempts)
        .bind(&columns.timeouts)
        .bind(&columns.keys)
        .bind(&columns.tags)
        .bind(&columns.tenants)
        .bind(&columns.states)
        .bind(now)
        .bind(&columns.unique_keys)
}

/// Refuses the batch's new jobs (`columns`, in `queues`) with `QueueFull` when they would take a
/// queue, or a tenant's share of one, past its maximum depth.
///
/// Each limited queue (and each tenant of the batch in a queue with a per-tenant limit) is
/// locked until the transaction ends, in ascending key order, so concurrent batches cannot both
/// see the last free places, and cannot deadlock (every transaction takes its idempotency and
/// unique key locks before these). The counts run after the locks, so they see every batch that
/// held them before.
async fn check_depth_limits(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    columns: &Columns,
    queues: &[&str],
) -> StoreResult<()> {
    let found = sqlx::query(ctx.sql.depth_limits.clone())
        .bind(queues)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read queue depth limits"))?;
    let mut limits: HashMap<String, (Option<u64>, Option<u64>)> = HashMap::new();
    for row in &found {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let queue: String = row.try_get("queue").map_err(read)?;
        let max_depth: Option<i64> = row.try_get("max_depth").map_err(read)?;
        let per_tenant: Option<i64> = row.try_get("max_depth_per_tenant").map_err(read)?;
        limits.insert(queue, (max_depth.map(depth_of), per_tenant.map(depth_of)));
    }
    let limit_of = |queue: &str| limits.get(queue).copied();
    let adding = conveyor_core::flow::depth_demand(
        columns
            .queues
            .iter()
            .zip(&columns.tenants)
            .map(|(queue, tenant)| (queue.as_str(), tenant.as_deref())),
        limit_of,
    );
    if adding.is_empty() {
        return Ok(());
    }
    let mut lock_keys: Vec<i64> = adding
        .keys()
        .map(|(queue, tenant)| depth_lock_key(ctx.schema, queue, *tenant))
        .collect();
    lock_keys.sort_unstable();
    lock_keys.dedup();
    sqlx::query(ctx.sql.lock_keys.clone())
        .bind(&lock_keys)
        .execute(&mut *conn)
        .await
        .map_err(db("lock queue depths"))?;
    let depth_queues: Vec<&str> = adding.keys().map(|(queue, _)| *queue).collect();
    let depth_tenants: Vec<Option<&str>> = adding.keys().map(|(_, tenant)| *tenant).collect();
    let depths: Vec<i64> = sqlx::query_scalar(ctx.sql.depths.clone())
        .bind(&depth_queues)
        .bind(&depth_tenants)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("count queue depths"))?;
    if depths.len() != adding.len() {
        return Err(StoreError::Backend(
            "postgres: queue depth count returned the wrong number of rows".to_string(),
        ));
    }
    let mut depths = depths.into_iter();
    conveyor_core::flow::depth_verdict(&adding, |_, _| Ok(depths.next().map_or(0, depth_of)))
}

/// A count or limit read from the database (never negative: the columns are checked).
fn depth_of(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

/// A limit as stored: `bigint`, so limits past `i64::MAX` (no queue holds that many) are kept
/// as `i64::MAX`.
fn stored_depth(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

// ---------------------------------------------------------------------------------------------
// Queue settings
// ---------------------------------------------------------------------------------------------

pub(crate) fn settings_of(row: &PgRow) -> StoreResult<QueueSettings> {
    let read = |e: sqlx::Error| corrupt(e.to_string());
    let count = |column: &str| -> StoreResult<Option<u64>> {
        Ok(row
            .try_get::<Option<i64>, _>(column)
            .map_err(read)?
            .map(depth_of))
    };
    let rate = |count_column: &str, period_column: &str| -> StoreResult<Option<RateLimit>> {
        Ok(match (count(count_column)?, count(period_column)?) {
            (Some(count), Some(period_ms)) => Some(RateLimit { count, period_ms }),
            _ => None,
        })
    };
    let weight: Option<i32> = row.try_get("weight").map_err(read)?;
    Ok(QueueSettings {
        paused: row.try_get("paused").map_err(read)?,
        max_depth: count("max_depth")?,
        max_depth_per_tenant: count("max_depth_per_tenant")?,
        concurrency_limit: count("concurrency_limit")?,
        per_key_concurrency_limit: count("per_key_concurrency_limit")?,
        rate_limit: rate("rate_count", "rate_period_ms")?,
        per_key_rate_limit: rate("per_key_rate_count", "per_key_rate_period_ms")?,
        weight: weight.map(|w| u32::try_from(w).unwrap_or(1)),
        completed_retention_secs: count("completed_retention_secs")?,
        dead_retention_secs: count("dead_retention_secs")?,
    })
}

pub(crate) async fn queue_settings_get(
    conn: &mut PgConnection,
    sql: &Sql,
    queue: &str,
) -> StoreResult<QueueSettings> {
    let row = sqlx::query(sql.settings_get.clone())
        .bind(queue)
        .fetch_optional(conn)
        .await
        .map_err(db("read queue settings"))?;
    row.as_ref()
        .map(settings_of)
        .transpose()
        .map(Option::unwrap_or_default)
}

/// Stores a queue's settings and returns them as stored. When the change resumes a paused
/// queue, its waiting fetchers in every process are notified; returns whether it did. Must run
/// inside a transaction, so that the wake-up is sent only if the change commits.
pub(crate) async fn queue_settings_put(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    queue: &str,
    settings: &QueueSettings,
) -> StoreResult<(QueueSettings, bool)> {
    let row = sqlx::query(ctx.sql.settings_put.clone())
        .bind(queue)
        .bind(settings.paused)
        .bind(settings.max_depth.map(stored_depth))
        .bind(settings.max_depth_per_tenant.map(stored_depth))
        .bind(ctx.now)
        .bind(settings.concurrency_limit.map(stored_depth))
        .bind(settings.per_key_concurrency_limit.map(stored_depth))
        .bind(settings.rate_limit.map(|r| stored_depth(r.count)))
        .bind(settings.rate_limit.map(|r| stored_depth(r.period_ms)))
        .bind(settings.per_key_rate_limit.map(|r| stored_depth(r.count)))
        .bind(
            settings
                .per_key_rate_limit
                .map(|r| stored_depth(r.period_ms)),
        )
        .bind(
            settings
                .weight
                .map(|w| i32::try_from(w).unwrap_or(i32::MAX)),
        )
        .bind(settings.completed_retention_secs.map(stored_depth))
        .bind(settings.dead_retention_secs.map(stored_depth))
        .fetch_one(&mut *conn)
        .await
        .map_err(db("store queue settings"))?;
    let stored = settings_of(&row)?;
    let was_paused: bool = row
        .try_get("was_paused")
        .map_err(|e| corrupt(e.to_string()))?;
    let resumed = was_paused && !stored.paused;
    if resumed {
        notify(conn, ctx.sql, &[queue.to_string()]).await?;
    }
    Ok((stored, resumed))
}

pub(crate) async fn queue_settings_list(
    conn: &mut PgConnection,
    sql: &Sql,
) -> StoreResult<Vec<NamedQueueSettings>> {
    let found = sqlx::query(sql.settings_list.clone())
        .fetch_all(conn)
        .await
        .map_err(db("list queue settings"))?;
    found
        .iter()
        .map(|row| {
            Ok(NamedQueueSettings {
                name: row.try_get("queue").map_err(|e| corrupt(e.to_string()))?,
                settings: settings_of(row)?,
            })
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Fetch and leases
// ---------------------------------------------------------------------------------------------

/// Makes up to `batch` due scheduled/retryable jobs available (earliest first), notifying their
/// queues in the same statement. Returns how many.
pub(crate) async fn promote_due(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    batch: i64,
) -> StoreResult<u64> {
    let found = sqlx::query(ctx.sql.promote.clone())
        .bind(ctx.now)
        .bind(batch)
        .bind(&ctx.sql.channel)
        .fetch_all(conn)
        .await
        .map_err(db("promote due jobs"))?;
    changed_count(&found)
}

/// Jobs claimed by one fetch, and how many due jobs it promoted first.
pub(crate) struct Fetched {
    pub jobs: Vec<Job>,
    pub promoted: u64,
}

/// Promotes one batch of due jobs, then claims up to `max` available jobs in claim order.
///
/// Queues without flow control are claimed from in one statement. That statement refuses
/// (claiming nothing) when a queue of the fetch has limits or tenanted jobs waiting; only then
/// does the fetch take the flow-controlled claim (`flow::claim_controlled`).
pub(crate) async fn fetch(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: &FetchParams,
) -> StoreResult<Fetched> {
    let expires_at = after(ctx.now, params.lease, "lease")?;
    let promoted = promote_due(&mut *conn, ctx, PROMOTE_BATCH).await?;
    // A fetch of every kind takes the statement without a kind filter (`sql::KindFilter`).
    let statement = match (params.queues.as_slice(), params.kinds.is_some()) {
        ([_], true) => &ctx.sql.claim_one_queue,
        ([_], false) => &ctx.sql.claim_one_queue_any_kind,
        (_, true) => &ctx.sql.claim,
        (_, false) => &ctx.sql.claim_any_kind,
    };
    let claim = match params.queues.as_slice() {
        [queue] => sqlx::query(statement.clone()).bind(queue),
        queues => sqlx::query(statement.clone()).bind(queues),
    };
    let claim = claim
        .bind(limit(params.max))
        .bind(&params.worker_id)
        .bind(expires_at)
        .bind(ctx.now);
    let claim = match params.kinds.as_deref() {
        Some(kinds) => claim.bind(kinds),
        None => claim,
    };
    let found = claim
        .fetch_all(&mut *conn)
        .await
        .map_err(db("claim jobs"))?;
    let mut jobs = rows::jobs(&found)?;
    if jobs.is_empty() {
        // Nothing available, or the gate refused: only the gate can tell.
        let gate = match params.queues.as_slice() {
            [queue] => sqlx::query_scalar(ctx.sql.claim_one_queue_gate.clone()).bind(queue),
            queues => sqlx::query_scalar(ctx.sql.claim_gate.clone()).bind(queues),
        };
        let limited: bool = gate
            .fetch_one(&mut *conn)
            .await
            .map_err(db("check the flow-control gate"))?;
        if limited {
            let mut tx = conn.begin().await.map_err(db("begin limited claim"))?;
            jobs = crate::flow::claim_controlled(&mut tx, ctx, params, expires_at).await?;
            tx.commit().await.map_err(db("commit limited claim"))?;
        }
    } else {
        // RETURNING has no order; callers get jobs in the order they were claimed by.
        sort_in_claim_order(&mut jobs);
    }
    Ok(Fetched { jobs, promoted })
}

fn sort_in_claim_order(jobs: &mut [Job]) {
    jobs.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then(a.run_at.cmp(&b.run_at))
            .then(a.id.cmp(&b.id))
    });
}

pub(crate) async fn heartbeat_many(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    beats: &[HeartbeatParams],
) -> StoreResult<Vec<Option<DateTime<Utc>>>> {
    let expiries = beats
        .iter()
        .map(|beat| after(ctx.now, beat.extend_by, "extend_by"))
        .collect::<StoreResult<Vec<_>>>()?;
    // One row per lease: with a lease listed twice, the later expiry is the one stored, as if
    // the beats had been applied one after the other.
    let mut last: HashMap<LeaseKey, DateTime<Utc>> = HashMap::new();
    for (beat, expires) in beats.iter().zip(&expiries) {
        last.insert(lease_key(&beat.lease), *expires);
    }
    let mut ids = Vec::with_capacity(last.len());
    let mut tokens = Vec::with_capacity(last.len());
    let mut expires = Vec::with_capacity(last.len());
    for ((id, token), at) in last {
        ids.push(id);
        tokens.push(token);
        expires.push(at);
    }
    let held = held_leases(
        sqlx::query(ctx.sql.heartbeat.clone())
            .bind(&ids)
            .bind(&tokens)
            .bind(&expires)
            .fetch_all(conn)
            .await
            .map_err(db("heartbeat"))?,
    )?;
    Ok(beats
        .iter()
        .zip(expiries)
        .map(|(beat, expires)| held.contains(&lease_key(&beat.lease)).then_some(expires))
        .collect())
}

/// The `(id, token)` pairs returned by a lease-conditional batch statement.
fn held_leases(found: Vec<PgRow>) -> StoreResult<HashSet<LeaseKey>> {
    found
        .iter()
        .map(|row| {
            let read = |e: sqlx::Error| corrupt(e.to_string());
            Ok((row.try_get(0).map_err(read)?, row.try_get(1).map_err(read)?))
        })
        .collect()
}

/// Completes running jobs whose lease still holds, in one statement. Outcomes are per input, in
/// order; a lease listed twice is applied once (the first), like two completions in sequence.
pub(crate) async fn complete_many(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    completions: Vec<CompleteParams>,
) -> StoreResult<Vec<LeaseOutcome>> {
    let mut first: HashSet<LeaseKey> = HashSet::new();
    let mut ids = Vec::with_capacity(completions.len());
    let mut tokens = Vec::with_capacity(completions.len());
    let mut results: Vec<Option<Json<&Value>>> = Vec::with_capacity(completions.len());
    let mut is_first = Vec::with_capacity(completions.len());
    for completion in &completions {
        let new = first.insert(lease_key(&completion.lease));
        is_first.push(new);
        if new {
            ids.push(completion.lease.id);
            tokens.push(completion.lease.lease_token);
            results.push(completion.result.as_ref().map(Json));
        }
    }
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let applied = held_leases(
        sqlx::query(ctx.sql.complete.clone())
            .bind(&ids)
            .bind(&tokens)
            .bind(&results)
            .bind(ctx.now)
            .fetch_all(conn)
            .await
            .map_err(db("complete jobs"))?,
    )?;
    Ok(completions
        .iter()
        .zip(is_first)
        .map(|(completion, first)| {
            if first && applied.contains(&lease_key(&completion.lease)) {
                LeaseOutcome::Applied
            } else {
                LeaseOutcome::LeaseLost
            }
        })
        .collect())
}

/// Records a failed attempt on the job held under `lease`: `retryable` at `retry_at` while
/// attempts remain, else `dead` and finished. `None` when the lease no longer holds.
#[allow(clippy::too_many_arguments)] // Every value is one column of the one statement.
pub(crate) async fn record_failure(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    lease: LeaseRef,
    attempt: u32,
    max_attempts: u32,
    error: &ErrorRecord,
    retry_at: Option<DateTime<Utc>>,
) -> StoreResult<Option<Job>> {
    let (state, run_at, finished_at) = match retry_at {
        Some(at) if attempt < max_attempts => {
            (JobState::Retryable, Some(truncate_to_millis(at)), None)
        }
        _ => (JobState::Dead, None, Some(ctx.now)),
    };
    let row = sqlx::query(ctx.sql.record_failure.clone())
        .bind(state.as_str())
        .bind(run_at)
        .bind(finished_at)
        .bind(Json(error))
        .bind(lease.id)
        .bind(lease.lease_token)
        .fetch_optional(conn)
        .await
        .map_err(db("record failure"))?;
    row.as_ref().map(rows::job).transpose()
}

pub(crate) async fn fail(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: FailParams,
) -> StoreResult<Job> {
    let lease = params.lease;
    let row = sqlx::query(ctx.sql.held.clone())
        .bind(lease.id)
        .bind(lease.lease_token)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("read held job"))?
        .ok_or(StoreError::LeaseLost(lease.id))?;
    let attempt: i32 = row.try_get(0).map_err(|e| corrupt(e.to_string()))?;
    let max_attempts: i32 = row.try_get(1).map_err(|e| corrupt(e.to_string()))?;
    let (attempt, max_attempts) = (attempt.max(0) as u32, max_attempts.max(0) as u32);
    let (error, retry_at) = params.failure(ctx.now, attempt);
    // The update repeats the lease check: a rescue or cancel between the two statements makes
    // it match nothing, which is the same lost lease.
    record_failure(conn, ctx, lease, attempt, max_attempts, &error, retry_at)
        .await?
        .ok_or(StoreError::LeaseLost(lease.id))
}

/// Puts a held job back to `scheduled` (or `available` when `until` is not in the future),
/// giving the attempt back. Returns the job and whether it became available. Must run inside a
/// transaction, so that the wake-up is sent only if the change commits.
pub(crate) async fn snooze(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: SnoozeParams,
) -> StoreResult<(Job, bool)> {
    let until = truncate_to_millis(params.until.max(ctx.now));
    let state = if until > ctx.now {
        JobState::Scheduled
    } else {
        JobState::Available
    };
    let row = sqlx::query(ctx.sql.snooze.clone())
        .bind(state.as_str())
        .bind(until)
        .bind(params.lease.id)
        .bind(params.lease.lease_token)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("snooze job"))?
        .ok_or(StoreError::LeaseLost(params.lease.id))?;
    let job = rows::job(&row)?;
    let woke = job.state == JobState::Available;
    if woke {
        notify(conn, ctx.sql, std::slice::from_ref(&job.queue)).await?;
    }
    Ok((job, woke))
}

pub(crate) async fn release_many(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    leases: &[LeaseRef],
) -> StoreResult<u64> {
    if leases.is_empty() {
        return Ok(0);
    }
    let ids: Vec<Uuid> = leases.iter().map(|lease| lease.id).collect();
    let tokens: Vec<Uuid> = leases.iter().map(|lease| lease.lease_token).collect();
    let found = sqlx::query(ctx.sql.release.clone())
        .bind(&ids)
        .bind(&tokens)
        .bind(&ctx.sql.channel)
        .fetch_all(conn)
        .await
        .map_err(db("release jobs"))?;
    changed_count(&found)
}

/// Moves running jobs whose lease ran out to `retryable` (or `dead`), recording a
/// `lease_expired` error. Must run inside a transaction: the picked rows stay locked until the
/// failures are recorded.
pub(crate) async fn rescue_expired(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: &RescueParams,
) -> StoreResult<RescueReport> {
    let expired = sqlx::query(ctx.sql.rescue_pick.clone())
        .bind(ctx.now)
        .bind(limit(params.limit))
        .fetch_all(&mut *conn)
        .await
        .map_err(db("find expired leases"))?;
    let mut report = RescueReport::default();
    for row in &expired {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let lease = LeaseRef {
            id: row.try_get("id").map_err(read)?,
            lease_token: row.try_get("lease_token").map_err(read)?,
        };
        let attempt: i32 = row.try_get("attempt").map_err(read)?;
        let max_attempts: i32 = row.try_get("max_attempts").map_err(read)?;
        let worker: Option<String> = row.try_get("lease_worker").map_err(read)?;
        let attempt = attempt.max(0) as u32;
        let error = ErrorRecord::lease_expired(attempt, ctx.now, worker.as_deref());
        let retry_at = Some(params.retry.next_run_at(ctx.now, attempt));
        let max_attempts = max_attempts.max(0) as u32;
        let Some(job) = record_failure(
            &mut *conn,
            ctx,
            lease,
            attempt,
            max_attempts,
            &error,
            retry_at,
        )
        .await?
        else {
            continue;
        };
        report.add(&job);
    }
    Ok(report)
}

// ---------------------------------------------------------------------------------------------
// Administration
// ---------------------------------------------------------------------------------------------

/// Cancels an unfinished job. Must run inside a transaction: the row stays locked between the
/// state check and the change, so the `Conflict` names the state the job really had.
pub(crate) async fn cancel(conn: &mut PgConnection, ctx: &Ctx<'_>, id: Uuid) -> StoreResult<Job> {
    let state: Option<String> = sqlx::query_scalar(ctx.sql.cancel_lock.clone())
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("lock job for cancel"))?;
    let state = JobState::from_str(&state.ok_or(StoreError::NotFound(id))?).map_err(corrupt)?;
    if state.is_finished() {
        return Err(StoreError::Conflict {
            id,
            state,
            action: "cancel",
        });
    }
    let row = sqlx::query(ctx.sql.cancel.clone())
        .bind(ctx.now)
        .bind(id)
        .fetch_one(conn)
        .await
        .map_err(db("cancel job"))?;
    rows::job(&row)
}

pub(crate) async fn dead_replay(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    selector: &ReplaySelector,
) -> StoreResult<u64> {
    let found = match &selector.ids {
        Some(ids) => {
            sqlx::query(ctx.sql.replay_ids.clone())
                .bind(ctx.now)
                .bind(ids)
                .bind(&ctx.sql.channel)
                .fetch_all(conn)
                .await
        }
        None => {
            sqlx::query(ctx.sql.replay_filter.clone())
                .bind(ctx.now)
                .bind(selector.queue.as_deref())
                .bind(selector.kind.as_deref())
                .bind(&ctx.sql.channel)
                .fetch_all(conn)
                .await
        }
    }
    .map_err(db("replay dead jobs"))?;
    changed_count(&found)
}

pub(crate) async fn dead_discard(
    conn: &mut PgConnection,
    sql: &Sql,
    id: Uuid,
) -> StoreResult<bool> {
    let done = sqlx::query(sql.discard.clone())
        .bind(id)
        .execute(conn)
        .await
        .map_err(db("discard dead job"))?;
    Ok(done.rows_affected() > 0)
}

/// Stores jobs exactly as given (times at the store's millisecond precision), skipping ids that
/// already exist. Returns how many were stored and whether any of them is available. Must run
/// inside a transaction, so that the wake-up is sent only if the import commits.
pub(crate) async fn import(
    conn: &mut PgConnection,
    sql: &Sql,
    jobs: &[Job],
) -> StoreResult<(u64, bool)> {
    if jobs.is_empty() {
        return Ok((0, false));
    }
    let ms = truncate_to_millis;
    fn lease(job: &Job) -> Option<&conveyor_core::Lease> {
        job.lease.as_ref()
    }
    let found = sqlx::query(sql.import.clone())
        .bind(jobs.iter().map(|j| j.id).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.kind.as_str()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.queue.as_str()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| Json(&j.payload)).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.priority).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| ms(j.run_at)).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| to_i32(j.attempt, "attempt"))
                .collect::<StoreResult<Vec<_>>>()?,
        )
        .bind(
            jobs.iter()
                .map(|j| to_i32(j.max_attempts, "max_attempts"))
                .collect::<StoreResult<Vec<_>>>()?,
        )
        .bind(
            jobs.iter()
                .map(|j| j.timeout_ms.map(|t| i64::try_from(t).unwrap_or(i64::MAX)))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.idempotency_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(jobs.iter().map(|j| Json(&j.tags)).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.tenant.as_deref()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| j.state.as_str()).collect::<Vec<_>>())
        .bind(jobs.iter().map(|j| Json(&j.errors)).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| lease(j).map(|l| l.worker_id.as_str()))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| lease(j).map(|l| l.token))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| lease(j).map(|l| ms(l.expires_at)))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.result.as_ref().map(Json))
                .collect::<Vec<_>>(),
        )
        .bind(jobs.iter().map(|j| ms(j.created_at)).collect::<Vec<_>>())
        .bind(
            jobs.iter()
                .map(|j| j.started_at.map(ms))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.finished_at.map(ms))
                .collect::<Vec<_>>(),
        )
        .bind(
            jobs.iter()
                .map(|j| j.unique_key.as_deref())
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *conn)
        .await
        .map_err(db("import jobs"))?;
    let mut woken = BTreeSet::new();
    for row in &found {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let state: String = row.try_get("state").map_err(read)?;
        if state == JobState::Available.as_str() {
            woken.insert(row.try_get::<String, _>("queue").map_err(read)?);
        }
    }
    let woken: Vec<String> = woken.into_iter().collect();
    notify(conn, sql, &woken).await?;
    Ok((found.len() as u64, !woken.is_empty()))
}

/// The one leadership role maintenance uses.
const MAINTENANCE_ROLE: &str = "maintenance";

/// Takes or renews the maintenance leadership for `holder` until now + `ttl`.
pub(crate) async fn leader_try_acquire(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    holder: &str,
    ttl: std::time::Duration,
) -> StoreResult<bool> {
    // Configuration, not input: an absurd TTL saturates (as on SQLite) rather than fails.
    let expires_at = truncate_to_millis(conveyor_core::clock::after(ctx.now, ttl));
    let row = sqlx::query(ctx.sql.leader_acquire.clone())
        .bind(MAINTENANCE_ROLE)
        .bind(holder)
        .bind(expires_at)
        .bind(ctx.now)
        .fetch_optional(conn)
        .await
        .map_err(db("acquire leadership"))?;
    Ok(row.is_some())
}

/// Gives up the maintenance leadership if `holder` has it.
pub(crate) async fn leader_release(
    conn: &mut PgConnection,
    sql: &Sql,
    holder: &str,
) -> StoreResult<()> {
    sqlx::query(sql.leader_release.clone())
        .bind(MAINTENANCE_ROLE)
        .bind(holder)
        .execute(conn)
        .await
        .map_err(db("release leadership"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn job_in(state: JobState, finished_at: Option<DateTime<Utc>>) -> Job {
        let mut job = Job {
            id: Uuid::now_v7(),
            kind: "k".into(),
            queue: "q".into(),
            payload: Value::Null,
            priority: 0,
            run_at: Utc::now(),
            attempt: 0,
            max_attempts: 1,
            timeout_ms: None,
            idempotency_key: Some("key".into()),
            tags: Vec::new(),
            tenant: None,
            state,
            errors: Vec::new(),
            lease: None,
            result: None,
            created_at: Utc::now(),
            started_at: None,
            finished_at: None,
            unique_key: None,
        };
        job.finished_at = finished_at;
        job
    }

    #[test]
    fn completed_jobs_hold_their_key_only_within_the_window() {
        let now = truncate_to_millis(Utc::now());
        let options = StoreOptions {
            completed_idempotency_window: Duration::from_secs(60),
        };
        let hour = chrono::Duration::hours(1);
        let minute = chrono::Duration::seconds(60);
        let recent = job_in(
            JobState::Completed,
            Some(now - chrono::Duration::seconds(59)),
        );
        let expired = job_in(JobState::Completed, Some(now - minute));
        assert!(holds_key(&recent, now, &options));
        assert!(
            !holds_key(&expired, now, &options),
            "the window is exclusive"
        );
        assert!(!holds_key(
            &job_in(JobState::Dead, Some(now)),
            now,
            &options
        ));
        assert!(!holds_key(
            &job_in(JobState::Cancelled, Some(now)),
            now,
            &options
        ));
        for state in [
            JobState::Scheduled,
            JobState::Available,
            JobState::Running,
            JobState::Retryable,
        ] {
            assert!(holds_key(&job_in(state, None), now, &options), "{state}");
        }
        let forever = StoreOptions {
            completed_idempotency_window: Duration::MAX,
        };
        let old = job_in(JobState::Completed, Some(now - hour));
        assert!(
            holds_key(&old, now, &forever),
            "an unbounded window never ends"
        );
    }
}
