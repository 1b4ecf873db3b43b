//! Limited claims on the writer thread: concurrency and rate limits (per queue and per
//! tenant) and tenant fairness. The writer is the only claimer, so the counts read here are
//! exact across every worker; the picking itself is `conveyor_core::limits`.

use chrono::Duration;
use conveyor_core::limits::named::{self as named, KeyUsage};
use conveyor_core::limits::{self, Admission, Group, LimitSpec, LimitUsage, Reads};
use conveyor_core::{FetchParams, Job, JobState, QueueSettings, RateLimit, StoreResult};
use rusqlite::{params, Connection};
use std::collections::{BTreeMap, HashMap};
use uuid::Uuid;

use crate::errors::backend;
use crate::jobs::job_by_id;
use crate::rows::millis;
use crate::writer::WriteCtx;

/// Whether `queue` has available jobs with a tenant: such queues are claimed from
/// round-robin by tenant. One probe of the `jobs_fair` index.
pub(crate) fn has_tenanted(ctx: &WriteCtx<'_>, queue: &str) -> StoreResult<bool> {
    has_available_with(ctx, queue, "tenant")
}

/// How many jobs a fetch wanting `want` may claim from `queue` now: as many as the queue's
/// concurrency and rate limits leave.
pub(crate) fn quota(
    ctx: &WriteCtx<'_>,
    queue: &str,
    settings: &QueueSettings,
    want: usize,
) -> StoreResult<usize> {
    let running = if settings.concurrency_limit.is_some() {
        ctx.queue_count(queue, &[JobState::Running])?
    } else {
        0
    };
    if let Some(period_ms) = settings.rate_record_ttl_ms() {
        prune_starts(ctx, queue, period_ms)?;
    }
    let recent = match settings.rate_limit {
        Some(rate) => recent_starts(ctx, queue, "", rate)?,
        None => 0,
    };
    Ok(limits::queue_quota(settings, want, running, recent))
}

/// Up to `quota` of `queue`'s available jobs in pick order, taken round-robin across its
/// tenants within each tenant's own limits.
pub(crate) fn tenant_candidates(
    ctx: &WriteCtx<'_>,
    queue: &str,
    settings: &QueueSettings,
    quota: usize,
    filter: &KindFilter,
) -> StoreResult<Vec<Job>> {
    let (groups, share, mut firsts) =
        tenant_groups(ctx, queue, settings, quota, filter, Reads::Share)?;
    let mut picked = limits::round_robin(&groups, quota);
    if limits::read_more(&groups, &picked, quota, share) {
        let (groups, _, again) = tenant_groups(ctx, queue, settings, quota, filter, Reads::Full)?;
        picked = limits::round_robin(&groups, quota);
        firsts = again;
    }
    let mut jobs = Vec::with_capacity(picked.jobs.len());
    for id in picked.jobs {
        // Each group's first job came whole with its key; the others are read now.
        let job = match firsts.remove(&id) {
            Some(job) => Some(job),
            None => job_by_id(ctx, &id.to_string())?,
        };
        jobs.extend(job);
    }
    Ok(jobs)
}

/// The kinds a fetch takes, for the statements that read candidates by tenant: only the
/// fetch's `kinds` when it names some, never its excluded kinds (open breakers). Bound as two
/// JSON arrays to a statement's last two parameters ([`KindFilter::sql`]).
pub(crate) struct KindFilter {
    pub(crate) only: Option<String>,
    pub(crate) excluded: String,
}

impl KindFilter {
    pub(crate) fn new(params: &FetchParams) -> StoreResult<Self> {
        let json = |kinds: &[String]| {
            serde_json::to_string(kinds).map_err(|e| {
                conveyor_core::StoreError::backend(format!("cannot serialize kinds: {e}"))
            })
        };
        Ok(Self {
            only: params.kinds.as_deref().map(json).transpose()?,
            excluded: json(&params.excluded_kinds)?,
        })
    }

