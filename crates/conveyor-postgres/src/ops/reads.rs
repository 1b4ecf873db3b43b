//! Reading jobs: one by id, lists, per-queue counts and the next due time.

use super::*;

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
pub(super) enum Bind<'a> {
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
