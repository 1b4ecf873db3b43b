//! The `kafka` source against Tansu, an Apache Kafka-compatible broker (started by each test on
//! a port of its own with in-memory storage, and killed at its end), and a real SQLite store:
//! each record becomes exactly one job, and the group's offsets are committed only once the jobs
//! are stored. 10,000 records over three partitions make 10,000 jobs with the group's lag at
//! zero; a source killed mid-ingest and started again leaves every record one job; a full
//! queue holds the batch (its offsets uncommitted) until it accepts again; bodies that are not
//! JSON are kept or dead-lettered; two sources in one group share the partitions without
//! duplicates; a cut connection is reconnected.
//!
//! Tansu is started as `../../conveyor/tests/support/tansu.rs` says (shared with the server's
//! Kafka tests in `crates/conveyor/tests/sources_brokers.rs`).

mod kit;

#[path = "../../conveyor/tests/support/proxy.rs"]
mod proxy;

use conveyor_core::JobState;
use conveyor_sources::SourceState;
use kit::*;
use serde_json::{json, Value};
use std::time::Duration;

#[path = "../../conveyor/tests/support/tansu.rs"]
mod tansu;

use tansu::{Tansu, PARTITIONS};

/// A broker whose clients all reach it through a proxy (it advertises the proxy's address),
/// so cutting the proxy's connections cuts every connection a client has.
async fn tansu_behind_proxy() -> (Tansu, proxy::Proxy) {
    let port = tansu::free_port();
    let proxy = proxy::Proxy::start(([127, 0, 0, 1], port).into()).await;
    let tansu = Tansu::start_on(port, proxy.addr.to_string()).await;
    (tansu, proxy)
}

/// A topic of the test's own, with three partitions.
async fn topic(tansu: &Tansu, prefix: &str) -> String {
    let name = unique(prefix);
    tansu.create_topic(&name).await;
    name
}

/// The source's configuration for `topic` on `tansu`, with `extra` fields merged in.
fn config(tansu: &Tansu, name: &str, topic: &str, group: &str, extra: Value) -> Value {
    let mut config = json!({
        "name": name,
        "type": "kafka",
        "brokers": tansu.address,
        "topic": topic,
        "group": group,
        "job": { "kind": "order.placed", "queue": QUEUE },
    });
    if let (Some(config), Some(extra)) = (config.as_object_mut(), extra.as_object()) {
        for (key, value) in extra {
            config.insert(key.clone(), value.clone());
        }
    }
    config
}