    /// The condition on `kind`, its arrays at parameters `?{first}` and `?{first + 1}`. A
    /// filter that keeps every kind still names both parameters but never reads `kind`, so a
    /// read by an index without the column stays within the index (no row lookups).
    pub(crate) fn sql(&self, first: usize) -> String {
        let (only, excluded) = (first, first + 1);
        if self.only.is_none() && self.excluded == "[]" {
            return format!("(?{only} IS NULL AND ?{excluded} = '[]')");
        }
        format!(
            "(?{only} IS NULL OR kind IN (SELECT value FROM json_each(?{only}))) \
             AND kind NOT IN (SELECT value FROM json_each(?{excluded}))"
        )
    }
}

/// After a claim: records the claimed jobs' starts for the rate limits of their queues and
/// moves each queue's tenant round-robin cursor to the tenant of its last claimed job.
pub(crate) fn record_claims(ctx: &mut WriteCtx<'_>, jobs: &[Job]) -> StoreResult<()> {
    for job in jobs {
        let Some(settings) = ctx.settings.get(&job.queue) else {
            continue;
        };
        let mut scopes: Vec<&str> = Vec::with_capacity(2);
        if settings.rate_limit.is_some() {
            scopes.push("");
        }
        if let (Some(_), Some(tenant)) = (settings.per_key_rate_limit, &job.tenant) {
            scopes.push(tenant);
        }
        if !scopes.is_empty() {
            let mut insert = ctx
                .conn
                .prepare_cached(
                    "INSERT INTO rate_starts (queue, scope, started_at) VALUES (?1, ?2, ?3)",
                )
                .map_err(backend)?;
            for scope in scopes {
                insert
                    .execute(params![job.queue, scope, millis(ctx.now)])
                    .map_err(backend)?;
            }
        }
    }
    // Jobs are in pick order per queue, so the last one of each queue sets its cursors.
    for job in jobs {
        if ctx.cursors.contains_key(&job.queue) || job.tenant.is_some() {
            ctx.cursors.insert(job.queue.clone(), job.tenant.clone());
        }
    }
    Ok(())
}

fn prune_starts(ctx: &WriteCtx<'_>, queue: &str, period_ms: u64) -> StoreResult<()> {
    let horizon = ctx.now - Duration::milliseconds(period_ms.min(i64::MAX as u64) as i64);
    ctx.conn
        .prepare_cached("DELETE FROM rate_starts WHERE queue = ?1 AND started_at <= ?2")
        .and_then(|mut stmt| stmt.execute(params![queue, millis(horizon)]))
        .map_err(backend)?;
    Ok(())
}

/// Starts recorded for `queue` and `scope` ('' for the whole queue, else a tenant) within the
/// rate limit's period up to now.
fn recent_starts(
    ctx: &WriteCtx<'_>,
    queue: &str,
    scope: &str,
    rate: RateLimit,
) -> StoreResult<u64> {
    let since = ctx.now - rate.period();
    let n: i64 = ctx
        .conn
        .prepare_cached(
            "SELECT COUNT(*) FROM rate_starts WHERE queue = ?1 AND scope = ?2 AND started_at > ?3",
        )
        .and_then(|mut stmt| stmt.query_row(params![queue, scope, millis(since)], |row| row.get(0)))
        .map_err(backend)?;
    Ok(n.max(0) as u64)
}

fn running_of_tenant(ctx: &WriteCtx<'_>, queue: &str, tenant: &str) -> StoreResult<u64> {
    let n: i64 = ctx
        .conn
        .prepare_cached(
            "SELECT COUNT(*) FROM jobs WHERE state = 'running' AND queue = ?1 AND tenant = ?2 \
             AND tenant IS NOT NULL",
        )
        .and_then(|mut stmt| stmt.query_row(params![queue, tenant], |row| row.get(0)))
        .map_err(backend)?;
    Ok(n.max(0) as u64)
}

