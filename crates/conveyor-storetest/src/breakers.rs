//! Circuit breakers: the records a store keeps (conditional on their version), breaker
//! settings kept with a queue's and a kind's settings, fetches that skip kinds, and the whole
//! open / half-open / closed cycle across two processes sharing the store.

use std::sync::Arc;

use conveyor_core::access::Actor;
use conveyor_core::breaker::BreakerRecord;
use conveyor_core::kinds::KindSettings;
use conveyor_core::{
    AuditAction, AuditListParams, BreakerScope, BreakerSettings, BreakerState, FetchParams,
    QueueSettings, StoredBreaker,
};
use conveyor_engine::breakers::Outcome;
use conveyor_engine::CircuitBreakers;

use crate::kit::{complete, fetch_params, ids, insert, lease_of, new_job, secs, span, Harness};

/// A checked fetch, as the long-poll hands the breakers.
fn valid_fetch(queues: &[&str], max: usize) -> conveyor_core::Valid<conveyor_core::FetchParams> {
    conveyor_core::Valid::fetch(fetch_params(queues, max)).expect("a valid fetch")
}

/// The same, for a worker that names the kinds it handles.
fn valid_fetch_of(
    queues: &[&str],
    max: usize,
    kinds: &[&str],
) -> conveyor_core::Valid<conveyor_core::FetchParams> {
    let mut params = fetch_params(queues, max);
    params.kinds = Some(kinds.iter().map(|k| k.to_string()).collect());
    conveyor_core::Valid::fetch(params).expect("a valid fetch")
}

fn stored(scope: BreakerScope, name: &str, version: u64, h: &Harness) -> StoredBreaker {
    StoredBreaker {
        scope,
        name: name.to_string(),
        version,
        record: BreakerRecord::closed(h.now()),
    }
}

/// A breaker's record is written only on the version it was read at: the first write of a
/// new one wins, a write on a stale version is refused; queue and kind breakers of one name
/// are distinct; a bad name is refused naming the field.
pub async fn breaker_records_are_written_only_on_their_version(h: &Harness) {
    let store = &h.store;
    assert!(store.breakers_list().await.expect("list").is_empty());
    let mut first = stored(BreakerScope::Queue, "mail", 0, h);
    first.record.calls = 3;
    assert!(store.breaker_write(&first).await.expect("insert"));
    assert!(
        !store.breaker_write(&first).await.expect("second insert"),
        "a second insert of a new breaker loses"
    );
    let read = store
        .breaker_get(BreakerScope::Queue, "mail")
        .await
        .expect("get")
        .expect("stored");
    assert_eq!((read.version, read.record.calls), (1, 3));
    let mut next = read.clone();
    next.record.state = BreakerState::Open;
    assert!(store.breaker_write(&next).await.expect("update"));
    assert!(
        !store.breaker_write(&next).await.expect("stale update"),
        "version 1 is stale now"
    );
    let kind = stored(BreakerScope::Kind, "mail", 0, h);
    assert!(store.breaker_write(&kind).await.expect("kind breaker"));
    let all = store.breakers_list().await.expect("list");
    let seen: Vec<(BreakerScope, &str, u64, BreakerState)> = all
        .iter()
        .map(|b| (b.scope, b.name.as_str(), b.version, b.record.state))
        .collect();
    assert_eq!(
        seen,
        vec![
            (BreakerScope::Kind, "mail", 1, BreakerState::Closed),
            (BreakerScope::Queue, "mail", 2, BreakerState::Open),
        ],
        "by scope name, then name"
    );
    assert!(store
        .breaker_get(BreakerScope::Kind, "other")
        .await
        .expect("get")
        .is_none());
    let bad = stored(BreakerScope::Queue, "bad name\u{0}", 0, h);
    let error = store.breaker_write(&bad).await.expect_err("bad name");
    assert!(error.to_string().contains("name"), "{error}");
}

fn breaker(min_calls: u32, half_open_calls: u32) -> BreakerSettings {
    BreakerSettings {
        failure_ratio: 0.5,
        min_calls,
        window_ms: 60_000,
        open_ms: 10_000,
        half_open_calls,
        pause_on_retry_after: true,
    }
}

