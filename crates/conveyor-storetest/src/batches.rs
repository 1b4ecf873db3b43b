//! Batches (`conveyor_core::batch`): a batch kind's jobs go out only to batch fetches, several
//! at a time, all of one kind, queue and key, once the group is full or its oldest job has
//! waited `max_wait_ms`. The looks go through the engine as the server's and the worker's do
//! (`conveyor_engine::Gates`), with the kind's settings read back from the store.

use std::time::Duration;

use conveyor_core::batch::BatchSpec;
use conveyor_core::kinds::KindSettings;
use conveyor_core::{FetchParams, Job, JobState, NewJob, Valid};
use conveyor_engine::batches::claim_batch;
use conveyor_engine::{fetch_waiting_with, Gates, KindRegistry, LimitStamps};
use serde_json::json;

use crate::kit::{fetch_params, get, insert, job_in, millis, span, Harness};

async fn batch_kind(h: &Harness, kind: &str, spec: BatchSpec) -> KindRegistry {
    h.store
        .kind_put(KindSettings {
            batch: Some(spec),
            ..KindSettings::new(kind)
        })
        .await
        .expect("kind settings");
    KindRegistry::new(h.store.clone())
}

fn row(queue: &str, account: &str, n: u32) -> NewJob {
    let mut job = job_in(queue, "rows.insert");
    job.payload = json!({"account": account, "n": n});
    job
}

/// One look, as a fetch that waits no time takes it.
async fn look(h: &Harness, kinds: &KindRegistry, params: FetchParams, batch: bool) -> Vec<Job> {
    let gates = Gates {
        breakers: None,
        kinds: Some(kinds),
        batch,
    };
    let params = Valid::fetch(params).expect("valid fetch");
    fetch_waiting_with(
        h.store.as_ref(),
        gates,
        params,
        Duration::ZERO,
        Duration::from_millis(10),
        None,
        std::future::pending(),
    )
    .await
    .expect("fetch")
}

fn numbers(jobs: &[Job]) -> Vec<u64> {
    let mut numbers: Vec<u64> = jobs
        .iter()
        .map(|job| job.payload["n"].as_u64().expect("n"))
        .collect();
    numbers.sort_unstable();
    numbers
}

/// Two jobs of a batch of three wait until the oldest has waited `max_wait_ms`; a third makes
/// the batch full and it goes out at once; what is left goes out when its time comes.
pub async fn a_batch_goes_out_full_or_when_its_oldest_has_waited(h: &Harness) {
    let spec = BatchSpec::of(3).max_wait_ms(1000);
    let kinds = batch_kind(h, "rows.insert", spec.clone()).await;
    insert(h, row("rows", "a", 1)).await;
    h.advance(millis(100));
    insert(h, row("rows", "a", 2)).await;
    let first_at = h.now() - span(millis(100));
    assert!(look(h, &kinds, fetch_params(&["rows"], 100), true)
        .await
        .is_empty());
    let batches = kinds.batches().await.expect("batch kinds");
    let early = claim_batch(
        h.store.as_ref(),
        None,
        &batches,
        &Valid::fetch(fetch_params(&["rows"], 100)).expect("valid"),
    )
    .await
    .expect("look");
    assert!(early.jobs.is_empty());
    assert_eq!(
        early.ready_at,
        Some(conveyor_core::clock::truncate_to_millis(
            first_at + span(millis(1000))
        )),
        "ready when the oldest has waited max_wait_ms"
    );
    insert(h, row("rows", "a", 3)).await;
    insert(h, row("rows", "a", 4)).await;
    let full = look(h, &kinds, fetch_params(&["rows"], 100), true).await;
    assert_eq!(numbers(&full), vec![1, 2, 3], "a full batch, oldest first");
    assert!(full.iter().all(|job| job.state == JobState::Running));
    assert!(
        look(h, &kinds, fetch_params(&["rows"], 100), true)
            .await
            .is_empty(),
        "one left: it waits"
    );
    h.advance(millis(1000));
    let rest = look(h, &kinds, fetch_params(&["rows"], 100), true).await;
    assert_eq!(numbers(&rest), vec![4]);
    // A fetch's own max caps the batch.
    for n in 5..9 {
        insert(h, row("rows", "a", n)).await;
    }
    let capped = look(h, &kinds, fetch_params(&["rows"], 2), true).await;
    assert_eq!(numbers(&capped), vec![5, 6]);
}

