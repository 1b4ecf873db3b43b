//! The hot statements' plans on a table with statistics, as PostgreSQL's generic plans (which
//! it switches to after five executions of a prepared statement) would run them.
//!
//! Each of these once had a generic plan that grew with the table: a completion compared every
//! running job with every item of its batch, the claim hashed the whole table, the prune read
//! the whole table (docs/guide/src/postgresql.md, "How it works"). Plans are read with `EXPLAIN`
//! (not timed), after `ANALYZE` of a table where few jobs are running, the case that misled the
//! planner.

use conveyor_core::{CompleteParams, FetchParams, Job, NewJob};
use conveyor_core::{JobStore, LeaseStore};
use sqlx::Connection;
use std::time::Duration;

use crate::retention::Retention;
use crate::sql::Sql;
use crate::{PgOptions, PgStore};

/// Drops the test's schema when dropped, so a failing test leaves nothing behind either. Drop
/// cannot await: the work runs on a thread of its own with its own runtime.
struct DropSchema(String);

impl Drop for DropSchema {
    fn drop(&mut self) {
        let (url, schema) = (database_url(), self.0.clone());
        let dropped = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                    "DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                )))
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
                Ok(())
            })
        })
        .join();
        if !matches!(dropped, Ok(Ok(()))) {
            eprintln!("could not drop test schema {}", self.0);
        }
    }
}

fn database_url() -> String {
    std::env::var("CONVEYOR_TEST_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".to_string())
}

/// The generic plan of `statement`, executed with `arguments`, as JSON text.
async fn generic_plan(
    conn: &mut sqlx::PgConnection,
    name: &str,
    statement: &str,
    types: &str,
    arguments: &str,
) -> String {
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "PREPARE {name}({types}) AS {statement}"
    )))
    .execute(&mut *conn)
    .await
    .expect("prepare");
    let plan: serde_json::Value = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (FORMAT JSON) EXECUTE {name}({arguments})"
    )))
    .fetch_one(&mut *conn)
    .await
    .expect("explain");
    plan.to_string()
}

/// A store (two connections) in a new schema that is dropped with the guard: the database
/// URL, the schema, the store and the guard.
async fn store_in_new_schema() -> (String, String, PgStore, DropSchema) {
    let url = database_url();
    let schema = format!("conveyor_plans_{}", uuid::Uuid::new_v4().simple());
    let cleanup = DropSchema(schema.clone());
    let store = PgStore::connect(
        &url,
        PgOptions {
            schema: schema.clone(),
            max_connections: 2,
            ..PgOptions::default()
        },
    )
    .await
    .expect("the test database (set CONVEYOR_TEST_PG_URL)");
    (url, schema, store, cleanup)
}

/// A store in a new schema holding 20,000 jobs, `claimed` of them claimed (running).
async fn store_with_claims(url: &str, schema: &str, claimed: usize) -> (PgStore, Vec<Job>) {
    let store = PgStore::connect(
        url,
        PgOptions {
            schema: schema.to_string(),
            max_connections: 4,
            ..PgOptions::default()
        },
    )
    .await
    .expect("the test database (set CONVEYOR_TEST_PG_URL)");
    let jobs: Vec<NewJob> = (0..20_000)
        .map(|i| NewJob::new("plan", serde_json::json!({ "i": i })))
        .collect();
    store.jobs_insert_many(jobs).await.expect("insert");
    let running = claim(&store, claimed).await;
    (store, running)
}

