//! The limited claim: concurrency and rate limits (per queue and per tenant), tenant
//! fairness and queue weights. Fetches take this path only when the fast claim statement's
//! gate sends them here (a queue of the fetch has limits, tenanted jobs waiting, or, with
//! several queues, a weight).
//!
//! It runs in one transaction holding each of the fetch's queues' claim locks (advisory, taken
//! in ascending key order so fetchers cannot deadlock), so the running jobs and recent starts
//! it counts include every claim of the fetchers that held the locks before, in any process.
//! The picking itself is `conveyor_core::limits`, shared with the SQLite store.

use chrono::{DateTime, Utc};
use conveyor_core::limits::named::{self as named, KeyUsage};
use conveyor_core::limits::{self, Admission, Group, LimitSpec, LimitUsage, Reads};
use conveyor_core::{FetchParams, Job, QueueSettings, RateLimit, StoreResult};
use sqlx::types::Json;
use sqlx::{AssertSqlSafe, Connection, PgConnection, Row};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use uuid::Uuid;

use crate::ctx::Ctx;
use crate::errors::{corrupt, db};
use crate::names::{concurrency_lock_key, named_limits_lock_key};
use crate::rows::{self, count_of, limit, settings_of};

/// A job a fetch may claim, with what the claim order and the named limits' admission need.
#[derive(Debug, Clone)]
struct Candidate {
    id: Uuid,
    priority: i32,
    run_at: DateTime<Utc>,
    /// The named-limit keys it holds (`None`: none).
    limit_keys: Option<Vec<String>>,
    /// Where its row was read (`ctid`), which the claim finds it by.
    tid: String,
    /// Its turn by key, when it was read in turn order (`by_turn`).
    turn: Option<u64>,
}

fn candidates_of(rows: &[sqlx::postgres::PgRow]) -> StoreResult<Vec<Candidate>> {
    rows.iter()
        .map(|row| {
            let read = |e: sqlx::Error| corrupt(e.to_string());
            let keys: Option<Json<Vec<String>>> = row.try_get("limit_keys").map_err(read)?;
            Ok(Candidate {
                id: row.try_get("id").map_err(read)?,
                priority: row.try_get("priority").map_err(read)?,
                run_at: row.try_get("run_at").map_err(read)?,
                limit_keys: keys.map(|Json(keys)| keys),
                tid: row.try_get("tid").map_err(read)?,
                // Only the read in turn order has the column.
                turn: row
                    .try_get::<Option<i64>, _>("fair_turn")
                    .ok()
                    .flatten()
                    .map(|turn| u64::try_from(turn).unwrap_or(0)),
            })
        })
        .collect()
}

/// A queue of the fetch as the prelude read it: its settings, and whether it holds available
/// jobs with a tenant or with a round-robin limit key.
struct QueueRead<'a> {
    name: &'a str,
    settings: QueueSettings,
    tenanted: bool,
    fair_keyed: bool,
    /// Whether it holds available keyed jobs without a turn yet (they became available other
    /// than by enqueue), given theirs before the claim reads by turn.
    unturned: bool,
}

/// Claims for a fetch that the gate sent here, in a transaction of its own.
///
/// Round trips are what this claim costs (a fetch of keyed jobs spends most of its time
/// waiting on them, and the locks are held across those after them): one statement reads
/// everything that needs no lock (`prelude`), one opens the transaction and takes the locks,
/// and the rest run under them.
pub(crate) async fn claim_limited(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: &FetchParams,
    expires_at: DateTime<Utc>,
) -> StoreResult<Vec<Job>> {
    let mut names: Vec<&str> = params.queues.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    let found = sqlx::query(ctx.sql.limits.prelude.clone())
        .bind(&names)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read queue settings"))?;
    // The named limits are the same on every row.
    let specs = match found.first() {
        Some(row) => {
            let documents: Option<Json<Vec<(String, serde_json::Value)>>> = row
                .try_get("limit_specs")
                .map_err(|e| corrupt(e.to_string()))?;
            limit_specs(documents.map(|Json(documents)| documents))
        }
        None => BTreeMap::new(),
    };
    let mut rows: HashMap<String, &sqlx::postgres::PgRow> = HashMap::with_capacity(found.len());
    for row in &found {
        let queue: String = row.try_get("queue").map_err(|e| corrupt(e.to_string()))?;
        rows.insert(queue, row);
    }
    // The fetch's queues in the order given, each once, without paused ones.
    let mut queues: Vec<QueueRead<'_>> = Vec::with_capacity(rows.len());
    for name in &params.queues {
        let Some(row) = rows.remove(name) else {
            continue;
        };
        let read = queue_read(name, row)?;
        if !read.settings.paused {
            queues.push(read);
        }
    }
    // The queues' claim locks in ascending order, then the named limits' (every claim takes
    // them in this order, so none waits for another that waits for it).
    let mut lock_keys: Vec<i64> = queues
        .iter()
        .map(|queue| concurrency_lock_key(ctx.schema, queue.name))
        .collect();
    lock_keys.sort_unstable();
    lock_keys.dedup();
    if !specs.is_empty() {
        lock_keys.push(named_limits_lock_key(ctx.schema));
    }
    let mut tx = conn
        .begin_with(begin_locked(&lock_keys))
        .await
        .map_err(db("begin limited claim"))?;
    let jobs = claim_locked(&mut tx, ctx, params, expires_at, &queues, &specs).await?;
    tx.commit().await.map_err(db("commit limited claim"))?;
    Ok(jobs)
}

