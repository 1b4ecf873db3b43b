//! Named limits (`PUT /v1/limits/{name}`): jobs stamped with limit keys at enqueue (through
//! the engine's `LimitStamps`, as every server and the facade open their store) and claimed
//! only while each key they hold has room.

use std::sync::Arc;

use conveyor_core::kinds::KindSettings;
use conveyor_core::limits::named::KeyUsage;
use conveyor_core::{Job, NewJob, QueueSettings, Store, StoreError};
use conveyor_engine::LimitStamps;
use serde_json::{json, Value};

use crate::kit::{complete, fetch, fetch_params, job_in, lease_of, millis, secs, span, Harness};

async fn define(store: &dyn Store, name: &str, limit: Value) {
    store
        .config_put(conveyor_core::config::LIMITS, name, limit)
        .await
        .expect("define a limit");
}

fn customer_job(queue: &str, customer: &str) -> NewJob {
    job_in(queue, "sync").with_payload(json!({"customer": {"id": customer}}))
}

trait WithPayload {
    fn with_payload(self, payload: Value) -> Self;
}

impl WithPayload for NewJob {
    fn with_payload(mut self, payload: Value) -> Self {
        self.payload = payload;
        self
    }
}

fn customers(jobs: &[Job]) -> Vec<String> {
    jobs.iter()
        .map(|job| {
            job.payload["customer"]["id"]
                .as_str()
                .unwrap_or("?")
                .to_string()
        })
        .collect()
}

fn count_of(jobs: &[Job], customer: &str) -> usize {
    customers(jobs).iter().filter(|c| *c == customer).count()
}

async fn queue_naming(store: &dyn Store, queue: &str, limits: &[&str]) {
    let mut settings = QueueSettings::default();
    settings.limits = limits.iter().map(|name| name.to_string()).collect();
    store
        .queue_settings_put(queue, settings)
        .await
        .expect("queue settings");
}

/// A limit keyed by a payload field holds each customer to its concurrency separately, and a
/// second, unkeyed limit on the same jobs holds the total: both at once. Jobs of a full key
/// are passed over, so the other customers' jobs behind them start; finishing one job gives
/// its keys one place back.
pub async fn several_named_limits_hold_at_once(h: &Harness) {
    let store = LimitStamps::wrap(h.store.clone());
    define(
        &*store,
        "per-customer",
        json!({"concurrency": 2, "key": "payload.customer.id"}),
    )
    .await;
    define(&*store, "vendor", json!({"concurrency": 5})).await;
    queue_naming(&*store, "calls", &["per-customer", "vendor"]).await;
    // A flood of one customer ahead of the others.
    let mut jobs: Vec<NewJob> = (0..10).map(|_| customer_job("calls", "acme")).collect();
    jobs.extend((0..3).map(|_| customer_job("calls", "globex")));
    jobs.extend((0..3).map(|_| customer_job("calls", "initech")));
    let inserted = store.jobs_insert_many(jobs).await.expect("insert");
    assert_eq!(
        inserted[0].job.limit_keys,
        vec!["per-customer:acme".to_string(), "vendor:".to_string()],
        "stamped at enqueue"
    );
    let first = store
        .jobs_fetch(fetch_params(&["calls"], 20))
        .await
        .expect("fetch");
    assert_eq!(first.len(), 5, "the total holds: {:?}", customers(&first));
    assert_eq!(count_of(&first, "acme"), 2, "{:?}", customers(&first));
    assert_eq!(count_of(&first, "globex"), 2, "{:?}", customers(&first));
    assert_eq!(count_of(&first, "initech"), 1, "{:?}", customers(&first));
    let none = store
        .jobs_fetch(fetch_params(&["calls"], 20))
        .await
        .expect("fetch");
    assert!(
        none.is_empty(),
        "every place is taken: {:?}",
        customers(&none)
    );
    let usage = store
        .limit_usage("per-customer", None)
        .await
        .expect("usage");
    assert_eq!(
        usage,
        ["acme", "globex", "initech"]
            .iter()
            .zip([2, 2, 1])
            .map(|(key, running)| KeyUsage {
                key: key.to_string(),
                running,
                recent_starts: 0
            })
            .collect::<Vec<_>>()
    );
    let acme = first
        .iter()
        .find(|job| job.payload["customer"]["id"] == "acme")
        .expect("an acme job");
    complete(h, lease_of(acme), None).await;
    let next = store
        .jobs_fetch(fetch_params(&["calls"], 20))
        .await
        .expect("fetch");
    // The total's one place back goes to the next key in turn with room: acme or initech,
    // never globex, which holds its 2.
    assert_eq!(next.len(), 1, "{:?}", customers(&next));
    assert_ne!(customers(&next), vec!["globex"]);
}