/// Claims `count` jobs of the default queue, 500 at a time.
async fn claim(store: &PgStore, count: usize) -> Vec<Job> {
    let mut running = Vec::new();
    while running.len() < count {
        running.extend(
            store
                .jobs_fetch(FetchParams {
                    worker_id: "w".to_string(),
                    queues: vec!["default".to_string()],
                    max: 500.min(count - running.len()),
                    lease: Duration::from_secs(60),
                    kinds: None,
                    excluded_kinds: Vec::new(),
                })
                .await
                .expect("fetch"),
        );
    }
    running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_statements_keep_their_plans_on_a_table_with_statistics() {
    let url = database_url();
    let schema = format!("conveyor_plans_{}", uuid::Uuid::new_v4().simple());
    let _cleanup = DropSchema(schema.clone());
    // 20,000 jobs; 3,000 claimed and 2,700 of those completed: few running, many finished.
    let (store, claimed) = store_with_claims(&url, &schema, 3000).await;
    let completions = claimed[..2700]
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

    let sql = Sql::new(&schema);
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ANALYZE \"{schema}\".jobs; SET plan_cache_mode = force_generic_plan"
    )))
    .execute(&mut conn)
    .await
    .expect("analyze");
    let claim = generic_plan(
        &mut conn,
        "claim",
        sql.claim_one_queue_any_kind.as_str(),
        "text, bigint, text, timestamptz, timestamptz",
        "'default', 100, 'w', now(), now()",
    )
    .await;
    let claim_kinds = generic_plan(
        &mut conn,
        "claim_kinds",
        sql.claim_one_queue.as_str(),
        "text, bigint, text, timestamptz, timestamptz, text[]",
        "'default', 100, 'w', now(), now(), '{plan}'",
    )
    .await;
    let complete = generic_plan(
        &mut conn,
        "complete",
        sql.complete.as_str(),
        "uuid[], uuid[], jsonb[], timestamptz",
        "'{}', '{}', '{}', now()",
    )
    .await;
    let complete_flow_jobs = generic_plan(
        &mut conn,
        "complete_flow_jobs",
        sql.complete_flow_jobs.as_str(),
        "uuid[], uuid[], jsonb[], timestamptz",
        "'{}', '{}', '{}', now()",
    )
    .await;
    let heartbeat = generic_plan(
        &mut conn,
        "heartbeat",
        sql.heartbeat.as_str(),
        "uuid[], uuid[], timestamptz[]",
        "'{}', '{}', '{}'",
    )
    .await;
    sqlx::raw_sql("SET enable_seqscan = off")
        .execute(&mut conn)
        .await
        .expect("as the prune runs");
    let prune = generic_plan(
        &mut conn,
        "prune",
        Retention::new(&schema).prune_statement(),
        "uuid, timestamptz, float8, float8, bigint",
        "'00000000-0000-0000-0000-000000000000', now(), 1.0, 1.0, 100",
    )
    .await;

    assert!(
        claim.contains("Tid Scan"),
        "claim updates by address: {claim}"
    );
    assert!(
        claim.contains("jobs_fetch") && !claim.contains("Seq Scan") && !claim.contains("Sort"),
        "claim walks jobs_fetch in order: {claim}"
    );
    assert!(
        claim_kinds.contains("Tid Scan")
            && claim_kinds.contains("jobs_fetch")
            && !claim_kinds.contains("Sort"),
        "a claim naming kinds walks jobs_fetch in order too: {claim_kinds}"
    );
    for (name, plan) in [
        ("complete", &complete),
        ("complete_flow_jobs", &complete_flow_jobs),
        ("heartbeat", &heartbeat),
    ] {
        assert!(
            plan.contains("jobs_pkey") && !plan.contains("jobs_lease"),
            "{name} finds its rows by primary key, not among every running job: {plan}"
        );
        assert!(!plan.contains("Seq Scan"), "{name}: {plan}");
    }
    assert!(
        prune.contains("jobs_pkey") && !prune.contains("Seq Scan"),
        "prune walks the primary key range: {prune}"
    );
}

/// The flow statements' reads, as generic plans made while the flow tables are empty and have
/// no statistics (a new schema on a server whose autovacuum is off): such a plan stays cached
/// on its connection while the tables grow, so a read that scanned the table here would scan
/// it whole on every flow event later. Each read must probe the primary key instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_reads_probe_keys_when_planned_on_empty_tables() {
    let (url, schema, _store, _cleanup) = store_in_new_schema().await;
    let sql = Sql::new(&schema);
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql("SET plan_cache_mode = force_generic_plan")
        .execute(&mut conn)
        .await
        .expect("generic plans");
    let heads = generic_plan(
        &mut conn,
        "lock_heads",
        sql.workflow.lock_heads.as_str(),
        "uuid[]",
        "'{}'",
    )
    .await;
    let steps = generic_plan(
        &mut conn,
        "graph_steps",
        sql.workflow.graph_steps.as_str(),
        "uuid[]",
        "'{}'",
    )
    .await;
    let start = generic_plan(
        &mut conn,
        "start_steps",
        sql.workflow.start_steps.as_str(),
        "uuid[], text[]",
        "'{}', '{}'",
    )
    .await;
    assert!(
        heads.contains("flows_pkey") && !heads.contains("Seq Scan"),
        "lock_heads: {heads}"
    );
    assert!(
        steps.contains("flow_steps_pkey") && !steps.contains("Seq Scan"),
        "graph_steps: {steps}"
    );
    // The parents' results: one key lookup each (the update of the starting steps is planned
    // per run in a flow transaction, see `workflow::plan_flow_statements`).
    assert!(
        start.contains("\"Node Type\":\"Limit\"") && start.contains("flow_steps_pkey"),
        "start_steps reads parents by key: {start}"
    );
}

