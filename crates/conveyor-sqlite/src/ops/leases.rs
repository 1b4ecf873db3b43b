//! Jobs under lease: promotion of due jobs, the claim, heartbeats, completion, failure, snooze, release and rescue.

use super::*;
use conveyor_core::limits::{Admission, LimitUsage};

/// Makes due scheduled and retryable jobs available.
pub(crate) fn promote_due(ctx: &mut WriteCtx<'_>) -> StoreResult<u64> {
    ctx.promoted = true;
    expire_due(ctx)?;
    if !any_due(ctx, "state IN ('scheduled', 'retryable') AND run_at <= ?1")? {
        return Ok(0);
    }
    let mut changed = 0;
    // Each repeats the partial index's own condition (`state IN (...)`) so SQLite uses it.
    let promotions = [
        (
            JobState::Scheduled,
            "UPDATE jobs SET state = 'available' WHERE state IN ('scheduled', 'retryable') AND state = 'scheduled' AND run_at <= ?1 \
             RETURNING queue",
        ),
        (
            JobState::Retryable,
            "UPDATE jobs SET state = 'available' WHERE state IN ('scheduled', 'retryable') AND state = 'retryable' AND run_at <= ?1 \
             RETURNING queue",
        ),
    ];
    for (from, sql) in promotions {
        let queues: Vec<String> = ctx
            .conn
            .prepare_cached(sql)
            .and_then(|mut stmt| {
                stmt.query_map(params![millis(ctx.now)], |row| row.get(0))?
                    .collect()
            })
            .map_err(backend)?;
        for queue in &queues {
            ctx.count_move(queue, Some(from), Some(JobState::Available));
        }
        changed += queues.len() as u64;
    }
    if changed > 0 {
        ctx.wake = true;
    }
    Ok(changed)
}

/// Whether any job meets `condition` (one that a partial index answers, its one parameter the
/// writer's now). An `UPDATE` that changes nothing still opens a cursor on the table and every
/// index of `jobs` before it looks: run on every fetch for promotions and expiries that are
/// seldom due, those opens were 7 % of the writer in a plain drain (perf); one probe is not.
fn any_due(ctx: &WriteCtx<'_>, condition: &str) -> StoreResult<bool> {
    ctx.conn
        .prepare_cached(&format!(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE {condition})"
        ))
        .and_then(|mut stmt| stmt.query_row(params![millis(ctx.now)], |row| row.get(0)))
        .map_err(backend)
}

/// Most jobs expired by one pass (the rest wait for the next; the claim itself skips a job
/// whose expiry has come).
const EXPIRE_BATCH: i64 = 1000;

/// Moves waiting jobs (scheduled, available, retryable) whose `expires_at` has come to
/// `expired`, telling their flows.
pub(crate) fn expire_due(ctx: &mut WriteCtx<'_>) -> StoreResult<u64> {
    if !any_due(
        ctx,
        "expires_at IS NOT NULL AND state IN ('scheduled', 'available', 'retryable') \
         AND expires_at <= ?1",
    )? {
        return Ok(0);
    }
    let mut count = 0;
    // One statement per waiting state, so each job's count moves from the state it was in.
    // Each repeats the partial index's own condition so SQLite uses it. The state is written
    // into the statement, not bound: a parameter compared with a partial index's column makes
    // SQLite prepare the statement again on every run (perf: 4-10 % of the writer, spent in
    // `sqlite3Reprepare` every round that fetched). `as_str` is one of three fixed names.
    for from in JobState::WAITING {
        let expired: Vec<Job> = ctx
            .conn
            .prepare_cached(&format!(
                "UPDATE jobs SET state = 'expired', finished_at = ?1 WHERE id IN ( \
                     SELECT id FROM jobs WHERE expires_at IS NOT NULL \
                     AND state IN ('scheduled', 'available', 'retryable') AND state = '{}' \
                     AND expires_at <= ?1 ORDER BY expires_at LIMIT ?2) \
                 RETURNING {COLUMNS}",
                from.as_str()
            ))
            .and_then(|mut stmt| {
                stmt.query_map(params![millis(ctx.now), EXPIRE_BATCH], rows::job)?
                    .collect()
            })
            .map_err(backend)?;
        for job in &expired {
            ctx.count_move(&job.queue, Some(from), Some(JobState::Expired));
            sequence::moved(ctx, job, from)?;
            workflow::job_finished(ctx, job)?;
        }
        count += expired.len() as u64;
    }
    Ok(count)
}

