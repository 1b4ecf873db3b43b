//! Jobs under lease: promotion of due jobs, the claim, heartbeats, completion, failure, snooze, release and rescue.

use super::*;

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

/// Most jobs one expiry pass moves (the rest wait for the next; a claim never takes them, as
/// it filters on the expiry itself).
pub(crate) const EXPIRE_BATCH: i64 = 1000;

/// Moves waiting jobs (scheduled, available, retryable) whose `expires_at` has come to
/// `expired`. Plain jobs in one statement; a job of a flow in a transaction of its own that
/// locks its flow first and tells it. Returns how many expired.
pub(crate) async fn expire_due(conn: &mut PgConnection, ctx: &Ctx<'_>) -> StoreResult<u64> {
    let plain = sqlx::query(ctx.sql.expire_plain.clone())
        .bind(ctx.now)
        .bind(EXPIRE_BATCH)
        .execute(&mut *conn)
        .await
        .map_err(db("expire jobs"))?
        .rows_affected();
    let flow_jobs = sqlx::query(ctx.sql.expiring_flow_jobs.clone())
        .bind(ctx.now)
        .bind(EXPIRE_BATCH)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("find expiring jobs of flows"))?;
    let mut expired = plain;
    for row in &flow_jobs {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let id: Uuid = row.try_get("id").map_err(read)?;
        let flow_id: Uuid = row.try_get("flow_id").map_err(read)?;
        let mut tx = conn.begin().await.map_err(db("begin flow job expiry"))?;
        workflow::lock_flows(&mut tx, ctx, vec![flow_id]).await?;
        let row = sqlx::query(ctx.sql.expire_flow_job.clone())
            .bind(ctx.now)
            .bind(id)
            .fetch_optional(&mut *tx)
            .await
            .map_err(db("expire a job of a flow"))?;
        if let Some(row) = row {
            let job = rows::job(&row)?;
            workflow::job_finished(&mut tx, ctx, &job).await?;
            expired += 1;
        }
        tx.commit().await.map_err(db("commit flow job expiry"))?;
        ctx.flows_committed();
    }
    Ok(expired)
}

/// Jobs claimed by one fetch, and how many due jobs it promoted first.
pub(crate) struct Fetched {
    pub jobs: Vec<Job>,
    pub promoted: u64,
}

/// Promotes one batch of due jobs, then claims up to `max` available jobs in claim order.
///
/// Queues without limits are claimed from in one statement. That statement refuses
/// (claiming nothing) when a queue of the fetch has limits or tenanted jobs waiting; only then
/// does the fetch take the limited claim (`limits::claim_limited`), and so do the fetches of
/// those queues in the second after (`LimitSql::limited_lately`).
pub(crate) async fn fetch(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    params: &FetchParams,
) -> StoreResult<Fetched> {
    let expires_at = after(ctx.now, params.lease, "lease")?;
    let promoted = promote_due(&mut *conn, ctx, PROMOTE_BATCH).await?;
    if ctx.sql.limits.limited_lately(&params.queues) {
        let jobs = crate::limits::claim_limited(&mut *conn, ctx, params, expires_at).await?;
        return Ok(Fetched { jobs, promoted });
    }
    // A fetch of every kind takes the statement without a kind filter (`sql::KindFilter`).
    // Kinds whose circuit breaker is open; only a fetch of any kind still has them
    // (`validate::fetch` folds them into a fetch's own kinds).
    let excluding = params.kinds.is_none() && !params.excluded_kinds.is_empty();
    let statement = match (params.queues.as_slice(), params.kinds.is_some(), excluding) {
        ([_], true, _) => &ctx.sql.claim_one_queue,
        ([_], false, true) => &ctx.sql.claim_one_queue_except_kinds,
        ([_], false, false) => &ctx.sql.claim_one_queue_any_kind,
        (_, true, _) => &ctx.sql.claim,
        (_, false, true) => &ctx.sql.claim_except_kinds,
        (_, false, false) => &ctx.sql.claim_any_kind,
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
        None if excluding => claim.bind(&params.excluded_kinds),
        None => claim,
    };
    let mut tx = conn
        .begin_with(crate::sql::CLAIM_BEGIN)
        .await
        .map_err(db("begin claim"))?;
    let found = claim.fetch_all(&mut *tx).await.map_err(db("claim jobs"))?;
    tx.commit().await.map_err(db("commit claim"))?;
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
            .map_err(db("check the limits gate"))?;
        if limited {
            ctx.sql.limits.set_limited(&params.queues);
            jobs = crate::limits::claim_limited(&mut *conn, ctx, params, expires_at).await?;
        }
    } else {
        // RETURNING has no order; callers get jobs in the order they were claimed by.
        sort_in_claim_order(&mut jobs);
    }
    Ok(Fetched { jobs, promoted })
}