/// A queue as the prelude read it (`settings_of` when it has a settings row).
fn queue_read<'a>(name: &'a str, row: &sqlx::postgres::PgRow) -> StoreResult<QueueRead<'a>> {
    let get = |e: sqlx::Error| corrupt(e.to_string());
    let stored: bool = row.try_get("stored").map_err(get)?;
    Ok(QueueRead {
        name,
        settings: if stored {
            settings_of(row)?
        } else {
            QueueSettings::default()
        },
        tenanted: row.try_get("tenanted").map_err(get)?,
        fair_keyed: row.try_get("fair_keyed").map_err(get)?,
        unturned: row.try_get("unturned").map_err(get)?,
    })
}

/// `BEGIN` and one advisory lock per key, in the order given, as one simple query: the locks
/// cost no round trip of their own. The keys are numbers, so the text needs no quoting.
fn begin_locked(keys: &[i64]) -> AssertSqlSafe<String> {
    let mut text = String::from("BEGIN");
    for key in keys {
        text.push_str(&format!("; SELECT pg_advisory_xact_lock({key})"));
    }
    AssertSqlSafe(text)
}

/// The named limits from their stored documents (name, document). A document that does not
/// read as a limit holds nothing (the API checks what it stores).
fn limit_specs(documents: Option<Vec<(String, serde_json::Value)>>) -> BTreeMap<String, LimitSpec> {
    let mut specs = BTreeMap::new();
    for (name, document) in documents.unwrap_or_default() {
        if let Ok(mut spec) = serde_json::from_value::<LimitSpec>(document) {
            spec.name = name.clone();
            specs.insert(name, spec);
        }
    }
    specs
}