pub(crate) fn fetch(ctx: &mut WriteCtx<'_>, params: &FetchParams) -> StoreResult<Vec<Job>> {
    if !ctx.promoted {
        promote_due(ctx)?;
    }
    let mut queues: Vec<(String, QueueSettings)> = Vec::with_capacity(params.queues.len());
    for queue in &params.queues {
        let settings = ctx.settings.get(queue).cloned().unwrap_or_default();
        // Queue names arrive distinct (`validate::fetch`).
        if !settings.paused {
            queues.push((queue.clone(), settings));
        }
    }
    // Named limits: counted only when a queue of the fetch has available jobs with limit keys
    // (one probe each), so fetches where no job carries one pay nothing more.
    let mut limited = false;
    for (queue, _) in &queues {
        if limits::has_limited(ctx, queue)? {
            limited = true;
            break;
        }
    }
    let specs = if limited {
        limits::specs(ctx.conn)?
    } else {
        Default::default()
    };
    let usage = if specs.is_empty() {
        LimitUsage::default()
    } else {
        limits::usage(ctx, &specs)?
    };
    let mut admission = (!specs.is_empty()).then(|| Admission::new(&specs, &usage));
    if let Some(weights) =
        conveyor_core::limits::fetch_weights(queues.iter().map(|(_, s)| s.weight))
    {
        let mut plan =
            conveyor_core::limits::WeightedFetch::new(&weights, params.max, &mut rand::rng());
        let mut jobs = Vec::with_capacity(params.max);
        while let Some((index, ask)) = plan.next_ask() {
            let (queue, settings) = &queues[index];
            let found = queue_candidates(ctx, queue, settings, params, ask, admission.as_ref())?;
            let candidates = found.len();
            let claimed = claim(ctx, params, found, admission.as_mut())?;
            plan.record(candidates, claimed.len());
            jobs.extend(claimed);
        }
        return Ok(jobs);
    }
    let mut lists = Vec::with_capacity(queues.len());
    for (queue, settings) in &queues {
        lists.push(queue_candidates(
            ctx,
            queue,
            settings,
            params,
            params.max,
            admission.as_ref(),
        )?);
    }
    let candidates = conveyor_core::limits::merge_in_claim_order(lists, params.max, |job| {
        (job.priority, job.run_at, job.id)
    });
    claim(ctx, params, candidates, admission.as_mut())
}

/// Up to `want` of `queue`'s available jobs, in the order a fetch should claim them: plain
/// claim order, or through the limits when the queue has limits or tenanted jobs waiting.
pub(super) fn queue_candidates(
    ctx: &mut WriteCtx<'_>,
    queue: &str,
    settings: &QueueSettings,
    params: &FetchParams,
    want: usize,
    admission: Option<&Admission<'_>>,
) -> StoreResult<Vec<Job>> {
    // Keys with no room: their jobs are not worth reading.
    let full = admission.map(Admission::full).unwrap_or_default();
    let tenanted = limits::has_tenanted(ctx, queue)?;
    // Jobs holding a keyed limit's key take turns by it, unless the queue holds tenants to
    // per-tenant limits (those need the tenant round-robin's budgets).
    let per_tenant =
        settings.per_key_concurrency_limit.is_some() || settings.per_key_rate_limit.is_some();
    let fair = match admission {
        Some(admission) if !per_tenant && limits::has_fair_keyed(ctx, queue)? => Some(admission),
        _ => None,
    };
    if settings.limits_starts() || tenanted || fair.is_some() {
        // The kinds filter applies as candidates are read, so jobs of other kinds ahead in
        // the queue take none of the quota.
        let filter = limits::KindFilter::new(params)?;
        let quota = limits::quota(ctx, queue, settings, want)?;
        if quota == 0 {
            return Ok(Vec::new());
        }
        if let Some(admission) = fair {
            return crate::turns::candidates(ctx, queue, quota, &filter, admission);
        }
        if tenanted {
            return limits::tenant_candidates(ctx, queue, settings, quota, &filter);
        }
        // One group in claim order: the plain read, cut to the quota.
        return first_available_for(ctx, queue, params, quota);
    }
    if !full.is_empty() && limits::has_limited(ctx, queue)? {
        // Jobs holding a limit key with no room are passed over as candidates are read, so a
        // flood of one full key cannot hide the jobs behind it.
        return limits::first_available_with_room(ctx, queue, params, want, &full);
    }
    first_available_for(ctx, queue, params, want)
}

