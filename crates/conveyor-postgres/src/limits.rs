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
use conveyor_core::limits::{self, Group};
use conveyor_core::{FetchParams, Job, QueueSettings, RateLimit, StoreResult};
use sqlx::{PgConnection, Row};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use uuid::Uuid;

use crate::errors::{corrupt, db};
use crate::names::{concurrency_lock_key, quoted};
use crate::ops::{lock_in_order, settings_of, Ctx};
use crate::rows;
use crate::sql::{stmt, COLUMNS, SETTINGS_COLUMNS};
use sqlx::SqlStr;

/// The statements of the limited claim for one schema, and the round-robin cursors.
pub(crate) struct LimitSql {
    settings_for: SqlStr,
    running: SqlStr,
    prune_starts: SqlStr,
    recent_starts: SqlStr,
    record_starts: SqlStr,
    has_tenanted: SqlStr,
    first: SqlStr,
    tenants: SqlStr,
    untenanted: SqlStr,
    tenant_jobs: SqlStr,
    key_counts: SqlStr,
    claim_ids: SqlStr,
    /// Per queue, the tenant group this process served last (`None`: jobs without a tenant),
    /// so its next fetch continues the rotation. Kept per process: with several nodes each
    /// rotates on its own, which still serves every tenant in turn.
    cursors: Mutex<HashMap<String, Option<String>>>,
}

impl LimitSql {
    pub(crate) fn new(schema: &str) -> Self {
        let jobs = format!("{}.jobs", quoted(schema));
        let settings = format!("{}.queue_settings", quoted(schema));
        let starts = format!("{}.rate_starts", quoted(schema));
        let order = "ORDER BY priority DESC, run_at, id";
        let (kinds3, kinds4) = (kinds_at(3), kinds_at(4));
        Self {
            settings_for: stmt(format!(
                "SELECT queue, {SETTINGS_COLUMNS} FROM {settings} WHERE queue = ANY($1)"
            )),
            running: stmt(format!(
                "SELECT count(*) FROM {jobs} WHERE state = 'running' AND queue = $1"
            )),
            prune_starts: stmt(format!(
                "DELETE FROM {starts} WHERE queue = $1 AND started_at <= $2"
            )),
            recent_starts: stmt(format!(
                "SELECT count(*) FROM {starts} WHERE queue = $1 AND scope = $2 \
                 AND started_at > $3"
            )),
            record_starts: stmt(format!(
                "INSERT INTO {starts} (queue, scope, started_at) \
                 SELECT s.queue, s.scope, $3 FROM unnest($1::text[], $2::text[]) AS s(queue, scope)"
            )),
            has_tenanted: stmt(format!(
                "SELECT EXISTS (SELECT 1 FROM {jobs} WHERE state = 'available' AND queue = $1 \
                 AND tenant IS NOT NULL)"
            )),
            // Every candidate read below takes only the fetch's kinds (`$k::text[]`, NULL for
            // any) and none of its excluded kinds: filtered after the claim instead, jobs of
            // other kinds ahead in the queue would take the whole quota.
            first: stmt(format!(
                "SELECT id, priority, run_at FROM {jobs} WHERE state = 'available' \
                 AND queue = $1 AND {kinds3} {order} LIMIT $2"
            )),
            // Distinct tenants after `$2` ('' for from the first), one index seek each.
            // Distinct tenants after `$2` ('' for from the first), one seek in `jobs_fair` each
            // (the ORDER BY is that index's order, so no other index can serve it unsorted).
            tenants: stmt(format!(
                "WITH RECURSIVE t(tenant) AS ( \
                     SELECT (SELECT tenant FROM {jobs} WHERE state = 'available' \
                             AND queue = $1 AND tenant IS NOT NULL AND tenant > $2 \
                             AND {kinds4} ORDER BY tenant, priority DESC, run_at, id LIMIT 1) \
                     UNION ALL \
                     SELECT (SELECT j.tenant FROM {jobs} j WHERE j.state = 'available' \
                             AND j.queue = $1 AND j.tenant IS NOT NULL AND j.tenant > t.tenant \
                             AND {kinds4} ORDER BY j.tenant, j.priority DESC, j.run_at, j.id LIMIT 1) \
                     FROM t WHERE t.tenant IS NOT NULL) \
                 SELECT tenant FROM t WHERE tenant IS NOT NULL LIMIT $3"
            )),
            untenanted: stmt(format!(
                "SELECT id, priority, run_at FROM ( \
                     SELECT id, tenant, priority, run_at FROM {jobs} \
                     WHERE state = 'available' AND queue = $1 AND {kinds4} {order} LIMIT $2) w \
                 WHERE tenant IS NULL {order} LIMIT $3"
            )),
            // Each tenant's first `n` available jobs (`$2`, `$3` side by side).
            tenant_jobs: stmt(format!(
                "SELECT t.tenant, j.id, j.priority, j.run_at \
                 FROM unnest($2::text[], $3::int8[]) AS t(tenant, n) \
                 CROSS JOIN LATERAL ( \
                     SELECT id, priority, run_at FROM {jobs} WHERE state = 'available' \
                     AND queue = $1 AND tenant = t.tenant AND tenant IS NOT NULL \
                     AND {kinds4} {order} LIMIT t.n) j"
            )),
            // Each tenant's running jobs and starts since `$3`, in the order of `$2`.
            key_counts: stmt(format!(
                "SELECT \
                     (SELECT count(*) FROM {jobs} r WHERE r.state = 'running' \
                      AND r.queue = $1 AND r.tenant = t.tenant AND r.tenant IS NOT NULL) \
                         AS running, \
                     (SELECT count(*) FROM {starts} s WHERE s.queue = $1 \
                      AND s.scope = t.tenant AND s.started_at > $3) AS recent \
                 FROM unnest($2::text[]) WITH ORDINALITY AS t(tenant, pos) ORDER BY t.pos"
            )),
            claim_ids: stmt(format!(
                "UPDATE {jobs} SET state = 'running', attempt = attempt + 1, \
                     lease_worker = $2, lease_token = gen_random_uuid(), \
                     lease_expires_at = $3, started_at = $4 \
                 WHERE id = ANY($1) AND state = 'available' \
                 AND ($5::text[] IS NULL OR kind = ANY($5)) AND kind <> ALL($6) \
                 AND (expires_at IS NULL OR expires_at > $4) \
                 RETURNING {COLUMNS}"
            )),
            cursors: Mutex::new(HashMap::new()),
        }
    }

