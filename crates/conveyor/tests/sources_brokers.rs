//! Event sources end to end for the brokers other than Redis (`sources_redis.rs` has those):
//! a real `conveyor serve` reading a real RabbitMQ (127.0.0.1:5672, guest/guest), NATS with
//! JetStream (127.0.0.1:4222), Mosquitto (127.0.0.1:1883) and moto's standalone server
//! standing in for SQS (started by each SQS test on a free port, killed at its end).
//!
//! - A server killed with SIGKILL mid-ingest and started again on the same SQLite file leaves
//!   every message exactly one job, and nothing unacknowledged at the broker (amqp, nats, mqtt,
//!   sqs, kafka).
//! - Two servers on one PostgreSQL schema share a source stored through the API: every message
//!   is one job, both servers read some, and what they received adds up to the messages sent
//!   (amqp, nats, sqs, kafka; SQS delivers at least once, and a Kafka rebalance hands a
//!   partition on from its last committed offset, so there a message received by both must be
//!   counted a duplicate instead). MQTT is left out: a source's `client_id` is part of its stored
//!   configuration, so every server runs it under the same client id, and an MQTT broker keeps
//!   one connection per client id (a second one takes the session over from the first); a
//!   shared subscription (`$share/group/topic`) does not change that, so two servers cannot
//!   share an MQTT source.
//! - A broker killed under a running server and started again on the same port and data
//!   directory: the source shows `error` with its `last_error` while `/readyz` still answers
//!   200, comes back to `running`, and every message published before and after is exactly one
//!   job (nats, mqtt and redis_stream, each on a private broker this test starts on a free
//!   port). RabbitMQ, SQS and Kafka are not restarted: the RabbitMQ here is the machine's shared
//!   service, which a test must not stop, and moto and Tansu (standing in for Kafka) keep their
//!   messages in memory, so a restarted one has lost them all (a restart could only test a
//!   loss); the Kafka source's reconnection is tested with a proxy cutting its connections in
//!   `crates/conveyor-sources/tests/kafka.rs`.
//!
//! Each test uses a queue, stream, subject, topic and session client id of its own (named with
//! the process id and the time) and removes them at its end (Drop guards, which also run when
//! a test fails half-way); the private brokers and moto are killed by the pid this test
//! started them with.
//!
//! moto is found as the conveyor-sources SQS tests find it: CONVEYOR_MOTO_SERVER, else
//! `target/py-venv/bin/moto_server` under the workspace, else on PATH; Tansu as
//! `support/tansu.rs` says.

mod common;
#[path = "support/tansu.rs"]
mod tansu;

use common::*;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

const RABBIT: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const NATS: &str = "nats://127.0.0.1:4222";
const MOSQUITTO_PORT: u16 = 1883;
const SQS_REGION: &str = "us-east-1";
/// The variables holding the SQS credentials, named in the sources' configuration (moto takes
/// any credentials).
const SQS_KEY_ENV: &str = "CONVEYOR_TEST_SQS_KEY";
const SQS_SECRET_ENV: &str = "CONVEYOR_TEST_SQS_SECRET";
const SQS_ENV: [(&str, &str); 2] = [(SQS_KEY_ENV, "test"), (SQS_SECRET_ENV, "test")];

/// The source every test runs, and the queue its jobs go to.
const SOURCE: &str = "orders";
const QUEUE: &str = "orders";

// ---------------------------------------------------------------------------------------------
// Shared helpers: names, clean-up, waiting, the server's view.

/// A name no other run uses: `conveyor-test-`, the prefix, this process's id and the time in
/// nanoseconds (letters, digits and dashes: a valid queue, stream, topic level and client id).
fn unique(prefix: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("conveyor-test-{prefix}-{}-{nanos}", std::process::id())
}

/// A runtime for the async broker clients (the test itself is blocking).
fn runtime() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Runs an async clean-up when dropped, on a thread and runtime of its own (the test's runtime
/// may be gone, or the test panicking), giving it 20 seconds.
struct Cleanup(Option<Box<dyn FnOnce() + Send>>);

impl Cleanup {
    fn new<F, Fut>(cleanup: F) -> Self
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()>,
    {
        Cleanup(Some(Box::new(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                let _ = tokio::time::timeout(Duration::from_secs(20), cleanup()).await;
            });
        })))
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if let Some(cleanup) = self.0.take() {
            let _ = std::thread::spawn(cleanup).join();
        }
    }
}

/// Polls `probe` every `every` until `done` holds for what it returned, and returns that;
/// after `limit`, fails naming `what` and showing the last value seen.
fn wait_for<T: std::fmt::Debug>(
    limit: Duration,
    every: Duration,
    what: &str,
    mut probe: impl FnMut() -> T,
    done: impl Fn(&T) -> bool,
) -> T {
    let deadline = Instant::now() + limit;
    loop {
        let value = probe();
        if done(&value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}; last seen: {value:?}"
        );
        std::thread::sleep(every);
    }
}

const POLL: Duration = Duration::from_millis(100);

/// `GET /v1/sources/orders`.
fn source(server: &str) -> Value {
    http()
        .get(format!("{server}/v1/sources/{SOURCE}"))
        .send()
        .expect("GET the source")
        .json()
        .expect("the source's JSON")
}

fn count(view: &Value, field: &str) -> u64 {
    view[field].as_u64().unwrap_or(0)
}

/// The jobs of the queue not yet run (no worker runs here: every job the sources made).
fn jobs_waiting(server: &str) -> u64 {
    let answer: Value = http()
        .get(format!("{server}/v1/queues"))
        .send()
        .expect("GET queues")
        .json()
        .expect("queues JSON");
    let queue = answer["queues"]
        .as_array()
        .and_then(|queues| queues.iter().find(|q| q["name"] == QUEUE).cloned())
        .unwrap_or_else(|| json!({}));
    ["available", "scheduled", "running", "retryable"]
        .iter()
        .map(|state| queue[state].as_u64().unwrap_or(0))
        .sum()
}

