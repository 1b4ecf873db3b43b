//! Limits: per-key concurrency limits, rate limits, tenant fairness and queue weights.

use conveyor_core::{Job, NewJob, QueueSettings, RateLimit, StoreError};

use crate::kit::{
    complete, fetch, fetch_none, fetch_params, insert, job_in, lease_of, millis, secs, Harness,
};

fn tenant_job(queue: &str, tenant: &str) -> NewJob {
    let mut job = job_in(queue, "k");
    job.tenant = Some(tenant.to_string());
    job
}

async fn insert_all(h: &Harness, jobs: Vec<NewJob>) {
    h.store.jobs_insert_many(jobs).await.expect("insert");
}

async fn set(h: &Harness, queue: &str, settings: QueueSettings) {
    h.store
        .queue_settings_put(queue, settings)
        .await
        .expect("settings");
}

fn tenants(jobs: &[Job]) -> Vec<Option<&str>> {
    jobs.iter().map(|job| job.tenant.as_deref()).collect()
}

/// A per-key concurrency limit caps each tenant's running jobs separately; jobs without a
/// tenant are not held back by it, and finishing a tenant's job frees one of its places.
pub async fn per_key_concurrency_limit_caps_each_tenant(h: &Harness) {
    set(h, "accounts", {
        let mut settings = QueueSettings::default();
        settings.per_key_concurrency_limit = Some(2);
        settings
    })
    .await;
    let mut jobs: Vec<NewJob> = (0..5).map(|_| tenant_job("accounts", "acme")).collect();
    jobs.extend((0..5).map(|_| tenant_job("accounts", "globex")));
    jobs.extend((0..3).map(|_| job_in("accounts", "k")));
    insert_all(h, jobs).await;
    let first = fetch(h, &["accounts"], 20).await;
    let count = |jobs: &[Job], tenant: Option<&str>| {
        jobs.iter()
            .filter(|j| j.tenant.as_deref() == tenant)
            .count()
    };
    assert_eq!(count(&first, Some("acme")), 2, "{:?}", tenants(&first));
    assert_eq!(count(&first, Some("globex")), 2);
    assert_eq!(count(&first, None), 3, "untenanted jobs are not limited");
    fetch_none(h, "accounts", "every tenant is at its limit").await;
    let acme = first
        .iter()
        .find(|j| j.tenant.as_deref() == Some("acme"))
        .expect("an acme job");
    complete(h, lease_of(acme), None).await;
    let next = fetch(h, &["accounts"], 20).await;
    assert_eq!(
        tenants(&next),
        vec![Some("acme")],
        "only acme got a place back"
    );
}

/// A rate limit allows at most `count` starts in any window of its period, however many
/// fetches ask; starts count even when the job has finished since.
pub async fn rate_limit_caps_starts_per_period(h: &Harness) {
    set(h, "api", {
        let mut settings = QueueSettings::default();
        settings.rate_limit = Some(RateLimit {
            count: 3,
            period_ms: 1000,
        });
        settings
    })
    .await;
    insert_all(h, (0..10).map(|_| job_in("api", "k")).collect()).await;
    let first = fetch(h, &["api"], 10).await;
    assert_eq!(first.len(), 3);
    for job in &first {
        complete(h, lease_of(job), None).await;
    }
    fetch_none(h, "api", "three starts this second already").await;
    h.advance(millis(600));
    fetch_none(h, "api", "still within the window of the first starts").await;
    h.advance(millis(401));
    assert_eq!(fetch(h, &["api"], 1).await.len(), 1, "the window moved on");
    assert_eq!(
        fetch(h, &["api"], 10).await.len(),
        2,
        "the rest of the budget"
    );
    fetch_none(h, "api", "budget spent again").await;
    h.advance(millis(1001));
    assert_eq!(fetch(h, &["api"], 10).await.len(), 3);
}