/// The limited claim under its locks (`claim_limited`).
async fn claim_locked(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: &FetchParams,
    expires_at: DateTime<Utc>,
    queues: &[QueueRead<'_>],
    specs: &BTreeMap<String, LimitSpec>,
) -> StoreResult<Vec<Job>> {
    let usage = if specs.is_empty() {
        None
    } else {
        Some(named_usage(conn, ctx, specs).await?)
    };
    let mut admission = usage.as_ref().map(|usage| Admission::new(specs, usage));
    let claim = Claim {
        params,
        expires_at,
        ctx,
        queues,
    };
    if let Some(weights) = limits::fetch_weights(queues.iter().map(|q| q.settings.weight)) {
        let mut plan = limits::WeightedFetch::new(&weights, params.max, &mut rand::rng());
        let mut jobs = Vec::with_capacity(params.max);
        while let Some((index, ask)) = plan.next_ask() {
            let picked =
                queue_candidates(conn, ctx, &queues[index], ask, params, admission.as_ref())
                    .await?;
            let candidates = picked.len();
            let claimed = claim.ids(conn, picked, admission.as_mut()).await?;
            plan.record(candidates, claimed.len());
            jobs.extend(claimed);
        }
        return Ok(jobs);
    }
    let mut lists = Vec::with_capacity(queues.len());
    for queue in queues {
        let found =
            queue_candidates(conn, ctx, queue, params.max, params, admission.as_ref()).await?;
        lists.push(found);
    }
    let picked = limits::merge_in_claim_order(lists, params.max, |c| (c.priority, c.run_at, c.id));
    claim.ids(conn, picked, admission.as_mut()).await
}

/// What each key of the named limits uses now. Counted under the named-limits lock, taken
/// after the queues' locks, so the counts include every claim that held it before, in any
/// process. Read whenever limits exist, not only when the fetch's queues held jobs with keys a
/// moment ago: a job with keys committed since would otherwise be read as a candidate with
/// nothing to admit it.
async fn named_usage(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    specs: &BTreeMap<String, LimitSpec>,
) -> StoreResult<LimitUsage> {
    let statements = &ctx.sql.limits;
    let mut usage = LimitUsage {
        running: running_by_key(conn, ctx, None).await?,
        ..LimitUsage::default()
    };
    for (name, spec) in specs {
        let Some(rate) = spec.rate else { continue };
        let (scope_queue, _) = named::rate_scope_of(&named::limit_key(name, None));
        sqlx::query(statements.prune_starts.clone())
            .bind(&scope_queue)
            .bind(ctx.now - rate.period())
            .execute(&mut *conn)
            .await
            .map_err(db("prune job starts"))?;
        for (value, count) in
            starts_by_key(conn, ctx, &scope_queue, ctx.now - rate.period()).await?
        {
            usage
                .recent_starts
                .insert(named::limit_key(name, Some(&value)), count);
        }
    }
    Ok(usage)
}

/// Running jobs per limit key: every key, or only those of the limit `only`.
async fn running_by_key(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    only: Option<&str>,
) -> StoreResult<HashMap<String, u64>> {
    let rows = sqlx::query(ctx.sql.limits.running_by_key.clone())
        .bind(only.map(|name| named::limit_key(name, None)))
        .fetch_all(&mut *conn)
        .await
        .map_err(db("count running jobs per limit key"))?;
    counts_by(&rows, "key")
}

/// Starts per key value kept under `scope_queue` (a limit's rate rows) since `since`.
async fn starts_by_key(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    scope_queue: &str,
    since: DateTime<Utc>,
) -> StoreResult<Vec<(String, u64)>> {
    let rows = sqlx::query(ctx.sql.limits.starts_by_key.clone())
        .bind(scope_queue)
        .bind(since)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("count starts per limit key"))?;
    counts_by(&rows, "scope")
}

/// Rows of `(column, n)` as (value, count) pairs.
fn counts_by<C: FromIterator<(String, u64)>>(
    rows: &[sqlx::postgres::PgRow],
    column: &str,
) -> StoreResult<C> {
    rows.iter()
        .map(|row| {
            let read = |e: sqlx::Error| corrupt(e.to_string());
            let n: i64 = row.try_get("n").map_err(read)?;
            Ok((row.try_get(column).map_err(read)?, count_of(n)))
        })
        .collect()
}

/// What each key of the limit `name` uses now (`QueueStore::limit_usage`).
pub(crate) async fn key_usage(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    name: &str,
    rate_period_ms: Option<u64>,
) -> StoreResult<Vec<KeyUsage>> {
    let running = running_by_key(conn, ctx, Some(name)).await?;
    let starts = match rate_period_ms {
        Some(period_ms) => {
            let since = ctx.now
                - RateLimit {
                    count: 1,
                    period_ms,
                }
                .period();
            let (scope_queue, _) = named::rate_scope_of(&named::limit_key(name, None));
            starts_by_key(conn, ctx, &scope_queue, since).await?
        }
        None => Vec::new(),
    };
    Ok(named::key_usage(running, starts))
}

struct Claim<'a, 'c> {
    params: &'a FetchParams,
    expires_at: DateTime<Utc>,
    ctx: &'a Ctx<'c>,
    /// The fetch's queues with their settings.
    queues: &'a [QueueRead<'a>],
}

