//! The `nats` source against a real NATS server with JetStream (127.0.0.1:4222) and a real
//! SQLite store: each message becomes exactly one job and is acknowledged only once that job is
//! stored. 10,000 messages make 10,000 jobs with nothing left unacknowledged; a source killed
//! mid-ingest and started again leaves every message one job; a full queue holds the batch
//! (kept in progress at the server) until it accepts again; bodies that are not JSON are kept or
//! dead-lettered; a cut connection is reconnected; the consumer's pending count is the lag.
//! Each test makes its own stream (memory storage) and deletes it.

mod kit;

#[path = "../../conveyor/tests/support/proxy.rs"]
mod proxy;

use async_nats::jetstream::{self, stream::StorageType};
use conveyor_core::JobState;
use conveyor_sources::SourceState;
use kit::*;
use serde_json::{json, Value};
use std::time::Duration;

const NATS: &str = "nats://127.0.0.1:4222";

/// A stream of the test's own (subjects `{name}.>`), deleted when dropped.
struct TestStream {
    name: String,
    js: jetstream::Context,
}

impl TestStream {
    async fn fresh(prefix: &str) -> Self {
        let name = unique(prefix);
        let client = async_nats::connect(NATS)
            .await
            .expect("NATS with JetStream on 127.0.0.1:4222");
        let js = jetstream::new(client);
        js.create_stream(jetstream::stream::Config {
            name: name.clone(),
            subjects: vec![format!("{name}.>")],
            storage: StorageType::Memory,
            ..Default::default()
        })
        .await
        .expect("create the stream");
        TestStream { name, js }
    }

    fn subject(&self) -> String {
        format!("{}.orders", self.name)
    }

    /// Publishes each body (with `headers`), waiting for JetStream to store them all.
    async fn publish(&self, bodies: impl IntoIterator<Item = Vec<u8>>, headers: &[(&str, &str)]) {
        let mut acks = Vec::new();
        for body in bodies {
            let ack = if headers.is_empty() {
                self.js.publish(self.subject(), body.into()).await
            } else {
                let mut map = async_nats::HeaderMap::new();
                for (name, value) in headers {
                    map.insert(*name, *value);
                }
                self.js
                    .publish_with_headers(self.subject(), map, body.into())
                    .await
            };
            acks.push(ack.expect("publish"));
            // The context holds a bounded number of acknowledgements in flight.
            if acks.len() == 500 {
                for ack in acks.drain(..) {
                    ack.await.expect("stored by JetStream");
                }
            }
        }
        for ack in acks {
            ack.await.expect("stored by JetStream");
        }
    }

    async fn consumer(&self, name: &str) -> jetstream::consumer::Info {
        self.js
            .get_stream(&self.name)
            .await
            .expect("the stream")
            .consumer_info(name)
            .await
            .expect("the consumer")
    }

    /// Messages the consumer has not acknowledged: delivered and pending, or not yet delivered.
    async fn unacknowledged(&self, consumer: &str) -> u64 {
        let info = self.consumer(consumer).await;
        info.num_pending + info.num_ack_pending as u64
    }

    /// A source reading this stream as `name` with the durable consumer `conveyor`.
    fn source(&self, name: &str, url: &str, extra: Value) -> Value {
        let mut source = json!({
            "name": name,
            "type": "nats",
            "url": url,
            "stream": self.name,
            "subject": format!("{}.>", self.name),
            "consumer": "conveyor",
            "job": { "kind": "order.placed", "queue": "orders" },
        });
        for (key, value) in extra.as_object().cloned().unwrap_or_default() {
            source[key] = value;
        }
        source
    }
}

impl Drop for TestStream {
    fn drop(&mut self) {
        // Dropped outside any async context is not guaranteed (a panicking test), so the
        // deletion runs on a runtime of its own.
        let name = self.name.clone();
        let _ = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async {
                if let Ok(client) = async_nats::connect(NATS).await {
                    let _ = jetstream::new(client).delete_stream(&name).await;
                }
            });
        })
        .join();
    }
}