fn ids(rows: rusqlite::Result<Vec<String>>) -> StoreResult<Vec<Uuid>> {
    rows.map_err(backend)?
        .iter()
        .map(|id| {
            Uuid::parse_str(id)
                .map_err(|e| conveyor_core::StoreError::backend(format!("bad job id {id:?}: {e}")))
        })
        .collect()
}

/// Up to `limit` distinct tenants with available jobs in `queue`, in ascending order, after
/// `after` (from the first when `None`), each with its first job in claim order, read whole.
/// Each step is one seek in `jobs_fair`, one more for the first job and
/// its row by primary key, so the cost follows the number of tenants read, not the number of
/// jobs they have; and a pass over many tenants, which takes one job from each, needs no
/// statement per tenant after it.
fn tenants(
    ctx: &WriteCtx<'_>,
    queue: &str,
    after: Option<&str>,
    limit: usize,
    filter: &KindFilter,
) -> StoreResult<Vec<(String, Job)>> {
    let kind = filter.sql(4);
    let key = "tenant";
    let mut found = ctx
        .conn
        .prepare_cached(&format!(
            // `grp`, not `tenant`: the outer select reads the jobs' own `tenant` column.
            "WITH RECURSIVE t(grp) AS ( \
                 SELECT (SELECT MIN({key}) FROM jobs WHERE state = 'available' AND queue = ?1 \
                         AND {key} IS NOT NULL AND {key} > ?2 AND {kind}) \
                 UNION ALL \
                 SELECT (SELECT MIN(j.{key}) FROM jobs j WHERE j.state = 'available' \
                         AND j.queue = ?1 AND j.{key} IS NOT NULL AND j.{key} > t.grp \
                         AND {kind}) \
                 FROM t WHERE t.grp IS NOT NULL), \
             firsts(grp, first) AS ( \
                 SELECT grp, (SELECT j.id FROM jobs j WHERE j.state = 'available' \
                         AND j.queue = ?1 AND j.{key} = t.grp AND j.{key} IS NOT NULL \
                         AND {kind} ORDER BY j.priority DESC, j.run_at, j.id LIMIT 1) \
                 FROM t WHERE grp IS NOT NULL LIMIT ?3) \
             SELECT {columns}, firsts.grp FROM firsts JOIN jobs ON jobs.id = firsts.first",
            columns = crate::rows::COLUMNS
        ))
        .and_then(|mut stmt| {
            // Tenants are never empty (names are validated), so '' stands for "from the first".
            stmt.query_map(
                params![
                    queue,
                    after.unwrap_or(""),
                    limit as i64,
                    filter.only,
                    filter.excluded
                ],
                |row| {
                    // The key is the last column, after the job's own.
                    let key = row.as_ref().column_count().saturating_sub(1);
                    Ok((row.get::<_, String>(key)?, crate::rows::job(row)?))
                },
            )?
            .collect::<rusqlite::Result<Vec<_>>>()
        })
        .map_err(backend)?;
    // The join need not keep the keys' order.
    found.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(found)
}

/// Available jobs without a value in `key` (a tenant, a round-robin limit key), looked for
/// among the queue's first [`limits::UNTENANTED_WINDOW`] available jobs.
fn untenanted_ids(
    ctx: &WriteCtx<'_>,
    key: &str,
    queue: &str,
    limit: usize,
    filter: &KindFilter,
) -> StoreResult<Vec<Uuid>> {
    let kind = filter.sql(4);
    ids(ctx
        .conn
        .prepare_cached(&format!(
            "SELECT id FROM (SELECT id, {key} AS k, priority, run_at FROM jobs \
                 WHERE state = 'available' AND queue = ?1 AND {kind} \
                 ORDER BY priority DESC, run_at, id LIMIT ?2) \
             WHERE k IS NULL ORDER BY priority DESC, run_at, id LIMIT ?3"
        ))
        .and_then(|mut stmt| {
            stmt.query_map(
                params![
                    queue,
                    limits::UNTENANTED_WINDOW as i64,
                    limit as i64,
                    filter.only,
                    filter.excluded
                ],
                |row| row.get(0),
            )?
            .collect()
        }))
}

