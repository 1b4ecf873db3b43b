//! With the server's autovacuum off, the store vacuums its jobs table itself from the
//! maintenance pass once enough of it is dead (a deep backlog otherwise drains at a fraction
//! of its speed). With autovacuum on, the pass leaves vacuuming to PostgreSQL.

mod common;

use conveyor_core::{CompleteParams, FetchParams, NewJob, Store};
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_vacuums_its_jobs_table_when_autovacuum_is_off() {
    let (store, _clock, _guard) = common::fresh_store().await;
    let pool = store.pool().clone();
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(&pool)
        .await
        .expect("autovacuum setting");
    // Dead rows: 3,000 jobs inserted, claimed and completed (two dead versions each).
    let jobs: Vec<NewJob> = (0..3000)
        .map(|i| NewJob::new("bulk", serde_json::json!({ "i": i })))
        .collect();
    store.jobs_insert_many(jobs).await.expect("insert");
    loop {
        let claimed = store
            .jobs_fetch(FetchParams {
                worker_id: "w".to_string(),
                queues: vec!["default".to_string()],
                max: 500,
                lease: Duration::from_secs(60),
                kinds: None,
            })
            .await
            .expect("fetch");
        if claimed.is_empty() {
            break;
        }
        let completions = claimed
            .iter()
            .filter_map(|job| job.lease_ref())
            .map(|lease| CompleteParams {
                lease,
                result: None,
            })
            .collect();
        store
            .jobs_complete_many(completions)
            .await
            .expect("complete");
    }
    let last_vacuum = || async {
        sqlx::query_scalar::<_, Option<chrono::DateTime<chrono::Utc>>>(
            "SELECT last_vacuum FROM pg_stat_user_tables \
             WHERE schemaname = $1 AND relname = 'jobs'",
        )
        .bind(store.schema())
        .fetch_optional(&pool)
        .await
        .expect("statistics")
        .flatten()
    };
    if autovacuum == "on" {
        // PostgreSQL's own autovacuum (tuned by migration 12) does it; the pass does nothing.
        store.storage_maintenance().await.expect("no-op");
        assert!(
            last_vacuum().await.is_none(),
            "no manual vacuum with autovacuum on"
        );
        return;
    }
    // Statistics reach pg_stat_user_tables within about a second: pass until the vacuum ran.
    let deadline = Instant::now() + Duration::from_secs(30);
    while last_vacuum().await.is_none() {
        assert!(
            Instant::now() < deadline,
            "the jobs table was never vacuumed"
        );
        store.storage_maintenance().await.expect("maintenance");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
