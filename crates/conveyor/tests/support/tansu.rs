//! Tansu, an Apache Kafka-compatible broker, for the Kafka source's tests: a process of the
//! test's own on a port of its own with in-memory storage, killed (by its pid) when dropped,
//! with a krafka client to make topics, publish and read the group's committed offsets.
//!
//! Tansu is found from CONVEYOR_TANSU, else `tansu` in cargo's bin directory or on PATH;
//! without it the tests fail saying how to install it (scripts/test.sh does).
#![allow(dead_code)]

use krafka::admin::{AdminClient, NewTopic, TopicPartition};
use krafka::{Kafka, Record};
use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The partitions of every topic a test makes.
pub const PARTITIONS: i32 = 3;

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
                 `cargo install tansu --version 0.6.0 --locked --features dynostore` \
                 (scripts/test.sh does this), or set CONVEYOR_TANSU to a tansu executable"
            )
        })
}

/// A port nothing listens on (the OS's pick, released at once).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

pub struct Tansu {
    child: Child,
    /// Where clients reach it (the address it advertises).
    pub address: String,
    pub kafka: Kafka,
    /// Each partition's end offset, from the offsets the broker gave the records published.
    ends: Mutex<HashMap<(String, i32), i64>>,
    _log: tempfile::TempDir,
}

impl Tansu {
    /// A broker listening on 127.0.0.1:`port` that tells clients to reach it at `advertised`
    /// (its own address, or a proxy's in front of it).
    pub async fn start_on(port: u16, advertised: String) -> Tansu {
        let log = tempfile::tempdir().expect("temp dir");
        let log_path = log.path().join("tansu.log");
        let log_file = std::fs::File::create(&log_path).expect("tansu's log");
        let executable = tansu_path();
        let child = Command::new(&executable)
            .args([
                "broker",
                "--listener-url",
                &format!("tcp://127.0.0.1:{port}"),
                "--advertised-listener-url",
                &format!("tcp://{advertised}"),
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
            match Kafka::builder(advertised.clone())
                .client_id("conveyor-test")
                .connect()
                .await
            {
                Ok(kafka) => break kafka,
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "tansu did not answer on {advertised}: {error}: {}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        Tansu {
            child,
            address: advertised,
            kafka,
            ends: Mutex::default(),
            _log: log,
        }
    }

    /// A broker on a free port, reached directly.
    pub async fn start() -> Tansu {
        let port = free_port();
        Tansu::start_on(port, format!("127.0.0.1:{port}")).await
    }

    fn admin(&self) -> AdminClient {
        self.kafka.admin()
    }

    /// Makes the topic `name` with [`PARTITIONS`] partitions.
    pub async fn create_topic(&self, name: &str) {
        let created = self
            .admin()
            .create_topics(
                [NewTopic::new(name, PARTITIONS, 1).expect("a topic")],
                Default::default(),
            )
            .await
            .expect("create the topic");
        for (topic, result) in created {
            result.unwrap_or_else(|error| panic!("create {topic}: {error}"));
        }
    }

    /// Publishes `bodies` to `topic`, keyed by their position so they spread over the
    /// partitions, with `headers` on each, each record a batch of its own.
    pub async fn publish(
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
    /// are those the broker gave the records published (Tansu 0.6's ListOffsets answers 1 for
    /// the latest offset of a partition holding many records).
    pub async fn unacknowledged(&self, topic: &str, group: &str) -> i64 {
        let committed = self
            .admin()
            .list_consumer_group_offsets(group, Default::default())
            .await
            .expect("the group's offsets");
        let ends = self.ends.lock().expect("the end offsets").clone();
        (0..PARTITIONS)
            .map(|partition| {
                let end = ends
                    .get(&(topic.to_string(), partition))
                    .copied()
                    .unwrap_or(0);
                let done = committed
                    .get(&TopicPartition::new(topic, partition))
                    .and_then(|offset| offset.as_ref().ok())
                    .and_then(|offset| offset.offset)
                    .unwrap_or(0);
                end - done
            })
            .sum()
    }
}

impl Drop for Tansu {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