/// The batched completion, planned for its real arguments on a table that has never been
/// analyzed (a new schema, autovacuum off, before the store's own ANALYZE): its filter on
/// `flow_id` once filtered the scan of `jobs`, which made the planner estimate one running job,
/// scan `jobs` and compare every running job with every completion (870 ms a batch). The filter
/// must stay a join filter, and any nested loop must look jobs up by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batched_completion_keeps_its_flow_filter_out_of_the_scan_of_an_unanalyzed_table() {
    let url = database_url();
    let schema = format!("conveyor_plans_{}", uuid::Uuid::new_v4().simple());
    let _cleanup = DropSchema(schema.clone());
    let (_store, claimed) = store_with_claims(&url, &schema, 5000).await;
    let leases: Vec<_> = claimed[..1000]
        .iter()
        .filter_map(|j| j.lease_ref())
        .collect();
    let array = |values: Vec<String>| format!("'{{{}}}'", values.join(","));
    let ids = array(leases.iter().map(|l| l.id.to_string()).collect());
    let tokens = array(leases.iter().map(|l| l.lease_token.to_string()).collect());
    let sql = Sql::new(&schema);
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql("SET plan_cache_mode = force_custom_plan")
        .execute(&mut conn)
        .await
        .expect("custom plans");
    let plan = generic_plan(
        &mut conn,
        "complete_fresh",
        sql.complete.as_str(),
        "uuid[], uuid[], jsonb[], timestamptz",
        &format!("{ids}, {tokens}, '{{}}', now()"),
    )
    .await;
    // A hash join over one scan of `jobs` is linear in the table (and the cost model moves to
    // the key once the table is large); a nested loop is fine only as key lookups.
    // The estimate that misled the planner came from filtering the scan of `jobs` on
    // `flow_id IS NULL` (one row estimated): that filter must stay a join filter.
    let scan_filters_flow = plan
        .split("\"Node Type\":")
        .any(|node| node.contains("\"Filter\":\"((flow_id IS NULL)"));
    assert!(
        !scan_filters_flow,
        "the scan of jobs must not be filtered on flow_id: {plan}"
    );
    // A hash join over one scan of `jobs` is linear in the table (and the cost model moves to
    // the key once the table is large); a nested loop is fine only as key lookups.
    let nested = plan.contains("\"Node Type\":\"Nested Loop\"");
    assert!(
        !nested || plan.contains("jobs_pkey"),
        "the completion must not compare every running job with every completion: {plan}"
    );
}