    fn cursor(&self, queue: &str) -> Option<Option<String>> {
        self.cursors
            .lock()
            .map(|cursors| cursors.get(queue).cloned())
            .unwrap_or(None)
    }

    fn set_cursor(&self, queue: &str, tenant: Option<String>) {
        if let Ok(mut cursors) = self.cursors.lock() {
            if tenant.is_some() || cursors.contains_key(queue) {
                cursors.insert(queue.to_string(), tenant);
            }
        }
    }
}

/// A job a fetch may claim, with what the claim order needs.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    id: Uuid,
    priority: i32,
    run_at: DateTime<Utc>,
}

fn candidates_of(rows: &[sqlx::postgres::PgRow]) -> StoreResult<Vec<Candidate>> {
    rows.iter()
        .map(|row| {
            let read = |e: sqlx::Error| corrupt(e.to_string());
            Ok(Candidate {
                id: row.try_get("id").map_err(read)?,
                priority: row.try_get("priority").map_err(read)?,
                run_at: row.try_get("run_at").map_err(read)?,
            })
        })
        .collect()
}

fn count_of(n: i64) -> u64 {
    u64::try_from(n).unwrap_or(0)
}

fn limit(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Claims for a fetch that the gate sent here. Must run in a transaction.
pub(crate) async fn claim_limited(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: &FetchParams,
    expires_at: DateTime<Utc>,
) -> StoreResult<Vec<Job>> {
    let statements = &ctx.sql.limits;
    let mut names: Vec<&str> = params.queues.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    let found = sqlx::query(statements.settings_for.clone())
        .bind(&names)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read queue settings"))?;
    let mut stored: BTreeMap<String, QueueSettings> = BTreeMap::new();
    for row in &found {
        let queue: String = row.try_get("queue").map_err(|e| corrupt(e.to_string()))?;
        stored.insert(queue, settings_of(row)?);
    }
    // The fetch's queues in the order given, without paused ones.
    let mut queues: Vec<(&str, QueueSettings)> = Vec::with_capacity(names.len());
    for queue in &params.queues {
        let settings = stored.get(queue).cloned().unwrap_or_default();
        if !settings.paused && !queues.iter().any(|(q, _)| q == queue) {
            queues.push((queue, settings));
        }
    }
    let lock_keys: Vec<i64> = queues
        .iter()
        .map(|(queue, _)| concurrency_lock_key(ctx.schema, queue))
        .collect();
    lock_in_order(&mut *conn, ctx, lock_keys, "lock queue claims").await?;

    let claim = Claim {
        params,
        expires_at,
        ctx,
        queues: &queues,
    };
    if let Some(weights) = limits::fetch_weights(queues.iter().map(|(_, s)| s.weight)) {
        let mut plan = limits::WeightedFetch::new(&weights, params.max, &mut rand::rng());
        let mut jobs = Vec::with_capacity(params.max);
        while let Some((index, ask)) = plan.next_ask() {
            let (queue, settings) = &queues[index];
            let picked = queue_candidates(conn, ctx, queue, settings, ask, params).await?;
            let candidates = picked.len();
            let claimed = claim.ids(conn, picked).await?;
            plan.record(candidates, claimed.len());
            jobs.extend(claimed);
        }
        return Ok(jobs);
    }
    let mut lists = Vec::with_capacity(queues.len());
    for (queue, settings) in &queues {
        lists.push(queue_candidates(conn, ctx, queue, settings, params.max, params).await?);
    }
    let picked = limits::merge_in_claim_order(lists, params.max, |c| (c.priority, c.run_at, c.id));
    claim.ids(conn, picked).await
}

struct Claim<'a, 'c> {
    params: &'a FetchParams,
    expires_at: DateTime<Utc>,
    ctx: &'a Ctx<'c>,
    /// The fetch's queues with their settings.
    queues: &'a [(&'a str, QueueSettings)],
}