/// With a key, a batch holds one key value; jobs of other keys claimed on the way are given
/// back untouched (available, the attempt not counted) and go out in batches of their own.
pub async fn a_keyed_batch_holds_one_key_and_gives_the_rest_back(h: &Harness) {
    let spec = BatchSpec::of(2).max_wait_ms(1000).key("payload.account");
    let kinds = batch_kind(h, "rows.insert", spec).await;
    let mut inserted = Vec::new();
    for (n, account) in ["b", "a", "a", "b", "c"].iter().enumerate() {
        inserted.push(insert(h, row("rows", account, n as u32)).await);
        h.advance(millis(1));
    }
    let first = look(h, &kinds, fetch_params(&["rows"], 100), true).await;
    let accounts: Vec<&str> = first
        .iter()
        .map(|job| job.payload["account"].as_str().expect("account"))
        .collect();
    assert_eq!(
        accounts,
        vec!["b", "b"],
        "the first full key in claim order"
    );
    let given_back = get(h, inserted[1].id).await;
    assert_eq!(given_back.state, JobState::Available);
    assert_eq!(
        given_back.attempt, 0,
        "a job given back has no attempt counted"
    );
    let second = look(h, &kinds, fetch_params(&["rows"], 100), true).await;
    assert_eq!(numbers(&second), vec![1, 2]);
    assert!(look(h, &kinds, fetch_params(&["rows"], 100), true)
        .await
        .is_empty());
    h.advance(millis(1000));
    let last = look(h, &kinds, fetch_params(&["rows"], 100), true).await;
    assert_eq!(numbers(&last), vec![4]);
    assert_eq!(last[0].payload["account"], "c");
}

/// A limit holds a keyed batch's jobs as any: while one account is at its limit, the batch
/// of another that is ready goes out instead, and nothing claimed on the way stays claimed.
pub async fn a_limit_holds_a_batch_and_the_next_ready_one_goes(h: &Harness) {
    let h = &Harness::new(LimitStamps::wrap(h.store.clone()), h.clock.clone());
    h.store
        .config_put(
            conveyor_core::config::LIMITS,
            "per-account",
            json!({"concurrency": 1, "key": "payload.account"}),
        )
        .await
        .expect("define a limit");
    let mut settings = conveyor_core::QueueSettings::default();
    settings.limits = vec!["per-account".into()];
    h.store
        .queue_settings_put("rows", settings)
        .await
        .expect("queue settings");
    let kinds = batch_kind(h, "rows.insert", BatchSpec::of(1).key("payload.account")).await;
    insert(h, row("rows", "a", 0)).await;
    let running = look(h, &kinds, fetch_params(&["rows"], 10), true).await;
    assert_eq!(numbers(&running), vec![0], "account a's first job runs");
    let held = insert(h, row("rows", "a", 1)).await;
    h.advance(millis(1));
    let other = insert(h, row("rows", "b", 2)).await;
    let next = look(h, &kinds, fetch_params(&["rows"], 10), true).await;
    assert_eq!(next.len(), 1);
    assert_eq!(
        next[0].id, other.id,
        "account b's batch goes while a is held"
    );
    let still = get(h, held.id).await;
    assert_eq!(still.state, JobState::Available);
    assert_eq!(still.attempt, 0);
}

/// A plain fetch never claims a batch kind's jobs, whether it names kinds or not; a batch
/// fetch of a kind that is not a batch kind takes whatever of it waits, one kind at a time.
pub async fn a_plain_fetch_never_claims_a_batch_kind(h: &Harness) {
    let kinds = batch_kind(h, "rows.insert", BatchSpec::of(10)).await;
    let batched = insert(h, row("mixed", "a", 1)).await;
    let plain = insert(h, job_in("mixed", "mail.send")).await;
    let mut of_rows = fetch_params(&["mixed"], 10);
    of_rows.kinds = Some(vec!["rows.insert".into()]);
    assert!(look(h, &kinds, of_rows, false).await.is_empty());
    let any = look(h, &kinds, fetch_params(&["mixed"], 10), false).await;
    assert_eq!(any.len(), 1);
    assert_eq!(any[0].id, plain.id);
    assert_eq!(get(h, batched.id).await.state, JobState::Available);
    let mut mail = fetch_params(&["mixed"], 10);
    mail.kinds = Some(vec!["mail.send".into()]);
    insert(h, job_in("mixed", "mail.send")).await;
    insert(h, job_in("mixed", "mail.send")).await;
    let mails = look(h, &kinds, mail, true).await;
    assert_eq!(mails.len(), 2, "not a batch kind: what waits goes at once");
    assert!(mails.iter().all(|job| job.kind == "mail.send"));
}
