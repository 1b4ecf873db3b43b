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
    // the primary key (for the cursor and an id prefix) and the partial indexes.
    let mut query = Conditions {
        text: format!("SELECT {COLUMNS} FROM {} WHERE TRUE", sql.jobs),
        binds: Vec::new(),
    };
    if let Some(queue) = &params.queue {
        query.add("queue = $?", [Bind::Text(queue)]);
    }
    if let Some(state) = params.state {
        query.add("state = $?", [Bind::Text(state.as_str())]);
    }
    if let Some(kind) = &params.kind {
        query.add("kind = $?", [Bind::Text(kind)]);
    }
    if let Some(after) = params.after {
        query.add("id < $?", [Bind::Id(after)]);
    }
    if let Some(prefix) = &params.id_prefix {
        // The prefix as the range of ids it can start, so the primary key serves it.
        let (low, high) = id_range(prefix);
        query.add("id BETWEEN $? AND $?", [Bind::Id(low), Bind::Id(high)]);
    }
    if let Some(tag) = &params.tag {
        query.add("tags @> ARRAY[$?]::text[]", [Bind::Text(tag)]);
    }
    if let Some(tenant) = &params.tenant {
        query.add("tenant = $?", [Bind::Text(tenant)]);
    }
    if let Some(sequence) = &params.sequence {
        query.add("sequence_key = $?", [Bind::Text(sequence)]);
    }
    if let Some(at) = params.created_after {
        query.add("created_at >= $?", [Bind::Time(at)]);
    }
    if let Some(at) = params.created_before {
        query.add("created_at < $?", [Bind::Time(at)]);
    }
    for (keys, value) in params.payload_leaves() {
        query.add(
            "(payload #> $?::text[]) = $?::jsonb",
            [Bind::Keys(keys), Bind::Json(value)],
        );
    }
    let Conditions { mut text, binds } = query;
    let limit_at = binds.len() + 1;
    text.push_str(&format!(" ORDER BY id DESC LIMIT ${limit_at}"));
    let mut query = sqlx::query(AssertSqlSafe(text));
    for bind in binds {
        query = match bind {
            Bind::Text(value) => query.bind(value),
            Bind::Id(value) => query.bind(value),
            Bind::Time(value) => query.bind(value),
            Bind::Keys(value) => query.bind(value),
            Bind::Json(value) => query.bind(sqlx::types::Json(value)),
        };
    }
    let found = query
        .bind(limit(params.limit))
        .fetch_all(conn)
        .await
        .map_err(db("list jobs"))?;
    rows::jobs(&found)
}

/// A statement's conditions assembled at run time, with their parameters.
struct Conditions<'a> {
    text: String,
    binds: Vec<Bind<'a>>,
}

impl<'a> Conditions<'a> {
    /// Adds ` AND {template}`, each `$?` standing for the next of `binds`.
    fn add<const N: usize>(&mut self, template: &str, binds: [Bind<'a>; N]) {
        let mut parts = template.split("$?");
        self.text.push_str(" AND ");
        self.text.push_str(parts.next().unwrap_or_default());
        for (bind, part) in binds.into_iter().zip(parts) {
            self.binds.push(bind);
            self.text.push_str(&format!("${}{part}", self.binds.len()));
        }
    }
}

/// A parameter of a statement assembled at run time.
pub(super) enum Bind<'a> {
    Text(&'a str),
    Id(Uuid),
    Time(DateTime<Utc>),
    Keys(Vec<String>),
    Json(serde_json::Value),
}

/// The lowest and highest uuid whose text starts with `prefix` (lowercase hex, dashes where a
/// uuid has them; checked by the caller).
fn id_range(prefix: &str) -> (Uuid, Uuid) {
    let digits: String = prefix.chars().filter(|c| *c != '-').collect();
    let pad = |fill: char| {
        let mut hex = digits.clone();
        while hex.len() < 32 {
            hex.push(fill);
        }
        Uuid::parse_str(&hex[..32]).unwrap_or(if fill == '0' {
            Uuid::nil()
        } else {
            Uuid::max()
        })
    };
    (pad('0'), pad('f'))
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

/// The first `limit` available jobs of `kind` in `queue` in claim order.
pub(crate) async fn available_of_kind(
    conn: &mut PgConnection,
    sql: &Sql,
    queue: &str,
    kind: &str,
    limit: usize,
) -> StoreResult<Vec<Job>> {
    let found = sqlx::query(sql.available_of_kind.clone())
        .bind(queue)
        .bind(kind)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(conn)
        .await
        .map_err(db("read a kind's available jobs"))?;
    rows::jobs(&found)
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