fn bodies(range: std::ops::Range<u64>) -> impl Iterator<Item = Vec<u8>> {
    range.map(body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_become_ten_thousand_jobs_each_acknowledged() {
    let store = open_store();
    let stream = TestStream::fresh("drain").await;
    stream.publish(bodies(0..10_000), &[]).await;
    let source = start(
        spec(stream.source("orders", NATS, json!({ "max_in_flight": 500 }))),
        &store,
    );
    wait_until!(
        Duration::from_secs(120),
        "10,000 jobs",
        source.count("enqueued") == 10_000,
        SLOW_POLL
    );
    assert_eq!(source.count("received"), 10_000);
    assert_eq!(source.count("duplicate"), 0);
    assert_eq!(source.state(), SourceState::Running);
    each_once(&store, "orders", "orders", 0..10_000).await;
    wait_until!(
        Duration::from_secs(10),
        "every message acknowledged",
        stream.unacknowledged("conveyor").await == 0,
        SLOW_POLL
    );
    // The consumer the source made: durable, explicit acknowledgements, room for a batch.
    let info = stream.consumer("conveyor").await;
    assert_eq!(
        info.config.ack_policy,
        jetstream::consumer::AckPolicy::Explicit
    );
    assert!(info.config.max_ack_pending >= 500);
    // The identity is the stream and its sequence.
    let job = &kit::jobs(&store, "orders", None).await[0];
    let key = job.idempotency_key.as_deref().unwrap_or_default();
    let identity = key.strip_prefix("source:orders:").unwrap_or_default();
    let (stream_name, sequence) = identity.rsplit_once(':').expect("stream:sequence");
    assert_eq!(stream_name, stream.name);
    assert!(sequence.parse::<u64>().is_ok(), "{key}");
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_killed_mid_ingest_leaves_every_message_one_job_after_its_restart() {
    let store = open_store();
    let stream = TestStream::fresh("kill").await;
    stream.publish(bodies(0..5_000), &[]).await;
    // Small batches, so the kill lands while most of the stream is still to do; what the
    // killed source held comes again after its two-second ack wait.
    let config = spec(stream.source(
        "orders",
        NATS,
        json!({ "max_in_flight": 50, "ack_wait_ms": 2000 }),
    ));
    let source = start(config.clone(), &store);
    wait_until!(
        Duration::from_secs(60),
        "some jobs stored",
        source.count("enqueued") >= 500,
        SLOW_POLL
    );
    source.abort().await;
    assert!(
        stream.unacknowledged("conveyor").await > 0,
        "the kill came after the whole stream was ingested: it tested no recovery"
    );
    let source = start(config, &store);
    wait_until!(
        Duration::from_secs(120),
        "5,000 jobs",
        depth(&store, "orders").await >= 5_000,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(30),
        "every message acknowledged",
        stream.unacknowledged("conveyor").await == 0,
        SLOW_POLL
    );
    each_once(&store, "orders", "orders", 0..5_000).await;
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_the_batch_in_progress_until_it_accepts_again() {
    let store = open_store();
    let stream = TestStream::fresh("full").await;
    set_max_depth(&store, "orders", Some(50)).await;
    // Three batches of 20: two fit under the depth of 50, the third is refused and held.
    stream.publish(bodies(0..60), &[]).await;
    // An ack wait shorter than the hold below: without the source's ack-progress, JetStream
    // would hand the held batch to the next fetch.
    let source = start(
        spec(stream.source(
            "orders",
            NATS,
            json!({ "max_in_flight": 20, "ack_wait_ms": 8000 }),
        )),
        &store,
    );
    wait_until!(
        Duration::from_secs(60),
        "the source to back off",
        source.state() == SourceState::BackingOff,
        SLOW_POLL
    );
    assert_eq!(depth(&store, "orders").await, 40);
    // The refused batch is held, not acknowledged.
    let info = stream.consumer("conveyor").await;
    assert_eq!((info.num_pending, info.num_ack_pending), (0, 20));
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(source.state(), SourceState::BackingOff);
    // Past its ack wait, the held batch is still in progress: a fetch of the consumer's own
    // finds nothing to deliver again.
    let consumer: jetstream::consumer::PullConsumer = stream
        .js
        .get_stream(&stream.name)
        .await
        .expect("the stream")
        .get_consumer("conveyor")
        .await
        .expect("the consumer");
    let mut stolen = consumer
        .fetch()
        .max_messages(20)
        .expires(Duration::from_secs(1))
        .messages()
        .await
        .expect("fetch");
    assert!(
        futures::StreamExt::next(&mut stolen).await.is_none(),
        "the held batch was delivered again"
    );
    set_max_depth(&store, "orders", None).await;
    wait_until!(
        Duration::from_secs(60),
        "all 60 jobs",
        depth(&store, "orders").await == 60,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(10),
        "every message acknowledged",
        stream.unacknowledged("conveyor").await == 0,
        SLOW_POLL
    );
    assert_eq!(source.state(), SourceState::Running);
    assert!(source.count("refused") >= 1);
    assert_eq!(source.count("duplicate"), 0, "the held batch came again");
    assert_eq!(stream.consumer("conveyor").await.num_redelivered, 0);
    each_once(&store, "orders", "orders", 0..60).await;
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_are_not_json_are_kept_or_dead_lettered() {
    let store = open_store();
    let stream = TestStream::fresh("invalid").await;
    // Two sources on the stream, each with its own durable consumer: one keeps what is not
    // JSON as base64, the other dead-letters it. The kind comes from a header.
    let mut kept = stream.source("kept", NATS, json!({ "on_invalid": "raw" }));
    kept["job"] = json!({ "kind": { "from": "header:kind" }, "queue": "kept" });
    let mut dead = stream.source(
        "dead",
        NATS,
        json!({ "on_invalid": "dead_letter", "consumer": "conveyor-dead" }),
    );
    dead["job"] = json!({ "kind": { "from": "header:kind" }, "queue": "dead" });
    let kept = start(spec(kept), &store);
    let dead = start(spec(dead), &store);
    stream
        .publish([b"\x01plain text".to_vec()], &[("kind", "note")])
        .await;
    stream.publish([body(4)], &[("kind", "note")]).await;
    wait_until!(
        Duration::from_secs(30),
        "both sources' jobs",
        kept.count("enqueued") == 2 && dead.count("enqueued") == 2,
        SLOW_POLL
    );
    assert_eq!(kept.count("invalid"), 1);
    assert_eq!(dead.count("invalid"), 1);
    let jobs = kit::jobs(&store, "kept", Some(JobState::Available)).await;
    assert_eq!(jobs.len(), 2);
    let raw = jobs
        .iter()
        .find(|job| job.payload.get("raw_base64").is_some())
        .expect("the raw job");
    assert_eq!(raw.kind, "note");
    assert_eq!(raw.payload["raw_base64"], "AXBsYWluIHRleHQ=");
    // The headers travel with the raw body; JetStream's own are not among them.
    assert_eq!(raw.payload["headers"], json!({ "kind": "note" }));
    let dead_jobs = kit::jobs(&store, "dead", Some(JobState::Dead)).await;
    assert_eq!(dead_jobs.len(), 1, "{dead_jobs:?}");
    assert_eq!(dead_jobs[0].payload["raw_base64"], "AXBsYWluIHRleHQ=");
    assert!(dead_jobs[0].errors[0].message.starts_with("source dead: "));
    assert_eq!(
        kit::jobs(&store, "dead", Some(JobState::Available))
            .await
            .len(),
        1
    );
    wait_until!(
        Duration::from_secs(10),
        "all acknowledged",
        stream.unacknowledged("conveyor").await == 0
            && stream.unacknowledged("conveyor-dead").await == 0,
        SLOW_POLL
    );
    kept.stop().await;
    dead.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_reconnected_and_every_message_is_one_job() {
    let store = open_store();
    let stream = TestStream::fresh("cut").await;
    let proxy = proxy::Proxy::start("127.0.0.1:4222".parse().expect("address")).await;
    let url = format!("nats://{}", proxy.addr);
    // What the cut connection held comes again after two seconds.
    let source = start(
        spec(stream.source(
            "orders",
            &url,
            json!({ "max_in_flight": 100, "ack_wait_ms": 2000 }),
        )),
        &store,
    );
    stream.publish(bodies(0..1_000), &[]).await;
    wait_until!(
        Duration::from_secs(60),
        "some jobs",
        source.count("enqueued") >= 100,
        SLOW_POLL
    );
    // Every connection reset, and new ones refused for a while.
    proxy.refuse(true);
    assert!(proxy.cut() >= 1);
    wait_until!(
        Duration::from_secs(30),
        "the source in error",
        source.state() == SourceState::Error,
        SLOW_POLL
    );
    let view = source.status.view();
    assert!(
        view["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("nats")),
        "{view}"
    );
    stream.publish(bodies(1_000..2_000), &[]).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    proxy.refuse(false);
    wait_until!(
        Duration::from_secs(90),
        "2,000 jobs",
        depth(&store, "orders").await >= 2_000,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(30),
        "every message acknowledged",
        stream.unacknowledged("conveyor").await == 0,
        SLOW_POLL
    );
    assert_eq!(source.state(), SourceState::Running);
    each_once(&store, "orders", "orders", 0..2_000).await;
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_is_the_consumers_pending_count() {
    let store = open_store();
    let stream = TestStream::fresh("lag").await;
    stream.publish(bodies(0..300), &[]).await;
    // The queue refuses at once, so the messages wait at the server.
    set_max_depth(&store, "orders", Some(1)).await;
    let source = start(
        spec(stream.source("orders", NATS, json!({ "max_in_flight": 10 }))),
        &store,
    );
    wait_until!(
        Duration::from_secs(30),
        "a lag",
        source.status.lag().is_some(),
        SLOW_POLL
    );
    // Read before the first fetch: all 300 wait.
    assert_eq!(source.status.lag(), Some(300));
    set_max_depth(&store, "orders", None).await;
    wait_until!(
        Duration::from_secs(30),
        "the lag back to 0",
        source.status.lag() == Some(0),
        SLOW_POLL
    );
    assert_eq!(depth(&store, "orders").await, 300);
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latest_start_skips_what_the_stream_held_a_consumer_is_reused_and_a_missing_stream_is_named(
) {
    let store = open_store();
    let stream = TestStream::fresh("latest").await;
    stream.publish(bodies(0..5), &[]).await;
    let source = start(
        spec(stream.source("orders", NATS, json!({ "start": "latest" }))),
        &store,
    );
    wait_until!(
        Duration::from_secs(30),
        "the consumer made",
        source.state() == SourceState::Running && source.status.lag().is_some(),
        SLOW_POLL
    );
    stream.publish(bodies(5..10), &[]).await;
    wait_until!(
        Duration::from_secs(30),
        "5 jobs",
        source.count("enqueued") == 5,
        SLOW_POLL
    );
    each_once(&store, "orders", "orders", 5..10).await;
    source.stop().await;

    // The existing consumer is reused: its ack wait follows the configuration, and a filter
    // that differs is refused rather than silently read.
    let changed = stream.source(
        "orders",
        NATS,
        json!({ "start": "latest", "ack_wait_ms": 7000 }),
    );
    let broker = conveyor_sources::connect(spec(changed))
        .await
        .map_err(|error| error.to_string())
        .expect("the consumer reused");
    drop(broker);
    let info = stream.consumer("conveyor").await;
    assert_eq!(info.config.ack_wait, Duration::from_secs(7));
    assert_eq!(
        info.config.deliver_policy,
        jetstream::consumer::DeliverPolicy::New
    );
    let other = stream.source(
        "orders",
        NATS,
        json!({ "subject": format!("{}.other", stream.name) }),
    );
    let error = conveyor_sources::connect(spec(other))
        .await
        .err()
        .expect("another filter refused");
    assert!(error.to_string().contains("reads the subject"), "{error}");

    let mut missing = stream.source("orders", NATS, json!({}));
    missing["stream"] = json!(unique("missing"));
    let error = conveyor_sources::connect(spec(missing))
        .await
        .err()
        .expect("no stream, no source");
    assert!(error.to_string().contains("does not exist"), "{error}");
}