/// Breaker settings are kept with a queue's and with a kind's other settings, and cleared.
pub async fn breaker_settings_round_trip_with_queue_and_kind_settings(h: &Harness) {
    let mut settings = QueueSettings::default();
    settings.circuit_breaker = Some(breaker(7, 3));
    settings.concurrency_limit = Some(4);
    h.store
        .queue_settings_put("mail", settings.clone())
        .await
        .expect("put");
    assert_eq!(
        h.store.queue_settings_get("mail").await.expect("get"),
        settings
    );
    let listed = h.store.queue_settings_list().await.expect("list");
    assert_eq!(listed[0].settings.circuit_breaker, Some(breaker(7, 3)));
    settings.circuit_breaker = None;
    h.store
        .queue_settings_put("mail", settings.clone())
        .await
        .expect("clear");
    assert_eq!(
        h.store
            .queue_settings_get("mail")
            .await
            .expect("get")
            .circuit_breaker,
        None
    );
    let kind = KindSettings {
        kind: "send".to_string(),
        schema: None,
        version: None,
        circuit_breaker: Some(breaker(2, 1)),
        limits: Vec::new(),
        sequence: None,
        batch: None,
        updated_at: chrono::DateTime::UNIX_EPOCH,
    };
    h.store.kind_put(kind).await.expect("kind put");
    let read = h.store.kind_get("send").await.expect("get").expect("kind");
    assert_eq!(read.circuit_breaker, Some(breaker(2, 1)));
    let mut bad = QueueSettings::default();
    bad.circuit_breaker = Some(BreakerSettings {
        failure_ratio: 2.0,
        ..breaker(1, 1)
    });
    let error = h
        .store
        .queue_settings_put("mail", bad)
        .await
        .expect_err("ratio above 1");
    assert!(
        error.to_string().contains("circuit_breaker.failure_ratio"),
        "{error}"
    );
}

/// A fetch with excluded kinds skips their jobs, in a plain and in a limited queue,
/// and with kinds of its own only the others are left.
pub async fn a_fetch_skips_excluded_kinds(h: &Harness) {
    let mut limited = QueueSettings::default();
    limited.concurrency_limit = Some(10);
    h.store
        .queue_settings_put("limited", limited)
        .await
        .expect("limit");
    for queue in ["plain", "limited"] {
        let blocked = insert(h, {
            let mut job = new_job("blocked");
            job.queue = queue.to_string();
            job.priority = 5;
            job
        })
        .await;
        let other = insert(h, {
            let mut job = new_job("other");
            job.queue = queue.to_string();
            job
        })
        .await;
        let got = h
            .store
            .jobs_fetch(FetchParams {
                excluded_kinds: vec!["blocked".to_string()],
                ..fetch_params(&[queue], 10)
            })
            .await
            .expect("fetch");
        assert_eq!(ids(&got), vec![other.id], "{queue}: only the other kind");
        let none = h
            .store
            .jobs_fetch(FetchParams {
                kinds: Some(vec!["blocked".to_string()]),
                excluded_kinds: vec!["blocked".to_string()],
                ..fetch_params(&[queue], 10)
            })
            .await
            .expect("fetch");
        assert!(none.is_empty(), "{queue}: its only kind is excluded");
        let rest = h
            .store
            .jobs_fetch(fetch_params(&[queue], 10))
            .await
            .expect("fetch");
        assert_eq!(ids(&rest), vec![blocked.id], "{queue}: still queued");
    }
}

fn failed<'a>(queue: &'a str, kind: &'a str) -> Outcome<'a> {
    Outcome {
        queue,
        kind,
        succeeded: false,
        retry_at: None,
    }
}

/// The cycle across two processes sharing the store: failures counted by one open the
/// queue's breaker for both (jobs stay queued, enqueues go on); when the open time is up
/// exactly `half_open_calls` probes are handed out cluster-wide; a probe's success closes it;
/// every transition is in the audit log.
pub async fn a_queue_breaker_opens_probes_and_closes_across_processes(h: &Harness) {
    let mut settings = QueueSettings::default();
    settings.circuit_breaker = Some(breaker(2, 1));
    h.store
        .queue_settings_put("flaky", settings)
        .await
        .expect("settings");
    let clock: Arc<dyn conveyor_core::Clock> = h.clock.clone();
    let one = CircuitBreakers::new(h.store.clone(), clock.clone());
    let two = CircuitBreakers::new(h.store.clone(), clock);
    for _ in 0..5 {
        insert(h, {
            let mut job = new_job("call");
            job.queue = "flaky".to_string();
            job
        })
        .await;
    }
    let first = one.fetch(valid_fetch(&["flaky"], 2)).await.expect("fetch");
    assert_eq!(first.len(), 2);
    for _ in &first {
        one.record_now(failed("flaky", "call"))
            .await
            .expect("count");
    }
    let view = two.view(BreakerScope::Queue, "flaky").await.expect("view");
    assert_eq!(view.state, BreakerState::Open, "{view:?}");
    assert_eq!(view.open_until, Some(h.now() + span(secs(10))));
    assert!(
        two.fetch(valid_fetch(&["flaky"], 10))
            .await
            .expect("fetch")
            .is_empty(),
        "open: nothing handed out by the other process"
    );
    let queued = insert(h, {
        let mut job = new_job("call");
        job.queue = "flaky".to_string();
        job
    })
    .await;
    assert_eq!(
        queued.state,
        conveyor_core::JobState::Available,
        "enqueue works"
    );
    h.advance(secs(10));
    let probe = two.fetch(valid_fetch(&["flaky"], 10)).await.expect("fetch");
    assert_eq!(probe.len(), 1, "half_open_calls = 1 probe");
    assert!(
        one.fetch(valid_fetch(&["flaky"], 10))
            .await
            .expect("fetch")
            .is_empty(),
        "the probe is handed out once across processes"
    );
    complete(h, lease_of(&probe[0]), None).await;
    two.record_now(Outcome {
        succeeded: true,
        ..failed("flaky", "call")
    })
    .await
    .expect("count");
    assert_eq!(
        one.view(BreakerScope::Queue, "flaky")
            .await
            .expect("view")
            .state,
        BreakerState::Closed
    );
    let rest = one.fetch(valid_fetch(&["flaky"], 10)).await.expect("fetch");
    // Six jobs: two running (their failures opened it), the probe done, three left.
    assert_eq!(rest.len(), 3, "closed: the rest is handed out");
    let mut params = AuditListParams::default();
    params.limit = 50;
    let audit = h.store.audit_list(params).await.expect("audit");
    let mut transitions: Vec<AuditAction> = audit
        .iter()
        .filter(|e| e.target.as_deref() == Some("queue:flaky"))
        .map(|e| e.action)
        .collect();
    transitions.reverse();
    assert_eq!(
        transitions,
        vec![
            AuditAction::BreakerOpen,
            AuditAction::BreakerHalfOpen,
            AuditAction::BreakerClose
        ]
    );
}

