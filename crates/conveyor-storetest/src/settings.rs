//! Queue settings: pause and resume, and back-pressure by maximum depth.

use conveyor_core::{JobState, NamedQueueSettings, QueueSettings, RateLimit, StoreError};

use crate::kit::{complete, fetch, fetch_none, fetch_one, insert, job_in, lease_of, Harness};

fn queue_full(error: StoreError) -> (String, Option<String>, u64, u64) {
    match error {
        StoreError::QueueFull {
            queue,
            tenant,
            depth,
            limit,
            retry_after,
        } => {
            assert!(!retry_after.is_zero(), "a refusal says when to retry");
            (queue, tenant, depth, limit)
        }
        other => panic!("expected QueueFull, got {other:?}"),
    }
}

/// A queue without settings reads as the defaults; put replaces them; list shows every queue
/// with settings of its own.
pub async fn queue_settings_default_then_round_trip_and_list(h: &Harness) {
    let store = &h.store;
    assert_eq!(
        store.queue_settings_get("mail").await.expect("get"),
        QueueSettings::default()
    );
    let wanted = {
        let mut settings = QueueSettings::default();
        settings.paused = true;
        settings.max_depth = Some(100);
        settings.max_depth_per_tenant = Some(10);
        settings.concurrency_limit = Some(4);
        settings.per_key_concurrency_limit = Some(2);
        settings.rate_limit = Some(RateLimit {
            count: 20,
            period_ms: 1000,
        });
        settings.per_key_rate_limit = Some(RateLimit {
            count: 5,
            period_ms: 60_000,
        });
        settings.weight = Some(3);
        settings.completed_retention_secs = Some(3600);
        settings.dead_retention_secs = Some(30 * 24 * 3600);
        settings
    };
    let stored = store
        .queue_settings_put("mail", wanted.clone())
        .await
        .expect("put");
    assert_eq!(stored, wanted);
    assert_eq!(store.queue_settings_get("mail").await.expect("get"), wanted);
    let cleared = {
        let mut settings = QueueSettings::default();
        settings.max_depth = Some(5);
        settings
    };
    store
        .queue_settings_put("mail", cleared.clone())
        .await
        .expect("put");
    store
        .queue_settings_put("reports", wanted.clone())
        .await
        .expect("put");
    let mut listed = store.queue_settings_list().await.expect("list");
    listed.sort_by(|a, b| a.name.cmp(&b.name));
    assert_eq!(
        listed,
        vec![
            NamedQueueSettings {
                name: "mail".into(),
                settings: cleared
            },
            NamedQueueSettings {
                name: "reports".into(),
                settings: wanted
            },
        ]
    );
}

/// A paused queue keeps accepting jobs but hands none out; its stats say paused; resuming
/// makes its jobs fetchable again. Other queues are unaffected.
pub async fn paused_queue_accepts_enqueues_but_is_not_fetched(h: &Harness) {
    let paused = {
        let mut settings = QueueSettings::default();
        settings.paused = true;
        settings
    };
    h.store
        .queue_settings_put("held", paused)
        .await
        .expect("pause");
    let job = insert(h, job_in("held", "k")).await;
    assert_eq!(
        job.state,
        JobState::Available,
        "enqueue continues while paused"
    );
    insert(h, job_in("open", "k")).await;
    fetch_none(h, "held", "the queue is paused").await;
    fetch_one(h, "open").await;
    let stats = h.store.queues_stats().await.expect("stats");
    let held = stats
        .iter()
        .find(|q| q.name == "held")
        .expect("held counted");
    assert!(held.paused, "stats show the pause");
    assert_eq!(held.available, 1);

    h.store
        .queue_settings_put("held", QueueSettings::default())
        .await
        .expect("resume");
    assert_eq!(
        fetch_one(h, "held").await.id,
        job.id,
        "resumed queue is fetched"
    );
}

