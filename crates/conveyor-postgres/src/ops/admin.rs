//! Operator actions on jobs: cancel, dead-letter replay and discard, import from another store.

use super::*;

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
