//! The demo behind `conveyor serve --demo`: a producer and a worker on the server's own store,
//! so a new user sees jobs flow, fail, retry and land in the dead-letter queue.

use conveyor::{
    JobContext, JobObserver, JobTemplate, NewJob, Outcome, RetryPolicy, Schedule, ScheduleSpec,
    Store, Worker,
};
use rand::Rng;
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// (kind, queue, max_attempts)
const KINDS: [(&str, &str, u32); 4] = [
    ("email.send", "mail", 5),
    ("report.generate", "reports", 4),
    ("image.resize", "default", 3),
    ("payment.capture", "default", 3),
];

pub(crate) async fn run(
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
    drain_timeout: Duration,
    observer: Arc<dyn JobObserver>,
) {
    // A cron schedule too, fired by the server's scheduler: a digest every 15 seconds.
    let digest = ScheduleSpec::new(
        "*/15 * * * * *",
        JobTemplate {
            queue: "reports".to_string(),
            ..JobTemplate::new("report.generate", json!({"report": "digest"}))
        },
    );
    match Schedule::from_spec("demo-digest", digest) {
        Ok(schedule) => {
            if let Err(error) = store.schedule_put(schedule).await {
                tracing::error!(%error, "demo could not define its schedule");
            }
        }
        Err(error) => tracing::error!(%error, "demo schedule is invalid"),
    }
    let producer = tokio::spawn(produce(store.clone(), shutdown.clone(), observer.clone()));
    let worker = Worker::builder(store)
        .queue("default", 4)
        .queue("mail", 4)
        .queue("reports", 2)
        .default_retry(RetryPolicy {
            base_ms: 500,
            factor: 2.0,
            max_ms: 8_000,
            jitter: 0.2,
        })
        .drain_timeout(drain_timeout)
        .observer(observer)
        .handle_json("email.send", |_ctx: JobContext, _| async move {
            pause(20, 150).await;
            if chance(0.15) {
                Outcome::retry("SMTP 421: service not available, try again later")
            } else {
                Outcome::complete_with(json!({"delivered": true}))
            }
        })
        .handle_json("report.generate", |ctx: JobContext, _| async move {
            pause(200, 900).await;
            if ctx.attempt < 2 && chance(0.5) {
                Outcome::retry_after(
                    Duration::from_secs(2),
                    "warehouse busy (429), retry after 2s",
                )
            } else {
                Outcome::complete_with(json!({"rows": rand::rng().random_range(100..5000)}))
            }
        })
        .handle_json("image.resize", |_ctx: JobContext, _| async move {
            pause(30, 200).await;
            if chance(0.1) {
                panic!("decoder crashed on a corrupt image");
            }
            Outcome::ok()
        })
        .handle_json("payment.capture", |_ctx: JobContext, payload| async move {
            pause(50, 300).await;
            if payload["card"] == "expired" {
                Outcome::permanent("card expired: retrying cannot help")
            } else if chance(0.3) {
                Outcome::retry("payment gateway timeout")
            } else {
                Outcome::ok()
            }
        })
        .build();
    match worker {
        Ok(worker) => {
            let stop = shutdown.clone();
            worker.run(async move { stop.cancelled().await }).await;
        }
        Err(error) => tracing::error!(%error, "demo worker could not start"),
    }
    let _ = producer.await;
}

fn chance(p: f64) -> bool {
    rand::rng().random_bool(p)
}

async fn pause(min_ms: u64, max_ms: u64) {
    let ms = rand::rng().random_range(min_ms..=max_ms);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

async fn produce(
    store: Arc<dyn Store>,
    shutdown: CancellationToken,
    observer: Arc<dyn JobObserver>,
) {
    let mut n: u64 = 0;
    loop {
        let wait = Duration::from_millis(rand::rng().random_range(100..400));
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        n += 1;
        let (kind, queue, max_attempts) = KINDS[rand::rng().random_range(0..KINDS.len())];
        let payload = match kind {
            "payment.capture" => {
                json!({"order": n, "card": if chance(0.25) { "expired" } else { "valid" }})
            }
            "email.send" => json!({"to": format!("user{n}@example.com"), "template": "welcome"}),
            _ => json!({"n": n}),
        };
        let mut job = NewJob::new(kind, payload);
        job.queue = queue.to_string();
        job.max_attempts = max_attempts;
        job.priority = if chance(0.1) { 10 } else { 0 };
        if queue == "mail" {
            // Mail is sent for three customers: their jobs are started round-robin.
            let tenants = ["acme", "globex", "initech"];
            job.tenant = Some(tenants[rand::rng().random_range(0..tenants.len())].to_string());
        }
        if chance(0.1) {
            job.run_at = Some(chrono::Utc::now() + chrono::Duration::seconds(5));
        }
        match store.jobs_insert_many(vec![job]).await {
            Ok(inserted) => observer.jobs_enqueued(&inserted),
            Err(error) => tracing::error!(%error, "demo producer could not enqueue"),
        }
    }
}