/// Waits for `total` jobs, then checks each number of `0..total` is in exactly one job's
/// payload, with the source's idempotency key, and no job more.
fn assert_each_message_one_job(server: &str, total: u64, limit: Duration) {
    let waiting = wait_for(
        limit,
        POLL,
        &format!("{total} jobs"),
        || (jobs_waiting(server), source(server)),
        |(jobs, _)| *jobs >= total,
    );
    assert_eq!(
        waiting.0, total,
        "more jobs than messages (a message became two jobs?); source: {}",
        waiting.1
    );
    let mut numbers = BTreeSet::new();
    let mut after: Option<String> = None;
    let mut jobs_seen = 0u64;
    let prefix = format!("source:{SOURCE}:");
    loop {
        let mut url = format!("{server}/v1/jobs?queue={QUEUE}&limit=500");
        if let Some(after) = &after {
            url.push_str(&format!("&after={after}"));
        }
        let page: Value = http()
            .get(url)
            .send()
            .expect("GET jobs")
            .json()
            .expect("jobs JSON");
        let jobs = page["jobs"].as_array().cloned().unwrap_or_default();
        if jobs.is_empty() {
            break;
        }
        for job in &jobs {
            jobs_seen += 1;
            let n = job["payload"]["n"]
                .as_u64()
                .unwrap_or_else(|| panic!("a job without a number in its payload: {job}"));
            assert!(numbers.insert(n), "message {n} became two jobs");
            assert!(
                job["idempotency_key"]
                    .as_str()
                    .is_some_and(|key| key.starts_with(&prefix)),
                "a job without the source's idempotency key: {job}"
            );
        }
        after = jobs
            .last()
            .and_then(|job| job["id"].as_str())
            .map(String::from);
    }
    assert_eq!(jobs_seen, total, "jobs listed");
    let expected: BTreeSet<u64> = (0..total).collect();
    let missing: Vec<u64> = expected.difference(&numbers).take(20).copied().collect();
    let extra: Vec<u64> = numbers.difference(&expected).take(20).copied().collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "the jobs' numbers are not 0..{total}: missing (first 20) {missing:?}, unexpected {extra:?}"
    );
}

fn body(n: u64) -> Vec<u8> {
    json!({ "n": n }).to_string().into_bytes()
}

/// A sources file (JSON) holding `spec` as the source `orders`.
fn sources_file(dir: &tempfile::TempDir, spec: &Value) -> PathBuf {
    let path = path_in(dir, "sources.json");
    let file = json!({ "sources": { SOURCE: spec } });
    std::fs::write(&path, file.to_string()).expect("write the sources file");
    path
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("a UTF-8 path")
}

/// `conveyor serve` on the SQLite file `db`, running the sources of `file`.
fn serve(db: &Path, file: &Path, env: &[(&str, &str)]) -> Server {
    let store = format!("sqlite://{}", db.display());
    start_server_with(
        &["--listen", "127.0.0.1:0", "--store", &store],
        &["--sources", path_str(file)],
        env,
    )
}

fn readyz(server: &str) -> u16 {
    http()
        .get(format!("{server}/readyz"))
        .send()
        .expect("GET /readyz")
        .status()
        .as_u16()
}

/// Stops a server as an operator would (SIGTERM) and waits for it to exit.
fn stop(server: &mut Server) {
    server.proc.sigterm();
    server.proc.wait_exit(Duration::from_secs(40));
}

/// The kill test's core: once the server has stored `at_least` jobs, kills it with SIGKILL.
/// Returns the source as last seen before the kill.
fn kill_when_some_stored(server: &mut Server, at_least: u64, every: Duration) -> Value {
    let seen = wait_for(
        Duration::from_secs(120),
        every,
        &format!("{at_least} jobs stored before the kill"),
        || source(&server.url),
        |view| count(view, "enqueued") >= at_least,
    );
    server.proc.kill_9();
    seen
}

// ---------------------------------------------------------------------------------------------
// RabbitMQ.