/// The queue's first `want` available jobs in claim order that the fetch takes by kind.
pub(super) fn first_available_for(
    ctx: &WriteCtx<'_>,
    queue: &str,
    params: &FetchParams,
    want: usize,
) -> StoreResult<Vec<Job>> {
    // Kinds whose circuit breaker is open; only a fetch of any kind still has them
    // (`validate::fetch` folds them into a fetch's own kinds).
    let excluded = params.excluded_kinds.as_slice();
    match (params.kinds.as_deref(), excluded) {
        (None, []) => first_available(ctx, queue, want),
        (Some(kinds), _) => first_available_of_kinds(ctx, queue, kinds, false, want),
        (None, excluded) => first_available_of_kinds(ctx, queue, excluded, true, want),
    }
}

/// Like [`first_available`], only jobs of `kinds` (skipping others in the same index range),
/// or with `except`, only jobs of other kinds.
pub(super) fn first_available_of_kinds(
    ctx: &WriteCtx<'_>,
    queue: &str,
    kinds: &[String],
    except: bool,
    limit: usize,
) -> StoreResult<Vec<Job>> {
    let kinds = serde_json::to_string(kinds)
        .map_err(|e| StoreError::backend(format!("cannot serialize kinds: {e}")))?;
    let not = if except { "NOT" } else { "" };
    ctx.conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM jobs WHERE state = 'available' AND queue = ?1 \
             AND kind {not} IN (SELECT value FROM json_each(?3)) \
             ORDER BY priority DESC, run_at, id LIMIT ?2"
        ))
        .and_then(|mut stmt| {
            stmt.query_map(params![queue, limit as i64, kinds], rows::job)?
                .collect::<Result<Vec<Job>, _>>()
        })
        .map_err(backend)
}

/// The queue's first `limit` available jobs in claim order (one range scan of `jobs_fetch`).
pub(crate) fn first_available(
    ctx: &WriteCtx<'_>,
    queue: &str,
    limit: usize,
) -> StoreResult<Vec<Job>> {
    ctx.conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM jobs WHERE state = 'available' AND queue = ?1 \
             ORDER BY priority DESC, run_at, id LIMIT ?2"
        ))
        .and_then(|mut stmt| {
            stmt.query_map(params![queue, limit as i64], rows::job)?
                .collect::<Result<Vec<Job>, _>>()
        })
        .map_err(backend)
}

/// Marks the candidates running under fresh leases (each only if still available) and
/// returns those claimed.
pub(super) fn claim(
    ctx: &mut WriteCtx<'_>,
    params: &FetchParams,
    candidates: Vec<Job>,
    mut admission: Option<&mut Admission<'_>>,
) -> StoreResult<Vec<Job>> {
    if candidates.is_empty() {
        return Ok(Vec::new());
    }
    let expires_at = clock::checked_after(ctx.now, params.lease, "lease")?;
    // No RETURNING here: SQLite buffers returned rows in a temporary table per statement, which
    // costs more than updating the already-read rows in memory.
    let mut claim = ctx
        .conn
        .prepare_cached(
            "UPDATE jobs SET state = 'running', attempt = attempt + 1, lease_worker = ?1, \
             lease_token = ?2, lease_expires_at = ?3, started_at = ?4, fair_turn = NULL \
             WHERE id = ?5 AND state = 'available'",
        )
        .map_err(backend)?;
    let mut jobs = Vec::with_capacity(candidates.len());
    for mut job in candidates {
        // Never hand out a job whose expiry has come (more than one sweep's batch may be due).
        if job.is_past_expiry(ctx.now) {
            continue;
        }
        if let Some(admission) = admission.as_deref_mut() {
            if !admission.admit(&job.limit_keys) {
                continue;
            }
        }
        let token = Uuid::new_v4();
        let claimed = claim
            .execute(params![
                params.worker_id,
                token.to_string(),
                millis(expires_at),
                millis(ctx.now),
                job.id.to_string()
            ])
            .map_err(backend)?;
        if claimed == 1 {
            job.state = JobState::Running;
            job.attempt += 1;
            job.started_at = Some(ctx.now);
            job.lease = Some(Lease {
                worker_id: params.worker_id.clone(),
                token,
                expires_at,
            });
            jobs.push(job);
        }
    }
    drop(claim);
    for job in &jobs {
        ctx.count_move(
            &job.queue,
            Some(JobState::Available),
            Some(JobState::Running),
        );
        ctx.claimed_queues.insert(job.id, job.queue.clone());
    }
    limits::record_claims(ctx, &jobs)?;
    crate::turns::serve(ctx, &jobs)?;
    if let Some(admission) = admission {
        limits::record_limit_starts(ctx, admission, &jobs)?;
    }
    Ok(jobs)
}

