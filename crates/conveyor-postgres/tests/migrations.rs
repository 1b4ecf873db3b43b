//! Migrations: concurrent starts, version checks, and bad settings.

mod common;

use conveyor_core::{JobStore, LeaseStore, QueueStore};
use conveyor_core::{ManualClock, NewJob, StoreError};
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
    assert!(matches!(err, StoreError::Backend { .. }), "{err:?}");
    assert!(message.contains("127.0.0.1:1/db"), "{message}");
    assert!(!message.contains("s3cret"), "{message}");
}

/// The migrations of schema version 11, the version before the jobs table's vacuum settings.
const VERSION_11: [(&str, &str); 11] = [
    ("jobs", include_str!("../src/migrations/0001_jobs.sql")),
    (
        "leadership",
        include_str!("../src/migrations/0002_leadership.sql"),
    ),
    (
        "queue_settings",
        include_str!("../src/migrations/0003_queue_settings.sql"),
    ),
    (
        "concurrency_limit",
        include_str!("../src/migrations/0004_concurrency_limit.sql"),
    ),
    (
        "schedules",
        include_str!("../src/migrations/0005_schedules.sql"),
    ),
    (
        "unique_jobs",
        include_str!("../src/migrations/0006_unique_jobs.sql"),
    ),
    (
        "flow_control",
        include_str!("../src/migrations/0007_flow_control.sql"),
    ),
    (
        "drop_jobs_running",
        include_str!("../src/migrations/0008_drop_jobs_running.sql"),
    ),
    ("access", include_str!("../src/migrations/0009_access.sql")),
    (
        "workers",
        include_str!("../src/migrations/0010_workers.sql"),
    ),
    (
        "retention",
        include_str!("../src/migrations/0011_retention.sql"),
    ),
];

