//! State changes, each run on the writer thread inside a group-commit round. Every change to a
//! running job is conditional on `state = 'running' AND lease_token = ?`.

use chrono::{DateTime, Utc};
use conveyor_core::clock;
use conveyor_core::flow as planner;
use conveyor_core::{
    CompleteParams, ErrorRecord, FailParams, FetchParams, HeartbeatParams, Inserted, Job, JobState,
    Lease, LeaseOutcome, LeaseRef, NewJob, QueueSettings, RateLimit, ReplaySelector, RescueParams,
    RescueReport, SnoozeParams, StoreError, StoreResult,
};
use rusqlite::{params, OptionalExtension};
use uuid::Uuid;

use crate::backend;
use crate::flow;
use crate::rows::{self, millis, COLUMNS};
use crate::unique;
use crate::writer::WriteCtx;

fn json_text<T: serde::Serialize>(value: &T, field: &str) -> StoreResult<String> {
    serde_json::to_string(value)
        .map_err(|e| StoreError::Backend(format!("cannot serialize {field}: {e}")))
}

pub(crate) fn job_by_id(ctx: &WriteCtx<'_>, id: &str) -> StoreResult<Option<Job>> {
    ctx.conn
        .prepare_cached(&format!("SELECT {COLUMNS} FROM jobs WHERE id = ?1"))
        .and_then(|mut stmt| stmt.query_row(params![id], rows::job).optional())
        .map_err(backend)
}

/// An existing job that an insert with `key` must return instead of creating a new one.
fn idempotent_match(ctx: &WriteCtx<'_>, key: &str) -> StoreResult<Option<Job>> {
    // The newest job that still holds the key: an older job made unfinished again (a replayed
    // dead job) holds it even when a newer one with the key has finished.
    let window_start = clock::before(ctx.now, ctx.options.completed_idempotency_window);
    let latest = ctx
        .conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM jobs WHERE idempotency_key = ?1 \
             AND (state NOT IN ('completed', 'dead', 'cancelled') \
                  OR (state = 'completed' AND finished_at > ?2)) \
             ORDER BY created_at DESC, id DESC LIMIT 1"
        ))
        .and_then(|mut stmt| {
            stmt.query_row(params![key, millis(window_start)], rows::job)
                .optional()
        })
        .map_err(backend)?;
    let window = ctx.options.completed_idempotency_window;
    Ok(latest.filter(|job| match job.state {
        JobState::Completed => job
            .finished_at
            .is_some_and(|finished| clock::after(finished, window) > ctx.now),
        JobState::Dead | JobState::Cancelled => false,
        _ => true,
    }))
}

