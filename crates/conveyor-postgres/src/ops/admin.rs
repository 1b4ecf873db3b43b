//! Operator actions on jobs: cancel, dead-letter replay and discard, import from another store.

use super::*;

/// What [`cancel`] did.
pub(crate) enum CancelOutcome {
    Cancelled(Box<Job>),
    /// The job belongs to this flow, which another transaction holds, perhaps waiting for the
    /// job's row that this one holds: roll back and call again with the flow to lock first.
    FlowBusy(Uuid),
}

/// Cancels an unfinished job, and tells its flow. Must run inside a transaction: the row stays
/// locked between the state check and the change, so the `Conflict` names the state the job
/// really had.
///
/// A flow's lock comes before its jobs' rows (see `workflow`), but the job's flow is known only
/// once its row is read, locked. So the flow is only tried then (`FlowBusy` when taken), and a
/// second call with `flow_first` locks the flow before the row. Plain jobs take one path.
pub(crate) async fn cancel(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    id: Uuid,
    flow_first: Option<Uuid>,
) -> StoreResult<CancelOutcome> {
    if let Some(flow_id) = flow_first {
        workflow::lock_flows(&mut *conn, ctx, vec![flow_id]).await?;
    }
    let row = sqlx::query(ctx.sql.cancel_lock.clone())
        .bind(id)
        .fetch_optional(&mut *conn)
        .await
        .map_err(db("lock job for cancel"))?
        .ok_or(StoreError::NotFound(id))?;
    let read = |e: sqlx::Error| corrupt(e.to_string());
    let state: String = row.try_get("state").map_err(read)?;
    let flow_id: Option<Uuid> = row.try_get("flow_id").map_err(read)?;
    let state = JobState::from_str(&state).map_err(corrupt)?;
    if state.is_finished() {
        return Err(StoreError::Conflict {
            id,
            state,
            action: "cancel",
        });
    }
    if let Some(flow_id) = flow_id {
        if flow_first != Some(flow_id) && !workflow::try_lock_flow(&mut *conn, ctx, flow_id).await?
        {
            return Ok(CancelOutcome::FlowBusy(flow_id));
        }
    }
    let row = sqlx::query(ctx.sql.cancel.clone())
        .bind(ctx.now)
        .bind(id)
        .fetch_one(&mut *conn)
        .await
        .map_err(db("cancel job"))?;
    let job = rows::job(&row)?;
    workflow::job_finished(conn, ctx, &job).await?;
    Ok(CancelOutcome::Cancelled(Box::new(job)))
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
                .fetch_all(&mut *conn)
                .await
        }
        None => {
            sqlx::query(ctx.sql.replay_filter.clone())
                .bind(ctx.now)
                .bind(selector.queue.as_deref())
                .bind(selector.kind.as_deref())
                .bind(&ctx.sql.channel)
                .fetch_all(&mut *conn)
                .await
        }
    }
    .map_err(db("replay dead jobs"))?;
    let mut replayed = changed_count(&found)?;
    // Those statements replay plain jobs only. A selection by ids that replayed every id had
    // no job of a flow; any other may have.
    let all_plain = selector.ids.as_ref().is_some_and(|ids| {
        let distinct: HashSet<&Uuid> = ids.iter().collect();
        replayed >= distinct.len() as u64
    });
    if !all_plain {
        replayed += replay_flow_jobs(conn, ctx, selector).await?;
    }
    Ok(replayed)
}

/// Replays the dead jobs of flows that `selector` selects, in one transaction that locks their
/// flows first and tells each (a replay of the step a flow stopped at resumes it).
async fn replay_flow_jobs(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    selector: &ReplaySelector,
) -> StoreResult<u64> {
    let found = match &selector.ids {
        Some(ids) => {
            sqlx::query(ctx.sql.dead_flow_jobs_ids.clone())
                .bind(ids)
                .fetch_all(&mut *conn)
                .await
        }
        None => {
            sqlx::query(ctx.sql.dead_flow_jobs_filter.clone())
                .bind(selector.queue.as_deref())
                .bind(selector.kind.as_deref())
                .fetch_all(&mut *conn)
                .await
        }
    }
    .map_err(db("find dead jobs of flows"))?;
    if found.is_empty() {
        return Ok(0);
    }
    let read = |e: sqlx::Error| corrupt(e.to_string());
    let mut ids = Vec::with_capacity(found.len());
    let mut flows = Vec::with_capacity(found.len());
    for row in &found {
        ids.push(row.try_get::<Uuid, _>("id").map_err(read)?);
        flows.push(row.try_get::<Uuid, _>("flow_id").map_err(read)?);
    }
    let mut tx = conn.begin().await.map_err(db("begin flow replay"))?;
    workflow::lock_flows(&mut tx, ctx, flows).await?;
    let rows = sqlx::query(ctx.sql.replay_flow_jobs.clone())
        .bind(ctx.now)
        .bind(&ids)
        .fetch_all(&mut *tx)
        .await
        .map_err(db("replay dead jobs of flows"))?;
    let mut queues = BTreeSet::new();
    let mut replayed = Vec::with_capacity(rows.len());
    for row in &rows {
        queues.insert(row.try_get::<String, _>("queue").map_err(read)?);
        replayed.push((
            row.try_get::<Uuid, _>("flow_id").map_err(read)?,
            row.try_get::<Uuid, _>("id").map_err(read)?,
        ));
    }
    let queues: Vec<String> = queues.into_iter().collect();
    notify(&mut tx, ctx.sql, &queues).await?;
    // Each flow's steps in the order they were created (ids are UUIDv7): when several dead
    // steps of a stopped flow are replayed together, the one it stopped at comes first.
    replayed.sort_unstable();
    for (flow_id, job_id) in &replayed {
        let event = FlowEvent::JobReplayed { job_id: *job_id };
        workflow::handle(&mut tx, ctx, *flow_id, event).await?;
    }
    tx.commit().await.map_err(db("commit flow replay"))?;
    ctx.flows_committed();
    Ok(replayed.len() as u64)
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

/// Stores jobs exactly as given (times at the store's millisecond precision), every column,
/// skipping ids that already exist. Returns how many were stored and whether any of them is
/// available. Must run inside a transaction, so that the wake-up is sent only if the import
/// commits.
pub(crate) async fn import(
    conn: &mut PgConnection,
    sql: &Sql,
    jobs: &[Job],
) -> StoreResult<(u64, bool)> {
    let (stored, woken) = store_exactly(&mut *conn, sql, jobs).await?;
    notify(conn, sql, &woken).await?;
    Ok((stored.len() as u64, !woken.is_empty()))
}