/// Limits come from the job itself, its queue and its kind; a job without a value for a limit's
/// key is not subject to it; a job naming a limit that does not exist is refused naming the
/// field, and nothing is stored.
pub async fn limits_named_by_job_queue_and_kind_combine(h: &Harness) {
    let store = LimitStamps::wrap(h.store.clone());
    define(
        &*store,
        "per-tenant",
        json!({"concurrency": 1, "key": "tenant"}),
    )
    .await;
    define(&*store, "reports", json!({"concurrency": 1})).await;
    define(&*store, "one-off", json!({"concurrency": 1})).await;
    queue_naming(&*store, "work", &["per-tenant"]).await;
    store
        .kind_put(KindSettings {
            kind: "report".to_string(),
            schema: None,
            version: None,
            circuit_breaker: None,
            limits: vec!["reports".to_string()],
            sequence: None,
            batch: None,
            updated_at: chrono::DateTime::UNIX_EPOCH,
        })
        .await
        .expect("kind settings");
    let mut tenanted = job_in("work", "mail");
    tenanted.tenant = Some("acme".into());
    let mut report = job_in("work", "report");
    report.tenant = Some("globex".into());
    let mut own = job_in("work", "mail");
    own.limits = vec!["one-off".into()];
    let inserted = store
        .jobs_insert_many(vec![tenanted.clone(), report, own, job_in("work", "mail")])
        .await
        .expect("insert");
    let keys: Vec<Vec<String>> = inserted.iter().map(|i| i.job.limit_keys.clone()).collect();
    assert_eq!(
        keys,
        vec![
            vec!["per-tenant:acme".to_string()],
            vec!["per-tenant:globex".to_string(), "reports:".to_string()],
            vec!["one-off:".to_string()],
            vec![],
        ]
    );
    let mut bad = job_in("work", "mail");
    bad.limits = vec!["one-off".into(), "nope".into()];
    match store.jobs_insert_many(vec![tenanted, bad]).await {
        Err(StoreError::Invalid(error)) => assert_eq!(error.field, "limits[1]"),
        other => panic!("a job naming an unknown limit is refused, got {other:?}"),
    }
    let mut params = conveyor_core::JobListParams::default();
    params.queue = Some("work".into());
    params.limit = 100;
    let listed = store.jobs_list(params).await.expect("list");
    assert_eq!(listed.len(), 4, "nothing of the refused batch was stored");
}

/// A rate on a keyed limit counts each key's starts within its period, including jobs that
/// finished since; the next period gives the key its starts back.
pub async fn a_named_rate_counts_starts_per_key_and_period(h: &Harness) {
    let store = LimitStamps::wrap(h.store.clone());
    define(
        &*store,
        "api",
        json!({"rate": {"count": 2, "period_ms": 1000}, "key": "payload.customer.id"}),
    )
    .await;
    queue_naming(&*store, "calls", &["api"]).await;
    let mut jobs: Vec<NewJob> = (0..5).map(|_| customer_job("calls", "acme")).collect();
    jobs.extend((0..5).map(|_| customer_job("calls", "globex")));
    store.jobs_insert_many(jobs).await.expect("insert");
    let first = store
        .jobs_fetch(fetch_params(&["calls"], 10))
        .await
        .expect("fetch");
    assert_eq!(count_of(&first, "acme"), 2, "{:?}", customers(&first));
    assert_eq!(count_of(&first, "globex"), 2, "{:?}", customers(&first));
    for job in &first {
        complete(h, lease_of(job), None).await;
    }
    let usage = store.limit_usage("api", Some(1000)).await.expect("usage");
    assert_eq!(
        usage.iter().map(|u| u.recent_starts).collect::<Vec<_>>(),
        vec![2, 2]
    );
    assert!(
        fetch(h, &["calls"], 10).await.is_empty(),
        "finished jobs' starts still count within the period"
    );
    h.advance(millis(1001));
    let next = store
        .jobs_fetch(fetch_params(&["calls"], 10))
        .await
        .expect("fetch");
    assert_eq!(next.len(), 4, "a new period: {:?}", customers(&next));
}

