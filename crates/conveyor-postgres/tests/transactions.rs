//! The transactional API: enqueueing and completing inside the application's own transaction.

mod common;

use conveyor_core::{FetchParams, JobListParams, JobState, LeaseOutcome, LeaseRef, NewJob};
use conveyor_core::{JobStore, LeaseStore};
use serde_json::json;
use std::time::Duration;

fn fetch_params() -> FetchParams {
    FetchParams {
        worker_id: "tx-worker".into(),
        queues: vec!["default".into()],
        max: 1,
        lease: Duration::from_secs(30),
        kinds: None,
        excluded_kinds: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_tx_rolled_back_leaves_no_job_and_committed_one_exists() {
    let (store, _clock, _guard) = common::fresh_store().await;

    // Rolled back: the job never existed.
    let mut tx = store.pool().begin().await.expect("begin");
    let inserted = store
        .enqueue_tx(&mut tx, vec![NewJob::new("rolled-back", json!({ "n": 1 }))])
        .await
        .expect("enqueue_tx");
    assert_eq!(inserted.len(), 1);
    let rolled_back = inserted[0].job.id;
    tx.rollback().await.expect("rollback");
    assert_eq!(store.job_get(rolled_back).await.expect("get"), None);

    // Committed: invisible to others until the commit, there after it, and the commit wakes
    // waiting fetchers through the NOTIFY sent inside the transaction.
    let mut tx = store.pool().begin().await.expect("begin");
    let inserted = store
        .enqueue_tx(&mut tx, vec![NewJob::new("committed", json!({ "n": 2 }))])
        .await
        .expect("enqueue_tx");
    let committed = inserted[0].job.id;
    assert_eq!(
        store.job_get(committed).await.expect("get"),
        None,
        "not visible before the commit"
    );
    let wakeup = store.wakeup();
    let notified = wakeup.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    tx.commit().await.expect("commit");
    tokio::time::timeout(Duration::from_secs(5), notified)
        .await
        .expect("the commit wakes waiting fetchers");
    let job = store
        .job_get(committed)
        .await
        .expect("get")
        .expect("the committed job exists");
    assert_eq!(job, inserted[0].job, "stored as returned");
    assert_eq!(job.state, JobState::Available);

    let all = store
        .jobs_list({
            let mut params = JobListParams::default();
            params.limit = 100;
            params
        })
        .await
        .expect("list");
    assert_eq!(all.len(), 1, "only the committed job: {all:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_tx_applies_idempotency_keys_and_validation() {
    let (store, _clock, _guard) = common::fresh_store().await;
    let keyed = || {
        let mut job = NewJob::new("keyed", json!({}));
        job.idempotency_key = Some("tx-key".into());
        job
    };
    let mut tx = store.pool().begin().await.expect("begin");
    let first = store
        .enqueue_tx(&mut tx, vec![keyed(), keyed()])
        .await
        .expect("enqueue_tx");
    assert!(!first[0].duplicate && first[1].duplicate, "{first:?}");
    tx.commit().await.expect("commit");
    let again = store.jobs_insert_many(vec![keyed()]).await.expect("insert");
    assert!(again[0].duplicate, "the committed job holds the key");
    assert_eq!(again[0].job.id, first[0].job.id);

    let mut bad = NewJob::new("bad", json!({}));
    bad.max_attempts = 0;
    let mut tx = store.pool().begin().await.expect("begin");
    let err = store
        .enqueue_tx(&mut tx, vec![bad])
        .await
        .expect_err("invalid job");
    assert!(
        matches!(err, conveyor_core::StoreError::Invalid(ref e) if e.field == "max_attempts"),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_tx_rolled_back_leaves_job_running_and_committed_completes_it() {
    let (store, _clock, _guard) = common::fresh_store().await;
    // The handler's own table, written in the same transaction as the completion.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
        "CREATE TABLE \"{}\".effects (job_id uuid PRIMARY KEY)",
        store.schema()
    )))
    .execute(store.pool())
    .await
    .expect("create app table");
    let record_effect = format!("INSERT INTO \"{}\".effects VALUES ($1)", store.schema());
    let count_effects = format!("SELECT count(*) FROM \"{}\".effects", store.schema());

    store
        .jobs_insert_many(vec![NewJob::new("charge", json!({}))])
        .await
        .expect("insert");
    let running = store
        .jobs_fetch(fetch_params())
        .await
        .expect("fetch")
        .pop()
        .expect("a job");
    let lease = LeaseRef {
        id: running.id,
        lease_token: running.lease.as_ref().expect("lease").token,
    };

    // Rolled back: the handler's write and the completion vanish together.
    let mut tx = store.pool().begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(record_effect.clone()))
        .bind(running.id)
        .execute(&mut *tx)
        .await
        .expect("app write");
    let outcome = store
        .complete_tx(&mut tx, lease, Some(json!("rolled back")))
        .await
        .expect("complete_tx");
    assert_eq!(outcome, LeaseOutcome::Applied);
    tx.rollback().await.expect("rollback");
    let still = store.job_get(running.id).await.expect("get").expect("job");
    assert_eq!(still, running, "still running under the same lease");
    let effects: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count_effects.clone()))
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(effects, 0);

    // Committed: both land.
    let mut tx = store.pool().begin().await.expect("begin");
    sqlx::query(sqlx::AssertSqlSafe(record_effect))
        .bind(running.id)
        .execute(&mut *tx)
        .await
        .expect("app write");
    let outcome = store
        .complete_tx(&mut tx, lease, Some(json!({ "charged": true })))
        .await
        .expect("complete_tx");
    assert_eq!(outcome, LeaseOutcome::Applied);
    tx.commit().await.expect("commit");
    let done = store.job_get(running.id).await.expect("get").expect("job");
    assert_eq!(done.state, JobState::Completed);
    assert_eq!(done.result, Some(json!({ "charged": true })));
    assert_eq!(done.lease, None);
    let effects: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(count_effects))
        .fetch_one(store.pool())
        .await
        .expect("count");
    assert_eq!(effects, 1);

    // The lease is spent: a second completion in a transaction is LeaseLost.
    let mut tx = store.pool().begin().await.expect("begin");
    let outcome = store
        .complete_tx(&mut tx, lease, None)
        .await
        .expect("complete_tx");
    assert_eq!(outcome, LeaseOutcome::LeaseLost);
    tx.rollback().await.expect("rollback");
}