/// A kind's breaker holds back that kind in every queue while other kinds flow; a failed
/// probe opens it again; a retry-after pauses it until then; an operator's open without an
/// end holds until closed by hand.
pub async fn a_kind_breaker_holds_only_its_kind_and_obeys_operators(h: &Harness) {
    h.store
        .kind_put(KindSettings {
            kind: "charge".to_string(),
            schema: None,
            version: None,
            circuit_breaker: Some(breaker(1, 1)),
            limits: Vec::new(),
            sequence: None,
            batch: None,
            updated_at: chrono::DateTime::UNIX_EPOCH,
        })
        .await
        .expect("kind");
    let clock: Arc<dyn conveyor_core::Clock> = h.clock.clone();
    let breakers = CircuitBreakers::new(h.store.clone(), clock);
    let mut charges = Vec::new();
    for queue in ["a", "b"] {
        for kind in ["charge", "charge", "email"] {
            let job = insert(h, {
                let mut job = new_job(kind);
                job.queue = queue.to_string();
                job
            })
            .await;
            if kind == "charge" {
                charges.push(job.id);
            }
        }
    }
    breakers
        .record_now(failed("a", "charge"))
        .await
        .expect("count");
    let got = breakers
        .fetch(valid_fetch(&["a", "b"], 10))
        .await
        .expect("fetch");
    assert!(got.iter().all(|j| j.kind == "email"), "{got:?}");
    assert_eq!(got.len(), 2);
    h.advance(secs(10));
    let probe = breakers
        .fetch(valid_fetch(&["a", "b"], 10))
        .await
        .expect("fetch");
    assert_eq!(
        probe.iter().map(|j| j.kind.as_str()).collect::<Vec<_>>(),
        vec!["charge"]
    );
    breakers
        .record_now(failed(&probe[0].queue, "charge"))
        .await
        .expect("count");
    let view = breakers
        .view(BreakerScope::Kind, "charge")
        .await
        .expect("view");
    assert_eq!(view.state, BreakerState::Open, "a failed probe reopens");
    h.advance(secs(10));
    let probe = breakers
        .fetch(valid_fetch(&["a", "b"], 10))
        .await
        .expect("fetch");
    assert_eq!(probe.len(), 1);
    // The probe's handler got a 429 asking for a minute: the kind pauses that long.
    breakers
        .record_now(Outcome {
            retry_at: Some(h.now() + span(secs(60))),
            ..failed(&probe[0].queue, "charge")
        })
        .await
        .expect("count");
    let view = breakers
        .view(BreakerScope::Kind, "charge")
        .await
        .expect("view");
    assert_eq!(view.open_until, Some(h.now() + span(secs(60))));
    let operator = Actor {
        name: "ops".to_string(),
        token_id: None,
    };
    breakers
        .open(
            BreakerScope::Kind,
            "charge",
            None,
            Some("vendor outage".into()),
            &operator,
        )
        .await
        .expect("open by hand");
    h.advance(secs(3_600));
    assert!(breakers
        .fetch(valid_fetch(&["a", "b"], 10))
        .await
        .expect("fetch")
        .is_empty());
    // A worker that names its kinds (as the HTTP clients do) is held back the same way.
    assert!(breakers
        .fetch(valid_fetch_of(&["a", "b"], 10, &["charge", "email"]))
        .await
        .expect("fetch")
        .is_empty());
    let view = breakers
        .close(BreakerScope::Kind, "charge", None, &operator)
        .await
        .expect("close by hand");
    assert_eq!((view.state, view.manual), (BreakerState::Closed, false));
    let rest = breakers
        .fetch(valid_fetch(&["a", "b"], 10))
        .await
        .expect("fetch");
    assert_eq!(rest.len(), 2, "the remaining charges: {rest:?}");
    let mut params = AuditListParams::default();
    params.limit = 50;
    let audit = h.store.audit_list(params).await.expect("audit");
    assert!(audit
        .iter()
        .any(|e| e.actor == "ops" && e.action == AuditAction::BreakerClose));
}