/// With a maximum depth, an enqueue that would pass it is refused with `QueueFull` and stores
/// nothing (a batch is refused whole); finished jobs free room; other queues are unaffected.
pub async fn max_depth_refuses_enqueues_past_the_limit_and_stores_nothing(h: &Harness) {
    let limited = {
        let mut settings = QueueSettings::default();
        settings.max_depth = Some(3);
        settings
    };
    h.store
        .queue_settings_put("small", limited)
        .await
        .expect("limit");
    for _ in 0..2 {
        insert(h, job_in("small", "k")).await;
    }
    let refused = h
        .store
        .jobs_insert_many(vec![job_in("small", "k"), job_in("small", "k")])
        .await
        .expect_err("a batch of two with one place left is refused");
    assert_eq!(queue_full(refused), ("small".into(), None, 2, 3));
    let depth = |stats: &[conveyor_core::QueueStats]| {
        stats
            .iter()
            .find(|q| q.name == "small")
            .map_or(0, |q| q.available)
    };
    assert_eq!(
        depth(&h.store.queues_stats().await.expect("stats")),
        2,
        "nothing of the refused batch was stored"
    );
    insert(h, job_in("small", "k")).await;
    let full = h
        .store
        .jobs_insert_many(vec![job_in("small", "k")])
        .await
        .expect_err("the queue is full");
    assert_eq!(queue_full(full), ("small".into(), None, 3, 3));
    insert(h, job_in("elsewhere", "k")).await;

    let running = fetch_one(h, "small").await;
    complete(h, lease_of(&running), None).await;
    insert(h, job_in("small", "k")).await;
}

/// The per-tenant maximum counts each tenant's unfinished jobs in the queue separately.
pub async fn max_depth_per_tenant_limits_each_tenant_separately(h: &Harness) {
    let limited = {
        let mut settings = QueueSettings::default();
        settings.max_depth_per_tenant = Some(2);
        settings
    };
    h.store
        .queue_settings_put("shared", limited)
        .await
        .expect("limit");
    let for_tenant = |tenant: &str| {
        let mut job = job_in("shared", "k");
        job.tenant = Some(tenant.to_string());
        job
    };
    insert(h, for_tenant("acme")).await;
    insert(h, for_tenant("acme")).await;
    let refused = h
        .store
        .jobs_insert_many(vec![for_tenant("acme")])
        .await
        .expect_err("acme is at its limit");
    assert_eq!(
        queue_full(refused),
        ("shared".into(), Some("acme".into()), 2, 2)
    );
    insert(h, for_tenant("globex")).await;
    insert(h, job_in("shared", "no-tenant")).await;
}

/// A full queue still answers an idempotent duplicate with the existing job: only jobs a batch
/// would add count towards the limit.
pub async fn duplicate_enqueue_into_a_full_queue_returns_the_existing_job(h: &Harness) {
    let limited = {
        let mut settings = QueueSettings::default();
        settings.max_depth = Some(1);
        settings
    };
    h.store
        .queue_settings_put("one", limited)
        .await
        .expect("limit");
    let mut keyed = job_in("one", "k");
    keyed.idempotency_key = Some("order-7".into());
    let first = insert(h, keyed.clone()).await;
    let again = h
        .store
        .jobs_insert_many(vec![keyed])
        .await
        .expect("a duplicate is not refused");
    assert!(again[0].duplicate);
    assert_eq!(again[0].job.id, first.id);
    let refused = h
        .store
        .jobs_insert_many(vec![job_in("one", "k")])
        .await
        .expect_err("a new job is refused");
    assert_eq!(queue_full(refused).2, 1);
}

/// A concurrency limit caps the queue's running jobs across every fetch (and so every worker
/// and node): fetches hand out only the free places; finishing a job frees one.
pub async fn concurrency_limit_caps_running_jobs_across_fetches(h: &Harness) {
    let limited = {
        let mut settings = QueueSettings::default();
        settings.concurrency_limit = Some(2);
        settings
    };
    h.store
        .queue_settings_put("narrow", limited)
        .await
        .expect("limit");
    for _ in 0..5 {
        insert(h, job_in("narrow", "k")).await;
    }
    insert(h, job_in("wide", "k")).await;
    let first = fetch(h, &["narrow"], 5).await;
    assert_eq!(first.len(), 2, "only two places");
    fetch_none(h, "narrow", "both places are taken").await;
    assert_eq!(
        fetch(h, &["narrow", "wide"], 5).await.len(),
        1,
        "other queues are not limited"
    );
    complete(h, lease_of(&first[0]), None).await;
    assert_eq!(
        fetch(h, &["narrow"], 5).await.len(),
        1,
        "a finished job frees a place"
    );
    fetch_none(h, "narrow", "full again").await;
    let stats = h.store.queues_stats().await.expect("stats");
    let narrow = stats.iter().find(|q| q.name == "narrow").expect("counted");
    assert_eq!((narrow.running, narrow.available), (2, 2));
}