pub(crate) fn insert_many(ctx: &mut WriteCtx<'_>, jobs: Vec<NewJob>) -> StoreResult<Vec<Inserted>> {
    check_depth_limits(ctx, &jobs)?;
    let mut inserted = Vec::with_capacity(jobs.len());
    for new in jobs {
        if let Some(key) = &new.idempotency_key {
            if let Some(existing) = idempotent_match(ctx, key)? {
                inserted.push(Inserted {
                    job: existing,
                    duplicate: true,
                });
                continue;
            }
        }
        // Checked after the idempotency key, which keeps precedence.
        let unique_key = new.unique_key();
        if let (Some(spec), Some(key)) = (&new.unique, &unique_key) {
            if let Some(existing) = unique::existing(ctx, key, spec)? {
                inserted.push(Inserted {
                    job: existing,
                    duplicate: true,
                });
                continue;
            }
        }
        // Stored to the millisecond: the answer must show the job as stored.
        let new_run_at = new.run_at.map(clock::truncate_to_millis);
        let run_at = new_run_at.map_or(ctx.now, |at| at.max(ctx.now));
        let state = if run_at > ctx.now {
            JobState::Scheduled
        } else {
            ctx.wake = true;
            JobState::Available
        };
        let job = Job {
            id: Uuid::now_v7(),
            kind: new.kind,
            queue: new.queue,
            payload: new.payload,
            priority: new.priority,
            // A past run_at keeps its place in the order (older first) but is not in the future.
            run_at: new_run_at.map_or(ctx.now, |at| at.min(run_at)),
            attempt: 0,
            max_attempts: new.max_attempts,
            timeout_ms: new.timeout_ms,
            idempotency_key: new.idempotency_key,
            tags: new.tags,
            tenant: new.tenant,
            state,
            errors: Vec::new(),
            lease: None,
            result: None,
            created_at: ctx.now,
            started_at: None,
            finished_at: None,
            unique_key,
        };
        let mut stmt = ctx
            .conn
            .prepare_cached(
                "INSERT INTO jobs (id, kind, queue, payload, priority, run_at, attempt, \
                 max_attempts, timeout_ms, idempotency_key, tags, tenant, state, errors, \
                 created_at, unique_key) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, 0, ?7, ?8, ?9, ?10, ?11, ?12, '[]', ?13, ?14)",
            )
            .map_err(backend)?;
        stmt.execute(params![
            job.id.to_string(),
            job.kind,
            job.queue,
            json_text(&job.payload, "payload")?,
            job.priority,
            millis(job.run_at),
            job.max_attempts,
            job.timeout_ms.map(|ms| ms.min(i64::MAX as u64) as i64),
            job.idempotency_key,
            json_text(&job.tags, "tags")?,
            job.tenant,
            job.state.as_str(),
            millis(job.created_at),
            job.unique_key,
        ])
        .map_err(backend)?;
        ctx.count_move(&job.queue, None, Some(job.state));
        inserted.push(Inserted {
            job,
            duplicate: false,
        });
    }
    Ok(inserted)
}

/// Makes due scheduled and retryable jobs available.
pub(crate) fn promote_due(ctx: &mut WriteCtx<'_>) -> StoreResult<u64> {
    ctx.promoted = true;
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
    if let Some(weights) = planner::fetch_weights(queues.iter().map(|(_, s)| s.weight)) {
        let mut plan = planner::WeightedFetch::new(&weights, params.max, &mut rand::rng());
        let mut jobs = Vec::with_capacity(params.max);
        while let Some((index, ask)) = plan.next_ask() {
            let (queue, settings) = &queues[index];
            let found = queue_candidates(ctx, queue, settings, params.kinds.as_deref(), ask)?;
            let candidates = found.len();
            let claimed = claim(ctx, params, found)?;
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
            params.kinds.as_deref(),
            params.max,
        )?);
    }
    let candidates =
        planner::merge_in_claim_order(lists, params.max, |job| (job.priority, job.run_at, job.id));
    claim(ctx, params, candidates)
}

/// Up to `want` of `queue`'s available jobs, in the order a fetch should claim them: plain
/// claim order, or through flow control when the queue has limits or tenanted jobs waiting.
fn queue_candidates(
    ctx: &mut WriteCtx<'_>,
    queue: &str,
    settings: &QueueSettings,
    kinds: Option<&[String]>,
    want: usize,
) -> StoreResult<Vec<Job>> {
    let tenanted = flow::has_tenanted(ctx, queue)?;
    if settings.limits_starts() || tenanted {
        let mut picked = flow::candidates(ctx, queue, settings, want, tenanted)?;
        // Picked before the kinds filter: a fetch restricted to some kinds may claim fewer
        // than it could when other kinds lead a flow-controlled queue.
        if let Some(kinds) = kinds {
            picked.retain(|job| kinds.contains(&job.kind));
        }
        return Ok(picked);
    }
    match kinds {
        None => first_available(ctx, queue, want),
        Some(kinds) => first_available_of_kinds(ctx, queue, kinds, want),
    }
}

