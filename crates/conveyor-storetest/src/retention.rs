//! Retention: pruning finished jobs past their retention, oldest first, in bounded steps.

use conveyor_core::{PruneParams, PruneReport, QueueSettings, RetentionPolicy};

use crate::kit::{complete, fetch_one, insert, job_in, lease_of, make_dead, secs, Harness};

fn defaults(limit: usize) -> PruneParams {
    PruneParams {
        retention: RetentionPolicy::default(),
        limit,
    }
}

async fn prune(h: &Harness, params: PruneParams) -> PruneReport {
    h.store.jobs_prune(params).await.expect("prune")
}

async fn completed_job(h: &Harness, queue: &str) -> uuid::Uuid {
    insert(h, job_in(queue, "k")).await;
    let job = fetch_one(h, queue).await;
    complete(h, lease_of(&job), None).await;
    job.id
}

/// Completed and cancelled jobs go after the completed retention (24 h by default), dead jobs
/// after the dead retention (14 days); unfinished jobs never; the queue counts follow.
pub async fn prune_deletes_finished_jobs_past_their_retention(h: &Harness) {
    let done = completed_job(h, "mail").await;
    let cancelled = insert(h, job_in("mail", "k")).await.id;
    h.store.job_cancel(cancelled).await.expect("cancel");
    let dead = make_dead(h, job_in("mail", "k")).await.id;
    let waiting = insert(h, job_in("mail", "k")).await.id;
    assert_eq!(
        prune(h, defaults(100)).await,
        PruneReport::default(),
        "nothing has expired yet"
    );
    h.advance(secs(24 * 3600 + 1));
    let report = prune(h, defaults(100)).await;
    assert_eq!((report.completed, report.cancelled, report.dead), (1, 1, 0));
    assert!(h.store.job_get(done).await.expect("get").is_none());
    assert!(h.store.job_get(cancelled).await.expect("get").is_none());
    assert!(
        h.store.job_get(dead).await.expect("get").is_some(),
        "dead jobs are kept longer"
    );
    h.advance(secs(14 * 24 * 3600));
    assert_eq!(prune(h, defaults(100)).await.dead, 1);
    assert!(h.store.job_get(dead).await.expect("get").is_none());
    assert!(
        h.store.job_get(waiting).await.expect("get").is_some(),
        "unfinished jobs stay"
    );
    let stats = h.store.queues_stats().await.expect("stats");
    let mail = stats.iter().find(|q| q.name == "mail").expect("mail");
    assert_eq!(
        (mail.completed, mail.cancelled, mail.dead, mail.available),
        (0, 0, 0, 1)
    );
}

/// A queue's own retention wins over the default, and each call deletes at most `limit`
/// jobs, the oldest first.
pub async fn prune_honours_queue_retention_and_limit(h: &Harness) {
    h.store
        .queue_settings_put("short", {
            let mut settings = QueueSettings::default();
            settings.completed_retention_secs = Some(60);
            settings
        })
        .await
        .expect("settings");
    let mut short = Vec::new();
    for _ in 0..3 {
        short.push(completed_job(h, "short").await);
        // Distinct finish times, so "oldest first" is not decided by a tie-break.
        h.advance(secs(1));
    }
    let kept = completed_job(h, "default").await;
    h.advance(secs(61));
    assert_eq!(prune(h, defaults(2)).await.completed, 2);
    assert!(
        h.store.job_get(short[0]).await.expect("get").is_none(),
        "oldest first"
    );
    assert!(h.store.job_get(short[1]).await.expect("get").is_none());
    assert!(h.store.job_get(short[2]).await.expect("get").is_some());
    assert_eq!(prune(h, defaults(2)).await.completed, 1);
    assert_eq!(prune(h, defaults(2)).await, PruneReport::default());
    assert!(
        h.store.job_get(kept).await.expect("get").is_some(),
        "other queues keep the default"
    );
}