impl Claim<'_, '_> {
    /// Claims the candidates that are still available, returns them in candidate order, records
    /// their starts for rate limits and moves the queues' round-robin cursors.
    async fn ids(
        &self,
        conn: &mut PgConnection,
        picked: Vec<Candidate>,
        mut admission: Option<&mut Admission<'_>>,
    ) -> StoreResult<Vec<Job>> {
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        let picked: Vec<Candidate> = match admission.as_deref_mut() {
            Some(admission) => admitted(picked, admission),
            None => picked,
        };
        let ids: Vec<Uuid> = picked.iter().map(|c| c.id).collect();
        let tids: Vec<&str> = picked.iter().map(|c| c.tid.as_str()).collect();
        let found = sqlx::query(self.ctx.sql.limits.claim_ids.clone())
            .bind(&ids)
            .bind(&self.params.worker_id)
            .bind(self.expires_at)
            .bind(self.ctx.now)
            // Candidates were read of these kinds already; checked again as they are claimed.
            .bind(self.params.kinds.as_deref())
            .bind(&self.params.excluded_kinds)
            .bind(&tids)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("claim jobs"))?;
        let mut by_id: HashMap<Uuid, Job> = rows::jobs(&found)?
            .into_iter()
            .map(|job| (job.id, job))
            .collect();
        let jobs: Vec<Job> = ids.iter().filter_map(|id| by_id.remove(id)).collect();
        record_starts(conn, self.ctx, self.queues, &jobs).await?;
        if let Some(admission) = admission {
            record_limit_starts(conn, self.ctx, admission, &jobs).await?;
        }
        for job in &jobs {
            self.ctx
                .sql
                .limits
                .set_cursor(&job.queue, job.tenant.clone());
        }
        serve(conn, self.ctx, &picked, &jobs).await?;
        Ok(jobs)
    }
}

/// After a claim: the turn served in each queue and priority moves up to the highest turn
/// claimed there (`turns::served`, as an upsert that only moves it forward), and keys whose
/// next turn it reached are forgotten.
async fn serve(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    picked: &[Candidate],
    claimed: &[Job],
) -> StoreResult<()> {
    let turns: HashMap<Uuid, u64> = picked
        .iter()
        .filter_map(|c| c.turn.map(|turn| (c.id, turn)))
        .collect();
    if turns.is_empty() {
        return Ok(());
    }
    let mut highest: BTreeMap<(&str, i32), u64> = BTreeMap::new();
    for job in claimed {
        if let Some(turn) = turns.get(&job.id) {
            let entry = highest.entry((&job.queue, job.priority)).or_insert(0);
            *entry = limits::turns::served(*entry, [*turn]);
        }
    }
    if highest.is_empty() {
        return Ok(());
    }
    let queues: Vec<&str> = highest.keys().map(|(queue, _)| *queue).collect();
    let priorities: Vec<i32> = highest.keys().map(|(_, priority)| *priority).collect();
    let served: Vec<i64> = highest
        .values()
        .map(|turn| i64::try_from(*turn).unwrap_or(i64::MAX))
        .collect();
    sqlx::query(ctx.sql.limits.serve.clone())
        .bind(&queues)
        .bind(&priorities)
        .bind(&served)
        .execute(&mut *conn)
        .await
        .map_err(db("record the turns served"))?;
    Ok(())
}

/// The candidates (in claim order) that the named limits let start, their starts counted in
/// `admission`.
fn admitted(picked: Vec<Candidate>, admission: &mut Admission<'_>) -> Vec<Candidate> {
    picked
        .into_iter()
        .filter(|c| admission.admit(c.limit_keys.as_deref().unwrap_or_default()))
        .collect()
}

/// Records the claimed jobs' starts under the rates of the named limits they hold.
async fn record_limit_starts(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    admission: &Admission<'_>,
    jobs: &[Job],
) -> StoreResult<()> {
    let mut queues: Vec<String> = Vec::new();
    let mut scopes: Vec<&str> = Vec::new();
    for job in jobs {
        for key in admission.rated(&job.limit_keys) {
            let (queue, scope) = named::rate_scope_of(key);
            queues.push(queue);
            scopes.push(scope);
        }
    }
    insert_starts(conn, ctx, &queues, &scopes).await
}