pub(crate) fn heartbeat_many(
    ctx: &mut WriteCtx<'_>,
    beats: &[HeartbeatParams],
) -> StoreResult<Vec<Option<DateTime<Utc>>>> {
    let mut stmt = ctx
        .conn
        .prepare_cached(
            "UPDATE jobs SET lease_expires_at = ?1 \
             WHERE id = ?2 AND state = 'running' AND lease_token = ?3",
        )
        .map_err(backend)?;
    let mut out = Vec::with_capacity(beats.len());
    for beat in beats {
        let expires = clock::checked_after(ctx.now, beat.extend_by, "extend_by")?;
        let changed = stmt
            .execute(params![
                millis(expires),
                beat.lease.id.to_string(),
                beat.lease.lease_token.to_string()
            ])
            .map_err(backend)?;
        out.push((changed == 1).then_some(expires));
    }
    Ok(out)
}

pub(crate) fn complete_many(
    ctx: &mut WriteCtx<'_>,
    completions: Vec<CompleteParams>,
) -> StoreResult<Vec<LeaseOutcome>> {
    let mut out = Vec::with_capacity(completions.len());
    let mut completed_queues = Vec::with_capacity(completions.len());
    for completion in completions {
        let lease = completion.lease;
        // The queue is needed for the counts: from the claim cache, else read with the lease check.
        let queue = match ctx.claimed_queues.remove(&lease.id) {
            Some(queue) => Some(queue),
            None => held_in_queue(ctx, &lease)?,
        };
        let Some(queue) = queue else {
            out.push(LeaseOutcome::LeaseLost);
            continue;
        };
        let result = completion
            .result
            .as_ref()
            .map(|value| json_text(value, "result"))
            .transpose()?;
        // The row's flow and sequence (NULL for plain jobs) tell whether a workflow must move
        // on and whether a blocked job is released.
        let changed: Option<(Option<String>, Option<String>)> = ctx
            .conn
            .prepare_cached(
                "UPDATE jobs SET state = 'completed', result = ?1, finished_at = ?2, \
                 lease_token = NULL, lease_expires_at = NULL \
                 WHERE id = ?3 AND state = 'running' AND lease_token = ?4 \
                 RETURNING flow_id, sequence_key",
            )
            .and_then(|mut stmt| {
                stmt.query_row(
                    params![
                        result,
                        millis(ctx.now),
                        lease.id.to_string(),
                        lease.lease_token.to_string()
                    ],
                    |row| Ok((row.get(0)?, row.get(1)?)),
                )
                .optional()
            })
            .map_err(backend)?;
        if let Some((flow_id, sequence_key)) = changed {
            if let Some(key) = sequence_key {
                // Running held the sequence; completed never does.
                sequence::release(ctx, &key)?;
            }
            if let Some(flow_id) = flow_id {
                let flow_id = Uuid::parse_str(&flow_id)
                    .map_err(|e| StoreError::backend(format!("stored flow id: {e}")))?;
                ctx.graphs.completing(lease.id, result);
                workflow::handle(
                    ctx,
                    flow_id,
                    FlowEvent::JobFinished {
                        job_id: lease.id,
                        state: JobState::Completed,
                    },
                )?;
            }
            completed_queues.push(queue);
            out.push(LeaseOutcome::Applied);
        } else {
            out.push(LeaseOutcome::LeaseLost);
        }
    }
    for queue in &completed_queues {
        ctx.count_move(queue, Some(JobState::Running), Some(JobState::Completed));
        // A finished job frees a place under a concurrency limit: waiting fetchers may claim.
        if ctx
            .settings
            .get(queue)
            .is_some_and(|s| s.concurrency_limit.is_some() || s.per_key_concurrency_limit.is_some())
            || (!ctx.wake && limits::has_limited(ctx, queue)?)
        {
            ctx.wake = true;
        }
    }
    Ok(out)
}