/// The batched writes of a flow event (`set_steps`, `start_steps`), planned as a flow
/// transaction plans them (`workflow::plan_flow_statements` sets the planner up) on an
/// analyzed table of 5,000 steps, for a batch of 400: each was costed as a hash of the whole steps table (6 ms a
/// completion batch at 5,000 steps, growing with the table) where probing the key costs 3 us a
/// step. They must probe the primary key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_step_writes_probe_keys_on_an_analyzed_table() {
    use conveyor_core::workflow::{NewFlow, ValidFlow};
    use conveyor_core::FlowStore;
    let (url, schema, store, _cleanup) = store_in_new_schema().await;
    let mut flows = Vec::new();
    for _ in 0..1000 {
        let flow = NewFlow::chain(
            ["a", "b", "c", "d", "e"]
                .map(|name| (name, NewJob::new("step", serde_json::json!({})))),
        );
        let created = store
            .flow_create(ValidFlow::new(flow).expect("valid"))
            .await
            .expect("create");
        flows.push(created.id);
    }
    let sql = Sql::new(&schema);
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "ANALYZE \"{schema}\".flow_steps; BEGIN"
    )))
    .execute(&mut conn)
    .await
    .expect("analyze");
    sqlx::query(sql.workflow.custom_plans.clone())
        .execute(&mut conn)
        .await
        .expect("flow planner settings");
    let array = |values: Vec<String>| format!("'{{{}}}'", values.join(","));
    let ids = array(flows[..400].iter().map(|id| id.to_string()).collect());
    let names = array(vec!["b".to_string(); 400]);
    let set = generic_plan(
        &mut conn,
        "set_steps",
        sql.workflow.set_steps.as_str(),
        "uuid[], text[], text[], timestamptz[], int8[], jsonb[]",
        &format!(
            "{ids}, {names}, {}, {}, {}, {}",
            array(vec!["completed".to_string(); 400]),
            array(vec!["2026-01-01T00:00:00Z".to_string(); 400]),
            array(vec!["1".to_string(); 400]),
            array(vec!["NULL".to_string(); 400]),
        ),
    )
    .await;
    let start = generic_plan(
        &mut conn,
        "start_steps",
        sql.workflow.start_steps.as_str(),
        "uuid[], text[]",
        &format!("{ids}, {names}"),
    )
    .await;
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut conn)
        .await
        .expect("rollback");
    for (name, plan) in [("set_steps", &set), ("start_steps", &start)] {
        assert!(
            !plan.contains("Hash Join") && !plan.contains("Seq Scan"),
            "{name} must not read the whole steps table: {plan}"
        );
        assert!(
            plan.contains("flow_steps_pkey"),
            "{name} probes keys: {plan}"
        );
    }
}

/// The completion of a batch's jobs of flows, planned where a completion batch runs it: in the
/// flow transaction, after `workflow::lock_heads` has locked the flows and set the planner up
/// for flow statements (joins as nested loops only). The table was analyzed while no job ran;
/// then 1,000 were claimed, and all of them complete. With the running check a filter of the
/// scan of `jobs` (estimated at one row), the plan scanned the running jobs and compared each
/// with every completion (0.35 to 1 s a batch of 1,000 in the flow benchmark after a drain);
/// it must look each job up by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completion_of_flow_jobs_never_compares_every_running_job_with_every_completion() {
    let url = database_url();
    let schema = format!("conveyor_plans_{}", uuid::Uuid::new_v4().simple());
    let _cleanup = DropSchema(schema.clone());
    let (store, _) = store_with_claims(&url, &schema, 0).await;
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("ANALYZE \"{schema}\".jobs")))
        .execute(&mut conn)
        .await
        .expect("analyze");
    let claimed = claim(&store, 1000).await;
    let leases: Vec<_> = claimed.iter().filter_map(|j| j.lease_ref()).collect();
    let array = |values: Vec<String>| format!("'{{{}}}'", values.join(","));
    let ids = array(leases.iter().map(|l| l.id.to_string()).collect());
    let tokens = array(leases.iter().map(|l| l.lease_token.to_string()).collect());
    let mut tx = conn.begin().await.expect("begin");
    let ctx = store.ctx();
    crate::workflow::lock_heads(&mut tx, &ctx, vec![uuid::Uuid::new_v4()])
        .await
        .expect("lock flows");
    crate::workflow::plan_flow_statements(&mut tx, &ctx)
        .await
        .expect("flow planner settings");
    let plan = generic_plan(
        &mut tx,
        "complete_flow_jobs_locked",
        store.inner.sql.complete_flow_jobs.as_str(),
        "uuid[], uuid[], jsonb[], timestamptz",
        &format!("{ids}, {tokens}, '{{}}', now()"),
    )
    .await;
    tx.rollback().await.expect("rollback");
    assert!(
        !plan.contains("\"Node Type\":\"Seq Scan\"") && plan.contains("jobs_pkey"),
        "the completion must look each job up by key: {plan}"
    );
}