/// Records the claimed jobs' starts for the rate limits of their queues.
async fn record_starts(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    read: &[QueueRead<'_>],
    jobs: &[Job],
) -> StoreResult<()> {
    let mut queues: Vec<&str> = Vec::new();
    let mut scopes: Vec<&str> = Vec::new();
    for job in jobs {
        let Some(queue_settings) = read
            .iter()
            .find(|q| q.name == job.queue)
            .map(|q| &q.settings)
        else {
            continue;
        };
        if queue_settings.rate_limit.is_some() {
            queues.push(&job.queue);
            scopes.push("");
        }
        if let (Some(_), Some(tenant)) = (queue_settings.per_key_rate_limit, &job.tenant) {
            queues.push(&job.queue);
            scopes.push(tenant);
        }
    }
    insert_starts(conn, ctx, &queues, &scopes).await
}

/// Records one start now for each (queue, scope) side by side: a queue's rate rows, or a named
/// limit's (`named::rate_scope_of`).
async fn insert_starts<Q: AsRef<str>>(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    queues: &[Q],
    scopes: &[&str],
) -> StoreResult<()> {
    if queues.is_empty() {
        return Ok(());
    }
    let queues: Vec<&str> = queues.iter().map(AsRef::as_ref).collect();
    sqlx::query(ctx.sql.limits.record_starts.clone())
        .bind(&queues)
        .bind(scopes)
        .bind(ctx.now)
        .execute(&mut *conn)
        .await
        .map_err(db("record job starts"))?;
    Ok(())
}

/// Up to `want` of `queue`'s available jobs that may start now, in the order to claim them.
async fn queue_candidates(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    read: &QueueRead<'_>,
    want: usize,
    params: &FetchParams,
    admission: Option<&Admission<'_>>,
) -> StoreResult<Vec<Candidate>> {
    let statements = &ctx.sql.limits;
    let (queue, settings) = (read.name, &read.settings);
    // Keys with no room: their jobs are not worth reading.
    let full = admission.map(Admission::full).unwrap_or_default();
    let running = if settings.concurrency_limit.is_some() {
        let n: i64 = sqlx::query_scalar(statements.running.clone())
            .bind(queue)
            .fetch_one(&mut *conn)
            .await
            .map_err(db("count running jobs"))?;
        count_of(n)
    } else {
        0
    };
    if let Some(period_ms) = settings.rate_record_ttl_ms() {
        let horizon = ctx.now
            - RateLimit {
                count: 1,
                period_ms,
            }
            .period();
        sqlx::query(statements.prune_starts.clone())
            .bind(queue)
            .bind(horizon)
            .execute(&mut *conn)
            .await
            .map_err(db("prune job starts"))?;
    }
    let recent = match settings.rate_limit {
        Some(rate) => recent_starts(conn, ctx, queue, "", rate).await?,
        None => 0,
    };
    let quota = limits::queue_quota(settings, want, running, recent);
    if quota == 0 {
        return Ok(Vec::new());
    }
    // Jobs holding a keyed limit's key take turns by it, unless the queue holds tenants to
    // per-tenant limits (those need the tenant round-robin's budgets).
    let per_tenant =
        settings.per_key_concurrency_limit.is_some() || settings.per_key_rate_limit.is_some();
    // The probes were read before the locks: a queue with per-tenant limits takes the tenant
    // pass even when none was seen, so a tenanted job committed since is held to its budget.
    let tenanted = read.tenanted || per_tenant;
    let fair = match admission {
        Some(admission) if !per_tenant && read.fair_keyed => Some(admission),
        _ => None,
    };
    if let Some(admission) = fair {
        return by_turn(conn, ctx, read, quota, params, admission).await;
    }
    if !tenanted {
        // With keys out of room, their jobs are passed over as candidates are read, so a flood
        // of one full key cannot hide the jobs behind it.
        let read = if full.is_empty() {
            &statements.first
        } else {
            &statements.first_with_room
        };
        let mut query = sqlx::query(read.clone())
            .bind(queue)
            .bind(limit(quota))
            .bind(params.kinds.as_deref())
            .bind(&params.excluded_kinds);
        if !full.is_empty() {
            query = query.bind(&full);
        }
        let found = query
            .fetch_all(&mut *conn)
            .await
            .map_err(db("read available jobs"))?;
        return candidates_of(&found);
    }
    let (groups, mut candidates, share) =
        tenant_groups(conn, ctx, queue, settings, quota, params, Reads::Share).await?;
    let mut picked = limits::round_robin(&groups, quota);
    if limits::read_more(&groups, &picked, quota, share) {
        let (groups, more, _) =
            tenant_groups(conn, ctx, queue, settings, quota, params, Reads::Full).await?;
        candidates = more;
        picked = limits::round_robin(&groups, quota);
    }
    Ok(picked
        .jobs
        .iter()
        .filter_map(|id| candidates.remove(id))
        .collect())
}

async fn recent_starts(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    queue: &str,
    scope: &str,
    rate: RateLimit,
) -> StoreResult<u64> {
    let n: i64 = sqlx::query_scalar(ctx.sql.limits.recent_starts.clone())
        .bind(queue)
        .bind(scope)
        .bind(ctx.now - rate.period())
        .fetch_one(&mut *conn)
        .await
        .map_err(db("count recent job starts"))?;
    Ok(count_of(n))
}

/// A queue's groups after `after` (from the first when `None`), up to `max`, each with its
/// first job in claim order.
async fn tenants(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    queue: &str,
    after: Option<&str>,
    max: usize,
    params: &FetchParams,
) -> StoreResult<Vec<(String, Candidate)>> {
    let found = sqlx::query(ctx.sql.limits.tenants.clone())
        .bind(queue)
        // Tenants are never empty (names are validated), so '' stands for "from the first".
        .bind(after.unwrap_or(""))
        .bind(limit(max))
        .bind(params.kinds.as_deref())
        .bind(&params.excluded_kinds)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read tenants"))?;
    let firsts = candidates_of(&found)?;
    found
        .iter()
        .zip(firsts)
        .map(|(row, first)| {
            let key: String = row.try_get("k").map_err(|e| corrupt(e.to_string()))?;
            Ok((key, first))
        })
        .collect()
}

/// Each tenant's per-key budget (in the order given), from its running jobs and recent starts
/// read in one statement; unlimited when the queue has no per-key limits.
async fn key_budgets(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    queue: &str,
    settings: &QueueSettings,
    tenants: &[&str],
) -> StoreResult<Vec<usize>> {
    if settings.per_key_concurrency_limit.is_none() && settings.per_key_rate_limit.is_none() {
        return Ok(vec![usize::MAX; tenants.len()]);
    }
    let since = settings
        .per_key_rate_limit
        .map_or(ctx.now, |rate| ctx.now - rate.period());
    let found = sqlx::query(ctx.sql.limits.key_counts.clone())
        .bind(queue)
        .bind(tenants)
        .bind(since)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("count tenants' running jobs and starts"))?;
    if found.len() != tenants.len() {
        return Err(corrupt(
            "tenant counts returned the wrong number of rows".to_string(),
        ));
    }
    found
        .iter()
        .map(|row| {
            let read = |e: sqlx::Error| corrupt(e.to_string());
            let running: i64 = row.try_get("running").map_err(read)?;
            let recent: i64 = row.try_get("recent").map_err(read)?;
            Ok(limits::key_budget(
                settings,
                count_of(running),
                count_of(recent),
            ))
        })
        .collect()
}