/// Like [`first_available`], only jobs of `kinds` (skipping others in the same index range).
fn first_available_of_kinds(
    ctx: &WriteCtx<'_>,
    queue: &str,
    kinds: &[String],
    limit: usize,
) -> StoreResult<Vec<Job>> {
    let kinds = serde_json::to_string(kinds)
        .map_err(|e| StoreError::Backend(format!("cannot serialize kinds: {e}")))?;
    ctx.conn
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM jobs WHERE state = 'available' AND queue = ?1 \
             AND kind IN (SELECT value FROM json_each(?3)) \
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
fn claim(
    ctx: &mut WriteCtx<'_>,
    params: &FetchParams,
    candidates: Vec<Job>,
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
             lease_token = ?2, lease_expires_at = ?3, started_at = ?4 \
             WHERE id = ?5 AND state = 'available'",
        )
        .map_err(backend)?;
    let mut jobs = Vec::with_capacity(candidates.len());
    for mut job in candidates {
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
    flow::record_claims(ctx, &jobs)?;
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
        let changed = ctx
            .conn
            .prepare_cached(
                "UPDATE jobs SET state = 'completed', result = ?1, finished_at = ?2, \
                 lease_token = NULL, lease_expires_at = NULL \
                 WHERE id = ?3 AND state = 'running' AND lease_token = ?4",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    result,
                    millis(ctx.now),
                    lease.id.to_string(),
                    lease.lease_token.to_string()
                ])
            })
            .map_err(backend)?;
        if changed == 1 {
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
        {
            ctx.wake = true;
        }
    }
    Ok(out)
}

/// The queue of a running job still held under `lease`; `None` when the lease was lost.
fn held_in_queue(ctx: &WriteCtx<'_>, lease: &LeaseRef) -> StoreResult<Option<String>> {
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
    let mut stmt = ctx
        .conn
        .prepare_cached(&format!(
            "UPDATE jobs SET state = ?1, run_at = COALESCE(?2, run_at), finished_at = ?3, \
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
                id
            ],
            rows::job,
        )
        .map_err(backend)?;
    drop(stmt);
    ctx.count_move(&job.queue, Some(JobState::Running), Some(job.state));
    Ok(job)
}

/// The attempt counters of a running job still held under `lease`, or `LeaseLost`.
fn held(ctx: &WriteCtx<'_>, lease: &LeaseRef) -> StoreResult<(u32, u32)> {
    ctx.conn
        .prepare_cached(
            "SELECT attempt, max_attempts FROM jobs \
             WHERE id = ?1 AND state = 'running' AND lease_token = ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![lease.id.to_string(), lease.lease_token.to_string()],
                |row| Ok((row.get(0)?, row.get(1)?)),
            )
            .optional()
        })
        .map_err(backend)?
        .ok_or(StoreError::LeaseLost(lease.id))
}

pub(crate) fn fail(ctx: &mut WriteCtx<'_>, params: FailParams) -> StoreResult<Job> {
    let (attempt, max_attempts) = held(ctx, &params.lease)?;
    let lease_id = params.lease.id.to_string();
    let (error, retry_at) = params.failure(ctx.now, attempt);
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
    let expired: Vec<(String, u32, u32, Option<String>)> = ctx
        .conn
        .prepare_cached(
            "SELECT id, attempt, max_attempts, lease_worker FROM jobs \
             WHERE state = 'running' AND lease_expires_at <= ?1 \
             ORDER BY lease_expires_at LIMIT ?2",
        )
        .and_then(|mut stmt| {
            stmt.query_map(params![millis(ctx.now), params.limit as i64], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?))
            })?
            .collect()
        })
        .map_err(backend)?;
    let mut report = RescueReport::default();
    for (id, attempt, max_attempts, worker) in expired {
        let error = ErrorRecord::lease_expired(attempt, ctx.now, worker.as_deref());
        let retry_at = Some(params.retry.next_run_at(ctx.now, attempt));
        let job = record_failure(ctx, &id, attempt, max_attempts, error, retry_at)?;
        report.add(&job);
    }
    Ok(report)
}