pub(super) fn sort_in_claim_order(jobs: &mut [Job]) {
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
    // the beats had been applied one after the other. In id order, like every batch that
    // locks running jobs (`in_lock_order`).
    let mut last: BTreeMap<LeaseKey, DateTime<Utc>> = BTreeMap::new();
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

/// Orders a batch of running jobs by id before a statement updates them. A batch statement
/// locks its rows in the order of its arrays (a nested loop over `unnest` probing `jobs_pkey`),
/// so a heartbeat batch and a completion batch sharing two jobs in opposite orders deadlock, and
/// PostgreSQL breaks the tie only after `deadlock_timeout` (1 s), failing one of them: seen at
/// a million-job drain. In one order, one waits for the other instead.
pub(super) fn in_lock_order<T>(batch: &mut [T], id: impl Fn(&T) -> Uuid) {
    batch.sort_by_key(|item| id(item));
}

/// The `(id, token)` pairs returned by a lease-conditional batch statement.
pub(super) fn held_leases(found: Vec<PgRow>) -> StoreResult<HashSet<LeaseKey>> {
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
///
/// Jobs of flows are left out of that statement and completed after it, all of them in one
/// transaction of their own (a savepoint when `conn` is already in one) that locks their flows
/// first, in id order, and moves every flow with a few statements (see `workflow`); the first
/// statement names them, unless the store remembers them as jobs of flows it handed out (see
/// `FlowJobs`: then they skip it). Outside a caller's transaction, an error in that second
/// part leaves the first part's completions applied, as a connection lost right after a commit
/// would: an error says nothing about which applied, and a retry reports those as `LeaseLost`.
pub(crate) async fn complete_many(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    completions: Vec<CompleteParams>,
    handed_out: &FlowJobs,
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
    // Jobs known to be of flows skip the plain statement, which would only name their flows.
    let mut flow_of = handed_out.take(&ids);
    let mut plain: Vec<(Uuid, Uuid, Option<Json<&Value>>)> = ids
        .iter()
        .zip(&tokens)
        .zip(&results)
        .filter(|((id, _), _)| !flow_of.contains_key(id))
        .map(|((id, token), result)| (*id, *token, *result))
        .collect();
    in_lock_order(&mut plain, |(id, _, _)| *id);
    let mut plain_ids = Vec::with_capacity(plain.len());
    let mut plain_tokens = Vec::with_capacity(plain.len());
    let mut plain_results = Vec::with_capacity(plain.len());
    for (id, token, result) in plain {
        plain_ids.push(id);
        plain_tokens.push(token);
        plain_results.push(result);
    }
    let rows = if plain_ids.is_empty() {
        Vec::new()
    } else {
        sqlx::query(ctx.sql.complete.clone())
            .bind(&plain_ids)
            .bind(&plain_tokens)
            .bind(&plain_results)
            .bind(ctx.now)
            .fetch_all(&mut *conn)
            .await
            .map_err(db("complete jobs"))?
    };
    let mut applied = HashSet::with_capacity(rows.len());
    for row in &rows {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let id: Uuid = row.try_get(0).map_err(read)?;
        match row.try_get::<Option<Uuid>, _>(1).map_err(read)? {
            Some(token) => {
                applied.insert((id, token));
            }
            None => {
                if let Some(flow_id) = row.try_get::<Option<Uuid>, _>(2).map_err(read)? {
                    flow_of.insert(id, flow_id);
                }
            }
        }
    }
    if !flow_of.is_empty() {
        // Plain jobs whose lease was lost need nothing more.
        let mut left = Vec::new();
        for ((id, token), result) in ids.iter().zip(&tokens).zip(&results) {
            if flow_of.contains_key(id) {
                left.push((*id, *token, *result));
            }
        }
        applied.extend(complete_flow_jobs(conn, ctx, flow_of, left).await?);
    }
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

/// Jobs of flows this store handed out, with their flows (a job's flow never changes, so what
/// is remembered is never wrong). A completion batch of such jobs goes straight to their flows'
/// transaction, without the plain completion statement, which would only name their flows; a
/// job not remembered (claimed through another server, or forgotten) is found by that
/// statement as before.
#[derive(Default)]
pub(crate) struct FlowJobs(std::sync::Mutex<HashMap<Uuid, Uuid>>);

/// Most jobs of flows remembered; past it the memory starts afresh (a job it no longer knows
/// costs the plain statement, nothing else). Jobs that end otherwise than by completion (a
/// failure, a rescue) stay until then.
const MAX_REMEMBERED_FLOW_JOBS: usize = 100_000;

impl FlowJobs {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<Uuid, Uuid>> {
        // Nothing is left half-written under this lock: a poisoned map is still whole.
        self.0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Remembers the jobs of flows among `jobs`, just handed out.
    pub(crate) fn remember(&self, jobs: &[Job]) {
        if !jobs.iter().any(|job| job.flow.is_some()) {
            return;
        }
        let mut map = self.map();
        for job in jobs {
            if let Some(link) = &job.flow {
                if map.len() >= MAX_REMEMBERED_FLOW_JOBS {
                    map.clear();
                }
                map.insert(job.id, link.flow_id);
            }
        }
    }

    /// The flows of those of `ids` it remembers, forgetting them.
    fn take(&self, ids: &[Uuid]) -> HashMap<Uuid, Uuid> {
        let mut map = self.map();
        if map.is_empty() {
            return HashMap::new();
        }
        ids.iter()
            .filter_map(|id| map.remove(id).map(|flow| (*id, flow)))
            .collect()
    }
}

/// Completes `left`, the completions of jobs of flows (`flow_of`: each one's flow), locking
/// their flows first, and tells the flows in the same transaction. Returns the leases applied.
async fn complete_flow_jobs(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    flow_of: HashMap<Uuid, Uuid>,
    left: Vec<FlowCompletion<'_>>,
) -> StoreResult<HashSet<LeaseKey>> {
    // One transaction for the whole batch, however many flows it touches: it locks them all
    // (in id order, before their jobs: see `workflow`), completes the jobs, and moves every
    // flow with a few statements for all of them together (`workflow::handle_locked`).
    //
    // The wake-ups for the steps it starts are sent after the commit, not in the transaction:
    // PostgreSQL serializes the commits of all transactions that NOTIFY (a database-wide lock
    // held through the commit's WAL flush), so two completion batches, or a batch and a
    // producer, committed one after the other however many cores were free (about a tenth of
    // the flow benchmark's steps/s). Sent after the commit, the wake-up is a one-statement
    // transaction of its own. In a caller's transaction (`complete_tx`) it goes with that one.
    let deferred = std::sync::Mutex::new(BTreeSet::new());
    let ctx = &Ctx {
        deferred_wakeups: Some(&deferred),
        flow_started: ctx.flow_started.clone(),
        ..*ctx
    };
    let mut tx = conn.begin().await.map_err(db("begin flow completion"))?;
    let heads = workflow::lock_heads(&mut tx, ctx, flow_of.into_values().collect()).await?;
    // The flow transaction's planner settings, before the completion: its statement keeps the
    // running check out of the scan of `jobs` (see `complete_flow_jobs` in sql.rs), so that
    // with joins as nested loops only it can only look each job up by key.
    workflow::plan_flow_statements(&mut tx, ctx).await?;
    let mut ids = Vec::with_capacity(left.len());
    let mut tokens = Vec::with_capacity(left.len());
    let mut results = Vec::with_capacity(left.len());
    for (id, token, result) in left {
        ids.push(id);
        tokens.push(token);
        results.push(result);
    }
    let rows = sqlx::query(ctx.sql.complete_flow_jobs.clone())
        .bind(&ids)
        .bind(&tokens)
        .bind(&results)
        .bind(ctx.now)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("complete jobs of flows"))?;
    let mut applied = HashSet::with_capacity(rows.len());
    let mut finished = Vec::with_capacity(rows.len());
    for row in &rows {
        let read = |e: sqlx::Error| corrupt(e.to_string());
        let id: Uuid = row.try_get(0).map_err(read)?;
        applied.insert((id, row.try_get(1).map_err(read)?));
        finished.push((row.try_get::<Uuid, _>(2).map_err(read)?, id));
    }
    // In the batch's order, so the flows see their steps finish as the caller listed them.
    let order: HashMap<Uuid, usize> = ids.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    finished.sort_by_key(|(_, id)| order.get(id).copied());
    let events = finished
        .into_iter()
        .map(|(flow_id, job_id)| {
            let event = FlowEvent::JobFinished {
                job_id,
                state: JobState::Completed,
            };
            (flow_id, event)
        })
        .collect();
    workflow::handle_locked(&mut tx, ctx, heads, events).await?;
    tx.commit().await.map_err(db("commit flow completion"))?;
    ctx.flows_committed();
    let woken: Vec<String> = std::mem::take(
        &mut *deferred
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()),
    )
    .into_iter()
    .collect();
    if let Err(e) = notify(conn, ctx.sql, &woken).await {
        // The completions are stored: the caller must hear they applied. Workers that missed
        // the wake-up find the new steps at their next poll.
        tracing::warn!(error = %e, "could not wake workers for the flow steps just started");
    }
    Ok(applied)
}

/// One completion of a flow's job: id, lease token, result.
type FlowCompletion<'a> = (Uuid, Uuid, Option<Json<&'a Value>>);

/// Records a failed attempt on the job held under `lease`: `retryable` at `retry_at` while
/// attempts remain, else `dead` and finished, and tells the job's flow when it died. `None`
/// when the lease no longer holds.
///
/// A dying job of a flow needs `conn` in a transaction that holds the flow's lock (taken
/// before the job's row: see `workflow`).
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
        .bind(ctx.now)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("record failure"))?;
    let job = row.as_ref().map(rows::job).transpose()?;
    if let Some(job) = &job {
        workflow::job_finished(conn, ctx, job).await?;
    }
    Ok(job)
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
    let flow_id: Option<Uuid> = row.try_get(2).map_err(|e| corrupt(e.to_string()))?;
    let expires_at: Option<DateTime<Utc>> = row.try_get(3).map_err(|e| corrupt(e.to_string()))?;
    let worker: Option<String> = row.try_get(4).map_err(|e| corrupt(e.to_string()))?;
    let started_at: Option<DateTime<Utc>> = row.try_get(5).map_err(|e| corrupt(e.to_string()))?;
    let (attempt, max_attempts) = (attempt.max(0) as u32, max_attempts.max(0) as u32);
    let (mut error, retry_at) = params.failure(ctx.now, attempt);
    error.worker_id = worker;
    error.started_at = started_at;
    // A retry past the expiry finishes the job as well (`record_failure`).
    let dies = retry_at.is_none()
        || attempt >= max_attempts
        || retry_at
            .zip(expires_at)
            .is_some_and(|(at, expiry)| at >= expiry);
    // The update repeats the lease check: a rescue or cancel between the two statements makes
    // it match nothing, which is the same lost lease.
    match flow_id {
        // A dying step tells its flow, in one transaction that locks the flow first.
        Some(flow_id) if dies => {
            let mut tx = conn.begin().await.map_err(db("begin flow failure"))?;
            workflow::lock_flows(&mut tx, ctx, vec![flow_id]).await?;
            let job = record_failure(&mut tx, ctx, lease, attempt, max_attempts, &error, retry_at)
                .await?
                .ok_or(StoreError::LeaseLost(lease.id))?;
            tx.commit().await.map_err(db("commit flow failure"))?;
            ctx.flows_committed();
            Ok(job)
        }
        _ => record_failure(conn, ctx, lease, attempt, max_attempts, &error, retry_at)
            .await?
            .ok_or(StoreError::LeaseLost(lease.id)),
    }
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
    let mut leases = leases.to_vec();
    in_lock_order(&mut leases, |lease| lease.id);
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

