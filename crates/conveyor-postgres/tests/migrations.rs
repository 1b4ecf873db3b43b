//! Migrations: concurrent starts, version checks, and bad settings.

mod common;

use conveyor_core::{ManualClock, NewJob, Store, StoreError};
use conveyor_postgres::{migrate, PgOptions, PgStore, SCHEMA_VERSION};
use serde_json::json;
use std::sync::Arc;

async fn recorded_versions(store: &PgStore) -> Vec<i32> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT version FROM \"{}\".schema_migrations ORDER BY version",
        store.schema()
    )))
    .fetch_all(store.pool())
    .await
    .expect("read schema_migrations")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_starting_at_once_on_a_fresh_schema_both_succeed() {
    let schema = common::fresh_schema();
    let _guard = common::DropSchema::new(&schema);
    let clock = Arc::new(ManualClock::default());
    let url = common::database_url();
    let (a, b) = tokio::join!(
        PgStore::connect(&url, common::options(&schema, clock.clone())),
        PgStore::connect(&url, common::options(&schema, clock.clone())),
    );
    let a = a.expect("first store starts");
    let b = b.expect("second store starts");

    let expected: Vec<i32> = (1..=SCHEMA_VERSION as i32).collect();
    assert_eq!(recorded_versions(&a).await, expected, "each migration once");
    assert_eq!(migrate(a.pool(), &schema).await.expect("migrate"), 0);

    let inserted = a
        .jobs_insert_many(vec![NewJob::new("shared", json!({}))])
        .await
        .expect("insert via a");
    let seen = b.job_get(inserted[0].job.id).await.expect("get via b");
    assert_eq!(
        seen,
        Some(inserted[0].job.clone()),
        "one schema, two stores"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_migrate_calls_apply_each_migration_exactly_once() {
    let schema = common::fresh_schema();
    let _guard = common::DropSchema::new(&schema);
    let mut pools = Vec::new();
    for _ in 0..4 {
        pools.push(
            sqlx::postgres::PgPoolOptions::new()
                .max_connections(1)
                .connect(&common::database_url())
                .await
                .expect("connect"),
        );
    }
    let applied = futures::future::join_all(pools.iter().map(|pool| migrate(pool, &schema))).await;
    let applied: Vec<u32> = applied
        .into_iter()
        .map(|r| r.expect("every concurrent migrate succeeds"))
        .collect();
    assert_eq!(
        applied.iter().sum::<u32>(),
        SCHEMA_VERSION,
        "all migrations applied once in total: {applied:?}"
    );
    assert_eq!(
        applied.iter().filter(|n| **n > 0).count(),
        1,
        "one caller did all the work: {applied:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schema_migrated_by_a_newer_conveyor_is_refused() {
    let (store, clock, _guard) = common::fresh_store().await;
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO \"{}\".schema_migrations (version, name) VALUES (999, 'from the future')",
        store.schema()
    )))
    .execute(store.pool())
    .await
    .expect("pretend a newer version ran");

    for run_migrations in [true, false] {
        let options = PgOptions {
            run_migrations,
            ..common::options(store.schema(), clock.clone())
        };
        let err = PgStore::connect(&common::database_url(), options)
            .await
            .err()
            .expect("must refuse");
        let message = err.to_string();
        assert!(message.contains("newer"), "{message}");
        assert!(
            message.contains("999"),
            "names the version found: {message}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_migrations_an_unmigrated_schema_is_a_clear_error() {
    let schema = common::fresh_schema();
    let _guard = common::DropSchema::new(&schema);
    let options = PgOptions {
        run_migrations: false,
        ..common::options(&schema, Arc::new(ManualClock::default()))
    };
    let err = PgStore::connect(&common::database_url(), options)
        .await
        .err()
        .expect("must refuse");
    assert!(err.to_string().contains("run the migrations"), "{err}");

    // Once migrated, the same options connect.
    let pool = sqlx::PgPool::connect(&common::database_url())
        .await
        .expect("connect");
    assert_eq!(
        migrate(&pool, &schema).await.expect("migrate"),
        SCHEMA_VERSION
    );
    let options = PgOptions {
        run_migrations: false,
        ..common::options(&schema, Arc::new(ManualClock::default()))
    };
    PgStore::connect(&common::database_url(), options)
        .await
        .expect("a migrated schema connects without running migrations");
}

#[tokio::test]
async fn bad_schema_names_and_urls_are_rejected_before_connecting() {
    let err = PgStore::connect(
        &common::database_url(),
        PgOptions {
            schema: "jobs; DROP TABLE users".into(),
            ..PgOptions::default()
        },
    )
    .await
    .err()
    .expect("bad schema");
    assert!(
        matches!(err, StoreError::Invalid(ref e) if e.field == "schema"),
        "{err:?}"
    );

    let err = PgStore::connect("postgres://host:notaport/db", PgOptions::default())
        .await
        .err()
        .expect("bad url");
    assert!(
        matches!(err, StoreError::Invalid(ref e) if e.field == "url"),
        "{err:?}"
    );
}

#[tokio::test]
async fn an_unreachable_server_is_a_backend_error_without_the_password() {
    // Port 1 on loopback: nothing listens there, so the connection is refused at once.
    let err = PgStore::connect(
        "postgres://someone:s3cret@127.0.0.1:1/db?connect_timeout=2",
        PgOptions::default(),
    )
    .await
    .err()
    .expect("nothing listens on port 1");
    let message = err.to_string();
    assert!(matches!(err, StoreError::Backend(_)), "{err:?}");
    assert!(message.contains("127.0.0.1:1/db"), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
}