pub(crate) fn cancel(ctx: &mut WriteCtx<'_>, id: Uuid) -> StoreResult<Job> {
    let key = id.to_string();
    let job = job_by_id(ctx, &key)?.ok_or(StoreError::NotFound(id))?;
    if job.state.is_finished() {
        return Err(StoreError::Conflict {
            id,
            state: job.state,
            action: "cancel",
        });
    }
    let cancelled = ctx
        .conn
        .prepare_cached(&format!(
            "UPDATE jobs SET state = 'cancelled', finished_at = ?1, \
             lease_token = NULL, lease_expires_at = NULL WHERE id = ?2 RETURNING {COLUMNS}"
        ))
        .and_then(|mut stmt| stmt.query_row(params![millis(ctx.now), key], rows::job))
        .map_err(backend)?;
    ctx.count_move(&job.queue, Some(job.state), Some(JobState::Cancelled));
    Ok(cancelled)
}

pub(crate) fn dead_replay(ctx: &mut WriteCtx<'_>, selector: &ReplaySelector) -> StoreResult<u64> {
    let now = millis(ctx.now);
    let queues: Vec<String> = match &selector.ids {
        Some(ids) => {
            let mut stmt = ctx
                .conn
                .prepare_cached(
                    "UPDATE jobs SET state = 'available', attempt = 0, run_at = ?1, \
                     finished_at = NULL, result = NULL WHERE id = ?2 AND state = 'dead' \
                     RETURNING queue",
                )
                .map_err(backend)?;
            let mut queues = Vec::new();
            for id in ids {
                let queue: Option<String> = stmt
                    .query_row(params![now, id.to_string()], |row| row.get(0))
                    .optional()
                    .map_err(backend)?;
                queues.extend(queue);
            }
            queues
        }
        None => ctx
            .conn
            .prepare_cached(
                "UPDATE jobs SET state = 'available', attempt = 0, run_at = ?1, \
                 finished_at = NULL, result = NULL WHERE state = 'dead' \
                 AND (?2 IS NULL OR queue = ?2) AND (?3 IS NULL OR kind = ?3) RETURNING queue",
            )
            .and_then(|mut stmt| {
                stmt.query_map(params![now, selector.queue, selector.kind], |row| {
                    row.get(0)
                })?
                .collect()
            })
            .map_err(backend)?,
    };
    for queue in &queues {
        ctx.count_move(queue, Some(JobState::Dead), Some(JobState::Available));
    }
    let replayed = queues.len() as u64;
    if replayed > 0 {
        ctx.wake = true;
    }
    Ok(replayed)
}

pub(crate) fn dead_discard(ctx: &mut WriteCtx<'_>, id: Uuid) -> StoreResult<bool> {
    let queue: Option<String> = ctx
        .conn
        .prepare_cached("DELETE FROM jobs WHERE id = ?1 AND state = 'dead' RETURNING queue")
        .and_then(|mut stmt| {
            stmt.query_row(params![id.to_string()], |row| row.get(0))
                .optional()
        })
        .map_err(backend)?;
    if let Some(queue) = &queue {
        ctx.count_move(queue, Some(JobState::Dead), None);
    }
    Ok(queue.is_some())
}