/// A limit's values are read at each claim, so a change applies to the next one; a deleted
/// limit holds nothing, though jobs still carry its key.
pub async fn a_changed_or_deleted_limit_applies_at_the_next_claim(h: &Harness) {
    let store: Arc<dyn Store> = LimitStamps::wrap(h.store.clone());
    define(&*store, "gate", json!({"concurrency": 1})).await;
    queue_naming(&*store, "q", &["gate"]).await;
    store
        .jobs_insert_many((0..6).map(|_| job_in("q", "k")).collect())
        .await
        .expect("insert");
    assert_eq!(fetch(h, &["q"], 10).await.len(), 1);
    define(&*store, "gate", json!({"concurrency": 3})).await;
    assert_eq!(fetch(h, &["q"], 10).await.len(), 2, "raised to 3");
    store
        .config_delete(conveyor_core::config::LIMITS, "gate")
        .await
        .expect("delete");
    assert_eq!(fetch(h, &["q"], 10).await.len(), 3, "deleted: no limit");
}

/// Jobs take turns by their first keyed limit's key, so a flood of one key enqueued first does
/// not hold back the others, and a key weighing 3 gets three starts per turn.
pub async fn a_keyed_limits_keys_take_turns_by_weight(h: &Harness) {
    let store = under_per_customer(
        h,
        "calls",
        json!({"concurrency": 1000, "key": "payload.customer.id", "weights": {"big": 3}}),
    )
    .await;
    let mut jobs: Vec<NewJob> = (0..200).map(|_| customer_job("calls", "big")).collect();
    for small in ["s1", "s2", "s3"] {
        jobs.extend((0..4).map(|_| customer_job("calls", small)));
    }
    // And jobs under no keyed limit take a turn of their own.
    jobs.extend((0..4).map(|_| job_in("calls", "plain")));
    store.jobs_insert_many(jobs).await.expect("insert");
    let first = store
        .jobs_fetch(fetch_params(&["calls"], 14))
        .await
        .expect("fetch");
    // Turns in key order, the group without a key last: big ×3, s1, s2, s3, plain; twice.
    let expected: Vec<&str> = ["big", "big", "big", "s1", "s2", "s3", "?"].repeat(2);
    assert_eq!(customers(&first), expected);
    // The rotation carries on across fetches, and every small key's and plain job is started
    // long before the flood is done.
    let mut rest = Vec::new();
    for _ in 0..3 {
        rest.extend(
            store
                .jobs_fetch(fetch_params(&["calls"], 7))
                .await
                .expect("fetch"),
        );
    }
    for small in ["s1", "s2", "s3"] {
        assert_eq!(count_of(&rest, small), 2, "{:?}", customers(&rest));
    }
    assert_eq!(rest.iter().filter(|job| job.kind == "plain").count(), 2);
}

/// The harness's store behind the stamps, with `queue` under the limit `per-customer`
/// defined as `limit`.
async fn under_per_customer(h: &Harness, queue: &str, limit: Value) -> Arc<dyn Store> {
    let store = LimitStamps::wrap(h.store.clone());
    define(&*store, "per-customer", limit).await;
    queue_naming(&*store, queue, &["per-customer"]).await;
    store
}

/// `queue` under a limit keyed by customer that never holds a job back: what is left to see
/// is the order keys take their turns in.
async fn taking_turns(h: &Harness, queue: &str) -> Arc<dyn Store> {
    let limit = json!({"concurrency": 1000, "key": "payload.customer.id"});
    under_per_customer(h, queue, limit).await
}

/// `each` jobs of every customer in `names`, customer by customer.
fn jobs_of(queue: &str, names: &[&str], each: usize) -> Vec<NewJob> {
    names
        .iter()
        .flat_map(|customer| (0..each).map(move |_| customer_job(queue, customer)))
        .collect()
}