fn bodies(range: std::ops::Range<u64>) -> impl Iterator<Item = Vec<u8>> {
    range.map(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_records_become_ten_thousand_jobs_each_committed() {
    let tansu = Tansu::start().await;
    let store = open_store();
    let topic = topic(&tansu, "drain").await;
    tansu.publish(&topic, bodies(0..10_000), &[]).await;
    let source = start(
        spec(config(
            &tansu,
            "orders",
            &topic,
            "conveyor",
            json!({ "max_in_flight": 500 }),
        )),
        &store,
    );
    wait_until!(
        Duration::from_secs(120),
        format_args!("10,000 jobs: {}", source.status.view()),
        source.count("enqueued") == 10_000,
        SLOW_POLL
    );
    assert_eq!(source.count("received"), 10_000);
    assert_eq!(source.count("duplicate"), 0);
    assert_eq!(source.state(), SourceState::Running);
    each_once(&store, QUEUE, "orders", 0..10_000).await;
    wait_until!(
        Duration::from_secs(30),
        "every record committed",
        tansu.unacknowledged(&topic, "conveyor").await == 0,
        SLOW_POLL
    );
    // The identity is the topic, the partition and the offset; all three partitions were read.
    let mut partitions = std::collections::BTreeSet::new();
    for job in kit::jobs(&store, QUEUE, None).await {
        let key = job.idempotency_key.unwrap_or_default();
        let identity = key.strip_prefix("source:orders:").unwrap_or_default();
        let mut parts = identity.rsplitn(3, ':');
        let offset = parts.next().and_then(|o| o.parse::<i64>().ok());
        let partition = parts.next().and_then(|p| p.parse::<i32>().ok());
        assert_eq!(parts.next(), Some(topic.as_str()), "{key}");
        assert!(offset.is_some(), "{key}");
        partitions.insert(partition.expect("a partition"));
    }
    assert_eq!(partitions.len(), PARTITIONS as usize);
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_killed_mid_ingest_leaves_every_record_one_job_after_its_restart() {
    let tansu = Tansu::start().await;
    let store = open_store();
    let topic = topic(&tansu, "kill").await;
    tansu.publish(&topic, bodies(0..5_000), &[]).await;
    // Small batches, so the kill lands while most of the topic is still to do.
    let config = spec(config(
        &tansu,
        "orders",
        &topic,
        "conveyor",
        json!({ "max_in_flight": 50, "session_timeout_ms": 6000 }),
    ));
    let source = start(config.clone(), &store);
    wait_until!(
        Duration::from_secs(60),
        "some jobs stored",
        source.count("enqueued") >= 500
    );
    source.abort().await;
    assert!(
        tansu.unacknowledged(&topic, "conveyor").await > 0,
        "the kill came after the whole topic was ingested: it tested no recovery"
    );
    // The killed member leaves the group when its session times out; the new one starts from
    // the offsets committed, and what was stored and not committed is found again.
    let source = start(config, &store);
    wait_until!(
        Duration::from_secs(120),
        format_args!("5,000 jobs: {}", source.status.view()),
        depth(&store, QUEUE).await >= 5_000,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(30),
        "every record committed",
        tansu.unacknowledged(&topic, "conveyor").await == 0,
        SLOW_POLL
    );
    each_once(&store, QUEUE, "orders", 0..5_000).await;
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_the_batch_uncommitted_until_it_accepts_again() {
    let tansu = Tansu::start().await;
    let store = open_store();
    let topic = topic(&tansu, "full").await;
    set_max_depth(&store, QUEUE, Some(50)).await;
    tansu.publish(&topic, bodies(0..300), &[]).await;
    let source = start(
        spec(config(
            &tansu,
            "orders",
            &topic,
            "conveyor",
            json!({ "max_in_flight": 20 }),
        )),
        &store,
    );
    wait_until!(
        Duration::from_secs(60),
        "the source to back off",
        source.state() == SourceState::BackingOff,
        SLOW_POLL
    );
    let held = depth(&store, QUEUE).await;
    assert!(held <= 50, "{held} jobs past a maximum depth of 50");
    // The refused batch is not committed: the group still owes at least the rest.
    assert!(tansu.unacknowledged(&topic, "conveyor").await >= 300 - held as i64);
    set_max_depth(&store, QUEUE, None).await;
    wait_until!(
        Duration::from_secs(60),
        "all 300 jobs",
        depth(&store, QUEUE).await == 300,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(30),
        "every record committed",
        tansu.unacknowledged(&topic, "conveyor").await == 0,
        SLOW_POLL
    );
    assert_eq!(source.state(), SourceState::Running);
    assert!(source.count("refused") >= 1);
    assert_eq!(source.count("duplicate"), 0, "the held batch came again");
    each_once(&store, QUEUE, "orders", 0..300).await;
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_are_not_json_are_kept_or_dead_lettered() {
    let tansu = Tansu::start().await;
    let store = open_store();
    let topic = topic(&tansu, "invalid").await;
    // Two sources on the topic, each in its own group: one keeps what is not JSON as base64,
    // the other dead-letters it. The kind comes from a header.
    let mut kept = config(
        &tansu,
        "kept",
        &topic,
        "kept",
        json!({ "on_invalid": "raw" }),
    );
    kept["job"] = json!({ "kind": { "from": "header:kind" }, "queue": "kept" });
    let mut dead = config(
        &tansu,
        "dead",
        &topic,
        "dead",
        json!({ "on_invalid": "dead_letter" }),
    );
    dead["job"] = json!({ "kind": { "from": "header:kind" }, "queue": "dead" });
    tansu
        .publish(&topic, [b"not json".to_vec()], &[("kind", "raw.thing")])
        .await;
    let kept = start(spec(kept), &store);
    let dead = start(spec(dead), &store);
    wait_until!(
        Duration::from_secs(60),
        "both sources' jobs",
        kept.count("enqueued") == 1 && dead.count("enqueued") == 1,
        SLOW_POLL
    );
    let kept_jobs = kit::jobs(&store, "kept", None).await;
    assert_eq!(kept_jobs.len(), 1);
    assert_eq!(kept_jobs[0].kind, "raw.thing");
    assert_eq!(kept_jobs[0].state, JobState::Available);
    assert_eq!(kept_jobs[0].payload["raw_base64"], "bm90IGpzb24=");
    assert_eq!(kept_jobs[0].payload["headers"]["kind"], "raw.thing");
    let dead_jobs = kit::jobs(&store, "dead", None).await;
    assert_eq!(dead_jobs.len(), 1);
    assert_eq!(dead_jobs[0].state, JobState::Dead);
    assert_eq!(dead_jobs[0].payload["raw_base64"], "bm90IGpzb24=");
    assert_eq!(kept.count("invalid"), 1);
    assert_eq!(dead.count("invalid"), 1);
    for group in ["kept", "dead"] {
        wait_until!(
            Duration::from_secs(30),
            "the record committed",
            tansu.unacknowledged(&topic, group).await == 0,
            SLOW_POLL
        );
    }
    kept.stop().await;
    dead.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_sources_in_one_group_share_the_partitions_without_duplicates() {
    let tansu = Tansu::start().await;
    let store = open_store();
    let topic = topic(&tansu, "shared").await;
    let config = spec(config(
        &tansu,
        "orders",
        &topic,
        "conveyor",
        json!({ "max_in_flight": 100 }),
    ));
    let first = start(config.clone(), &store);
    let second = start(config, &store);
    wait_until!(
        Duration::from_secs(60),
        "both members holding partitions",
        // A member knows its lag once it holds partitions and its positions in them: the
        // second's means the group has shared the partitions between the two.
        first.status.lag().is_some() && second.status.lag().is_some(),
        SLOW_POLL
    );
    tansu.publish(&topic, bodies(0..3_000), &[]).await;
    wait_until!(
        Duration::from_secs(120),
        "3,000 jobs",
        depth(&store, QUEUE).await == 3_000,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(30),
        "every record committed",
        tansu.unacknowledged(&topic, "conveyor").await == 0,
        SLOW_POLL
    );
    each_once(&store, QUEUE, "orders", 0..3_000).await;
    let received = [first.count("received"), second.count("received")];
    assert!(
        received.iter().all(|&n| n > 0),
        "one member read everything: {received:?}"
    );
    // A rebalance may hand a partition over before its last batch is committed: the new
    // holder reads that batch again and finds its jobs (duplicates, not second jobs).
    let duplicates = first.count("duplicate") + second.count("duplicate");
    assert_eq!(received.iter().sum::<u64>(), 3_000 + duplicates);
    first.stop().await;
    second.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_reconnected_and_every_record_is_one_job() {
    let (tansu, proxy) = tansu_behind_proxy().await;
    let store = open_store();
    let topic = topic(&tansu, "cut").await;
    tansu.publish(&topic, bodies(0..2_000), &[]).await;
    let source = start(
        spec(config(
            &tansu,
            "orders",
            &topic,
            "conveyor",
            json!({ "max_in_flight": 50, "session_timeout_ms": 6000 }),
        )),
        &store,
    );
    wait_until!(
        Duration::from_secs(60),
        "some jobs stored",
        source.count("enqueued") >= 200
    );
    assert!(proxy.cut() > 0, "the proxy carried no connection to cut");
    wait_until!(
        Duration::from_secs(120),
        "2,000 jobs",
        depth(&store, QUEUE).await == 2_000,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(30),
        "every record committed",
        tansu.unacknowledged(&topic, "conveyor").await == 0,
        SLOW_POLL
    );
    each_once(&store, QUEUE, "orders", 0..2_000).await;
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latest_start_skips_what_the_topic_held() {
    let tansu = Tansu::start().await;
    let store = open_store();
    let topic = topic(&tansu, "latest").await;
    tansu.publish(&topic, bodies(0..100), &[]).await;
    let source = start(
        spec(config(
            &tansu,
            "orders",
            &topic,
            "conveyor",
            json!({ "start": "latest" }),
        )),
        &store,
    );
    wait_until!(
        Duration::from_secs(60),
        "the source running",
        source.state() == SourceState::Running,
        SLOW_POLL
    );
    // The member has joined and found its positions (at the end) once its lag is known.
    wait_until!(
        Duration::from_secs(60),
        "the source's lag",
        source.status.lag().is_some(),
        SLOW_POLL
    );
    tansu.publish(&topic, bodies(100..150), &[]).await;
    wait_until!(
        Duration::from_secs(60),
        "50 jobs",
        depth(&store, QUEUE).await == 50,
        SLOW_POLL
    );
    each_once(&store, QUEUE, "orders", 100..150).await;
    source.stop().await;
}