impl Claim<'_, '_> {
    /// Claims the candidates that are still available, returns them in candidate order, records
    /// their starts for rate limits and moves the queues' round-robin cursors.
    async fn ids(&self, conn: &mut PgConnection, picked: Vec<Candidate>) -> StoreResult<Vec<Job>> {
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        let ids: Vec<Uuid> = picked.iter().map(|c| c.id).collect();
        let found = sqlx::query(self.ctx.sql.limits.claim_ids.clone())
            .bind(&ids)
            .bind(&self.params.worker_id)
            .bind(self.expires_at)
            .bind(self.ctx.now)
            // Candidates were read of these kinds already; checked again as they are claimed.
            .bind(self.params.kinds.as_deref())
            .bind(&self.params.excluded_kinds)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("claim jobs"))?;
        let mut by_id: HashMap<Uuid, Job> = rows::jobs(&found)?
            .into_iter()
            .map(|job| (job.id, job))
            .collect();
        let jobs: Vec<Job> = ids.iter().filter_map(|id| by_id.remove(id)).collect();
        record_starts(conn, self.ctx, self.queues, &jobs).await?;
        for job in &jobs {
            self.ctx
                .sql
                .limits
                .set_cursor(&job.queue, job.tenant.clone());
        }
        Ok(jobs)
    }
}