/// A fetch of up to `max` jobs of `queue`.
async fn take(store: &dyn Store, queue: &str, max: usize) -> Vec<Job> {
    store
        .jobs_fetch(fetch_params(&[queue], max))
        .await
        .expect("fetch")
}

/// A key whose first jobs arrive while the others are being served waits at most one turn,
/// wherever its name sorts: it joins the turn being served, not the start of the line (where
/// it would wait behind every turn the others have queued) nor ahead of the others' next turn.
pub async fn a_key_that_arrives_late_waits_at_most_one_turn(h: &Harness) {
    let store = taking_turns(h, "late").await;
    let early = jobs_of("late", &["b", "c", "d"], 20);
    store.jobs_insert_many(early).await.expect("insert");
    // Three turns of three keys.
    assert_eq!(take(&*store, "late", 9).await.len(), 9);
    // A customer whose name sorts first and one whose name sorts last arrive, with a few jobs.
    let late = jobs_of("late", &["a", "e"], 3);
    store.jobs_insert_many(late).await.expect("insert late");
    let mut turn = customers(&take(&*store, "late", 5).await);
    turn.sort();
    assert_eq!(turn, ["a", "b", "c", "d", "e"], "one turn, each key once");
}

/// Jobs of one key that become available together later (delayed, then due) take their turns
/// one at a time among the keys waiting then, not all at once ahead of them.
pub async fn a_burst_that_comes_due_takes_one_turn_at_a_time(h: &Harness) {
    let store = taking_turns(h, "due").await;
    let later = h.now() + span(secs(3600));
    let mut jobs = jobs_of("due", &["burst"], 20);
    for job in &mut jobs {
        job.run_at = Some(later);
    }
    jobs.extend(jobs_of("due", &["b", "c"], 20));
    store.jobs_insert_many(jobs).await.expect("insert");
    let before = take(&*store, "due", 10).await;
    assert_eq!(count_of(&before, "burst"), 0, "not due yet");
    h.advance(secs(3601));
    let after = take(&*store, "due", 6).await;
    assert_eq!(after.len(), 6);
    for customer in ["burst", "b", "c"] {
        assert_eq!(
            count_of(&after, customer),
            2,
            "two turns of three keys: {:?}",
            customers(&after)
        );
    }
}

/// Priority leads across keys: a higher-priority job runs before every lower-priority one
/// whatever its key, keys take turns within each priority, and within a key priority decides
/// too.
pub async fn priority_leads_across_keys_and_within_a_key(h: &Harness) {
    let store = taking_turns(h, "urgent").await;
    store
        .jobs_insert_many(jobs_of("urgent", &["a", "b"], 3))
        .await
        .expect("insert");
    let mut urgent = jobs_of("urgent", &["b", "c", "c"], 1);
    for job in &mut urgent {
        job.priority = 10;
    }
    store.jobs_insert_many(urgent).await.expect("insert urgent");
    let first = take(&*store, "urgent", 4).await;
    let priorities: Vec<i32> = first.iter().map(|job| job.priority).collect();
    assert_eq!(priorities, [10, 10, 10, 0], "{:?}", customers(&first));
    assert_eq!(
        customers(&first),
        ["b", "c", "c", "a"],
        "the urgent ones, keys in turn (b, c, then c's second), then the others' first turn"
    );
}

/// Enqueues of one key racing each other take consecutive turns, not the same ones, so a key
/// that arrives after them still alternates with the flood.
pub async fn racing_enqueues_of_one_key_take_consecutive_turns(h: &Harness) {
    let store = taking_turns(h, "race").await;
    // The flood's key record exists before the race, as it would once the key is in use.
    store
        .jobs_insert_many(jobs_of("race", &["flood"], 1))
        .await
        .expect("insert");
    let batches = (0..4).map(|_| {
        let store = store.clone();
        async move {
            store
                .jobs_insert_many(jobs_of("race", &["flood"], 25))
                .await
                .expect("insert racing")
        }
    });
    futures::future::join_all(batches).await;
    store
        .jobs_insert_many(jobs_of("race", &["late"], 2))
        .await
        .expect("insert late");
    // Two enqueues given the same turns would put two of the flood's jobs in its second turn.
    let first = take(&*store, "race", 4).await;
    assert_eq!(customers(&first), ["flood", "late", "flood", "late"]);
}