mod rabbit {
    use super::*;
    use lapin::options::{
        BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
    };
    use lapin::types::{AMQPValue, FieldTable};
    use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};

    async fn open() -> (Connection, Channel) {
        let connection = Connection::connect(RABBIT, ConnectionProperties::default())
            .await
            .expect("RabbitMQ on 127.0.0.1:5672 (guest/guest)");
        let channel = connection.create_channel().await.expect("a channel");
        (connection, channel)
    }

    /// A queue of the test's own, deleted when dropped (and by RabbitMQ once unused for ten
    /// minutes, if the run dies before).
    pub struct Queue {
        pub name: String,
        _cleanup: Cleanup,
    }

    impl Queue {
        pub fn fresh(rt: &Runtime, prefix: &str) -> Queue {
            let name = unique(prefix);
            rt.block_on(async {
                let (connection, channel) = open().await;
                let mut arguments = FieldTable::default();
                arguments.insert("x-expires".into(), AMQPValue::LongInt(600_000));
                channel
                    .queue_declare(
                        name.as_str().into(),
                        QueueDeclareOptions::default(),
                        arguments,
                    )
                    .await
                    .expect("declare the queue");
                let _ = connection.close(200, "declared".into()).await;
            });
            let doomed = name.clone();
            Queue {
                name,
                _cleanup: Cleanup::new(move || async move {
                    let (connection, channel) = open().await;
                    let _ = channel
                        .queue_delete(doomed.as_str().into(), QueueDeleteOptions::default())
                        .await;
                    let _ = connection.close(200, "deleted".into()).await;
                }),
            }
        }

        /// Publishes `{"n": n}` for each n, waiting for RabbitMQ to confirm them all; the even
        /// ones carry the message id `m-{n}`, the odd ones none (their identity is then a hash
        /// of the content).
        pub fn publish(&self, rt: &Runtime, range: std::ops::Range<u64>) {
            rt.block_on(async {
                let (connection, channel) = open().await;
                channel
                    .confirm_select(ConfirmSelectOptions::default())
                    .await
                    .expect("publisher confirms");
                let numbers: Vec<u64> = range.collect();
                for chunk in numbers.chunks(1000) {
                    for &n in chunk {
                        let mut properties = BasicProperties::default();
                        if n % 2 == 0 {
                            properties = properties.with_message_id(format!("m-{n}").into());
                        }
                        let _confirm = channel
                            .basic_publish(
                                "".into(),
                                self.name.as_str().into(),
                                BasicPublishOptions::default(),
                                &body(n),
                                properties,
                            )
                            .await
                            .expect("publish");
                    }
                    let returned = channel
                        .wait_for_confirms()
                        .await
                        .expect("RabbitMQ confirms the messages");
                    assert!(returned.is_empty(), "messages returned: {returned:?}");
                }
                let _ = connection.close(200, "published".into()).await;
            });
        }

        /// The queue's ready messages and its consumers (a passive declare). Messages delivered
        /// and not acknowledged are not counted until their connection closes, when RabbitMQ
        /// puts them back.
        pub fn depth(&self, rt: &Runtime) -> (u32, u32) {
            rt.block_on(async {
                let (connection, channel) = open().await;
                let queue = channel
                    .queue_declare(
                        self.name.as_str().into(),
                        QueueDeclareOptions {
                            passive: true,
                            ..QueueDeclareOptions::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .expect("a passive declare of the test's queue");
                let _ = connection.close(200, "read".into()).await;
                (queue.message_count(), queue.consumer_count())
            })
        }

        /// Once no consumer is left (every server stopped), what the queue holds: messages
        /// never delivered, and the ones delivered and never acknowledged, put back when their
        /// connection closed.
        pub fn unacknowledged_once_unconsumed(&self, rt: &Runtime) -> u32 {
            let (ready, _) = wait_for(
                Duration::from_secs(30),
                POLL,
                "RabbitMQ to see the consumers gone",
                || self.depth(rt),
                |(_, consumers)| *consumers == 0,
            );
            ready
        }

        pub fn spec(&self, max_in_flight: usize) -> Value {
            json!({
                "type": "amqp", "url": RABBIT, "queue": self.name,
                "max_in_flight": max_in_flight,
                "job": { "kind": "order.placed", "queue": QUEUE },
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// NATS JetStream.

mod jetstream {
    use super::*;
    use async_nats::jetstream::stream::{Config, StorageType};

    pub const CONSUMER: &str = "conveyor";

    async fn context(url: &str) -> async_nats::jetstream::Context {
        let client = async_nats::connect(url)
            .await
            .unwrap_or_else(|error| panic!("NATS with JetStream on {url}: {error}"));
        async_nats::jetstream::new(client)
    }

    /// A stream of the test's own (subjects `{name}.>`), deleted when dropped.
    pub struct Stream {
        pub name: String,
        url: String,
        _cleanup: Cleanup,
    }

    impl Stream {
        pub fn fresh(rt: &Runtime, url: &str, prefix: &str, storage: StorageType) -> Stream {
            let name = unique(prefix);
            rt.block_on(async {
                context(url)
                    .await
                    .create_stream(Config {
                        name: name.clone(),
                        subjects: vec![format!("{name}.>")],
                        storage,
                        ..Default::default()
                    })
                    .await
                    .expect("create the stream");
            });
            let (doomed, at) = (name.clone(), url.to_string());
            Stream {
                name,
                url: url.to_string(),
                _cleanup: Cleanup::new(move || async move {
                    if let Ok(client) = async_nats::connect(at.as_str()).await {
                        let _ = async_nats::jetstream::new(client)
                            .delete_stream(&doomed)
                            .await;
                    }
                }),
            }
        }

        /// Publishes `{"n": n}` for each n, waiting for JetStream to store them all.
        pub fn publish(&self, rt: &Runtime, range: std::ops::Range<u64>) {
            rt.block_on(async {
                let js = context(&self.url).await;
                let subject = format!("{}.orders", self.name);
                let mut acks = Vec::new();
                for n in range {
                    let ack = js
                        .publish(subject.clone(), body(n).into())
                        .await
                        .expect("publish");
                    acks.push(ack);
                    if acks.len() == 500 {
                        for ack in acks.drain(..) {
                            ack.await.expect("stored by JetStream");
                        }
                    }
                }
                for ack in acks {
                    ack.await.expect("stored by JetStream");
                }
            });
        }

        /// The durable consumer's messages not yet delivered and delivered but not
        /// acknowledged.
        pub fn unacknowledged(&self, rt: &Runtime) -> (u64, u64) {
            rt.block_on(async {
                let info = context(&self.url)
                    .await
                    .get_stream(&self.name)
                    .await
                    .expect("the test's stream")
                    .consumer_info(CONSUMER)
                    .await
                    .expect("the source's durable consumer");
                (info.num_pending, info.num_ack_pending as u64)
            })
        }

        pub fn spec(&self, max_in_flight: usize, ack_wait_ms: Option<u64>) -> Value {
            let mut spec = json!({
                "type": "nats", "url": self.url, "stream": self.name,
                "subject": format!("{}.>", self.name), "consumer": CONSUMER,
                "max_in_flight": max_in_flight,
                "job": { "kind": "order.placed", "queue": QUEUE },
            });
            if let Some(ms) = ack_wait_ms {
                spec["ack_wait_ms"] = json!(ms);
            }
            spec
        }
    }
}

// ---------------------------------------------------------------------------------------------
// MQTT.

mod mqtt {
    use super::*;
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};

    /// A topic and a session client id of the test's own; the session is removed when dropped.
    pub struct Session {
        pub port: u16,
        pub topic: String,
        pub client_id: String,
        _cleanup: Cleanup,
    }

    impl Session {
        pub fn fresh(port: u16, prefix: &str) -> Session {
            let name = unique(prefix);
            let doomed = name.clone();
            Session {
                port,
                topic: format!("conveyor-test/{name}"),
                client_id: name,
                _cleanup: Cleanup::new(move || end_session(port, doomed)),
            }
        }

        pub fn spec(&self, max_in_flight: usize) -> Value {
            json!({
                "type": "mqtt", "url": format!("mqtt://127.0.0.1:{}", self.port),
                "topic": self.topic, "client_id": self.client_id,
                "max_in_flight": max_in_flight,
                "job": { "kind": "order.placed", "queue": QUEUE },
            })
        }

        /// Messages the broker still holds for the session, unacknowledged: with no server
        /// connected, a client with the session's id connects (keeping the session), counts
        /// what the broker sends it for two seconds, and acknowledges none.
        pub fn unacknowledged(&self, rt: &Runtime) -> usize {
            rt.block_on(async {
                let mut options = MqttOptions::new(self.client_id.clone(), "127.0.0.1", self.port);
                options
                    .set_clean_session(false)
                    .set_manual_acks(true)
                    .set_max_packet_size(1 << 20, 1 << 20);
                let (_client, mut event_loop) = AsyncClient::new(options, 10);
                let mut count = 0;
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                while let Ok(event) = tokio::time::timeout_at(deadline, event_loop.poll()).await {
                    match event.expect("the probe's connection") {
                        Event::Incoming(Packet::Publish(_)) => count += 1,
                        Event::Incoming(Packet::ConnAck(ack)) => assert!(
                            ack.session_present,
                            "the broker had no session for the source's client id"
                        ),
                        _ => {}
                    }
                }
                count
            })
        }
    }

    /// Removes a session: a client with its id connects with a clean session, then leaves.
    async fn end_session(port: u16, client_id: String) {
        let mut options = MqttOptions::new(client_id, "127.0.0.1", port);
        options.set_clean_session(true);
        let (client, mut event_loop) = AsyncClient::new(options, 10);
        while let Ok(event) = event_loop.poll().await {
            if let Event::Incoming(Packet::ConnAck(_)) = event {
                let _ = client.disconnect().await;
            }
        }
    }

    /// A publisher with a clean session of its own, at QoS 1, counting the broker's PUBACKs.
    pub struct Publisher {
        client: AsyncClient,
        topic: String,
        pub sent: Arc<AtomicU64>,
        acked: Arc<AtomicU64>,
        event_loop: tokio::task::JoinHandle<()>,
    }

    impl Drop for Publisher {
        fn drop(&mut self) {
            self.event_loop.abort();
        }
    }

    impl Publisher {
        pub fn new(rt: &Runtime, session: &Session) -> Arc<Publisher> {
            let mut options = MqttOptions::new(unique("pub"), "127.0.0.1", session.port);
            options.set_max_packet_size(1 << 20, 1 << 20);
            let (client, mut event_loop) = AsyncClient::new(options, 1000);
            let acked = Arc::new(AtomicU64::new(0));
            let counted = acked.clone();
            let event_loop = rt.spawn(async move {
                loop {
                    match event_loop.poll().await {
                        Ok(Event::Incoming(Packet::PubAck(_))) => {
                            counted.fetch_add(1, Ordering::SeqCst);
                        }
                        Ok(_) => {}
                        Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                    }
                }
            });
            Arc::new(Publisher {
                client,
                topic: session.topic.clone(),
                sent: Arc::new(AtomicU64::new(0)),
                acked,
                event_loop,
            })
        }

        pub async fn publish(&self, n: u64) {
            self.client
                .publish(self.topic.as_str(), QoS::AtLeastOnce, false, body(n))
                .await
                .expect("publish");
            self.sent.fetch_add(1, Ordering::SeqCst);
        }

        /// Publishes `{"n": n}` for each n, then waits for the broker to take them all.
        pub fn publish_all(&self, rt: &Runtime, range: std::ops::Range<u64>) {
            let expected = range.end - range.start;
            rt.block_on(async {
                for n in range {
                    self.publish(n).await;
                }
            });
            self.confirmed(expected);
        }

        /// Waits until the broker has acknowledged `expected` messages.
        pub fn confirmed(&self, expected: u64) {
            wait_for(
                Duration::from_secs(60),
                Duration::from_millis(20),
                &format!("the broker to take {expected} messages"),
                || {
                    (
                        self.sent.load(Ordering::SeqCst),
                        self.acked.load(Ordering::SeqCst),
                    )
                },
                |(sent, acked)| *sent >= expected && acked >= sent,
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// SQS (moto).

mod sqs {
    use super::*;
    use aws_sdk_sqs::config::{Credentials, Region};
    use aws_sdk_sqs::types::{QueueAttributeName, SendMessageBatchRequestEntry};
    use aws_sdk_sqs::Client;

    fn moto_server_path() -> PathBuf {
        if let Some(path) = std::env::var_os("CONVEYOR_MOTO_SERVER") {
            return PathBuf::from(path);
        }
        let venv =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/py-venv/bin/moto_server");
        if venv.is_file() {
            return venv;
        }
        let path = std::env::var_os("PATH").unwrap_or_default();
        if let Some(found) = std::env::split_paths(&path)
            .map(|dir| dir.join("moto_server"))
            .find(|candidate| candidate.is_file())
        {
            return found;
        }
        panic!(
            "the SQS tests need moto's standalone server and found none: install it with \
             `python3 -m venv target/py-venv && target/py-venv/bin/pip install 'moto[server]'` \
             (scripts/test.sh does this), or set CONVEYOR_MOTO_SERVER to a moto_server executable"
        );
    }

    fn client(endpoint: &str) -> Client {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(Region::new(SQS_REGION))
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new("test", "test", None, None, "test"))
            .build();
        Client::from_conf(config)
    }

    /// A moto server of the test's own on a free port, killed (by its pid) when dropped: its
    /// queues, in memory, go with it.
    pub struct Moto {
        child: Child,
        pub url: String,
        _log: tempfile::TempDir,
    }

    impl Drop for Moto {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    impl Moto {
        pub fn start(rt: &Runtime) -> Moto {
            let port = free_port();
            let log = tempfile::tempdir().expect("temp dir");
            let log_path = log.path().join("moto.log");
            let log_file = std::fs::File::create(&log_path).expect("moto's log");
            let executable = moto_server_path();
            let child = Command::new(&executable)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("log"))
                .stderr(log_file)
                .spawn()
                .unwrap_or_else(|error| panic!("start {}: {error}", executable.display()));
            let moto = Moto {
                child,
                url: format!("http://127.0.0.1:{port}"),
                _log: log,
            };
            let client = client(&moto.url);
            rt.block_on(async {
                let deadline = Instant::now() + Duration::from_secs(60);
                while client.list_queues().send().await.is_err() {
                    assert!(
                        Instant::now() < deadline,
                        "moto_server did not answer on port {port}: {}",
                        std::fs::read_to_string(&log_path).unwrap_or_default()
                    );
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            });
            moto
        }

        pub fn queue(&self, rt: &Runtime, prefix: &str) -> Queue {
            let client = client(&self.url);
            let name = unique(prefix);
            let url = rt
                .block_on(client.create_queue().queue_name(&name).send())
                .expect("create the queue")
                .queue_url
                .expect("a queue url");
            Queue {
                client,
                url,
                endpoint: self.url.clone(),
            }
        }
    }

    /// A queue of the test's own (it goes with its moto server).
    pub struct Queue {
        client: Client,
        url: String,
        endpoint: String,
    }

    impl Queue {
        /// Sends `{"n": n}` for each n, ten to a call, eight calls at a time.
        pub fn send(&self, rt: &Runtime, range: std::ops::Range<u64>) {
            let numbers: Vec<u64> = range.collect();
            let chunks: Vec<Vec<u64>> = numbers.chunks(10).map(<[u64]>::to_vec).collect();
            let mut lanes: Vec<Vec<Vec<u64>>> = vec![Vec::new(); 8];
            for (index, chunk) in chunks.into_iter().enumerate() {
                lanes[index % 8].push(chunk);
            }
            rt.block_on(async {
                let mut tasks = Vec::new();
                for lane in lanes {
                    let client = self.client.clone();
                    let url = self.url.clone();
                    tasks.push(tokio::spawn(async move {
                        for chunk in lane {
                            let entries = chunk
                                .iter()
                                .enumerate()
                                .map(|(index, &n)| {
                                    SendMessageBatchRequestEntry::builder()
                                        .id(index.to_string())
                                        .message_body(String::from_utf8(body(n)).expect("text"))
                                        .build()
                                        .expect("an entry")
                                })
                                .collect();
                            let output = client
                                .send_message_batch()
                                .queue_url(&url)
                                .set_entries(Some(entries))
                                .send()
                                .await
                                .expect("SendMessageBatch");
                            assert!(output.failed().is_empty(), "{:?}", output.failed());
                        }
                    }));
                }
                for task in tasks {
                    task.await.expect("a sending task");
                }
            });
        }

        fn attribute(&self, rt: &Runtime, name: QueueAttributeName) -> u64 {
            let output = rt
                .block_on(
                    self.client
                        .get_queue_attributes()
                        .queue_url(&self.url)
                        .attribute_names(name.clone())
                        .send(),
                )
                .expect("GetQueueAttributes");
            output
                .attributes()
                .and_then(|attributes| attributes.get(&name))
                .and_then(|count| count.parse().ok())
                .unwrap_or_else(|| panic!("no {name:?} in {output:?}"))
        }

        /// Messages not deleted: (waiting to be received, received and not yet deleted).
        pub fn undeleted(&self, rt: &Runtime) -> (u64, u64) {
            (
                self.attribute(rt, QueueAttributeName::ApproximateNumberOfMessages),
                self.attribute(
                    rt,
                    QueueAttributeName::ApproximateNumberOfMessagesNotVisible,
                ),
            )
        }

        pub fn spec(&self, max_in_flight: usize, visibility_timeout_secs: Option<u32>) -> Value {
            let mut spec = json!({
                "type": "sqs", "url": self.endpoint, "queue_url": self.url,
                "region": SQS_REGION, "access_key_id_env": SQS_KEY_ENV,
                "secret_access_key_env": SQS_SECRET_ENV, "max_in_flight": max_in_flight,
                "job": { "kind": "order.placed", "queue": QUEUE },
            });
            if let Some(secs) = visibility_timeout_secs {
                spec["visibility_timeout_secs"] = json!(secs);
            }
            spec
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Kafka (Tansu).

mod kafka {
    use super::*;

    /// The consumer group the servers join.
    pub const GROUP: &str = "conveyor";

    /// A topic of the test's own on a Tansu of its own (both go when this is dropped).
    pub struct Topic {
        tansu: tansu::Tansu,
        name: String,
    }

    impl Topic {
        pub fn fresh(rt: &Runtime, prefix: &str) -> Topic {
            rt.block_on(async {
                let tansu = tansu::Tansu::start().await;
                let name = unique(prefix);
                tansu.create_topic(&name).await;
                Topic { tansu, name }
            })
        }

        /// Publishes `{"n": n}` for each n, spread over the partitions.
        pub fn publish(&self, rt: &Runtime, range: std::ops::Range<u64>) {
            rt.block_on(self.tansu.publish(&self.name, range.map(body), &[]));
        }

        /// Records the group has not committed past.
        pub fn unacknowledged(&self, rt: &Runtime) -> i64 {
            rt.block_on(self.tansu.unacknowledged(&self.name, GROUP))
        }

        /// A member silent for six seconds leaves the group: a killed server's partitions go
        /// to the others (or to the restarted server) that soon.
        pub fn spec(&self, max_in_flight: usize) -> Value {
            json!({
                "type": "kafka", "brokers": self.tansu.address, "topic": self.name,
                "group": GROUP, "session_timeout_ms": 6000, "max_in_flight": max_in_flight,
                "job": { "kind": "order.placed", "queue": QUEUE },
            })
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Brokers of the test's own, for the restart tests.

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// A broker process this test starts (and starts again) on a port and data directory of its
/// own; killed by its pid when dropped.
struct OwnBroker {
    what: &'static str,
    program: &'static str,
    args: Vec<String>,
    port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl OwnBroker {
    fn new(what: &'static str, program: &'static str) -> OwnBroker {
        assert!(
            Path::new(program).is_file(),
            "the {what} restart test needs {program}"
        );
        OwnBroker {
            what,
            program,
            args: Vec::new(),
            port: free_port(),
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
        }
    }

    fn data_dir(&self) -> String {
        self.dir.path().join("data").display().to_string()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("broker.log")).unwrap_or_default()
    }

    /// Starts it and waits until its port accepts connections.
    fn start(&mut self) {
        assert!(self.child.is_none(), "{} is running already", self.what);
        std::fs::create_dir_all(self.data_dir()).expect("the broker's data directory");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("broker.log"))
            .expect("the broker's log");
        let child = Command::new(self.program)
            .args(&self.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| panic!("start {}: {error}", self.program));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            let exited = self
                .child
                .as_mut()
                .and_then(|child| child.try_wait().ok().flatten());
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "{} did not listen on port {} (exit: {exited:?}); its log:\n{}",
                self.what,
                self.port,
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` to it (the pid this test started) and waits for it to exit.
    fn stop(&mut self, signal_number: i32) {
        let mut child = self.child.take().expect("the broker is running");
        signal(child.id() as i32, signal_number);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if child.try_wait().expect("try_wait").is_some() {
                return;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{} did not exit within 30 s of signal {signal_number}",
                    self.what
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for OwnBroker {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The broker-restart test's middle: with `broker` gone, the source shows `error` and a last
/// error, the server stays ready, and it had not stored everything. Returns the source's view.
fn assert_error_shown_while_broker_down(server: &Server, published: u64) -> Value {
    let view = wait_for(
        Duration::from_secs(60),
        POLL,
        "the source to show the broker's failure",
        || source(&server.url),
        |view| view["state"] == "error" && view["last_error"].is_string(),
    );
    assert_eq!(
        readyz(&server.url),
        200,
        "/readyz failed while a source's broker was down: {view}"
    );
    // Still in error a moment later (the broker is really gone), with nothing new stored.
    std::thread::sleep(Duration::from_millis(500));
    let later = source(&server.url);
    assert_eq!(later["state"], "error", "{later}");
    assert!(
        count(&later, "enqueued") < published,
        "the broker went down after every message was stored: it tested no recovery ({later})"
    );
    later
}

/// After the broker is back: the source returns to `running`.
fn assert_running_again(server: &Server) {
    wait_for(
        Duration::from_secs(60),
        POLL,
        "the source to be running again",
        || source(&server.url),
        |view| view["state"] == "running",
    );
}

// ---------------------------------------------------------------------------------------------
// 1. A server killed mid-ingest and restarted on the same SQLite file.

#[test]
fn amqp_a_server_killed_mid_ingest_leaves_every_message_one_job_after_its_restart() {
    const TOTAL: u64 = 20_000;
    let rt = runtime();
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let queue = rabbit::Queue::fresh(&rt, "srv-amqp-kill");
    queue.publish(&rt, 0..TOTAL);
    // Small batches (the prefetch is max_in_flight), so the kill lands with most to do.
    let file = sources_file(&dir, &queue.spec(50));
    let mut server = serve(&db, &file, &[]);
    let before = kill_when_some_stored(&mut server, 1_000, POLL);
    // The killed server's connection closed: what it held unacknowledged is back in the queue.
    let left = queue.unacknowledged_once_unconsumed(&rt);
    assert!(
        left > 0,
        "the kill came after the whole queue was ingested: it tested no recovery ({before})"
    );
    let mut server = serve(&db, &file, &[]);
    assert_each_message_one_job(&server.url, TOTAL, Duration::from_secs(300));
    wait_for(
        Duration::from_secs(30),
        POLL,
        "the queue to be read to its end",
        || queue.depth(&rt),
        |(ready, _)| *ready == 0,
    );
    let after = source(&server.url);
    assert_eq!(after["state"], "running", "{after}");
    stop(&mut server);
    assert_eq!(
        queue.unacknowledged_once_unconsumed(&rt),
        0,
        "messages left unacknowledged at RabbitMQ (back in the queue once the server stopped)"
    );
}

#[test]
fn nats_a_server_killed_mid_ingest_leaves_every_message_one_job_after_its_restart() {
    const TOTAL: u64 = 20_000;
    let rt = runtime();
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let stream = jetstream::Stream::fresh(
        &rt,
        NATS,
        "srv-nats-kill",
        async_nats::jetstream::stream::StorageType::Memory,
    );
    stream.publish(&rt, 0..TOTAL);
    // What the killed server held comes again after its two-second ack wait.
    let file = sources_file(&dir, &stream.spec(50, Some(2_000)));
    let mut server = serve(&db, &file, &[]);
    let before = kill_when_some_stored(&mut server, 1_000, POLL);
    let (pending, ack_pending) = stream.unacknowledged(&rt);
    assert!(
        pending + ack_pending > 0,
        "the kill came after the whole stream was ingested: it tested no recovery ({before})"
    );
    let server = serve(&db, &file, &[]);
    assert_each_message_one_job(&server.url, TOTAL, Duration::from_secs(300));
    wait_for(
        Duration::from_secs(30),
        POLL,
        "every message acknowledged at JetStream (num_pending, num_ack_pending)",
        || stream.unacknowledged(&rt),
        |left| *left == (0, 0),
    );
    let after = source(&server.url);
    assert_eq!(after["state"], "running", "{after}");
}

/// Mosquitto keeps at most 1,000 messages for a session (`max_queued_messages`) and drops the
/// rest, so this test sends 900, paced while the server reads; the kill lands while they are
/// still coming, and what comes while no server runs waits in the session.
#[test]
fn mqtt_a_server_killed_mid_ingest_leaves_every_message_one_job_after_its_restart() {
    const TOTAL: u64 = 900;
    let rt = runtime();
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let session = mqtt::Session::fresh(MOSQUITTO_PORT, "srv-mqtt-kill");
    let file = sources_file(&dir, &session.spec(20));
    let mut server = serve(&db, &file, &[]);
    // Subscribed (the session exists at the broker) once running: only then are messages
    // kept for it.
    wait_for(
        Duration::from_secs(30),
        POLL,
        "the source to subscribe",
        || source(&server.url),
        |view| view["state"] == "running",
    );
    let publisher = mqtt::Publisher::new(&rt, &session);
    let pacing = publisher.clone();
    let publishing = rt.spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(5));
        for n in 0..TOTAL {
            tick.tick().await;
            pacing.publish(n).await;
        }
    });
    let before = kill_when_some_stored(&mut server, 150, Duration::from_millis(20));
    let sent_at_kill = publisher.sent.load(Ordering::SeqCst);
    assert!(
        sent_at_kill < TOTAL,
        "the kill came after every message was published: it tested no recovery ({before})"
    );
    rt.block_on(publishing).expect("the publishing task");
    publisher.confirmed(TOTAL);
    // The session kept what the killed server had not acknowledged, and what came since.
    let mut server = serve(&db, &file, &[]);
    assert_each_message_one_job(&server.url, TOTAL, Duration::from_secs(180));
    let after = source(&server.url);
    assert_eq!(after["state"], "running", "{after}");
    assert!(
        count(&after, "enqueued") > 0,
        "the restarted server stored nothing: {after}"
    );
    stop(&mut server);
    assert_eq!(
        session.unacknowledged(&rt),
        0,
        "messages left unacknowledged in the MQTT session"
    );
}

/// moto answers about ten calls a second, so this test sends 500 messages, not 20,000.
#[test]
fn sqs_a_server_killed_mid_ingest_leaves_every_message_one_job_after_its_restart() {
    const TOTAL: u64 = 500;
    let rt = runtime();
    let moto = sqs::Moto::start(&rt);
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let queue = moto.queue(&rt, "srv-sqs-kill");
    queue.send(&rt, 0..TOTAL);
    // What the killed server held becomes visible again after three seconds.
    let file = sources_file(&dir, &queue.spec(20, Some(3)));
    let mut server = serve(&db, &file, &SQS_ENV);
    let before = kill_when_some_stored(&mut server, 60, POLL);
    let (waiting, in_flight) = queue.undeleted(&rt);
    assert!(
        waiting + in_flight > 0,
        "the kill came after the whole queue was ingested: it tested no recovery ({before})"
    );
    let server = serve(&db, &file, &SQS_ENV);
    assert_each_message_one_job(&server.url, TOTAL, Duration::from_secs(300));
    wait_for(
        Duration::from_secs(60),
        POLL,
        "every message deleted from the queue (visible, not visible)",
        || queue.undeleted(&rt),
        |left| *left == (0, 0),
    );
    let after = source(&server.url);
    assert_eq!(after["state"], "running", "{after}");
}

#[test]
fn kafka_a_server_killed_mid_ingest_leaves_every_message_one_job_after_its_restart() {
    const TOTAL: u64 = 20_000;
    let rt = runtime();
    let dir = temp_dir();
    let db = path_in(&dir, "jobs.db");
    let topic = kafka::Topic::fresh(&rt, "srv-kafka-kill");
    topic.publish(&rt, 0..TOTAL);
    let file = sources_file(&dir, &topic.spec(50));
    let mut server = serve(&db, &file, &[]);
    let before = kill_when_some_stored(&mut server, 1_000, POLL);
    assert!(
        topic.unacknowledged(&rt) > 0,
        "the kill came after the whole topic was ingested: it tested no recovery ({before})"
    );
    // The restarted server joins the group; the killed member's partitions come to it once
    // that member's session times out, from the offsets committed.
    let server = serve(&db, &file, &[]);
    assert_each_message_one_job(&server.url, TOTAL, Duration::from_secs(300));
    wait_for(
        Duration::from_secs(60),
        POLL,
        "every record committed by the group",
        || topic.unacknowledged(&rt),
        |left| *left == 0,
    );
    let after = source(&server.url);
    assert_eq!(after["state"], "running", "{after}");
}

// ---------------------------------------------------------------------------------------------
// 2. Two servers on one PostgreSQL sharing a source stored through the API.

/// Starts two servers on a fresh schema, stores `spec` as the source `orders` through the
/// first, and waits for both to run it.
fn two_servers_sharing(schema: &Schema, spec: &Value, env: &[(&str, &str)]) -> [Server; 2] {
    let store = schema.url();
    migrate(&store);
    let args = ["--listen", "127.0.0.1:0", "--store", store.as_str()];
    let servers = [
        start_server_with(&args, &[], env),
        start_server_with(&args, &[], env),
    ];
    let response = http()
        .put(format!("{}/v1/sources/{SOURCE}", servers[0].url))
        .json(spec)
        .send()
        .expect("PUT the source");
    let status = response.status().as_u16();
    let answer = response.text().unwrap_or_default();
    assert_eq!(status, 201, "storing the source: {answer}");
    // The other server reads the stored configuration within a second or so.
    wait_for(
        Duration::from_secs(30),
        POLL,
        "both servers running the source",
        || servers.each_ref().map(|server| source(&server.url)),
        |views| views.iter().all(|view| view["state"] == "running"),
    );
    servers
}

/// How a broker hands a message to the servers sharing it.
#[derive(Clone, Copy, PartialEq)]
enum Delivery {
    /// To one consumer only, while it holds it (a RabbitMQ queue, a JetStream consumer).
    ToOne,
    /// At least once: SQS may hand a message held invisible by one server to another as well
    /// (documented for standard queues; moto, whose ReceiveMessage takes no lock, does it when
    /// two receives race), and a Kafka rebalance hands a partition on from its last committed
    /// offset. The second copy must then be found as a duplicate, not stored again.
    AtLeastOnce,
}

/// Every message is one job and both servers received some. With [`Delivery::ToOne`], what
/// they received adds up to the messages sent (no message was read by both) and neither saw a
/// duplicate; with [`Delivery::AtLeastOnce`], every message received beyond those sent was
/// recognised as a duplicate.
fn assert_shared_without_duplicates(
    servers: &[Server; 2],
    total: u64,
    limit: Duration,
    delivery: Delivery,
) {
    wait_for(
        limit,
        POLL,
        &format!("{total} jobs stored by the two servers"),
        || servers.each_ref().map(|server| source(&server.url)),
        |views| {
            views
                .iter()
                .map(|view| count(view, "enqueued"))
                .sum::<u64>()
                >= total
        },
    );
    assert_each_message_one_job(&servers[0].url, total, Duration::from_secs(10));
    let sum = |views: &[Value; 2], field: &str| views.iter().map(|v| count(v, field)).sum::<u64>();
    let views = match delivery {
        Delivery::ToOne => servers.each_ref().map(|server| source(&server.url)),
        // A copy received may still be in its commit: its duplicate is counted once it is.
        Delivery::AtLeastOnce => wait_for(
            Duration::from_secs(30),
            POLL,
            "every message received beyond those sent to be found a duplicate",
            || servers.each_ref().map(|server| source(&server.url)),
            |views| sum(views, "received") == total + sum(views, "duplicates"),
        ),
    };
    let received = views.each_ref().map(|view| count(view, "received"));
    assert!(
        received.iter().all(|&n| n > 0),
        "one server read everything: received {received:?}; {views:?}"
    );
    assert_eq!(
        sum(&views, "enqueued"),
        total,
        "jobs the two servers stored (more: a message became two jobs): {views:?}"
    );
    if delivery == Delivery::ToOne {
        assert_eq!(
            sum(&views, "received"),
            total,
            "messages received by the two servers (more: some were read twice): {views:?}"
        );
        assert_eq!(sum(&views, "duplicates"), 0, "duplicates seen: {views:?}");
    }
    for view in &views {
        assert_eq!(view["state"], "running", "{view}");
    }
}

#[test]
fn amqp_two_servers_on_postgres_share_a_stored_source_without_duplicates() {
    const TOTAL: u64 = 5_000;
    let rt = runtime();
    let queue = rabbit::Queue::fresh(&rt, "srv-amqp-shared");
    let schema = Schema::fresh("conveyor_src_amqp");
    let mut servers = two_servers_sharing(&schema, &queue.spec(50), &[]);
    queue.publish(&rt, 0..TOTAL);
    assert_shared_without_duplicates(&servers, TOTAL, Duration::from_secs(180), Delivery::ToOne);
    for server in &mut servers {
        stop(server);
    }
    assert_eq!(
        queue.unacknowledged_once_unconsumed(&rt),
        0,
        "messages left unacknowledged at RabbitMQ (back in the queue once the servers stopped)"
    );
}

#[test]
fn nats_two_servers_on_postgres_share_a_stored_source_without_duplicates() {
    const TOTAL: u64 = 5_000;
    let rt = runtime();
    let stream = jetstream::Stream::fresh(
        &rt,
        NATS,
        "srv-nats-shared",
        async_nats::jetstream::stream::StorageType::Memory,
    );
    let schema = Schema::fresh("conveyor_src_nats");
    let servers = two_servers_sharing(&schema, &stream.spec(50, None), &[]);
    stream.publish(&rt, 0..TOTAL);
    assert_shared_without_duplicates(&servers, TOTAL, Duration::from_secs(180), Delivery::ToOne);
    wait_for(
        Duration::from_secs(30),
        POLL,
        "every message acknowledged at JetStream (num_pending, num_ack_pending)",
        || stream.unacknowledged(&rt),
        |left| *left == (0, 0),
    );
}

#[test]
fn sqs_two_servers_on_postgres_share_a_stored_source_without_duplicates() {
    const TOTAL: u64 = 400;
    let rt = runtime();
    let moto = sqs::Moto::start(&rt);
    let queue = moto.queue(&rt, "srv-sqs-shared");
    let schema = Schema::fresh("conveyor_src_sqs");
    let servers = two_servers_sharing(&schema, &queue.spec(20, None), &SQS_ENV);
    queue.send(&rt, 0..TOTAL);
    assert_shared_without_duplicates(
        &servers,
        TOTAL,
        Duration::from_secs(300),
        Delivery::AtLeastOnce,
    );
    wait_for(
        Duration::from_secs(60),
        POLL,
        "every message deleted from the queue (visible, not visible)",
        || queue.undeleted(&rt),
        |left| *left == (0, 0),
    );
}

#[test]
fn kafka_two_servers_on_postgres_share_a_stored_source_without_duplicates() {
    const TOTAL: u64 = 5_000;
    let rt = runtime();
    let topic = kafka::Topic::fresh(&rt, "srv-kafka-shared");
    let schema = Schema::fresh("conveyor_src_kafka");
    let servers = two_servers_sharing(&schema, &topic.spec(50), &[]);
    // A member knows its lag once it holds partitions and its positions in them: both knowing
    // theirs means the group has shared the partitions between the two servers.
    wait_for(
        Duration::from_secs(60),
        POLL,
        "both servers holding partitions of the topic",
        || servers.each_ref().map(|server| source(&server.url)),
        |views| views.iter().all(|view| view["lag"].is_u64()),
    );
    topic.publish(&rt, 0..TOTAL);
    assert_shared_without_duplicates(
        &servers,
        TOTAL,
        Duration::from_secs(180),
        Delivery::AtLeastOnce,
    );
    wait_for(
        Duration::from_secs(60),
        POLL,
        "every record committed by the group",
        || topic.unacknowledged(&rt),
        |left| *left == 0,
    );
}

// ---------------------------------------------------------------------------------------------
// 3. A broker killed under a running server and started again.

/// nats-server with JetStream on file storage, killed with SIGKILL: what it acknowledged to
/// publishers was written to its files (the process dies, not the machine).
#[test]
fn nats_a_broker_killed_and_restarted_under_the_server_loses_and_doubles_nothing() {
    const FIRST: u64 = 20_000;
    const MORE: u64 = 5_000;
    let rt = runtime();
    let mut broker = OwnBroker::new("nats-server", "/usr/sbin/nats-server");
    broker.args = [
        "-js",
        "-sd",
        &broker.data_dir(),
        "-a",
        "127.0.0.1",
        "-p",
        &broker.port.to_string(),
    ]
    .map(String::from)
    .to_vec();
    broker.start();
    let url = format!("nats://127.0.0.1:{}", broker.port);
    let stream = jetstream::Stream::fresh(
        &rt,
        &url,
        "srv-nats-restart",
        async_nats::jetstream::stream::StorageType::File,
    );
    stream.publish(&rt, 0..FIRST);
    let dir = temp_dir();
    let file = sources_file(&dir, &stream.spec(50, Some(2_000)));
    let server = serve(&path_in(&dir, "jobs.db"), &file, &[]);
    wait_for(
        Duration::from_secs(120),
        POLL,
        "some jobs stored before the broker is killed",
        || source(&server.url),
        |view| count(view, "enqueued") >= 1_000,
    );
    broker.stop(libc::SIGKILL);
    assert_error_shown_while_broker_down(&server, FIRST);
    broker.start();
    assert_running_again(&server);
    stream.publish(&rt, FIRST..FIRST + MORE);
    assert_each_message_one_job(&server.url, FIRST + MORE, Duration::from_secs(300));
    wait_for(
        Duration::from_secs(30),
        POLL,
        "every message acknowledged at JetStream (num_pending, num_ack_pending)",
        || stream.unacknowledged(&rt),
        |left| *left == (0, 0),
    );
    let after = source(&server.url);
    assert_eq!(after["state"], "running", "{after}");
}

/// Mosquitto with persistence, stopped with SIGTERM: it writes its persistence file (the
/// sessions, their subscriptions and the messages they hold) only at a clean shutdown or an
/// autosave, so a SIGKILL would lose what the broker had taken since, whatever the source does.
/// Its queue per session is raised above the default 1,000 so the burst below is all kept.
#[test]
fn mqtt_a_broker_stopped_and_restarted_under_the_server_loses_and_doubles_nothing() {
    const FIRST: u64 = 3_000;
    const MORE: u64 = 1_000;
    let rt = runtime();
    let mut broker = OwnBroker::new("mosquitto", "/usr/sbin/mosquitto");
    let config = broker.dir.path().join("mosquitto.conf");
    std::fs::write(
        &config,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous true\npersistence true\n\
             persistence_location {data}/\nmax_queued_messages 20000\nuser root\n",
            port = broker.port,
            data = broker.data_dir(),
        ),
    )
    .expect("mosquitto's configuration");
    broker.args = vec!["-c".into(), config.display().to_string()];
    broker.start();
    let session = mqtt::Session::fresh(broker.port, "srv-mqtt-restart");
    let dir = temp_dir();
    let file = sources_file(&dir, &session.spec(20));
    let mut server = serve(&path_in(&dir, "jobs.db"), &file, &[]);
    wait_for(
        Duration::from_secs(30),
        POLL,
        "the source to subscribe",
        || source(&server.url),
        |view| view["state"] == "running",
    );
    let publisher = mqtt::Publisher::new(&rt, &session);
    publisher.publish_all(&rt, 0..FIRST);
    drop(publisher);
    wait_for(
        Duration::from_secs(120),
        Duration::from_millis(20),
        "some jobs stored before the broker is stopped",
        || source(&server.url),
        |view| count(view, "enqueued") >= 300,
    );
    broker.stop(libc::SIGTERM);
    assert_error_shown_while_broker_down(&server, FIRST);
    broker.start();
    assert_running_again(&server);
    let publisher = mqtt::Publisher::new(&rt, &session);
    publisher.publish_all(&rt, FIRST..FIRST + MORE);
    assert_each_message_one_job(&server.url, FIRST + MORE, Duration::from_secs(300));
    let after = source(&server.url);
    assert_eq!(after["state"], "running", "{after}");
    stop(&mut server);
    assert_eq!(
        session.unacknowledged(&rt),
        0,
        "messages left unacknowledged in the MQTT session"
    );
}

/// Redis with an append-only file written on every command (`appendfsync always`), killed with
/// SIGKILL: every entry and every acknowledgement it answered is on disk.
#[test]
fn redis_a_broker_killed_and_restarted_under_the_server_loses_and_doubles_nothing() {
    const FIRST: u64 = 20_000;
    const MORE: u64 = 5_000;
    let mut broker = OwnBroker::new("redis-server", "/usr/bin/redis-server");
    broker.args = [
        "--port",
        &broker.port.to_string(),
        "--bind",
        "127.0.0.1",
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--save",
        "",
        "--dir",
        &broker.data_dir(),
    ]
    .map(String::from)
    .to_vec();
    broker.start();
    let url = format!("redis://127.0.0.1:{}", broker.port);
    let stream = unique("srv-redis-restart");
    let redis = || {
        redis::Client::open(url.as_str())
            .and_then(|client| client.get_connection())
            .expect("the test's Redis")
    };
    let add = |range: std::ops::Range<u64>| {
        let numbers: Vec<u64> = range.collect();
        let mut connection = redis();
        for chunk in numbers.chunks(1000) {
            let mut pipe = redis::pipe();
            for &n in chunk {
                pipe.xadd(&stream, "*", &[("body", body(n))]).ignore();
            }
            let () = pipe.query(&mut connection).expect("XADD");
        }
    };
    // Entries the group's consumer read and never acknowledged: pending, and not yet read.
    let unacknowledged = || -> (u64, u64) {
        let info: redis::streams::StreamInfoGroupsReply =
            redis::Commands::xinfo_groups(&mut redis(), &stream).expect("XINFO GROUPS");
        let group = info
            .groups
            .iter()
            .find(|group| group.name == "conveyor")
            .expect("the source's group");
        (group.pending as u64, group.lag.unwrap_or(0) as u64)
    };
    add(0..FIRST);
    let dir = temp_dir();
    // Entries read and not acknowledged when the connection died are taken over after a second.
    let file = sources_file(
        &dir,
        &json!({
            "type": "redis_stream", "url": url, "stream": stream, "group": "conveyor",
            "claim_idle_ms": 1000, "max_in_flight": 50,
            "job": { "kind": "order.placed", "queue": QUEUE },
        }),
    );
    let server = serve(&path_in(&dir, "jobs.db"), &file, &[]);
    wait_for(
        Duration::from_secs(120),
        POLL,
        "some jobs stored before the broker is killed",
        || source(&server.url),
        |view| count(view, "enqueued") >= 1_000,
    );
    broker.stop(libc::SIGKILL);
    assert_error_shown_while_broker_down(&server, FIRST);
    broker.start();
    assert_running_again(&server);
    add(FIRST..FIRST + MORE);
    assert_each_message_one_job(&server.url, FIRST + MORE, Duration::from_secs(300));
    wait_for(
        Duration::from_secs(30),
        POLL,
        "every entry acknowledged (pending, lag)",
        unacknowledged,
        |left| *left == (0, 0),
    );
    let after = source(&server.url);
    assert_eq!(after["state"], "running", "{after}");
    // The stream goes with the broker and its data directory when `broker` is dropped.
}
