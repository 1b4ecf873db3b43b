//! Events: what an event makes (jobs and flows, `FlowStore::events_accept`) is stored in one
//! transaction, all or none, and found again by its idempotency keys.

use conveyor_core::workflow::{FlowListParams, NewFlow, ValidFlow};
use conveyor_core::{NewJob, QueueSettings, StoreError, ValidJob};
use serde_json::json;

use crate::kit::{fetch, fetch_none, insert, job_in, Harness};

fn keyed_job(queue: &str, key: &str) -> ValidJob {
    let mut job = job_in(queue, "event.job");
    job.payload = json!({"user": 7});
    job.idempotency_key = Some(key.to_string());
    ValidJob::new(job).expect("a valid job")
}

fn keyed_flow(queue: &str, key: &str) -> ValidFlow {
    let step = |name: &str| {
        let mut job = NewJob::new(format!("event.{name}"), json!({"user": 7}));
        job.queue = queue.to_string();
        (name.to_string(), job)
    };
    ValidFlow::new(NewFlow::chain([step("a"), step("b")]).idempotency_key(key))
        .expect("a valid flow")
}

async fn flow_count(h: &Harness) -> usize {
    h.store
        .flows_list(FlowListParams::newest(100))
        .await
        .expect("flows_list")
        .len()
}

pub async fn events_accept_stores_jobs_and_flows_all_or_none_once(h: &Harness) {
    // A part the store refuses (a job into a full queue, after the flow in the same call)
    // stores nothing of the call.
    let mut small = QueueSettings::default();
    small.max_depth = Some(1);
    h.store
        .queue_settings_put("ev-small", small)
        .await
        .expect("limit");
    insert(h, job_in("ev-small", "filler")).await;
    let refused = h
        .store
        .events_accept(
            vec![
                keyed_job("ev-jobs", "event:e1:first"),
                keyed_job("ev-small", "event:e1:second"),
            ],
            vec![keyed_flow("ev-flows", "event:e1:third")],
        )
        .await
        .expect_err("a job into a full queue refuses the whole call");
    assert!(
        matches!(refused, StoreError::QueueFull { .. }),
        "{refused:?}"
    );
    assert_eq!(
        flow_count(h).await,
        0,
        "no flow of a refused call is stored"
    );
    fetch_none(h, "ev-jobs", "no job of a refused call is stored").await;
    fetch_none(h, "ev-flows", "no flow step of a refused call is stored").await;

    // Accepted: each job and flow made once, in the order given.
    let jobs = || {
        vec![
            keyed_job("ev-jobs", "event:e2:first"),
            keyed_job("ev-jobs", "event:e2:second"),
        ]
    };
    let flows = || {
        vec![
            keyed_flow("ev-flows", "event:e2:third"),
            keyed_flow("ev-flows", "event:e2:fourth"),
        ]
    };
    let first = h
        .store
        .events_accept(jobs(), flows())
        .await
        .expect("accepted");
    assert_eq!((first.jobs.len(), first.flows.len()), (2, 2));
    assert!(first.jobs.iter().all(|job| !job.duplicate), "{first:?}");
    assert!(first.flows.iter().all(|flow| !flow.duplicate), "{first:?}");
    assert_eq!(
        first.jobs[1].job.idempotency_key.as_deref(),
        Some("event:e2:second")
    );
    assert_eq!(flow_count(h).await, 2);

    // The same event again: everything found by its key, nothing new.
    let again = h
        .store
        .events_accept(jobs(), flows())
        .await
        .expect("accepted again");
    assert!(again.jobs.iter().all(|job| job.duplicate), "{again:?}");
    assert!(again.flows.iter().all(|flow| flow.duplicate), "{again:?}");
    let ids = |accepted: &conveyor_core::Accepted| {
        (
            accepted.jobs.iter().map(|i| i.job.id).collect::<Vec<_>>(),
            accepted.flows.iter().map(|f| f.id).collect::<Vec<_>>(),
        )
    };
    assert_eq!(ids(&again), ids(&first));
    assert_eq!(flow_count(h).await, 2, "no second flow");
    assert_eq!(
        fetch(h, &["ev-jobs"], 10).await.len(),
        2,
        "two jobs, once each"
    );
    let started = fetch(h, &["ev-flows"], 10).await;
    assert_eq!(
        started.len(),
        2,
        "each flow's first step, once: {started:?}"
    );

    // Nothing given, nothing stored.
    let empty = h
        .store
        .events_accept(Vec::new(), Vec::new())
        .await
        .expect("an empty call");
    assert_eq!(empty, conveyor_core::Accepted::default());
}