/// No statement of the store is compiled by PostgreSQL's JIT: on a table without statistics the
/// planner's estimates of a flow's steps passed the JIT threshold, and compiling the graph read
/// took 130 ms where running it took 7 (7 s of a 21 s flow benchmark). The store's own
/// connections have it off; a flow transaction turns it off for itself, so that pools given to
/// `from_pool` are covered too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flow_statements_are_never_jit_compiled() {
    let (url, schema, store, _cleanup) = store_in_new_schema().await;
    let jit: String = sqlx::query_scalar("SHOW jit")
        .fetch_one(store.pool())
        .await
        .expect("show jit");
    assert_eq!(jit, "off", "the store's connections never compile");

    let sql = Sql::new(&schema);
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    // JIT for any plan at all, as a pool of the application's own might have it.
    sqlx::raw_sql("SET jit = on; SET jit_above_cost = 0; BEGIN")
        .execute(&mut conn)
        .await
        .expect("settings");
    let graph = sql.workflow.graph_steps.as_str();
    let ids = format!("'{{{}}}'", uuid::Uuid::now_v7());
    let before = generic_plan(&mut conn, "graph_before", graph, "uuid[]", &ids).await;
    sqlx::query(sql.workflow.custom_plans.clone())
        .execute(&mut conn)
        .await
        .expect("flow planner settings");
    let after = generic_plan(&mut conn, "graph_after", graph, "uuid[]", &ids).await;
    let in_transaction: String = sqlx::query_scalar("SELECT current_setting('jit')")
        .fetch_one(&mut conn)
        .await
        .expect("jit setting");
    sqlx::raw_sql("ROLLBACK")
        .execute(&mut conn)
        .await
        .expect("rollback");
    assert_eq!(in_transaction, "off", "a flow transaction turns JIT off");
    // Where the server has JIT at all, the plan before the settings shows it: the control.
    if before.contains("\"JIT\"") {
        assert!(
            !after.contains("\"JIT\""),
            "flow reads are not compiled: {after}"
        );
    }
}

/// Whatever the planner estimates, a claim walks `jobs_fetch` in order and stops after `LIMIT`
/// rows. Estimates did mislead it: at the start of a million-job drain on a new schema (the
/// migrations analyze the jobs table while it is empty), the custom plan expected four rows in
/// the queue and chose a bitmap scan of every available job and a sort, 1.3 s per claim until
/// the first ANALYZE (docs/benchmarks.md, "PostgreSQL at depth from a cold start"). Growing such
/// a table here would take a million rows, so the test misleads the planner the other way the
/// costs can: index pages made dear (`random_page_cost`). Without the claim's transaction
/// (`CLAIM_BEGIN`) the planner then sorts; inside it, it cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_walks_jobs_fetch_in_order_whatever_the_estimates() {
    let (url, schema, store, _cleanup) = store_in_new_schema().await;
    for queue in ["other", "burst"] {
        let jobs: Vec<NewJob> = (0..5_000)
            .map(|i| {
                let mut job = NewJob::new("plan", serde_json::json!({ "i": i }));
                job.queue = queue.to_string();
                job
            })
            .collect();
        store.jobs_insert_many(jobs).await.expect("insert");
    }
    let mut conn = sqlx::PgConnection::connect(&url).await.expect("connect");
    sqlx::raw_sql("SET plan_cache_mode = force_custom_plan; SET random_page_cost = 1000000")
        .execute(&mut conn)
        .await
        .expect("mislead the planner");

    let sql = Sql::new(&schema);
    let statement = sql.claim_one_queue_any_kind.as_str();
    let types = "text, bigint, text, timestamptz, timestamptz";
    let arguments = "'burst', 250, 'w', now(), now()";
    // `generic_plan` explains the plan `plan_cache_mode` makes: a custom one here, as a claim got.
    let unguarded = generic_plan(&mut conn, "claim_unguarded", statement, types, arguments).await;
    assert!(
        unguarded.contains("Sort"),
        "misled, the planner sorts the queue's whole backlog: {unguarded}"
    );

    let mut tx = conn
        .begin_with(crate::sql::CLAIM_BEGIN)
        .await
        .expect("begin");
    let guarded = generic_plan(&mut tx, "claim_guarded", statement, types, arguments).await;
    tx.rollback().await.expect("rollback");
    assert!(
        guarded.contains("jobs_fetch") && !guarded.contains("Sort"),
        "the claim walks jobs_fetch in order: {guarded}"
    );
}