pub(crate) fn import(ctx: &mut WriteCtx<'_>, jobs: Vec<Job>) -> StoreResult<u64> {
    let mut imported = 0;
    for job in jobs {
        let lease = job.lease.as_ref();
        let payload = json_text(&job.payload, "payload")?;
        let tags = json_text(&job.tags, "tags")?;
        let errors = json_text(&job.errors, "errors")?;
        let result = job
            .result
            .as_ref()
            .map(|r| json_text(r, "result"))
            .transpose()?;
        let changed = ctx
            .conn
            .prepare_cached(&format!(
                "INSERT INTO jobs ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, \
                 ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22) \
                 ON CONFLICT (id) DO NOTHING"
            ))
            .and_then(|mut stmt| {
                stmt.execute(rusqlite::params![
                    job.id.to_string(),
                    job.kind,
                    job.queue,
                    payload,
                    job.priority,
                    millis(job.run_at),
                    job.attempt,
                    job.max_attempts,
                    job.timeout_ms.map(|ms| ms.min(i64::MAX as u64) as i64),
                    job.idempotency_key,
                    tags,
                    job.tenant,
                    job.state.as_str(),
                    errors,
                    lease.map(|l| l.worker_id.clone()),
                    lease.map(|l| l.token.to_string()),
                    lease.map(|l| millis(l.expires_at)),
                    result,
                    millis(job.created_at),
                    job.started_at.map(millis),
                    job.finished_at.map(millis),
                    job.unique_key,
                ])
            })
            .map_err(backend)?;
        if changed == 1 {
            ctx.count_move(&job.queue, None, Some(job.state));
            if matches!(job.state, JobState::Available) {
                ctx.wake = true;
            }
            imported += 1;
        }
    }
    Ok(imported)
}

/// The one leadership role maintenance uses.
const MAINTENANCE_ROLE: &str = "maintenance";

pub(crate) fn leader_try_acquire(
    ctx: &mut WriteCtx<'_>,
    holder: &str,
    ttl: std::time::Duration,
) -> StoreResult<bool> {
    let expires = millis(clock::after(ctx.now, ttl));
    // Take the role if it is free, expired, or already ours; otherwise leave it.
    let current: String = ctx
        .conn
        .prepare_cached(
            "INSERT INTO leadership (name, holder, expires_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, \
             expires_at = excluded.expires_at \
             WHERE leadership.holder = excluded.holder OR leadership.expires_at <= ?4 \
             RETURNING holder",
        )
        .and_then(|mut stmt| {
            stmt.query_row(
                params![MAINTENANCE_ROLE, holder, expires, millis(ctx.now)],
                |row| row.get(0),
            )
            .optional()
        })
        .map_err(backend)?
        .unwrap_or_default();
    Ok(current == holder)
}

pub(crate) fn leader_release(ctx: &mut WriteCtx<'_>, holder: &str) -> StoreResult<()> {
    ctx.conn
        .prepare_cached("DELETE FROM leadership WHERE name = ?1 AND holder = ?2")
        .and_then(|mut stmt| stmt.execute(params![MAINTENANCE_ROLE, holder]))
        .map_err(backend)?;
    Ok(())
}

const UNFINISHED: [JobState; 4] = [
    JobState::Scheduled,
    JobState::Available,
    JobState::Running,
    JobState::Retryable,
];

/// Refuses the whole batch when it would take a queue, or a tenant's share of one, past its
/// configured maximum depth. Queues without limits cost one in-memory lookup.
fn check_depth_limits(ctx: &WriteCtx<'_>, jobs: &[NewJob]) -> StoreResult<()> {
    let depth_limited = |queue: &str| {
        ctx.settings
            .get(queue)
            .is_some_and(|s| s.max_depth.is_some() || s.max_depth_per_tenant.is_some())
    };
    if !jobs.iter().any(|job| depth_limited(&job.queue)) {
        return Ok(());
    }
    // A duplicate adds nothing: it returns the existing job, so it never counts.
    let duplicates = unique::duplicates(ctx, jobs, |key| {
        idempotent_match(ctx, key).map(|found| found.is_some())
    })?;
    let limits = |queue: &str| {
        ctx.settings
            .get(queue)
            .map(|s| (s.max_depth, s.max_depth_per_tenant))
    };
    let counted = jobs
        .iter()
        .enumerate()
        .filter(|(index, _)| !duplicates.contains(index))
        .map(|(_, job)| (job.queue.as_str(), job.tenant.as_deref()));
    let demand = planner::depth_demand(counted, limits);
    planner::depth_verdict(&demand, |queue, tenant| match tenant {
        None => queue_depth(ctx, queue),
        Some(tenant) => {
            let depth: i64 = ctx
                .conn
                .prepare_cached(
                    "SELECT COUNT(*) FROM jobs WHERE queue = ?1 AND tenant = ?2 \
                     AND tenant IS NOT NULL \
                     AND state IN ('scheduled', 'available', 'running', 'retryable')",
                )
                .and_then(|mut stmt| stmt.query_row(params![queue, tenant], |row| row.get(0)))
                .map_err(backend)?;
            Ok(depth.max(0) as u64)
        }
    })
}