/// Up to `limit` of `queue`'s available jobs without a round-robin limit key, in claim
/// order, read whole (they take a turn among the keys, `crate::turns::candidates`).
pub(crate) fn unkeyed(
    ctx: &WriteCtx<'_>,
    queue: &str,
    limit: usize,
    filter: &KindFilter,
) -> StoreResult<Vec<Job>> {
    let mut jobs = Vec::new();
    for id in untenanted_ids(ctx, "fair_key", queue, limit, filter)? {
        jobs.extend(job_by_id(ctx, &id.to_string())?);
    }
    Ok(jobs)
}

fn tenant_ids(
    ctx: &WriteCtx<'_>,
    queue: &str,
    tenant: &str,
    limit: usize,
    filter: &KindFilter,
) -> StoreResult<Vec<Uuid>> {
    let kind = filter.sql(4);
    let key = "tenant";
    ids(ctx
        .conn
        .prepare_cached(&format!(
            "SELECT id FROM jobs WHERE state = 'available' AND queue = ?1 AND {key} = ?2 \
             AND {key} IS NOT NULL AND {kind} ORDER BY priority DESC, run_at, id LIMIT ?3"
        ))
        .and_then(|mut stmt| {
            stmt.query_map(
                params![queue, tenant, limit as i64, filter.only, filter.excluded],
                |row| row.get(0),
            )?
            .collect()
        }))
}

/// The queue's groups in round-robin order (starting after the group served last), each
/// with its first jobs and its per-key budget.
fn tenant_groups(
    ctx: &WriteCtx<'_>,
    queue: &str,
    settings: &QueueSettings,
    quota: usize,
    filter: &KindFilter,
    reads: Reads,
) -> StoreResult<(Vec<Group>, usize, HashMap<Uuid, Job>)> {
    let cursor = ctx.cursors.get(queue).cloned();
    let after = match &cursor {
        Some(Some(key)) => tenants(ctx, queue, Some(key), quota, filter)?,
        _ => Vec::new(),
    };
    let from_start = if after.len() < quota {
        tenants(ctx, queue, None, quota, filter)?
    } else {
        Vec::new()
    };
    let names = |found: &[(String, Job)]| found.iter().map(|(name, _)| name.clone()).collect();
    let pass = |ungrouped: bool| {
        limits::tenant_pass(
            names(&after),
            names(&from_start),
            ungrouped,
            cursor.as_ref().map(|served| served.as_deref()),
            quota,
            reads,
        )
    };
    // Jobs without a key are read (a window of the queue) only when this pass reaches their
    // turn (`limits::ungrouped_turn`).
    let (mut order, mut reads) = pass(true);
    let mut ungrouped = Vec::new();
    if limits::ungrouped_turn(&order) {
        ungrouped = untenanted_ids(ctx, "tenant", queue, quota, filter)?;
        if ungrouped.is_empty() {
            (order, reads) = pass(false);
        }
    }
    let mut by_key: HashMap<String, Job> = after.into_iter().chain(from_start).collect();
    let mut firsts = HashMap::with_capacity(order.len());
    let per_key =
        settings.per_key_concurrency_limit.is_some() || settings.per_key_rate_limit.is_some();
    let mut groups = Vec::with_capacity(order.len());
    for key in order {
        let Some(key) = key else {
            groups.push(Group {
                key: None,
                jobs: ungrouped.iter().copied().take(reads).collect(),
                budget: usize::MAX,
                weight: 1,
            });
            continue;
        };
        let budget = if per_key {
            let running = if settings.per_key_concurrency_limit.is_some() {
                running_of_tenant(ctx, queue, &key)?
            } else {
                0
            };
            let recent = match settings.per_key_rate_limit {
                Some(rate) => recent_starts(ctx, queue, &key, rate)?,
                None => 0,
            };
            limits::key_budget(settings, running, recent)
        } else {
            usize::MAX
        };
        let wanted = limits::weighted_reads(reads, 1, quota).min(budget);
        let jobs = match (wanted, by_key.remove(&key)) {
            (0, _) => Vec::new(),
            // Read with the tenant.
            (1, Some(first)) => {
                let id = first.id;
                firsts.insert(id, first);
                vec![id]
            }
            _ => tenant_ids(ctx, queue, &key, wanted, filter)?,
        };
        groups.push(Group {
            key: Some(key),
            jobs,
            budget,
            weight: 1,
        });
    }
    Ok((groups, reads, firsts))
}