/// Records the lost attempt of a running job read as a row with `id`, `lease_token`,
/// `attempt`, `max_attempts`, `lease_worker` and `flow_id`: `retryable` after the policy's backoff, or
/// `dead` when out of attempts, with the error `error_for(attempt, worker)` builds. `None` when
/// its lease changed meanwhile, or when it would die and its flow is busy (see `workflow`).
/// Shared by lease expiry and stale workers; `conn` must be in a transaction.
pub(crate) async fn rescue_row(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    row: &PgRow,
    retry: &conveyor_core::RetryPolicy,
    error_for: impl FnOnce(u32, Option<&str>) -> ErrorRecord,
) -> StoreResult<Option<Job>> {
    let read = |e: sqlx::Error| corrupt(e.to_string());
    let lease = LeaseRef {
        id: row.try_get("id").map_err(read)?,
        lease_token: row.try_get("lease_token").map_err(read)?,
    };
    let attempt = row.try_get::<i32, _>("attempt").map_err(read)?.max(0) as u32;
    let max_attempts = row.try_get::<i32, _>("max_attempts").map_err(read)?.max(0) as u32;
    let worker: Option<String> = row.try_get("lease_worker").map_err(read)?;
    let flow_id: Option<Uuid> = row.try_get("flow_id").map_err(read)?;
    // A step on its last attempt dies and tells its flow, whose lock comes after this job's
    // row here (picked locked): only tried, so this never waits for a flow whose holder may be
    // waiting for this row. A busy flow leaves the job to the next pass.
    let expires_at: Option<DateTime<Utc>> = row.try_get("expires_at").map_err(read)?;
    let retry_at = Some(retry.next_run_at(ctx.now, attempt));
    // A retry past the expiry finishes the job as well (`record_failure`).
    let dies = attempt >= max_attempts
        || retry_at
            .zip(expires_at)
            .is_some_and(|(at, expiry)| at >= expiry);
    if let Some(flow_id) = flow_id {
        if dies && !workflow::try_lock_flow(&mut *conn, ctx, flow_id).await? {
            return Ok(None);
        }
    }
    // The rescued attempt's start, so its history shows how long it held the job.
    let mut error = error_for(attempt, worker.as_deref());
    error.started_at = row.try_get("started_at").map_err(read)?;
    record_failure(conn, ctx, lease, attempt, max_attempts, &error, retry_at).await
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
        let rescued = rescue_row(&mut *conn, ctx, row, &params.retry, |attempt, worker| {
            ErrorRecord::lease_expired(attempt, ctx.now, worker)
        })
        .await?;
        if let Some(job) = rescued {
            report.add(&job);
        }
    }
    Ok(report)
}

/// Records a running job's progress while its lease holds; `LeaseLost` otherwise.
pub(crate) async fn progress(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    lease: LeaseRef,
    progress: &conveyor_core::Progress,
) -> StoreResult<()> {
    let done = sqlx::query(ctx.sql.progress.clone())
        .bind(Json(progress))
        .bind(lease.id)
        .bind(lease.lease_token)
        .execute(conn)
        .await
        .map_err(db("record progress"))?;
    if done.rows_affected() == 1 {
        Ok(())
    } else {
        Err(StoreError::LeaseLost(lease.id))
    }
}
