//! PostgreSQL restarted mid-run (`pg_ctlcluster ... restart`): workers and maintenance ride out
//! the outage and the run completes with nothing lost; an enqueue that could not be committed
//! returns an error, never a false success.
//!
//! The test creates a private PostgreSQL cluster on a free port (Debian's `pg_createcluster`),
//! so restarting it cannot disturb the tests that share the machine's main cluster. It is
//! dropped at the end, however the test ends.

use conveyor_core::{JobStore, QueueStore};
use conveyor_core::{NewJob, Store};
use conveyor_postgres::{PgOptions, PgStore};
use conveyor_storetest::eventually::eventually_within;
use conveyor_storetest::pg_cluster::Cluster;
use conveyor_worker::{Maintenance, Outcome, Worker};
use serde_json::json;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Notify;
use uuid::Uuid;

const JOBS: usize = 3_000;

async fn completed(store: &PgStore) -> Option<u64> {
    let stats = store.queues_stats().await.ok()?;
    Some(stats.iter().map(|q| q.completed).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_restart_mid_run_loses_nothing() {
    let cluster = tokio::task::spawn_blocking(Cluster::create).await.unwrap();
    let store = PgStore::connect(&cluster.url(), PgOptions::default())
        .await
        .expect("connect");
    let jobs: Vec<NewJob> = (0..JOBS)
        .map(|n| NewJob::new("work", json!({"n": n})))
        .collect();
    let mut expected: HashSet<Uuid> = HashSet::new();
    for chunk in jobs.chunks(500) {
        for inserted in store
            .jobs_insert_many(chunk.to_vec())
            .await
            .expect("insert")
        {
            expected.insert(inserted.job.id);
        }
    }

    let handled: Arc<Mutex<HashSet<Uuid>>> = Arc::default();
    let restart_now = Arc::new(Notify::new());
    let (seen, trigger) = (handled.clone(), restart_now.clone());
    let shared: Arc<dyn Store> = Arc::new(store.clone());
    let worker = Worker::builder(shared.clone())
        .queue("default", 8)
        .lease(Duration::from_secs(2))
        .poll_interval(Duration::from_millis(100))
        .with_maintenance(Maintenance::new(shared.clone()).interval(Duration::from_millis(200)))
        .handle_json("work", move |ctx, _| {
            let (seen, trigger) = (seen.clone(), trigger.clone());
            async move {
                let mut seen = seen.lock().unwrap();
                seen.insert(ctx.id);
                if seen.len() == JOBS / 4 {
                    trigger.notify_one();
                }
                Outcome::ok()
            }
        })
        .build()
        .unwrap();
    let stop = Arc::new(Notify::new());
    let stopper = stop.clone();
    let running = tokio::spawn(worker.run(async move { stopper.notified().await }));

    restart_now.notified().await;
    // Enqueue while the server goes down and comes back: every acknowledged job must exist.
    let acked: Arc<Mutex<Vec<Uuid>>> = Arc::default();
    let (producer_store, producer_acked) = (store.clone(), acked.clone());
    let producing = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let keep_producing = producing.clone();
    let producer = tokio::spawn(async move {
        let mut failures = 0;
        while keep_producing.load(std::sync::atomic::Ordering::SeqCst) {
            match producer_store
                .jobs_insert_many(vec![NewJob::new("work", json!({"during": "restart"}))])
                .await
            {
                Ok(inserted) => producer_acked.lock().unwrap().push(inserted[0].job.id),
                Err(_) => failures += 1,
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        failures
    });
    let restarted = Instant::now();
    let ctl = tokio::task::spawn_blocking(move || {
        cluster.ctl("restart");
        cluster
    });
    let cluster = ctl.await.unwrap();
    producing.store(false, std::sync::atomic::Ordering::SeqCst);
    let failures = producer.await.unwrap();
    let acked = acked.lock().unwrap().clone();
    expected.extend(acked.iter().copied());

    let want = expected.len() as u64;
    eventually_within(
        &format!("all {want} jobs to complete after the restart"),
        Duration::from_secs(120),
        || async {
            match completed(&store).await {
                Some(done) if done == want => Ok(()),
                other => Err(format!("{other:?} completed")),
            }
        },
    )
    .await;
    stop.notify_one();
    running.await.unwrap();

    let handled = handled.lock().unwrap().clone();
    assert_eq!(
        handled, expected,
        "every job, including those acknowledged during the restart, ran"
    );
    for id in &acked {
        let job = store
            .job_get(*id)
            .await
            .unwrap()
            .expect("acknowledged job exists");
        assert_eq!(job.state, conveyor_core::JobState::Completed);
    }
    eprintln!(
        "restart took {:?}; {} enqueues acknowledged and {failures} refused during it",
        restarted.elapsed(),
        acked.len()
    );
    drop(store);
    drop(cluster);
}