/// Completing a flow's step inside the caller's transaction moves the flow (its next step
/// starts when the transaction commits) and leaves the caller's planner settings as they were:
/// the flow event's own settings do not outlive it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn complete_tx_of_a_flow_step_keeps_the_callers_planner_settings() {
    use conveyor_core::workflow::{NewFlow, ValidFlow};
    use conveyor_core::FlowStore;
    let (store, _clock, _guard) = common::fresh_store().await;
    let flow = NewFlow::chain(["a", "b"].map(|name| (name, NewJob::new("step", json!({})))));
    store
        .flow_create(ValidFlow::new(flow).expect("valid"))
        .await
        .expect("create");
    let first = store
        .jobs_fetch(fetch_params())
        .await
        .expect("fetch")
        .pop()
        .expect("step a");
    let lease = LeaseRef {
        id: first.id,
        lease_token: first.lease.as_ref().expect("lease").token,
    };
    let mut tx = store.pool().begin().await.expect("begin");
    // The store's connections have JIT off; the caller's transaction turns it on, to see it kept.
    sqlx::query("SELECT set_config('jit', 'on', true)")
        .execute(&mut *tx)
        .await
        .expect("jit on");
    let setting = |name: &'static str| format!("SELECT current_setting('{name}')");
    let before: Vec<String> = {
        let mut values = Vec::new();
        for name in [
            "enable_hashjoin",
            "enable_mergejoin",
            "plan_cache_mode",
            "jit",
        ] {
            values.push(
                sqlx::query_scalar(sqlx::AssertSqlSafe(setting(name)))
                    .fetch_one(&mut *tx)
                    .await
                    .expect("setting"),
            );
        }
        values
    };
    let outcome = store
        .complete_tx(&mut tx, lease, None)
        .await
        .expect("complete_tx");
    assert_eq!(outcome, LeaseOutcome::Applied);
    let mut after = Vec::new();
    for name in [
        "enable_hashjoin",
        "enable_mergejoin",
        "plan_cache_mode",
        "jit",
    ] {
        after.push(
            sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(setting(name)))
                .fetch_one(&mut *tx)
                .await
                .expect("setting"),
        );
    }
    assert_eq!(after, before, "the caller's planner settings are kept");
    tx.commit().await.expect("commit");
    let next = store
        .jobs_fetch(fetch_params())
        .await
        .expect("fetch")
        .pop()
        .expect("step b started with a's completion");
    assert_eq!(next.flow.as_ref().map(|f| f.step.as_str()), Some("b"));
}
