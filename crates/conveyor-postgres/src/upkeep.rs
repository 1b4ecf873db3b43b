//! Upkeep of the store's storage (the jobs table, the flow tables workflows rewrite, and the audit
//! log retention deletes from): vacuuming when the server's autovacuum is off, and rebuilding an index that pages kept alive by a few long-lived entries have made sparse.
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
/// An index is sparse once it holds more than this many times the pages its entries need, plus
/// `INDEX_SLACK_PAGES` (tiny indexes are left alone).
const INDEX_SPARSE_FACTOR: f64 = 1.5;
const INDEX_SLACK_PAGES: f64 = 8.0;
/// A sparse index is rebuilt once it grew this many times the size it had when last in bounds.
const INDEX_GROWTH_FACTOR: f64 = 1.2;
/// The share of a leaf page a B-tree fills when built (its default `fillfactor`).
const BTREE_FILL: f64 = 0.9;
const PAGE_BYTES: f64 = 8192.0;

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

/// What a table's statistics call for: a pass once `dead` reaches `MIN_DEAD_ROWS` or the share
/// `1 / dead_share` of the live rows (see `VACUUMED_TABLES` for each table's share).
fn pass_for(dead: i64, live: i64, modified_since_analyze: i64, dead_share: i64) -> Pass {
    if dead < MIN_DEAD_ROWS.max(live / dead_share.max(1)) {
        Pass::None
    } else if modified_since_analyze >= MIN_DEAD_ROWS.max(live) {
        Pass::VacuumAnalyze
    } else {
        Pass::Vacuum
    }
}

/// The tables the store vacuums itself, most urgent first, each with the share of its live rows
/// (`1 / n`) that must be dead before a pass. Every step of a workflow rewrites its
/// `flow_steps` row and every flow event its `flows` row, so with autovacuum off they bloat
/// like `jobs` (one flow bench left 30,000 live and 59,901 dead step rows).
///
/// `jobs` is vacuumed at a hundredth: every claim's ordered index scan steps over the dead
/// entries. The flow tables are read by key only and their changes are HOT updates (migration
/// 15), which add no index entry and whose dead versions the next read of their page prunes;
/// what a pass is for there is deleted flows and the odd version that left its page. A pass
/// reads the whole table (0.1 to 0.25 s at 30,000 steps), so at a hundredth it ran about once a
/// second of a chain drain, an eighth of the server's time in statements (docs/benchmarks.md,
/// "Workflows, fifth round"); at half, the table stays within twice its live size.
///
/// `audit_log` is appended to by every enqueue request and deleted from at its head by
/// retention: unvacuumed, the deleted entries' space is never reused and the table grows by
/// every entry ever written, whatever the retention (a soak at 105 requests a second kept
/// ~3,200 entries and grew 1.8 MB a minute). It is read by key only, so half is soon enough.
const VACUUMED_TABLES: [(&str, i64); 4] = [
    ("jobs", 100),
    ("flow_steps", 2),
    ("flows", 2),
    ("audit_log", 2),
];

/// The statement for a pass over `table`. `PARALLEL 0`: parallel index vacuuming finishes a
/// pass sooner by taking cores from the claims and completions it is there to speed up.
fn statement_for(pass: &Pass, schema: &str, table: &str) -> Option<String> {
    let options = match pass {
        Pass::None => return None,
        Pass::Vacuum => "PARALLEL 0",
        Pass::VacuumAnalyze => "ANALYZE, PARALLEL 0",
    };
    Some(format!("VACUUM ({options}) {}.{table}", quoted(schema)))
}

/// An index whose pages hold much less than they could: more than `INDEX_SPARSE_FACTOR` times the
/// pages its `entries` entries of about `key_bytes` of key each (the columns' average widths)
/// need.
fn index_sparse(pages: f64, entries: f64, key_bytes: f64) -> bool {
    if entries < 0.0 || pages <= INDEX_SLACK_PAGES {
        return false;
    }
    // An index tuple: an 8-byte header and the key, aligned to 8, plus a 4-byte line pointer.
    let entry_bytes = ((8.0 + key_bytes) / 8.0).ceil() * 8.0 + 4.0;
    let needed = (entries * entry_bytes / (PAGE_BYTES * BTREE_FILL)).ceil() + 1.0;
    pages > INDEX_SPARSE_FACTOR * needed + INDEX_SLACK_PAGES
}

