//! The `kafka` source against Tansu, an Apache Kafka-compatible broker (started by each test on
//! a port of its own with in-memory storage, and killed at its end), and a real SQLite store:
//! each record becomes exactly one job, and the group's offsets are committed only once the jobs
//! are stored. 10,000 records over three partitions make 10,000 jobs with the group's lag at
//! zero; a source killed mid-ingest and started again leaves every record one job; a full
//! queue holds the batch (its offsets uncommitted) until it accepts again; bodies that are not
//! JSON are kept or dead-lettered; two sources in one group share the partitions without
//! duplicates; a cut connection is reconnected.
//!
//! Tansu is found from CONVEYOR_TANSU, else `tansu` in cargo's bin directory or on PATH;
//! without it the tests fail saying how to install it (scripts/test.sh does).

mod kit;

#[path = "../../conveyor/tests/support/proxy.rs"]
mod proxy;

use conveyor_core::JobState;
use conveyor_sources::SourceState;
use kit::*;
use krafka::admin::{AdminClient, NewTopic, TopicPartition};
use krafka::{Kafka, Record};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const PARTITIONS: i32 = 3;

fn tansu_path() -> PathBuf {
    if let Some(path) = std::env::var_os("CONVEYOR_TANSU") {
        return PathBuf::from(path);
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(home) = std::env::var_os("CARGO_HOME") {
        candidates.push(PathBuf::from(home).join("bin/tansu"));
    }
    if let Some(home) = std::env::var_os("HOME") {
        candidates.push(PathBuf::from(home).join(".cargo/bin/tansu"));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    candidates.extend(std::env::split_paths(&path).map(|dir| dir.join("tansu")));
    candidates
        .into_iter()
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "the Kafka tests need Tansu and found none: install it with \
                 `cargo install tansu --locked --features dynostore` (scripts/test.sh does \
                 this), or set CONVEYOR_TANSU to a tansu executable"
            )
        })
}

/// A Tansu broker of the test's own, killed (by its pid) when dropped.
struct Tansu {
    child: Child,
    address: String,
    kafka: Kafka,
    /// Each partition's end offset, from the offsets the broker gave the records published.
    ends: std::sync::Mutex<std::collections::HashMap<(String, i32), i64>>,
    _log: tempfile::TempDir,
}

impl Tansu {
    async fn start() -> Tansu {
        Tansu::start_advertising(false).await.0
    }

    /// A broker whose clients all reach it through a proxy (it advertises the proxy's
    /// address), so cutting the proxy's connections cuts every connection a client has.
    async fn start_behind_proxy() -> (Tansu, proxy::Proxy) {
        let (tansu, proxy) = Tansu::start_advertising(true).await;
        (tansu, proxy.expect("a proxy"))
    }

    async fn start_advertising(behind_proxy: bool) -> (Tansu, Option<proxy::Proxy>) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
        let own: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
        let proxy = if behind_proxy {
            Some(proxy::Proxy::start(own).await)
        } else {
            None
        };
        let address = proxy
            .as_ref()
            .map_or_else(|| own.to_string(), |proxy| proxy.addr.to_string());
        let listener = format!("tcp://{own}");
        let advertised = format!("tcp://{address}");
        let log = tempfile::tempdir().expect("temp dir");
        let log_path = log.path().join("tansu.log");
        let log_file = std::fs::File::create(&log_path).expect("tansu's log");
        let executable = tansu_path();
        let child = Command::new(&executable)
            .args([
                "broker",
                "--listener-url",
                &listener,
                "--advertised-listener-url",
                &advertised,
                "--storage-engine",
                "memory://tansu/",
            ])
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("log"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|error| panic!("start {}: {error}", executable.display()));
        let deadline = Instant::now() + Duration::from_secs(60);
        let kafka = loop {
            match Kafka::builder(address.clone())
                .client_id("conveyor-test")
                .connect()
                .await
            {
                Ok(kafka) => break kafka,
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "tansu did not answer on {address}: {error}: {}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let tansu = Tansu {
            child,
            address,
            kafka,
            ends: Default::default(),
            _log: log,
        };
        (tansu, proxy)
    }

    fn admin(&self) -> AdminClient {
        self.kafka.admin()
    }

    /// A topic of the test's own, with three partitions.
    async fn topic(&self, prefix: &str) -> String {
        let name = unique(prefix);
        let created = self
            .admin()
            .create_topics(
                [NewTopic::new(&name, PARTITIONS, 1).expect("a topic")],
                Default::default(),
            )
            .await
            .expect("create the topic");
        for (topic, result) in created {
            result.unwrap_or_else(|error| panic!("create {topic}: {error}"));
        }
        name
    }

