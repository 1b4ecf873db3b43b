//! Vacuuming the jobs table when the server's autovacuum is off.
//!
//! Every claim and completion leaves a dead row version, and dead `jobs_fetch` entries sit
//! exactly where the next claim starts its ordered scan: unvacuumed, a 1,000,000-job backlog
//! drains at a sixth of the speed (docs/benchmarks.md, "PostgreSQL at depth"). Migration 12
//! tunes autovacuum for the table, which helps only where autovacuum runs. Where it is off
//! (`SHOW autovacuum`), the maintenance leader vacuums the table itself once enough of it is
//! dead, on a task of its own so that lease rescue never waits for it.

use conveyor_core::{StoreError, StoreResult};
use sqlx::PgPool;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::errors::db;
use crate::names::quoted;

/// Dead rows that make a vacuum worth it: this many, or a hundredth of the live ones.
const MIN_DEAD_ROWS: i64 = 1000;

pub(crate) struct SelfVacuum {
    schema: String,
    /// A vacuum is running; the next one waits for it to end.
    running: Arc<AtomicBool>,
}

impl SelfVacuum {
    /// `Some` when the server's autovacuum is off (or cannot be read: vacuuming then is the
    /// safe side, it only costs a statistics read per pass).
    pub(crate) async fn needed(pool: &PgPool, schema: &str) -> Option<Self> {
        let setting: Result<String, sqlx::Error> =
            sqlx::query_scalar("SHOW autovacuum").fetch_one(pool).await;
        let off = setting.map_or(true, |value| value != "on");
        if off {
            tracing::info!(
                schema,
                "PostgreSQL autovacuum is off: Conveyor vacuums its jobs table itself"
            );
        }
        off.then(|| Self {
            schema: schema.to_string(),
            running: Arc::new(AtomicBool::new(false)),
        })
    }

    /// Starts `VACUUM (ANALYZE)` of the jobs table when enough of it is dead and no vacuum is
    /// running; returns at once.
    pub(crate) async fn run_if_due(&self, pool: &PgPool) -> StoreResult<()> {
        if self.running.load(Ordering::Acquire) {
            return Ok(());
        }
        let counts: Option<(i64, i64)> = sqlx::query_as(
            "SELECT n_dead_tup, n_live_tup FROM pg_stat_user_tables \
             WHERE schemaname = $1 AND relname = 'jobs'",
        )
        .bind(&self.schema)
        .fetch_optional(pool)
        .await
        .map_err(db("read the jobs table's statistics"))?;
        let Some((dead, live)) = counts else {
            return Ok(());
        };
        if dead < MIN_DEAD_ROWS.max(live / 100) {
            return Ok(());
        }
        if self.running.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let running = self.running.clone();
        let pool = pool.clone();
        // VACUUM cannot run in a transaction block: the simple query protocol, not a prepared
        // statement. The schema name was validated when the store was built.
        let statement = crate::sql::stmt(format!("VACUUM (ANALYZE) {}.jobs", quoted(&self.schema)));
        tokio::spawn(async move {
            let outcome: Result<_, StoreError> = sqlx::raw_sql(statement)
                .execute(&pool)
                .await
                .map_err(db("vacuum the jobs table"));
            match outcome {
                Ok(_) => tracing::debug!(dead, "vacuumed the jobs table"),
                Err(error) => tracing::warn!(%error, "vacuuming the jobs table failed"),
            }
            running.store(false, Ordering::Release);
        });
        Ok(())
    }
}