/// Unfinished jobs in `queue`.
fn queue_depth(ctx: &WriteCtx<'_>, queue: &str) -> StoreResult<u64> {
    queue_count(ctx, queue, &UNFINISHED)
}

/// Jobs of `queue` in `states`: the stored counts plus this round's changes not yet written.
pub(crate) fn queue_count(
    ctx: &WriteCtx<'_>,
    queue: &str,
    states: &[JobState],
) -> StoreResult<u64> {
    let mut stmt = ctx
        .conn
        .prepare_cached("SELECT n FROM queue_state_counts WHERE queue = ?1 AND state = ?2")
        .map_err(backend)?;
    let mut total: i64 = 0;
    for state in states {
        let stored: Option<i64> = stmt
            .query_row(params![queue, state.as_str()], |row| row.get(0))
            .optional()
            .map_err(backend)?;
        total += stored.unwrap_or(0);
    }
    let pending: i64 = ctx
        .counts
        .iter()
        .filter(|(q, state, _)| q == queue && states.contains(state))
        .map(|(_, _, delta)| delta)
        .sum();
    Ok((total + pending).max(0) as u64)
}

pub(crate) fn queue_settings_put(
    ctx: &mut WriteCtx<'_>,
    queue: &str,
    settings: QueueSettings,
) -> StoreResult<QueueSettings> {
    let as_sql = |n: Option<u64>| n.map(|n| n.min(i64::MAX as u64) as i64);
    let rate_count = |rate: Option<RateLimit>| as_sql(rate.map(|r| r.count));
    let rate_period = |rate: Option<RateLimit>| as_sql(rate.map(|r| r.period_ms));
    ctx.conn
        .prepare_cached(
            "INSERT INTO queue_settings (queue, paused, max_depth, max_depth_per_tenant, \
             concurrency_limit, per_key_concurrency_limit, rate_count, rate_period_ms, \
             per_key_rate_count, per_key_rate_period_ms, weight, completed_retention_secs, \
             dead_retention_secs) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13) \
             ON CONFLICT (queue) DO UPDATE SET \
             paused = excluded.paused, max_depth = excluded.max_depth, \
             max_depth_per_tenant = excluded.max_depth_per_tenant, \
             concurrency_limit = excluded.concurrency_limit, \
             per_key_concurrency_limit = excluded.per_key_concurrency_limit, \
             rate_count = excluded.rate_count, rate_period_ms = excluded.rate_period_ms, \
             per_key_rate_count = excluded.per_key_rate_count, \
             per_key_rate_period_ms = excluded.per_key_rate_period_ms, \
             weight = excluded.weight, \
             completed_retention_secs = excluded.completed_retention_secs, \
             dead_retention_secs = excluded.dead_retention_secs",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![
                queue,
                settings.paused,
                as_sql(settings.max_depth),
                as_sql(settings.max_depth_per_tenant),
                as_sql(settings.concurrency_limit),
                as_sql(settings.per_key_concurrency_limit),
                rate_count(settings.rate_limit),
                rate_period(settings.rate_limit),
                rate_count(settings.per_key_rate_limit),
                rate_period(settings.per_key_rate_limit),
                settings.weight,
                as_sql(settings.completed_retention_secs),
                as_sql(settings.dead_retention_secs),
            ])
        })
        .map_err(backend)?;
    let was_paused = ctx.settings.get(queue).is_some_and(|s| s.paused);
    if was_paused && !settings.paused {
        // Resumed: its jobs are fetchable again.
        ctx.wake = true;
    }
    ctx.settings.insert(queue.to_string(), settings.clone());
    Ok(settings)
}