/// Records the claimed jobs' starts for the rate limits of their queues.
async fn record_starts(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    settings: &[(&str, QueueSettings)],
    jobs: &[Job],
) -> StoreResult<()> {
    let mut queues: Vec<&str> = Vec::new();
    let mut scopes: Vec<&str> = Vec::new();
    for job in jobs {
        let Some((_, queue_settings)) = settings.iter().find(|(q, _)| *q == job.queue) else {
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
    if queues.is_empty() {
        return Ok(());
    }
    sqlx::query(ctx.sql.limits.record_starts.clone())
        .bind(&queues)
        .bind(&scopes)
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
    queue: &str,
    settings: &QueueSettings,
    want: usize,
    params: &FetchParams,
) -> StoreResult<Vec<Candidate>> {
    let statements = &ctx.sql.limits;
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
    let tenanted: bool = sqlx::query_scalar(statements.has_tenanted.clone())
        .bind(queue)
        .fetch_one(&mut *conn)
        .await
        .map_err(db("look for tenanted jobs"))?;
    if !tenanted {
        let found = sqlx::query(statements.first.clone())
            .bind(queue)
            .bind(limit(quota))
            .bind(params.kinds.as_deref())
            .bind(&params.excluded_kinds)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("read available jobs"))?;
        return candidates_of(&found);
    }
    let (groups, candidates) = tenant_groups(conn, ctx, queue, settings, quota, params).await?;
    let picked = limits::round_robin(&groups, quota);
    Ok(picked
        .jobs
        .iter()
        .filter_map(|id| candidates.get(id).copied())
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

async fn tenants(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    queue: &str,
    after: Option<&str>,
    max: usize,
    params: &FetchParams,
) -> StoreResult<Vec<String>> {
    sqlx::query_scalar(ctx.sql.limits.tenants.clone())
        .bind(queue)
        // Tenants are never empty (names are validated), so '' stands for "from the first".
        .bind(after.unwrap_or(""))
        .bind(limit(max))
        .bind(params.kinds.as_deref())
        .bind(&params.excluded_kinds)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read tenants"))
}

/// The condition that a job is of a kind the fetch takes: its kinds at `$n` (NULL: any), its
/// excluded kinds at `$n+1`.
fn kinds_at(n: usize) -> String {
    let excluded = n + 1;
    format!("(${n}::text[] IS NULL OR kind = ANY(${n})) AND kind <> ALL(${excluded}::text[])")
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
) -> StoreResult<(Vec<Group>, HashMap<Uuid, Candidate>)> {
    let statements = &ctx.sql.limits;
    let cursor = statements.cursor(queue);
    let after = match &cursor {
        Some(Some(tenant)) => tenants(conn, ctx, queue, Some(tenant), quota, params).await?,
        _ => Vec::new(),
    };
    let from_start = if after.len() < quota {
        tenants(conn, ctx, queue, None, quota, params).await?
    } else {
        Vec::new()
    };
    let untenanted = candidates_of(
        &sqlx::query(statements.untenanted.clone())
            .bind(queue)
            .bind(limit(limits::UNTENANTED_WINDOW))
            .bind(limit(quota))
            .bind(params.kinds.as_deref())
            .bind(&params.excluded_kinds)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("read jobs without a tenant"))?,
    )?;
    let (order, reads) = limits::tenant_pass(
        after,
        from_start,
        !untenanted.is_empty(),
        cursor.as_ref().map(|served| served.as_deref()),
        quota,
    );
    let tenants: Vec<&str> = order.iter().flatten().map(String::as_str).collect();
    let budgets = key_budgets(conn, ctx, queue, settings, &tenants).await?;
    // Every tenant's first jobs in one statement (a LATERAL read per tenant).
    let wanted: Vec<i64> = budgets.iter().map(|b| limit(reads.min(*b))).collect();
    let found = sqlx::query(statements.tenant_jobs.clone())
        .bind(queue)
        .bind(&tenants)
        .bind(&wanted)
        .bind(params.kinds.as_deref())
        .bind(&params.excluded_kinds)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read tenants' jobs"))?;
    let mut by_tenant: HashMap<String, Vec<Candidate>> = HashMap::new();
    for row in &found {
        let tenant: String = row.try_get("tenant").map_err(|e| corrupt(e.to_string()))?;
        let candidate = candidates_of(std::slice::from_ref(row))?;
        by_tenant.entry(tenant).or_default().extend(candidate);
    }
    let mut all: HashMap<Uuid, Candidate> = HashMap::new();
    let mut groups = Vec::with_capacity(order.len());
    let mut budgets = budgets.into_iter();
    for tenant in order {
        let Some(tenant) = tenant else {
            let jobs: Vec<Uuid> = untenanted.iter().take(reads).map(|c| c.id).collect();
            all.extend(untenanted.iter().map(|c| (c.id, *c)));
            groups.push(Group {
                tenant: None,
                jobs,
                budget: usize::MAX,
            });
            continue;
        };
        let budget = budgets.next().unwrap_or(0);
        let found = by_tenant.remove(&tenant).unwrap_or_default();
        groups.push(Group {
            jobs: found.iter().map(|c| c.id).collect(),
            tenant: Some(tenant),
            budget,
        });
        all.extend(found.into_iter().map(|c| (c.id, c)));
    }
    Ok((groups, all))
}