/// Per state: how many jobs, and a digest of their ids and contents (the columns version 11
/// has; later versions add columns, which old jobs leave NULL).
async fn jobs_digest(pool: &sqlx::PgPool, schema: &str) -> Vec<(String, i64, String)> {
    sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT state, count(*), md5(string_agg(ROW(id, kind, queue, payload, priority, \
             run_at, attempt, max_attempts, timeout_ms, idempotency_key, tags, tenant, state, \
             errors, lease_worker, lease_token, lease_expires_at, result, created_at, \
             started_at, finished_at, unique_key)::text, '|' ORDER BY id)) \
         FROM \"{schema}\".jobs j GROUP BY state ORDER BY state"
    )))
    .fetch_all(pool)
    .await
    .expect("digest the jobs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_populated_version_11_schema_upgrades_without_losing_a_job() {
    let schema = common::fresh_schema();
    let _guard = common::DropSchema::new(&schema);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .connect(&common::database_url())
        .await
        .expect("connect");
    let quoted = format!("\"{schema}\"");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {quoted}; CREATE TABLE {quoted}.schema_migrations (\
             version integer PRIMARY KEY, name text NOT NULL, \
             applied_at timestamptz NOT NULL DEFAULT now())"
    )))
    .execute(&pool)
    .await
    .expect("create the schema");
    for (version, (name, sql)) in (1..).zip(VERSION_11) {
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.replace("@schema@", &quoted)))
            .execute(&pool)
            .await
            .unwrap_or_else(|e| panic!("migration {version} ({name}): {e}"));
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO {quoted}.schema_migrations (version, name) VALUES ($1, $2)"
        )))
        .bind(version)
        .bind(name)
        .execute(&pool)
        .await
        .expect("record the migration");
    }
    // 100,000 jobs, spread over every state, with and without tenants, keys and results.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "INSERT INTO {quoted}.jobs (id, kind, queue, payload, priority, run_at, attempt, \
             max_attempts, timeout_ms, idempotency_key, tags, tenant, state, errors, \
             lease_worker, lease_token, lease_expires_at, result, created_at, started_at, \
             finished_at, unique_key) \
         SELECT gen_random_uuid(), 'kind-' || (i % 3), 'queue-' || (i % 5), \
             jsonb_build_object('i', i), i % 4, now() + (i % 7 - 3) * interval '1 minute', \
             CASE WHEN s.state IN ('scheduled', 'available') THEN 0 ELSE 1 END, 3, \
             CASE WHEN i % 2 = 0 THEN 60000 END, \
             CASE WHEN i % 11 = 0 THEN 'key-' || i END, ARRAY['t' || (i % 4)], \
             CASE WHEN i % 13 = 0 THEN 'tenant-' || (i % 3) END, s.state, \
             CASE WHEN s.state IN ('retryable', 'dead') \
                 THEN '[{{\"message\": \"boom\"}}]'::jsonb ELSE '[]'::jsonb END, \
             CASE WHEN s.state = 'running' THEN 'worker-1' END, \
             CASE WHEN s.state = 'running' THEN gen_random_uuid() END, \
             CASE WHEN s.state = 'running' THEN now() + interval '1 minute' END, \
             CASE WHEN s.state = 'completed' THEN jsonb_build_object('ok', i) END, \
             now() - interval '1 hour', \
             CASE WHEN s.state NOT IN ('scheduled', 'available') THEN now() END, \
             CASE WHEN s.state IN ('completed', 'dead', 'cancelled') THEN now() END, \
             CASE WHEN i % 17 = 0 THEN 'unique-' || i END \
         FROM generate_series(1, 100000) AS i \
         CROSS JOIN LATERAL (SELECT (ARRAY['scheduled', 'available', 'running', \
             'retryable', 'completed', 'dead', 'cancelled'])[i % 7 + 1] AS state) s"
    )))
    .execute(&pool)
    .await
    .expect("populate 100,000 jobs");
    let before = jobs_digest(&pool, &schema).await;
    assert_eq!(before.len(), 7, "every state is populated: {before:?}");
    assert_eq!(before.iter().map(|(_, n, _)| n).sum::<i64>(), 100_000);
    let filenode = || {
        sqlx::query_scalar::<_, i64>(sqlx::AssertSqlSafe(format!(
            "SELECT pg_relation_filenode('{quoted}.jobs')::bigint"
        )))
        .fetch_one(&pool)
    };
    let file_before = filenode().await.expect("the jobs table's file");

    assert_eq!(
        migrate(&pool, &schema).await.expect("upgrade"),
        SCHEMA_VERSION - 11,
        "only the migrations after version 11"
    );
    assert_eq!(
        jobs_digest(&pool, &schema).await,
        before,
        "no job lost or changed"
    );
    // A rewrite (say, a column added with a volatile default) would give the table a new file
    // and hold every job for the copy.
    assert_eq!(
        filenode().await.expect("the jobs table's file"),
        file_before,
        "the upgrade does not rewrite the jobs table"
    );
    let in_flows: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT count(*) FROM {quoted}.jobs WHERE flow_id IS NOT NULL OR flow_step IS NOT NULL \
             OR parents IS NOT NULL OR progress IS NOT NULL"
    )))
    .fetch_one(&pool)
    .await
    .expect("count jobs with workflow columns");
    assert_eq!(
        in_flows, 0,
        "old jobs belong to no flow and report no progress"
    );
    let options: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT unnest(reloptions) FROM pg_class WHERE oid = '{quoted}.jobs'::regclass"
    )))
    .fetch_all(&pool)
    .await
    .expect("read the storage parameters");
    assert!(
        options.contains(&"autovacuum_vacuum_scale_factor=0.01".to_string()),
        "{options:?}"
    );

    // The upgraded store works on the old jobs: it claims available ones and counts them all.
    let clock = Arc::new(ManualClock::default());
    let store = common::connect(&schema, clock).await;
    let claimed = store
        .jobs_fetch(conveyor_core::FetchParams {
            worker_id: "upgraded".to_string(),
            queues: vec!["queue-1".to_string()],
            max: 10,
            lease: std::time::Duration::from_secs(60),
            kinds: None,
            excluded_kinds: Vec::new(),
        })
        .await
        .expect("claim after the upgrade");
    assert_eq!(claimed.len(), 10, "available jobs of queue-1 are claimed");
    let stats = store.queues_stats().await.expect("stats");
    let counted: u64 = stats
        .iter()
        .map(|q| {
            q.available + q.scheduled + q.running + q.retryable + q.completed + q.dead + q.cancelled
        })
        .sum();
    assert_eq!(counted, 100_000, "{stats:?}");
}

/// A store on `schema`, migrated, with a manual clock.
async fn connect(schema: &str) -> PgStore {
    PgStore::connect(
        &common::database_url(),
        common::options(schema, Arc::new(ManualClock::default())),
    )
    .await
    .expect("store starts")
}

/// The names of the sequence release triggers on the schema's jobs table.
async fn release_triggers(store: &PgStore) -> Vec<String> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "SELECT tgname::text FROM pg_trigger \
         WHERE tgrelid = '\"{}\".jobs'::regclass AND tgname LIKE 'jobs_sequence_release%' \
         ORDER BY tgname",
        store.schema()
    )))
    .fetch_all(store.pool())
    .await
    .expect("read the jobs table's triggers")
}

/// Claims every job `queue` lets run now, which must be one, and completes it; its id.
async fn complete_the_only_runnable(store: &PgStore, queue: &str) -> uuid::Uuid {
    let claimed = store
        .jobs_fetch(conveyor_core::FetchParams {
            worker_id: "w".into(),
            queues: vec![queue.to_string()],
            max: 10,
            lease: std::time::Duration::from_secs(60),
            kinds: None,
            excluded_kinds: Vec::new(),
        })
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1, "one runnable job: {claimed:?}");
    let lease = claimed[0].lease_ref().expect("a claimed job has a lease");
    store
        .jobs_complete_many(vec![conveyor_core::CompleteParams {
            lease,
            result: None,
        }])
        .await
        .expect("complete it");
    claimed[0].id
}