/// The queue's groups in round-robin order (starting after the group served last), each with
/// its first jobs and per-key budget, and every candidate read by id.
async fn tenant_groups(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    queue: &str,
    settings: &QueueSettings,
    quota: usize,
    params: &FetchParams,
    reads: Reads,
) -> StoreResult<(Vec<Group>, HashMap<Uuid, Candidate>, usize)> {
    let statements = &ctx.sql.limits;
    let cursor = statements.cursor(queue);
    let after = match &cursor {
        Some(Some(key)) => tenants(conn, ctx, queue, Some(key), quota, params).await?,
        _ => Vec::new(),
    };
    let from_start = if after.len() < quota {
        tenants(conn, ctx, queue, None, quota, params).await?
    } else {
        Vec::new()
    };
    // Each group's first job, as its key was read.
    let mut firsts: HashMap<String, Candidate> = HashMap::new();
    let mut keys = |groups: Vec<(String, Candidate)>| -> Vec<String> {
        groups
            .into_iter()
            .map(|(key, first)| {
                firsts.insert(key.clone(), first);
                key
            })
            .collect()
    };
    let (after, from_start) = (keys(after), keys(from_start));
    let pass = |ungrouped: bool| {
        limits::tenant_pass(
            after.clone(),
            from_start.clone(),
            ungrouped,
            cursor.as_ref().map(|served| served.as_deref()),
            quota,
            reads,
        )
    };
    // Jobs without a key are read (a window of the queue) only when this pass reaches their
    // turn (`limits::ungrouped_turn`).
    let (mut order, mut reads) = pass(true);
    let mut untenanted = Vec::new();
    if limits::ungrouped_turn(&order) {
        let found = sqlx::query(statements.untenanted.clone())
            .bind(queue)
            .bind(limit(limits::UNTENANTED_WINDOW))
            .bind(limit(quota))
            .bind(params.kinds.as_deref())
            .bind(&params.excluded_kinds)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("read jobs without a tenant"))?;
        untenanted = candidates_of(&found)?;
        if untenanted.is_empty() {
            (order, reads) = pass(false);
        }
    }
    let tenants: Vec<&str> = order.iter().flatten().map(String::as_str).collect();
    let budgets = key_budgets(conn, ctx, queue, settings, &tenants).await?;
    // How many jobs to read from each group: its first job came with its key, so only groups
    // to read more of are read again, all in one statement (a LATERAL read per group). Tenants
    // all weigh one.
    let wanted: Vec<usize> = budgets
        .iter()
        .map(|budget| limits::weighted_reads(reads, 1, quota).min(*budget))
        .collect();
    let mut by_tenant: HashMap<String, Vec<Candidate>> = HashMap::new();
    let (more, more_wanted): (Vec<&str>, Vec<i64>) = tenants
        .iter()
        .zip(&wanted)
        .filter(|(_, wanted)| **wanted > 1)
        .map(|(tenant, wanted)| (*tenant, limit(*wanted)))
        .unzip();
    for (tenant, wanted) in tenants.iter().zip(&wanted) {
        if *wanted == 1 {
            if let Some(first) = firsts.remove(*tenant) {
                by_tenant.insert(tenant.to_string(), vec![first]);
            }
        }
    }
    if !more.is_empty() {
        let found = sqlx::query(statements.tenant_jobs.clone())
            .bind(queue)
            .bind(&more)
            .bind(&more_wanted)
            .bind(params.kinds.as_deref())
            .bind(&params.excluded_kinds)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("read tenants' jobs"))?;
        for row in &found {
            let tenant: String = row.try_get("tenant").map_err(|e| corrupt(e.to_string()))?;
            let candidate = candidates_of(std::slice::from_ref(row))?;
            by_tenant.entry(tenant).or_default().extend(candidate);
        }
    }
    let mut all: HashMap<Uuid, Candidate> = HashMap::new();
    let mut groups = Vec::with_capacity(order.len());
    let mut budgets = budgets.into_iter();
    for tenant in order {
        let Some(tenant) = tenant else {
            let jobs: Vec<Uuid> = untenanted.iter().take(reads).map(|c| c.id).collect();
            all.extend(untenanted.drain(..).map(|c| (c.id, c)));
            groups.push(Group {
                key: None,
                jobs,
                budget: usize::MAX,
                weight: 1,
            });
            continue;
        };
        let budget = budgets.next().unwrap_or(0);
        let found = by_tenant.remove(&tenant).unwrap_or_default();
        groups.push(Group {
            jobs: found.iter().map(|c| c.id).collect(),
            key: Some(tenant),
            budget,
            weight: 1,
        });
        all.extend(found.into_iter().map(|c| (c.id, c)));
    }
    Ok((groups, all, reads))
}

