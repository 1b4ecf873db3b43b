//! The storage upkeep of the maintenance pass. With the server's autovacuum off, the store
//! vacuums its jobs table itself once enough of it is dead (a deep backlog otherwise drains at a
//! fraction of its speed); with autovacuum on, it leaves vacuuming to PostgreSQL. Either way it
//! rebuilds an index that pages kept alive by a few long-lived entries made sparse and growing.

mod common;

use conveyor_core::{CompleteParams, FetchParams, NewJob, PruneParams, RetentionPolicy};
use conveyor_core::{JobStore, LeadershipStore, LeaseStore};
use conveyor_storetest::eventually::eventually_within;
use std::time::Duration;

/// Claims and completes every job of `queue`.
async fn drain(store: &conveyor_postgres::PgStore, queue: &str) {
    loop {
        let claimed = store
            .jobs_fetch(FetchParams {
                worker_id: "w".to_string(),
                queues: vec![queue.to_string()],
                max: 500,
                lease: Duration::from_secs(60),
                kinds: None,
                excluded_kinds: Vec::new(),
            })
            .await
            .expect("fetch");
        if claimed.is_empty() {
            return;
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
}

/// Deletes every job that finished more than a second ago.
async fn prune_finished(store: &conveyor_postgres::PgStore) {
    let retention = RetentionPolicy {
        completed: Duration::from_secs(1),
        dead: Duration::from_secs(1),
    };
    while store
        .jobs_prune(PruneParams {
            retention,
            limit: 10_000,
        })
        .await
        .expect("prune")
        .total()
        > 0
    {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_key_left_sparse_by_long_lived_jobs_is_rebuilt_without_losing_a_job() {
    let (store, clock, _guard) = common::fresh_store().await;
    let pool = store.pool().clone();
    let schema = store.schema().to_string();
    let pkey_bytes = || async {
        sqlx::query_scalar::<_, i64>("SELECT pg_relation_size(format('%I.jobs_pkey', $1::text))")
            .bind(&schema)
            .fetch_one(&pool)
            .await
            .expect("index size")
    };
    let vacuum = format!("VACUUM \"{schema}\".jobs");
    // Seen small and within bounds first, as by a store that has been running.
    store.storage_maintenance().await.expect("first pass");
    // Rounds as a queue lives them: 4,000 jobs, one in twenty of which outlives the rest (a
    // queue nobody works here, as dead jobs kept 14 days are); the others run, finish and are
    // pruned. Each round leaves its pages of the primary key holding a few entries each.
    let mut largest = 0;
    let mut kept = 0;
    for round in 0..30 {
        let jobs: Vec<NewJob> = (0..4000)
            .map(|i| {
                let mut job = NewJob::new("bulk", serde_json::json!({ "round": round, "i": i }));
                if i % 20 == 0 {
                    job.queue = "kept".to_string();
                    kept += 1;
                }
                job
            })
            .collect();
        store.jobs_insert_many(jobs).await.expect("insert");
        drain(&store, "default").await;
        clock.advance(Duration::from_secs(2));
        prune_finished(&store).await;
        // Page and entry counts, as autovacuum (or the store's own vacuum) would record them.
        sqlx::raw_sql(sqlx::AssertSqlSafe(vacuum.clone()))
            .execute(&pool)
            .await
            .expect("vacuum");
        let before = pkey_bytes().await;
        largest = largest.max(before);
        // The rebuild runs on a task of its own, and a pass may first start a vacuum (autovacuum
        // off): a second's worth of passes per round.
        let mut rebuilt = false;
        for _ in 0..20 {
            store.storage_maintenance().await.expect("maintenance");
            if pkey_bytes().await < before / 2 {
                rebuilt = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if rebuilt {
            let after = pkey_bytes().await;
            let counted: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
                "SELECT count(*) FROM \"{schema}\".jobs WHERE queue = 'kept'"
            )))
            .fetch_one(&pool)
            .await
            .expect("count");
            assert_eq!(counted, kept, "every kept job is still there");
            assert!(
                after * 2 < largest,
                "{after} bytes after, {largest} at most before"
            );
            return;
        }
    }
    panic!("the primary key was never rebuilt (largest {largest} bytes)");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_backlogs_index_is_left_alone() {
    let (store, clock, _guard) = common::fresh_store().await;
    let pool = store.pool().clone();
    let schema = store.schema().to_string();
    let vacuum = format!("VACUUM \"{schema}\".jobs");
    let pkey_bytes = || async {
        sqlx::query_scalar::<_, i64>("SELECT pg_relation_size(format('%I.jobs_pkey', $1::text))")
            .bind(&schema)
            .fetch_one(&pool)
            .await
            .expect("index size")
    };
    // A backlog of 20,000, seen within bounds, then worked off and pruned: the primary key is
    // now nearly empty, but its emptied pages are free for the next jobs and it did not grow.
    let jobs: Vec<NewJob> = (0..20_000)
        .map(|i| NewJob::new("bulk", serde_json::json!({ "i": i })))
        .collect();
    store.jobs_insert_many(jobs).await.expect("insert");
    sqlx::raw_sql(sqlx::AssertSqlSafe(vacuum.clone()))
        .execute(&pool)
        .await
        .expect("vacuum");
    store
        .storage_maintenance()
        .await
        .expect("pass within bounds");
    drain(&store, "default").await;
    clock.advance(Duration::from_secs(2));
    prune_finished(&store).await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(vacuum))
        .execute(&pool)
        .await
        .expect("vacuum");
    let before = pkey_bytes().await;
    for _ in 0..20 {
        store.storage_maintenance().await.expect("maintenance");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(pkey_bytes().await, before, "not rebuilt");
}

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
    drain(&store, "default").await;
    vacuumed_by_the_store(&store, &autovacuum, "jobs").await;
}

/// With autovacuum off, maintenance passes until the store has vacuumed `table`; with it on,
/// a pass leaves the table to PostgreSQL.
async fn vacuumed_by_the_store(store: &conveyor_postgres::PgStore, autovacuum: &str, table: &str) {
    let pool = store.pool().clone();
    let last_vacuum = || async {
        sqlx::query_scalar::<_, Option<chrono::DateTime<chrono::Utc>>>(
            "SELECT last_vacuum FROM pg_stat_user_tables \
             WHERE schemaname = $1 AND relname = $2",
        )
        .bind(store.schema())
        .bind(table)
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
            "no manual vacuum of {table} with autovacuum on"
        );
        return;
    }
    // Statistics reach pg_stat_user_tables within about a second: pass until the vacuum ran.
    eventually_within(
        &format!("the maintenance pass to vacuum {table}"),
        Duration::from_secs(30),
        || async {
            if let Some(at) = last_vacuum().await {
                return Some(at);
            }
            store.storage_maintenance().await.expect("maintenance");
            None
        },
    )
    .await;
}

/// A flow's step rows change in place (HOT updates, migration 15), but pruning finished flows
/// deletes them: with autovacuum off the store vacuums the flow tables too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_vacuums_its_flow_tables_when_autovacuum_is_off() {
    use conveyor_core::workflow::{NewFlow, ValidFlow};
    use conveyor_core::FlowStore;
    let (store, clock, _guard) = common::fresh_store().await;
    let pool = store.pool().clone();
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(&pool)
        .await
        .expect("autovacuum setting");
    // 400 chains of 3 steps run to the end and pruned: 1,200 dead step rows.
    for _ in 0..400 {
        let flow = NewFlow::chain(
            ["a", "b", "c"].map(|name| (name, NewJob::new("step", serde_json::json!({})))),
        );
        store
            .flow_create(ValidFlow::new(flow).expect("valid"))
            .await
            .expect("create");
    }
    drain(&store, "default").await;
    clock.advance(Duration::from_secs(2));
    let retention = RetentionPolicy {
        completed: Duration::from_secs(1),
        dead: Duration::from_secs(1),
    };
    let pruned = store
        .flows_prune(PruneParams {
            retention,
            limit: 10_000,
        })
        .await
        .expect("prune flows");
    assert_eq!(pruned, 400, "every finished flow pruned");
    vacuumed_by_the_store(&store, &autovacuum, "flow_steps").await;
}

/// Audit retention deletes the log's oldest entries; with autovacuum off their space is reused
/// only once the store vacuums the log (a soak's log otherwise grew with every entry written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_vacuums_its_audit_log_when_autovacuum_is_off() {
    use conveyor_core::access::{Actor, NewAuditEntry};
    use conveyor_core::{AccessStore, AuditAction, AuditCutoff};
    let (store, clock, _guard) = common::fresh_store().await;
    let pool = store.pool().clone();
    let autovacuum: String = sqlx::query_scalar("SHOW autovacuum")
        .fetch_one(&pool)
        .await
        .expect("autovacuum setting");
    // 1,500 entries, all past a one-second retention and pruned: 1,500 dead rows.
    for _ in 0..1500 {
        store
            .audit_append(NewAuditEntry::new(
                Actor::anonymous(),
                AuditAction::JobEnqueue,
            ))
            .await
            .expect("append");
    }
    clock.advance(Duration::from_secs(2));
    let mut pruned = 0;
    loop {
        let batch = store
            .audit_prune(AuditCutoff::OlderThan(Duration::from_secs(1)), 1000)
            .await
            .expect("prune");
        pruned += batch;
        if batch < 1000 {
            break;
        }
    }
    assert_eq!(pruned, 1500, "every entry past its retention");
    vacuumed_by_the_store(&store, &autovacuum, "audit_log").await;
}