/// Whether a sparse index should be rebuilt: it also grew by a fifth since it was last seen in
/// bounds (`baseline_pages`). A rebuild reads the whole table, which for a small index is nothing
/// and for a large one is rare: the bounds keep the index under twice the size it needs.
///
/// Why indexes of a queue grow sparse: the primary key and most indexes are ordered by creation
/// time (UUIDv7) or lease expiry, new entries go to the right and retention deletes from the left,
/// but a few entries in each old page outlive the rest (dead jobs are kept 14 days, completed
/// ones a day). B-tree pages are reclaimed only once wholly empty, so such a page stays, and the
/// index grows with the history of the queue rather than with its contents (the primary key
/// grew 370 kB a minute with 12,000 rows in the soak). VACUUM cannot merge pages; a rebuild can.
/// The growth test leaves a drained backlog's index alone: it is sparse, but its emptied pages
/// are free for the next entries, so it does not grow, and rebuilding it would only be undone.
fn index_needs_rebuild(pages: f64, entries: f64, key_bytes: f64, baseline_pages: f64) -> bool {
    index_sparse(pages, entries, key_bytes) && pages > INDEX_GROWTH_FACTOR * baseline_pages
}

pub(crate) struct Upkeep {
    schema: String,
    /// The server's autovacuum is off: this store vacuums the jobs table itself.
    vacuums: bool,
    /// A vacuum or rebuild is running; the next waits for it to end.
    running: Arc<AtomicBool>,
    /// No vacuum starts before this many milliseconds after `epoch`.
    rest_until_ms: Arc<AtomicU64>,
    /// Each index's pages when last seen within bounds, or first seen (see `index_bloated`).
    baseline_pages: std::sync::Mutex<std::collections::HashMap<String, f64>>,
    epoch: Instant,
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl Upkeep {
    /// Reads whether the server's autovacuum is on (if it cannot be read, this store vacuums:
    /// the safe side, it only costs a statistics read per pass).
    pub(crate) async fn new(pool: &PgPool, schema: &str) -> Self {
        let setting: Result<String, sqlx::Error> =
            sqlx::query_scalar("SHOW autovacuum").fetch_one(pool).await;
        let vacuums = setting.map_or(true, |value| value != "on");
        if vacuums {
            tracing::info!(
                schema,
                "PostgreSQL autovacuum is off: Conveyor vacuums its tables itself"
            );
        }
        Self {
            schema: schema.to_string(),
            vacuums,
            running: Arc::new(AtomicBool::new(false)),
            rest_until_ms: Arc::new(AtomicU64::new(0)),
            baseline_pages: std::sync::Mutex::new(std::collections::HashMap::new()),
            epoch: Instant::now(),
        }
    }

    /// Starts a vacuum of the jobs table when enough of it is dead (autovacuum off), or a
    /// rebuild of a bloated index, when nothing of the kind is running; returns at once.
    pub(crate) async fn run_if_due(&self, pool: &PgPool) -> StoreResult<()> {
        if self.running.load(Ordering::Acquire) {
            return Ok(());
        }
        let now_ms = millis(self.epoch.elapsed());
        if self.vacuums && now_ms >= self.rest_until_ms.load(Ordering::Acquire) {
            if let Some(statement) = self.vacuum_due(pool).await? {
                self.spawn(pool, statement, true);
                return Ok(());
            }
        }
        // One catalog read of about a dozen rows per pass.
        if let Some(statement) = self.rebuild_due(pool).await? {
            self.spawn(pool, statement, false);
        }
        Ok(())
    }

    async fn vacuum_due(&self, pool: &PgPool) -> StoreResult<Option<String>> {
        let counts: Vec<(String, i64, i64, i64)> = sqlx::query_as(
            "SELECT relname::text, n_dead_tup, n_live_tup, n_mod_since_analyze \
             FROM pg_stat_user_tables WHERE schemaname = $1 AND relname = ANY($2)",
        )
        .bind(&self.schema)
        .bind(VACUUMED_TABLES.map(|(table, _)| table).as_slice())
        .fetch_all(pool)
        .await
        .map_err(db("read the tables' statistics"))?;
        // The first table (in VACUUMED_TABLES order) that needs a pass; one pass at a time.
        for (table, dead_share) in VACUUMED_TABLES {
            let Some((_, dead, live, modified)) = counts.iter().find(|row| row.0 == table) else {
                continue;
            };
            // The schema name was validated when the store was built.
            if let Some(statement) = statement_for(
                &pass_for(*dead, *live, *modified, dead_share),
                &self.schema,
                table,
            ) {
                return Ok(Some(statement));
            }
        }
        Ok(None)
    }

    /// `REINDEX INDEX CONCURRENTLY` of the first index of the jobs table that is sparse and still
    /// growing (`index_needs_rebuild`), going by the page and entry counts the last VACUUM
    /// recorded (`pg_class`) and the key columns' average widths (`pg_stats`). Concurrently: the
    /// new index is built beside the old while jobs are claimed and inserted, and swapped in under
    /// a brief lock. A rebuild that failed half-way leaves an invalid `_ccnew` index, which is
    /// dropped first.
    async fn rebuild_due(&self, pool: &PgPool) -> StoreResult<Option<String>> {
        let indexes: Vec<(String, f64, f64, f64, bool, f64)> = sqlx::query_as(
            "SELECT c.relname::text, c.relpages::float8, c.reltuples::float8, \
                 COALESCE((SELECT sum(COALESCE(s.avg_width, 8))::float8 \
                     FROM unnest(i.indkey) AS k(attnum) \
                     JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum \
                     LEFT JOIN pg_stats s ON s.schemaname = n.nspname \
                         AND s.tablename = 'jobs' AND s.attname = a.attname), 16), \
                 i.indisvalid, (pg_relation_size(c.oid) / 8192)::float8 \
             FROM pg_index i \
             JOIN pg_class c ON c.oid = i.indexrelid \
             JOIN pg_class t ON t.oid = i.indrelid \
             JOIN pg_namespace n ON n.oid = t.relnamespace \
             WHERE n.nspname = $1 AND t.relname = 'jobs' \
             ORDER BY c.relname",
        )
        .bind(&self.schema)
        .fetch_all(pool)
        .await
        .map_err(db("read the jobs table's index sizes"))?;
        let schema = quoted(&self.schema);
        if let Some((leftover, ..)) = indexes
            .iter()
            .find(|(name, .., valid, _)| !valid && name.contains("_ccnew"))
        {
            return Ok(Some(format!(
                "DROP INDEX CONCURRENTLY IF EXISTS {schema}.{}",
                quoted(leftover)
            )));
        }
        // A poisoned lock only means another pass panicked mid-update: the map is still usable.
        let mut baselines = self
            .baseline_pages
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let bloated = indexes
            .iter()
            .find(|(name, pages, entries, key_bytes, valid, now)| {
                // Pages and entries are as the last VACUUM that scanned the index counted them (-1
                // entries: never). An index that grew well past that count since is not judged on
                // it: its entries are unknown until the next such VACUUM.
                if !valid || *entries < 0.0 || *now > *pages * 1.1 + 8.0 {
                    return false;
                }
                if !index_sparse(*pages, *entries, *key_bytes) {
                    baselines.insert(name.clone(), *pages);
                    return false;
                }
                let baseline = *baselines.entry(name.clone()).or_insert(*pages);
                index_needs_rebuild(*pages, *entries, *key_bytes, baseline)
            });
        Ok(bloated.map(|(name, pages, entries, ..)| {
            // Measured afresh once rebuilt.
            baselines.remove(name);
            tracing::info!(index = %name, pages, entries,
                "index sparse and growing: rebuilding it concurrently");
            format!("REINDEX INDEX CONCURRENTLY {schema}.{}", quoted(name))
        }))
    }

    /// Runs `statement` on a task of its own; a vacuum's duration sets the rest after it.
    fn spawn(&self, pool: &PgPool, statement: String, is_vacuum: bool) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let running = self.running.clone();
        let rest_until_ms = self.rest_until_ms.clone();
        let epoch = self.epoch;
        let pool = pool.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            // VACUUM and REINDEX CONCURRENTLY cannot run in a transaction block: the simple
            // query protocol, not a prepared statement.
            let outcome: Result<_, StoreError> = sqlx::raw_sql(crate::sql::stmt(statement.clone()))
                .execute(&pool)
                .await
                .map_err(db("keep the jobs table's storage"));
            let took = started.elapsed();
            match outcome {
                Ok(_) => tracing::debug!(%statement, ?took, "storage upkeep done"),
                Err(error) => tracing::warn!(%statement, %error, "storage upkeep failed"),
            }
            if is_vacuum {
                let rest = took.saturating_mul(REST_FACTOR);
                rest_until_ms.store(millis(epoch.elapsed() + rest), Ordering::Release);
            }
            running.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_needs_a_hundredth_of_the_table_dead_and_at_least_a_thousand_rows() {
        assert_eq!(pass_for(999, 0, 0, 100), Pass::None);
        assert_eq!(pass_for(1000, 0, 0, 100), Pass::Vacuum);
        assert_eq!(pass_for(19_999, 2_000_000, 0, 100), Pass::None);
        assert_eq!(pass_for(20_000, 2_000_000, 0, 100), Pass::Vacuum);
    }

    #[test]
    fn the_flow_tables_and_the_audit_log_wait_for_half_their_live_rows_dead() {
        let share = |table: &str| {
            VACUUMED_TABLES
                .iter()
                .find(|(name, _)| *name == table)
                .map(|(_, share)| *share)
        };
        assert_eq!(share("jobs"), Some(100));
        assert_eq!(share("audit_log"), Some(2));
        let steps = share("flow_steps").unwrap_or(0);
        assert_eq!(pass_for(14_999, 30_000, 0, steps), Pass::None);
        assert_eq!(pass_for(15_000, 30_000, 0, steps), Pass::Vacuum);
        // Small tables still wait for a thousand.
        assert_eq!(pass_for(999, 100, 0, steps), Pass::None);
    }

    #[test]
    fn statistics_are_refreshed_once_the_changes_reach_the_live_rows() {
        assert_eq!(pass_for(50_000, 2_000_000, 1_999_999, 100), Pass::Vacuum);
        assert_eq!(
            pass_for(50_000, 2_000_000, 2_000_000, 100),
            Pass::VacuumAnalyze
        );
        // A table growing from nothing is analyzed early (and at each doubling after).
        assert_eq!(pass_for(1_000, 500, 1_000, 100), Pass::VacuumAnalyze);
        assert_eq!(pass_for(10, 500, 1_000, 100), Pass::None);
    }

    #[test]
    fn an_index_is_rebuilt_once_it_is_sparse_and_still_growing() {
        // A uuid key: 28 bytes an entry, ~260 entries a page at 90 % fill, so 12,000 entries
        // need ~47 pages: sparse past 1.5 x 47 + 8 = 78.5.
        assert!(!index_sparse(8.0, 0.0, 16.0), "tiny indexes are left alone");
        assert!(!index_sparse(78.0, 12_000.0, 16.0));
        assert!(index_sparse(80.0, 12_000.0, 16.0));
        // Never vacuumed: no entry count to go by.
        assert!(!index_sparse(10_000.0, -1.0, 16.0));
        // A million entries of a ~90-byte key (jobs_fetch with a long queue name) need ~12,500.
        assert!(!index_sparse(18_000.0, 1_000_000.0, 80.0));
        assert!(index_sparse(20_000.0, 1_000_000.0, 80.0));

        // Sparse and grown from 78 pages when last in bounds: rebuilt past 1.2 x 78.
        assert!(!index_needs_rebuild(90.0, 12_000.0, 16.0, 78.0));
        assert!(index_needs_rebuild(95.0, 12_000.0, 16.0, 78.0));
        // Sparse but not growing (a drained backlog whose emptied pages wait for new entries).
        assert!(!index_needs_rebuild(40_000.0, 1_000.0, 80.0, 39_000.0));
        assert!(index_needs_rebuild(40_000.0, 1_000.0, 80.0, 20_000.0));
    }

    #[test]
    fn statements_name_the_schema_quoted_and_never_run_in_parallel() {
        // Schema names are validated as plain identifiers before a store is built.
        assert_eq!(statement_for(&Pass::None, "s", "jobs"), None);
        assert_eq!(
            statement_for(&Pass::Vacuum, "conveyor", "jobs").as_deref(),
            Some("VACUUM (PARALLEL 0) \"conveyor\".jobs")
        );
        assert_eq!(
            statement_for(&Pass::VacuumAnalyze, "tenant_a", "flow_steps").as_deref(),
            Some("VACUUM (ANALYZE, PARALLEL 0) \"tenant_a\".flow_steps")
        );
    }
}