/// Whether `queue` has available jobs stamped with limit keys. One probe of `jobs_limited`.
pub(crate) fn has_limited(ctx: &WriteCtx<'_>, queue: &str) -> StoreResult<bool> {
    has_available_with(ctx, queue, "limit_keys")
}

/// The named limits as configured (the shared configuration's `limits` collection). A
/// document that does not read as a limit holds nothing (the API checks what it stores).
pub(crate) fn specs(conn: &Connection) -> StoreResult<BTreeMap<String, LimitSpec>> {
    let entries = crate::config::list(conn, conveyor_core::config::LIMITS)?;
    Ok(entries
        .into_iter()
        .filter_map(|entry| {
            let mut spec: LimitSpec = serde_json::from_value(entry.document).ok()?;
            spec.name = entry.name;
            Some((spec.name.clone(), spec))
        })
        .collect())
}

/// Running jobs per limit key (all keys, or those of `only`'s limit). Bounded by the running
/// jobs with keys (`jobs_running_limited`).
fn running_by_key(conn: &Connection, only: Option<&str>) -> StoreResult<HashMap<String, u64>> {
    let prefix = only.map(|name| named::limit_key(name, None));
    conn.prepare_cached(
        "SELECT k.value, COUNT(*) FROM jobs j, json_each(j.limit_keys) k \
         WHERE j.state = 'running' AND j.limit_keys IS NOT NULL \
         AND (?1 IS NULL OR substr(k.value, 1, length(?1)) = ?1) GROUP BY k.value",
    )
    .and_then(|mut stmt| {
        stmt.query_map(params![prefix], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?.max(0) as u64,
            ))
        })?
        .collect()
    })
    .map_err(backend)
}

/// Starts per key of limit `name` since `since` (its rate rows, see
/// [`named::rate_scope_of`]).
fn starts_by_key(
    conn: &Connection,
    name: &str,
    since: chrono::DateTime<chrono::Utc>,
) -> StoreResult<Vec<(String, u64)>> {
    conn.prepare_cached(
        "SELECT scope, COUNT(*) FROM rate_starts WHERE queue = ?1 AND started_at > ?2 \
         GROUP BY scope ORDER BY scope",
    )
    .and_then(|mut stmt| {
        stmt.query_map(params![format!("@{name}"), millis(since)], |row| {
            Ok((
                row.get::<_, String>(0)?,
                row.get::<_, i64>(1)?.max(0) as u64,
            ))
        })?
        .collect()
    })
    .map_err(backend)
}

/// What every key of the named limits uses now, for a claim: start records older than each
/// limit's period are pruned first.
pub(crate) fn usage(
    ctx: &WriteCtx<'_>,
    specs: &BTreeMap<String, LimitSpec>,
) -> StoreResult<LimitUsage> {
    let mut usage = LimitUsage {
        running: running_by_key(ctx.conn, None)?,
        ..LimitUsage::default()
    };
    for (name, spec) in specs {
        let Some(rate) = spec.rate else { continue };
        prune_starts(ctx, &format!("@{name}"), rate.period_ms)?;
        for (value, count) in starts_by_key(ctx.conn, name, ctx.now - rate.period())? {
            usage
                .recent_starts
                .insert(named::limit_key(name, Some(&value)), count);
        }
    }
    Ok(usage)
}