    /// Publishes `bodies` to `topic`, keyed by their position so they spread over the
    /// partitions, with `headers` on each, each record a batch of its own.
    async fn publish(
        &self,
        topic: &str,
        bodies: impl IntoIterator<Item = Vec<u8>>,
        headers: &[(&str, &str)],
    ) {
        // One record per batch, so every offset starts a batch: Tansu 0.6 answers a fetch
        // from an offset inside a batch with the next batch, skipping the rest of that one
        // (Apache Kafka returns the batch holding the offset, and the consumer drops the
        // records before it). A group resuming from its committed offset fetches from there.
        let producer = self
            .kafka
            .producer()
            .batch_size(1)
            .build()
            .await
            .expect("a producer");
        let mut deliveries = Vec::new();
        for (index, body) in bodies.into_iter().enumerate() {
            let mut record = Record::new(topic.to_string(), body).key(format!("k{index}"));
            for (name, value) in headers {
                record = record.header(*name, value.as_bytes().to_vec());
            }
            deliveries.push(producer.enqueue(record).await.expect("enqueue a record"));
        }
        for delivery in deliveries {
            let stored = delivery.await.expect("a record delivered");
            assert!(stored.offset >= 0, "a record without an offset: {stored:?}");
            let mut ends = self.ends.lock().expect("the end offsets");
            let end = ends
                .entry((topic.to_string(), stored.partition))
                .or_insert(0);
            *end = (*end).max(stored.offset + 1);
        }
        producer.close().await.expect("close the producer");
    }

    /// Records the group has not committed past: each partition's end offset minus the
    /// group's committed offset (all of it where the group committed none). The end offsets
    /// are those the broker gave the records it stored (Tansu 0.6's ListOffsets answers 1 for
    /// the latest offset of a partition holding many records).
    async fn unacknowledged(&self, topic: &str, group: &str) -> i64 {
        let partitions: Vec<TopicPartition> = (0..PARTITIONS)
            .map(|partition| TopicPartition::new(topic, partition))
            .collect();
        let ends = self.ends.lock().expect("the end offsets").clone();
        let committed = self
            .admin()
            .list_consumer_group_offsets(group, Default::default())
            .await
            .expect("the group's offsets");
        partitions
            .iter()
            .map(|tp| {
                let end = ends
                    .get(&(topic.to_string(), tp.partition))
                    .copied()
                    .unwrap_or(0);
                let done = committed
                    .get(tp)
                    .and_then(|offset| offset.as_ref().ok())
                    .and_then(|offset| offset.offset)
                    .unwrap_or(0);
                end - done
            })
            .sum()
    }

    /// The source's configuration for `topic`, with `extra` fields merged in.
    fn source(&self, name: &str, topic: &str, group: &str, extra: Value) -> Value {
        let mut config = json!({
            "name": name,
            "type": "kafka",
            "brokers": self.address,
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
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn bodies(range: std::ops::Range<u64>) -> impl Iterator<Item = Vec<u8>> {
    range.map(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_records_become_ten_thousand_jobs_each_committed() {
    let tansu = Tansu::start().await;
    let store = open_store();
    let topic = tansu.topic("drain").await;
    tansu.publish(&topic, bodies(0..10_000), &[]).await;
    let source = start(
        spec(tansu.source(
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
    let topic = tansu.topic("kill").await;
    tansu.publish(&topic, bodies(0..5_000), &[]).await;
    // Small batches, so the kill lands while most of the topic is still to do.
    let config = spec(tansu.source(
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
    let topic = tansu.topic("full").await;
    set_max_depth(&store, QUEUE, Some(50)).await;
    tansu.publish(&topic, bodies(0..300), &[]).await;
    let source = start(
        spec(tansu.source("orders", &topic, "conveyor", json!({ "max_in_flight": 20 }))),
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
    let topic = tansu.topic("invalid").await;
    // Two sources on the topic, each in its own group: one keeps what is not JSON as base64,
    // the other dead-letters it. The kind comes from a header.
    let mut kept = tansu.source("kept", &topic, "kept", json!({ "on_invalid": "raw" }));
    kept["job"] = json!({ "kind": { "from": "header:kind" }, "queue": "kept" });
    let mut dead = tansu.source(
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
    let topic = tansu.topic("shared").await;
    let config = spec(tansu.source(
        "orders",
        &topic,
        "conveyor",
        json!({ "max_in_flight": 100 }),
    ));
    let first = start(config.clone(), &store);
    let second = start(config, &store);
    wait_until!(
        Duration::from_secs(60),
        "both running",
        first.state() == SourceState::Running && second.state() == SourceState::Running,
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
    let (tansu, proxy) = Tansu::start_behind_proxy().await;
    let store = open_store();
    let topic = tansu.topic("cut").await;
    tansu.publish(&topic, bodies(0..2_000), &[]).await;
    let source = start(
        spec(tansu.source(
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
    let topic = tansu.topic("latest").await;
    tansu.publish(&topic, bodies(0..100), &[]).await;
    let source = start(
        spec(tansu.source("orders", &topic, "conveyor", json!({ "start": "latest" }))),
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