/// Plain jobs pay for no sequence release trigger (migration 26): the first job of a sequence
/// arms it, and a job blocked behind the first is released when it completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_job_of_a_sequence_arms_its_release() {
    let schema = common::fresh_schema();
    let _guard = common::DropSchema::new(&schema);
    let store = connect(&schema).await;
    store
        .jobs_insert_many(vec![NewJob::new("plain", json!({}))])
        .await
        .expect("insert a plain job");
    assert!(
        release_triggers(&store).await.is_empty(),
        "no trigger before a job of a sequence"
    );

    let in_sequence = || {
        let mut job = NewJob::new("ordered", json!({}));
        job.queue = "ordered".to_string();
        job.sequence_key = Some(conveyor_core::sequence::SequenceKey {
            key: "payload.account=acme".to_string(),
            on_dead: conveyor_core::sequence::OnDead::Block,
        });
        job
    };
    let inserted = store
        .jobs_insert_many(vec![in_sequence(), in_sequence()])
        .await
        .expect("insert two jobs of one sequence");
    assert_eq!(
        release_triggers(&store).await,
        [
            "jobs_sequence_release_on_delete",
            "jobs_sequence_release_on_update"
        ]
    );
    assert_eq!(inserted[1].job.state, conveyor_core::JobState::Blocked);

    assert_eq!(
        complete_the_only_runnable(&store, "ordered").await,
        inserted[0].job.id,
        "the second waits behind the first"
    );
    let second = store
        .job_get(inserted[1].job.id)
        .await
        .expect("read the second")
        .expect("the second exists");
    assert_eq!(second.state, conveyor_core::JobState::Available);
}

/// Every partial index of `jobs` whose predicate pairs a state test with a NULL test puts the
/// NULL test first (migration 26): PostgreSQL checks each predicate, term by term in the
/// order written, for every row an insert, claim or completion writes, and a plain job fails
/// the NULL test at the cost of reading a flag, where the state test compares text.
#[tokio::test]
async fn partial_indexes_test_their_nulls_before_the_state() {
    let schema = common::fresh_schema();
    let _guard = common::DropSchema::new(&schema);
    let store = connect(&schema).await;
    let predicates: Vec<(String, String)> = sqlx::query_as(sqlx::AssertSqlSafe(format!(
        "SELECT c.relname::text, pg_get_expr(i.indpred, i.indrelid) FROM pg_index i \
         JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = '\"{}\".jobs'::regclass AND i.indpred IS NOT NULL",
        store.schema()
    )))
    .fetch_all(store.pool())
    .await
    .expect("read the jobs table's partial indexes");
    assert!(
        predicates.iter().any(|(name, _)| name == "jobs_fair_turn"),
        "the partial indexes were read: {predicates:?}"
    );
    let misordered: Vec<&(String, String)> = predicates
        .iter()
        .filter(|(_, predicate)| {
            let null_test = predicate.find("IS NOT NULL").or(predicate.find("IS NULL"));
            let state_test = predicate.find("state");
            matches!((null_test, state_test), (Some(null), Some(state)) if state < null)
        })
        .collect();
    assert!(
        misordered.is_empty(),
        "partial indexes testing the state before a NULL: {misordered:?}"
    );
}

/// A job of a sequence stored without `sequence_release_arm`, as a server older than
/// migration 26 still running beside it stores one, arms the release too (the BEFORE INSERT
/// trigger of migration 26): the job blocked behind it is released when it completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_of_a_sequence_stored_by_an_older_server_arms_the_release_too() {
    let schema = common::fresh_schema();
    let _guard = common::DropSchema::new(&schema);
    let store = connect(&schema).await;
    assert!(release_triggers(&store).await.is_empty());
    // The columns an older server writes for a sequence: the holder, then one blocked behind.
    let mut ids = Vec::new();
    for (no, state) in [(1, "available"), (2, "blocked")] {
        let id = uuid::Uuid::now_v7();
        sqlx::query(sqlx::AssertSqlSafe(format!(
            "INSERT INTO \"{}\".jobs (id, kind, queue, payload, priority, run_at, attempt, \
                 max_attempts, tags, state, errors, created_at, sequence_key, sequence_no) \
             VALUES ($1, 'ordered', 'ordered', '{{}}', 0, '2000-01-01', 0, 3, '{{}}', $2, '[]', \
                 '2000-01-01', 'payload.account=acme', $3)",
            store.schema()
        )))
        .bind(id)
        .bind(state)
        .bind(no)
        .execute(store.pool())
        .await
        .expect("insert as an older server does");
        ids.push(id);
    }
    assert_eq!(
        release_triggers(&store).await,
        [
            "jobs_sequence_release_on_delete",
            "jobs_sequence_release_on_update"
        ]
    );

    assert_eq!(
        complete_the_only_runnable(&store, "ordered").await,
        ids[0],
        "only the holder runs"
    );
    let blocked = store
        .job_get(ids[1])
        .await
        .expect("read the blocked job")
        .expect("it exists");
    assert_eq!(blocked.state, conveyor_core::JobState::Available);
}