/// Up to `quota` of the queue's available keyed jobs in turn order (`by_turn`, one range of
/// `jobs_fair_turn`), passing over jobs whose keys have no room under `admission`
/// (`turns::Picking`; read again without the keys used up when many are passed over), with
/// the queue's jobs without a key taking their turn among them (`turns::with_unkeyed`). Jobs
/// made available since their enqueue are given their turns first (`give_waiting`), under the
/// queue's claim lock.
async fn by_turn(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    read: &QueueRead<'_>,
    quota: usize,
    params: &FetchParams,
    admission: &Admission<'_>,
) -> StoreResult<Vec<Candidate>> {
    let statements = &ctx.sql.limits;
    let queue = read.name;
    if read.unturned {
        sqlx::query(statements.give_waiting.clone())
            .bind(queue)
            .execute(&mut *conn)
            .await
            .map_err(db("give turns to jobs made available"))?;
    }
    // Keys without room are found as the range is read (and counted as held back), then left
    // out of a read again.
    let mut full: BTreeSet<String> = BTreeSet::new();
    let mut picking = limits::turns::Picking::new(admission, quota);
    let mut keyed: Vec<(Candidate, (i32, u64))> = Vec::new();
    let mut seen: HashSet<Uuid> = HashSet::new();
    // A few more than the quota: jobs of keys out of room are passed over. A read again reads
    // past the jobs picked before it too.
    let more = quota.saturating_add(limits::turns::SKIPS_BEFORE_REREAD);
    let mut window = more;
    'reads: while !picking.done() {
        let full_keys: Vec<&str> = full.iter().map(String::as_str).collect();
        let found = sqlx::query(statements.by_turn.clone())
            .bind(queue)
            .bind(limit(window))
            .bind(params.kinds.as_deref())
            .bind(&params.excluded_kinds)
            .bind(&full_keys)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("read jobs by turn"))?;
        let ended = found.len() < window;
        for candidate in candidates_of(&found)? {
            if picking.done() {
                break 'reads;
            }
            if !seen.insert(candidate.id) {
                continue; // Picked before a re-read.
            }
            if !picking.offer(candidate.limit_keys.as_deref().unwrap_or_default()) {
                if picking.reread(&mut full) {
                    window = keyed.len().saturating_add(more);
                    continue 'reads;
                }
                continue;
            }
            let place = (candidate.priority, candidate.turn.unwrap_or(0));
            keyed.push((candidate, place));
        }
        if ended {
            break;
        }
        // Every job of the window was looked at: read further.
        window = window.saturating_add(more);
    }
    let places: Vec<(i32, u64)> = keyed.iter().map(|(_, place)| *place).collect();
    let share = limits::turns::unkeyed_share(&places, quota);
    let unkeyed = if share == 0 {
        Vec::new()
    } else {
        let found = sqlx::query(statements.unkeyed.clone())
            .bind(queue)
            .bind(limit(limits::UNTENANTED_WINDOW))
            .bind(limit(share))
            .bind(params.kinds.as_deref())
            .bind(&params.excluded_kinds)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("read jobs without a limit key"))?;
        candidates_of(&found)?
    };
    Ok(limits::turns::with_unkeyed(keyed, unkeyed, quota))
}

