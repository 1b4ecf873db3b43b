//! Retention: deleting finished jobs past their queue's (or the default) retention, in bounded
//! steps, oldest id first.

use conveyor_core::{uuid_v7_floor, JobState, PruneParams, PruneReport, StoreResult};
use sqlx::{Connection, PgConnection, Row, SqlStr};
use std::str::FromStr;

use crate::ctx::Ctx;
use crate::errors::{corrupt, db};
use crate::names::quoted;
use crate::rows::settings_of;
use crate::sql::stmt;

/// The statements of pruning for one schema.
pub(crate) struct Retention {
    overrides: SqlStr,
    no_seqscan: SqlStr,
    prune: SqlStr,
}

impl Retention {
    pub(crate) fn new(schema: &str) -> Self {
        let jobs = format!("{}.jobs", quoted(schema));
        let settings = format!("{}.queue_settings", quoted(schema));
        Self {
            overrides: stmt(format!(
                "SELECT queue, {} FROM {settings} \
                 WHERE completed_retention_secs IS NOT NULL OR dead_retention_secs IS NOT NULL",
                crate::sql::SETTINGS_COLUMNS
            )),
            no_seqscan: stmt("SET LOCAL enable_seqscan = off".to_string()),
            // Ids in creation order up to `$1`; each job's retention is its queue's, else the
            // default (`$3` dead, `$4` others). Rows another pruner holds are skipped.
            prune: stmt(format!(
                "DELETE FROM {jobs} WHERE id IN ( \
                     SELECT j.id FROM {jobs} j LEFT JOIN {settings} s ON s.queue = j.queue \
                     WHERE j.id < $1 AND j.state IN ('completed', 'cancelled', 'dead', 'expired') \
                     AND j.finished_at < $2 - make_interval(secs => COALESCE( \
                         CASE WHEN j.state IN ('dead', 'expired') THEN s.dead_retention_secs \
                              ELSE s.completed_retention_secs END, \
                         CASE WHEN j.state IN ('dead', 'expired') THEN $3 ELSE $4 END)) \
                     ORDER BY j.id LIMIT $5 \
                     FOR UPDATE OF j SKIP LOCKED) \
                 RETURNING state"
            )),
        }
    }
}

#[cfg(test)]
impl Retention {
    pub(crate) fn prune_statement(&self) -> &str {
        self.prune.as_str()
    }
}

fn secs(d: std::time::Duration) -> i64 {
    i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
}

pub(crate) async fn prune(
    conn: &mut PgConnection,
    ctx: &Ctx<'_>,
    retention: &Retention,
    params: &PruneParams,
) -> StoreResult<PruneReport> {
    let default_completed = secs(params.retention.completed);
    let default_dead = secs(params.retention.dead);
    let overrides = sqlx::query(retention.overrides.clone())
        .fetch_all(&mut *conn)
        .await
        .map_err(db("read retention settings"))?;
    let mut shortest = default_completed.min(default_dead);
    for row in &overrides {
        let settings = settings_of(row)?;
        for secs in [
            settings.completed_retention_secs,
            settings.dead_retention_secs,
        ]
        .into_iter()
        .flatten()
        {
            shortest = shortest.min(i64::try_from(secs).unwrap_or(i64::MAX));
        }
    }
    // No job created after now minus the shortest retention can have expired.
    let bound = uuid_v7_floor(ctx.now - chrono::Duration::seconds(shortest));
    // PostgreSQL cannot estimate a range of uuids (it assumes a third of the table matches
    // `id < $1`), so it chose a sequential scan of the whole table on every pass: 200 ms at
    // 1,000,000 jobs although nothing had expired. The primary key range, walked in id order up
    // to `LIMIT`, is always the right plan here; it is forced for this transaction only.
    let mut tx = conn.begin().await.map_err(db("begin pruning"))?;
    sqlx::query(retention.no_seqscan.clone())
        .execute(&mut *tx)
        .await
        .map_err(db("plan the prune"))?;
    let deleted = sqlx::query(retention.prune.clone())
        .bind(bound)
        .bind(ctx.now)
        .bind(default_dead as f64)
        .bind(default_completed as f64)
        .bind(i64::try_from(params.limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await
        .map_err(db("prune finished jobs"))?;
    tx.commit().await.map_err(db("commit pruning"))?;
    let mut report = PruneReport::default();
    for row in &deleted {
        let state: String = row.try_get("state").map_err(|e| corrupt(e.to_string()))?;
        match JobState::from_str(&state)? {
            JobState::Completed => report.completed += 1,
            JobState::Cancelled => report.cancelled += 1,
            _ => report.dead += 1,
        }
    }
    Ok(report)
}
