//! Conveyor embedded in a Rust program: typed jobs enqueued and worked on the embedded SQLite
//! store, no server. See README.md for how to run it.

use conveyor::{Client, JobOptions, Outcome, TypedJob, Worker};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// A job's payload is a plain serde type; its kind names it in the store.
#[derive(serde::Serialize, serde::Deserialize)]
struct SendWelcomeEmail {
    user_id: u64,
}

impl TypedJob for SendWelcomeEmail {
    const KIND: &'static str = "send_welcome_email";
}

const USERS: [u64; 3] = [7, 8, 9];

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "./conveyor-data/embedded.db".to_string());
    if let Some(folder) = std::path::Path::new(&path).parent() {
        std::fs::create_dir_all(folder)?;
    }
    let store = conveyor::open_store(&format!("sqlite://{path}"), Default::default()).await?;

    // Enqueue: each call returns once the job is durably stored.
    let client = Client::new(store.clone());
    let mut ids = Vec::new();
    for user_id in USERS {
        let options = JobOptions::default().queue("mail").max_attempts(3);
        let inserted = client
            .enqueue_with(SendWelcomeEmail { user_id }, options)
            .await?;
        ids.push(inserted.job.id);
    }
    println!("enqueued {} jobs", ids.len());

    // Work: a handler per kind; the first attempt for user 8 fails and is retried with backoff.
    let completed = Arc::new(AtomicUsize::new(0));
    let all_done = Arc::new(Notify::new());
    let worker = Worker::builder(store.clone())
        .queue("mail", 4)
        .with_maintenance(conveyor::Maintenance::new(store.clone()))
        .handle({
            let (completed, all_done) = (completed.clone(), all_done.clone());
            move |ctx, job: SendWelcomeEmail| {
                let (completed, all_done) = (completed.clone(), all_done.clone());
                async move {
                    if job.user_id == 8 && ctx.attempt == 1 {
                        return Outcome::retry_after(
                            Duration::from_millis(200),
                            "mail server busy",
                        );
                    }
                    println!("sent the welcome email to user {}", job.user_id);
                    if completed.fetch_add(1, Ordering::SeqCst) + 1 == USERS.len() {
                        all_done.notify_one();
                    }
                    Outcome::ok()
                }
            }
        })
        .build()?;
    // Stops on SIGTERM/SIGINT too, as a real service would.
    let stop = async move {
        tokio::select! {
            _ = all_done.notified() => {}
            _ = conveyor::shutdown_signal() => {}
        }
    };
    worker.run(stop).await;

    for id in ids {
        if let Some(job) = store.job_get(id).await? {
            println!("job {id}: {:?} after {} attempt(s)", job.state, job.attempt);
        }
    }
    Ok(())
}