/// A per-key rate limit budgets each tenant's starts separately.
pub async fn per_key_rate_limit_budgets_each_tenant(h: &Harness) {
    set(h, "mail", {
        let mut settings = QueueSettings::default();
        settings.per_key_rate_limit = Some(RateLimit {
            count: 2,
            period_ms: 60_000,
        });
        settings
    })
    .await;
    let mut jobs: Vec<NewJob> = (0..4).map(|_| tenant_job("mail", "acme")).collect();
    jobs.extend((0..4).map(|_| tenant_job("mail", "globex")));
    insert_all(h, jobs).await;
    let first = fetch(h, &["mail"], 10).await;
    assert_eq!(first.len(), 4, "two per tenant: {:?}", tenants(&first));
    fetch_none(h, "mail", "both tenants spent their budget").await;
    h.advance(secs(61));
    assert_eq!(fetch(h, &["mail"], 10).await.len(), 4);
}

/// Tenants are served round-robin: one tenant's flood does not delay another tenant's single
/// job, and single-job fetches rotate through the tenants.
pub async fn tenants_are_served_round_robin(h: &Harness) {
    insert_all(h, (0..300).map(|_| tenant_job("shared", "big")).collect()).await;
    insert(h, tenant_job("shared", "small")).await;
    let first = fetch(h, &["shared"], 2).await;
    assert_eq!(
        tenants(&first),
        vec![Some("big"), Some("small")],
        "the small tenant's one job goes in the first turn"
    );
    insert(h, tenant_job("shared", "small")).await;
    insert(h, tenant_job("shared", "third")).await;
    let mut order = Vec::new();
    for _ in 0..4 {
        let one = fetch(h, &["shared"], 1).await;
        assert_eq!(one.len(), 1);
        order.push(one[0].tenant.clone().unwrap_or_default());
    }
    assert_eq!(
        order,
        vec!["third", "big", "small", "big"],
        "rotation carries on"
    );
}

/// Jobs without a tenant take a turn as one more group.
pub async fn untenanted_jobs_take_a_turn_among_tenants(h: &Harness) {
    insert_all(h, (0..100).map(|_| tenant_job("mixed", "big")).collect()).await;
    insert(h, job_in("mixed", "k")).await;
    let first = fetch(h, &["mixed"], 2).await;
    assert_eq!(tenants(&first), vec![Some("big"), None]);
}

/// With more tenants than a fetch takes, the group without a tenant still gets its turn when
/// the rotation reaches it after the last tenant (the stores read that group only then), and
/// a pass that reaches it while none wait goes on to the first tenant.
pub async fn untenanted_jobs_get_their_turn_after_many_tenants(h: &Harness) {
    let names = ["t1", "t2", "t3", "t4", "t5"];
    let jobs = names
        .iter()
        .flat_map(|tenant| [tenant_job("wide", tenant), tenant_job("wide", tenant)]);
    insert_all(h, jobs.collect()).await;
    insert(h, job_in("wide", "k")).await;
    let mut served = Vec::new();
    for _ in 0..3 {
        let two = fetch(h, &["wide"], 2).await;
        served.extend(
            tenants(&two)
                .into_iter()
                .map(|t| t.unwrap_or("-").to_string()),
        );
    }
    assert_eq!(served, ["t1", "t2", "t3", "t4", "t5", "-"]);
    // No job without a tenant waits now: the next pass starts again at the first tenant.
    let next = fetch(h, &["wide"], 2).await;
    assert_eq!(tenants(&next), vec![Some("t1"), Some("t2")]);
}

/// Within a tenant, priority still decides.
pub async fn fairness_keeps_priority_within_a_tenant(h: &Harness) {
    let mut jobs: Vec<NewJob> = (0..3).map(|_| tenant_job("prio", "acme")).collect();
    let mut urgent = tenant_job("prio", "acme");
    urgent.priority = 10;
    jobs.push(urgent);
    insert_all(h, jobs).await;
    insert(h, tenant_job("prio", "globex")).await;
    let first = fetch(h, &["prio"], 2).await;
    assert_eq!(first[0].priority, 10, "acme's urgent job first");
    assert_eq!(first[1].tenant.as_deref(), Some("globex"));
}