/// The queue of a running job still held under `lease`; `None` when the lease was lost.
pub(super) fn held_in_queue(ctx: &WriteCtx<'_>, lease: &LeaseRef) -> StoreResult<Option<String>> {
    ctx.conn
        .prepare_cached(
            "SELECT queue FROM jobs WHERE id = ?1 AND state = 'running' AND lease_token = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![lease.id.to_string(), lease.lease_token.to_string()],
                |row| row.get(0),
            )
            .optional()
        })
        .map_err(backend)
}

/// Records a failed attempt on a running job and decides between `retryable` and `dead`.
pub(crate) fn record_failure(
    ctx: &mut WriteCtx<'_>,
    id: &str,
    attempt: u32,
    max_attempts: u32,
    error: ErrorRecord,
    retry_at: Option<DateTime<Utc>>,
) -> StoreResult<Job> {
    let (state, run_at, finished_at) = match retry_at {
        Some(at) if attempt < max_attempts => (JobState::Retryable, Some(millis(at)), None),
        _ => (JobState::Dead, None, Some(millis(ctx.now))),
    };
    // A retry that could not start before the job expires makes it expire now instead.
    let mut stmt = ctx
        .conn
        .prepare_cached(&format!(
            "UPDATE jobs SET \
             state = CASE WHEN ?1 = 'retryable' AND expires_at IS NOT NULL \
                 AND ?2 >= expires_at THEN 'expired' ELSE ?1 END, \
             finished_at = CASE WHEN ?1 = 'retryable' AND expires_at IS NOT NULL \
                 AND ?2 >= expires_at THEN ?6 ELSE ?3 END, \
             run_at = COALESCE(?2, run_at), \
             errors = json_insert(errors, '$[#]', json(?4)), \
             lease_token = NULL, lease_expires_at = NULL \
             WHERE id = ?5 AND state = 'running' RETURNING {COLUMNS}"
        ))
        .map_err(backend)?;
    let job = stmt
        .query_row(
            params![
                state.as_str(),
                run_at,
                finished_at,
                json_text(&error, "error")?,
                id,
                millis(ctx.now)
            ],
            rows::job,
        )
        .map_err(backend)?;
    drop(stmt);
    ctx.count_move(&job.queue, Some(JobState::Running), Some(job.state));
    sequence::moved(ctx, &job, JobState::Running)?;
    workflow::job_finished(ctx, &job)?;
    Ok(job)
}

/// Records a running job's progress while its lease holds.
pub(crate) fn progress(
    ctx: &mut WriteCtx<'_>,
    lease: LeaseRef,
    progress: &conveyor_core::Progress,
) -> StoreResult<()> {
    let changed = ctx
        .conn
        .prepare_cached(
            "UPDATE jobs SET progress = ?1 WHERE id = ?2 AND state = 'running' AND lease_token = ?3",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                json_text(progress, "progress").map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?,
                lease.id.to_string(),
                lease.lease_token.to_string()
            ])
        })
        .map_err(backend)?;
    if changed == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost(lease.id))
    }
}

/// The attempt counters of a running job still held under `lease`, or `LeaseLost`.
/// A held job's attempt, its attempt limit, the worker holding it and when the attempt started.
type Held = (u32, u32, Option<String>, Option<i64>);