/// Turns reserved for a batch about to be inserted ([`reserve_turns`]): per queue, priority and
/// key, the next place, the key's weight and how many places are left.
#[derive(Debug, Default)]
pub(crate) struct Reserved(HashMap<(String, i32, String), (u64, u64, u64)>);

impl Reserved {
    /// The turn of the next available job of `key` in `queue` at `priority`, while the
    /// reservation lasts.
    pub(crate) fn take(&mut self, queue: &str, priority: i32, key: &str) -> Option<i64> {
        let (place, weight, left) =
            self.0
                .get_mut(&(queue.to_string(), priority, key.to_string()))?;
        if *left == 0 {
            return None;
        }
        let turn = *place / (*weight).max(1);
        *place += 1;
        *left -= 1;
        i64::try_from(turn).ok()
    }
}

/// Reserves turns by key for the jobs of a batch that will be available when inserted (no
/// later `run_at`, no sequence), in a statement of its own on `conn`, outside the insert's
/// transaction: a key's row is locked only while the statement runs, so enqueues of the same
/// keys do not wait for each other's commits. A batch that then fails, or whose job turns out
/// a duplicate or folds into another, leaves its turns unused: its key's later jobs come a
/// turn later, nothing else.
pub(crate) async fn reserve_turns(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    jobs: &[conveyor_core::NewJob],
) -> StoreResult<Reserved> {
    let mut counts: BTreeMap<(&str, i32, &str), i64> = BTreeMap::new();
    for job in jobs {
        let Some(key) = named::fair_key(&job.limit_keys) else {
            continue;
        };
        let available = job.run_at.is_none_or(|at| at <= ctx.now) && job.sequence_key.is_none();
        if available {
            *counts.entry((&job.queue, job.priority, key)).or_insert(0) += 1;
        }
    }
    if counts.is_empty() {
        return Ok(Reserved::default());
    }
    let queues: Vec<&str> = counts.keys().map(|(queue, _, _)| *queue).collect();
    let priorities: Vec<i32> = counts.keys().map(|(_, priority, _)| *priority).collect();
    let keys: Vec<&str> = counts.keys().map(|(_, _, key)| *key).collect();
    let ns: Vec<i64> = counts.values().copied().collect();
    let rows = sqlx::query(ctx.sql.limits.reserve_turns.clone())
        .bind(&queues)
        .bind(&priorities)
        .bind(&keys)
        .bind(&ns)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("reserve turns"))?;
    let mut reserved = Reserved::default();
    for row in &rows {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let queue: String = row.try_get("queue").map_err(read)?;
        let priority: i32 = row.try_get("priority").map_err(read)?;
        let key: String = row.try_get("key").map_err(read)?;
        let weight: i64 = row.try_get("weight").map_err(read)?;
        let start: i64 = row.try_get("start").map_err(read)?;
        let n = counts
            .get(&(queue.as_str(), priority, key.as_str()))
            .copied()
            .unwrap_or(0);
        reserved.0.insert(
            (queue, priority, key),
            (count_of(start), count_of(weight), count_of(n)),
        );
    }
    Ok(reserved)
}