/// What each key of limit `name` uses now (`QueueStore::limit_usage`).
pub(crate) fn key_usage(
    conn: &Connection,
    name: &str,
    rate_period_ms: Option<u64>,
    now: chrono::DateTime<chrono::Utc>,
) -> StoreResult<Vec<KeyUsage>> {
    let starts = match rate_period_ms {
        Some(period_ms) => {
            let since = now - Duration::milliseconds(period_ms.min(i64::MAX as u64) as i64);
            starts_by_key(conn, name, since)?
        }
        None => Vec::new(),
    };
    Ok(named::key_usage(running_by_key(conn, Some(name))?, starts))
}

/// After a claim: records the starts of claimed jobs under their limits' rates.
pub(crate) fn record_limit_starts(
    ctx: &WriteCtx<'_>,
    admission: &Admission<'_>,
    jobs: &[Job],
) -> StoreResult<()> {
    let mut insert = ctx
        .conn
        .prepare_cached("INSERT INTO rate_starts (queue, scope, started_at) VALUES (?1, ?2, ?3)")
        .map_err(backend)?;
    for job in jobs {
        for key in admission.rated(&job.limit_keys) {
            let (queue, scope) = named::rate_scope_of(key);
            insert
                .execute(params![queue, scope, millis(ctx.now)])
                .map_err(backend)?;
        }
    }
    Ok(())
}

/// The queue's first `want` available jobs in claim order that the fetch takes by kind and
/// that hold none of the `full` limit keys (a JSON array bound once). The scan walks
/// `jobs_fetch` past the full keys' jobs, so its cost follows how many of them are ahead.
pub(crate) fn first_available_with_room(
    ctx: &WriteCtx<'_>,
    queue: &str,
    params: &FetchParams,
    want: usize,
    full: &[String],
) -> StoreResult<Vec<Job>> {
    let filter = KindFilter::new(params)?;
    let kind = filter.sql(4);
    let full = serde_json::to_string(full).map_err(|e| {
        conveyor_core::StoreError::backend(format!("cannot serialize limit keys: {e}"))
    })?;
    ctx.conn
        .prepare_cached(&format!(
            "SELECT {columns} FROM jobs WHERE state = 'available' AND queue = ?1 AND {kind} \
             AND NOT EXISTS (SELECT 1 FROM json_each(jobs.limit_keys) k \
                 WHERE k.value IN (SELECT value FROM json_each(?3))) \
             ORDER BY priority DESC, run_at, id LIMIT ?2",
            columns = crate::rows::COLUMNS
        ))
        .and_then(|mut stmt| {
            stmt.query_map(
                params![queue, want as i64, full, filter.only, filter.excluded],
                crate::rows::job,
            )?
            .collect::<Result<Vec<Job>, _>>()
        })
        .map_err(backend)
}

/// Whether `queue` has available jobs with a round-robin limit key. One probe of
/// `jobs_fair_turn`.
pub(crate) fn has_fair_keyed(ctx: &WriteCtx<'_>, queue: &str) -> StoreResult<bool> {
    has_available_with(ctx, queue, "fair_key")
}

/// Whether `queue` has available jobs with a value in `column`: one probe of the partial index
/// that holds only those (`jobs_fair`, `jobs_limited`, `jobs_fair_turn`).
fn has_available_with(ctx: &WriteCtx<'_>, queue: &str, column: &str) -> StoreResult<bool> {
    ctx.conn
        .prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE state = 'available' AND queue = ?1 \
             AND {column} IS NOT NULL)"
        ))
        .and_then(|mut stmt| stmt.query_row(params![queue], |row| row.get(0)))
        .map_err(backend)
}