/// A fetch over several weighted queues shares its capacity by weight, so a flooded queue does
/// not starve a light one; capacity a queue cannot use goes to the others.
pub async fn weighted_queues_share_a_fetch(h: &Harness) {
    set(h, "bulk", {
        let mut settings = QueueSettings::default();
        settings.weight = Some(1);
        settings
    })
    .await;
    set(h, "interactive", {
        let mut settings = QueueSettings::default();
        settings.weight = Some(3);
        settings
    })
    .await;
    // Bulk jobs all have higher priority: without weights they would all go first.
    let mut bulk: Vec<NewJob> = (0..100).map(|_| job_in("bulk", "k")).collect();
    for job in &mut bulk {
        job.priority = 5;
    }
    insert_all(h, bulk).await;
    insert_all(h, (0..100).map(|_| job_in("interactive", "k")).collect()).await;
    let got = fetch(h, &["bulk", "interactive"], 8).await;
    let interactive = got.iter().filter(|j| j.queue == "interactive").count();
    assert_eq!((got.len(), interactive), (8, 6), "3:1 of 8");
    // With the light queue nearly empty, its unused share goes to the other.
    let got = fetch(h, &["bulk", "interactive"], 200).await;
    assert_eq!(got.len(), 192);
}

/// Limits of zero and empty rate periods are refused, naming the field; nothing is stored.
pub async fn invalid_flow_settings_are_refused(h: &Harness) {
    let cases = [
        (
            {
                let mut settings = QueueSettings::default();
                settings.rate_limit = Some(RateLimit {
                    count: 5,
                    period_ms: 0,
                });
                settings
            },
            "rate_limit.period_ms",
        ),
        (
            {
                let mut settings = QueueSettings::default();
                settings.per_key_rate_limit = Some(RateLimit {
                    count: 0,
                    period_ms: 10,
                });
                settings
            },
            "per_key_rate_limit.count",
        ),
        (
            {
                let mut settings = QueueSettings::default();
                settings.per_key_concurrency_limit = Some(0);
                settings
            },
            "per_key_concurrency_limit",
        ),
        (
            {
                let mut settings = QueueSettings::default();
                settings.weight = Some(0);
                settings
            },
            "weight",
        ),
    ];
    for (settings, field) in cases {
        match h.store.queue_settings_put("q", settings).await {
            Err(StoreError::Invalid(error)) => assert_eq!(error.field, field),
            other => panic!("expected Invalid({field}), got {other:?}"),
        }
    }
    assert_eq!(
        h.store.queue_settings_get("q").await.expect("get"),
        QueueSettings::default()
    );
}

/// A fetch that names `kinds` on a limited queue claims the jobs of those kinds even
/// when other kinds lead the queue (issue 27: 300 jobs of another kind ahead of 40 matching
/// ones under `concurrency_limit: 1000` claimed none), with and without tenants; jobs of other
/// kinds stay available.
pub async fn kinds_filter_applies_before_limits_pick(h: &Harness) {
    for (queue, tenanted) in [("limited", false), ("limited-fair", true)] {
        set(h, queue, {
            let mut settings = QueueSettings::default();
            settings.concurrency_limit = Some(1000);
            settings
        })
        .await;
        let with_tenant = |mut job: NewJob, n: usize| {
            if tenanted {
                job.tenant = Some(format!("t{}", n % 3));
            }
            job
        };
        insert_all(
            h,
            (0..300)
                .map(|n| with_tenant(job_in(queue, "other"), n))
                .collect(),
        )
        .await;
        insert_all(
            h,
            (0..40)
                .map(|n| with_tenant(job_in(queue, "wanted"), n))
                .collect(),
        )
        .await;
        let mut params = fetch_params(&[queue], 40);
        params.kinds = Some(vec!["wanted".to_string()]);
        let claimed = h.store.jobs_fetch(params).await.expect("fetch");
        assert_eq!(claimed.len(), 40, "{queue}: every wanted job is claimed");
        assert!(
            claimed.iter().all(|job| job.kind == "wanted"),
            "{queue}: only the named kind"
        );
        let others = fetch(h, &[queue], 1000).await;
        assert_eq!(
            others.len(),
            300,
            "{queue}: the other kind is left available"
        );
    }
}