pub(super) fn held(ctx: &WriteCtx<'_>, lease: &LeaseRef) -> StoreResult<Held> {
    ctx.conn
        .prepare_cached(
            "SELECT attempt, max_attempts, lease_worker, started_at FROM jobs \
             WHERE id = ?1 AND state = 'running' AND lease_token = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![lease.id.to_string(), lease.lease_token.to_string()],
                |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
            )
            .optional()
        })
        .map_err(backend)?
        .ok_or(StoreError::LeaseLost(lease.id))
}

pub(crate) fn fail(ctx: &mut WriteCtx<'_>, params: FailParams) -> StoreResult<Job> {
    let (attempt, max_attempts, worker, started_at) = held(ctx, &params.lease)?;
    let lease_id = params.lease.id.to_string();
    let (mut error, retry_at) = params.failure(ctx.now, attempt);
    error.worker_id = worker;
    error.started_at = started_at.map(conveyor_core::clock::from_millis);
    record_failure(ctx, &lease_id, attempt, max_attempts, error, retry_at)
}

pub(crate) fn snooze(ctx: &mut WriteCtx<'_>, params: SnoozeParams) -> StoreResult<Job> {
    held(ctx, &params.lease)?;
    let until = params.until.max(ctx.now);
    let state = if until > ctx.now {
        JobState::Scheduled
    } else {
        ctx.wake = true;
        JobState::Available
    };
    let job = ctx
        .conn
        .prepare_cached(&format!(
            "UPDATE jobs SET state = ?1, run_at = ?2, attempt = MAX(attempt - 1, 0), \
             lease_token = NULL, lease_expires_at = NULL \
             WHERE id = ?3 AND state = 'running' RETURNING {COLUMNS}"
        ))
        .and_then(|mut stmt| {
            stmt.query_row(
                params![state.as_str(), millis(until), params.lease.id.to_string()],
                rows::job,
            )
        })
        .map_err(backend)?;
    ctx.count_move(&job.queue, Some(JobState::Running), Some(job.state));
    Ok(job)
}

pub(crate) fn release_many(ctx: &mut WriteCtx<'_>, leases: &[LeaseRef]) -> StoreResult<u64> {
    let mut stmt = ctx
        .conn
        .prepare_cached(
            "UPDATE jobs SET state = 'available', attempt = MAX(attempt - 1, 0), \
             lease_token = NULL, lease_expires_at = NULL \
             WHERE id = ?1 AND state = 'running' AND lease_token = ?2 RETURNING queue",
        )
        .map_err(backend)?;
    let mut queues = Vec::new();
    for lease in leases {
        let queue: Option<String> = stmt
            .query_row(
                params![lease.id.to_string(), lease.lease_token.to_string()],
                |row| row.get(0),
            )
            .optional()
            .map_err(backend)?;
        queues.extend(queue);
    }
    drop(stmt);
    for queue in &queues {
        ctx.count_move(queue, Some(JobState::Running), Some(JobState::Available));
    }
    let released = queues.len() as u64;
    if released > 0 {
        ctx.wake = true;
    }
    Ok(released)
}

pub(crate) fn rescue_expired(
    ctx: &mut WriteCtx<'_>,
    params: &RescueParams,
) -> StoreResult<RescueReport> {
    type Expired = (String, u32, u32, Option<String>, Option<i64>);
    let expired: Vec<Expired> = ctx
        .conn
        .prepare_cached(
            "SELECT id, attempt, max_attempts, lease_worker, started_at FROM jobs \
             WHERE state = 'running' AND lease_expires_at <= ?1 \
             ORDER BY lease_expires_at LIMIT ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![millis(ctx.now), params.limit as i64], |row| {
                Ok((
                    row.get(0)?,
                    row.get(1)?,
                    row.get(2)?,
                    row.get(3)?,
                    row.get(4)?,
                ))
            })?
            .collect()
        })
        .map_err(backend)?;
    let mut report = RescueReport::default();
    for (id, attempt, max_attempts, worker, started_at) in expired {
        let mut error = ErrorRecord::lease_expired(attempt, ctx.now, worker.as_deref());
        // The rescued attempt's start, so its history shows how long it held the job.
        error.started_at = started_at.map(conveyor_core::clock::from_millis);
        let retry_at = Some(params.retry.next_run_at(ctx.now, attempt));
        let job = record_failure(ctx, &id, attempt, max_attempts, error, retry_at)?;
        report.add(&job);
    }
    Ok(report)
}
