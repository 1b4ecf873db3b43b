//! Vacuuming the jobs table when the server's autovacuum is off.
//!
//! Every claim and completion leaves a dead row version, and dead `jobs_fetch` entries sit
//! exactly where the next claim starts its ordered scan: unvacuumed, a 1,000,000-job backlog
//! drains at a sixth of the speed (docs/benchmarks.md, "PostgreSQL at depth"). Migration 12
//! tunes autovacuum for the table, which helps only where autovacuum runs. Where it is off
//! (`SHOW autovacuum`), the maintenance leader vacuums the table itself once enough of it is
//! dead, on a task of its own so that lease rescue never waits for it.
//!
//! A vacuum reads every index of the table whole, so at depth one pass costs about half a second
//! whatever it removes, while the dead entries it removes cost each claim a little more the longer
//! they stay. Vacuuming back to back spent more than the dead entries did (measured at 1,000,000
//! queued jobs: 47 passes, 28 s of a 49 s drain); after each pass the store therefore rests four
//! times as long as the pass took, which holds vacuuming to a fifth of one backend's time.

use conveyor_core::{StoreError, StoreResult};
use sqlx::PgPool;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::errors::db;
use crate::names::quoted;

/// Dead rows that make a vacuum worth it: this many, or a hundredth of the live ones.
const MIN_DEAD_ROWS: i64 = 1000;
/// After a pass, no other starts for this many times as long as the pass took.
const REST_FACTOR: u32 = 4;

/// What the table's statistics call for.
#[derive(Debug, PartialEq, Eq)]
enum Pass {
    None,
    Vacuum,
    /// Vacuum and refresh the planner's statistics. Only once the rows changed since the last
    /// analysis reach the live rows: `ANALYZE` samples 30,000 random rows, which at depth are
    /// mostly outside PostgreSQL's buffers, and the claim's plans no longer depend on fresh
    /// statistics (see `sql.rs`), only on having some.
    VacuumAnalyze,
}

fn pass_for(dead: i64, live: i64, modified_since_analyze: i64) -> Pass {
    if dead < MIN_DEAD_ROWS.max(live / 100) {
        Pass::None
    } else if modified_since_analyze >= MIN_DEAD_ROWS.max(live) {
        Pass::VacuumAnalyze
    } else {
        Pass::Vacuum
    }
}

/// The statement for a pass. `PARALLEL 0`: parallel index vacuuming finishes a pass sooner by
/// taking cores from the claims and completions it is there to speed up.
fn statement_for(pass: &Pass, schema: &str) -> Option<String> {
    let options = match pass {
        Pass::None => return None,
        Pass::Vacuum => "PARALLEL 0",
        Pass::VacuumAnalyze => "ANALYZE, PARALLEL 0",
    };
    Some(format!("VACUUM ({options}) {}.jobs", quoted(schema)))
}

pub(crate) struct SelfVacuum {
    schema: String,
    /// A vacuum is running; the next one waits for it to end.
    running: Arc<AtomicBool>,
    /// No pass starts before this many milliseconds after `epoch`.
    rest_until_ms: Arc<AtomicU64>,
    epoch: Instant,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
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
            rest_until_ms: Arc::new(AtomicU64::new(0)),
            epoch: Instant::now(),
        })
    }

    /// Starts a vacuum of the jobs table when enough of it is dead, no vacuum is running and the
    /// rest after the last one is over; returns at once.
    pub(crate) async fn run_if_due(&self, pool: &PgPool) -> StoreResult<()> {
        if self.running.load(Ordering::Acquire)
            || millis(self.epoch.elapsed()) < self.rest_until_ms.load(Ordering::Acquire)
        {
            return Ok(());
        }
        let counts: Option<(i64, i64, i64)> = sqlx::query_as(
            "SELECT n_dead_tup, n_live_tup, n_mod_since_analyze FROM pg_stat_user_tables \
             WHERE schemaname = $1 AND relname = 'jobs'",
        )
        .bind(&self.schema)
        .fetch_optional(pool)
        .await
        .map_err(db("read the jobs table's statistics"))?;
        let Some((dead, live, modified)) = counts else {
            return Ok(());
        };
        let pass = pass_for(dead, live, modified);
        // The schema name was validated when the store was built.
        let Some(statement) = statement_for(&pass, &self.schema) else {
            return Ok(());
        };
        if self.running.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let running = self.running.clone();
        let rest_until_ms = self.rest_until_ms.clone();
        let epoch = self.epoch;
        let pool = pool.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            // VACUUM cannot run in a transaction block: the simple query protocol, not a
            // prepared statement.
            let outcome: Result<_, StoreError> = sqlx::raw_sql(crate::sql::stmt(statement))
                .execute(&pool)
                .await
                .map_err(db("vacuum the jobs table"));
            let took = started.elapsed();
            match outcome {
                Ok(_) => tracing::debug!(dead, ?pass, ?took, "vacuumed the jobs table"),
                Err(error) => tracing::warn!(%error, "vacuuming the jobs table failed"),
            }
            let rest = took.saturating_mul(REST_FACTOR);
            rest_until_ms.store(millis(epoch.elapsed() + rest), Ordering::Release);
            running.store(false, Ordering::Release);
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_needs_a_hundredth_of_the_table_dead_and_at_least_a_thousand_rows() {
        assert_eq!(pass_for(999, 0, 0), Pass::None);
        assert_eq!(pass_for(1000, 0, 0), Pass::Vacuum);
        assert_eq!(pass_for(19_999, 2_000_000, 0), Pass::None);
        assert_eq!(pass_for(20_000, 2_000_000, 0), Pass::Vacuum);
    }

    #[test]
    fn statistics_are_refreshed_once_the_changes_reach_the_live_rows() {
        assert_eq!(pass_for(50_000, 2_000_000, 1_999_999), Pass::Vacuum);
        assert_eq!(pass_for(50_000, 2_000_000, 2_000_000), Pass::VacuumAnalyze);
        // A table growing from nothing is analyzed early (and at each doubling after).
        assert_eq!(pass_for(1_000, 500, 1_000), Pass::VacuumAnalyze);
        assert_eq!(pass_for(10, 500, 1_000), Pass::None);
    }

    #[test]
    fn statements_name_the_schema_quoted_and_never_run_in_parallel() {
        // Schema names are validated as plain identifiers before a store is built.
        assert_eq!(statement_for(&Pass::None, "s"), None);
        assert_eq!(
            statement_for(&Pass::Vacuum, "conveyor").as_deref(),
            Some("VACUUM (PARALLEL 0) \"conveyor\".jobs")
        );
        assert_eq!(
            statement_for(&Pass::VacuumAnalyze, "tenant_a").as_deref(),
            Some("VACUUM (ANALYZE, PARALLEL 0) \"tenant_a\".jobs")
        );
    }
}
