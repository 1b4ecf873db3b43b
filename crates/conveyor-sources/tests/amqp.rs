//! The amqp source against a real RabbitMQ (127.0.0.1:5672, guest/guest) and a real SQLite
//! store: every message becomes exactly one job and is acknowledged only once that job is
//! committed — through 10,000 messages, a source killed mid-ingest, a full queue, bodies that
//! are not JSON, and connections cut under it. Each test declares its own queue (named with
//! the process id and the time, expiring if a run dies before deleting it) and deletes it.

mod kit;

use conveyor_core::store::JobListParams;
use conveyor_core::JobState;
use conveyor_sources::SourceState;
use kit::*;
use lapin::options::{
    BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use serde_json::json;
use std::net::SocketAddr;

#[path = "../../conveyor/tests/support/proxy.rs"]
mod proxy;

const RABBIT: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

/// A queue of this test's own, deleted at the end (and by RabbitMQ after ten idle minutes if
/// the run died first).
struct TestQueue {
    name: String,
    _connection: Connection,
    channel: Channel,
    _cleanup: Cleanup,
}

async fn rabbit() -> (Connection, Channel) {
    let connection = Connection::connect(RABBIT, ConnectionProperties::default())
        .await
        .expect("RabbitMQ on 127.0.0.1:5672");
    let channel = connection.create_channel().await.expect("a channel");
    (connection, channel)
}

impl TestQueue {
    async fn fresh(prefix: &str) -> TestQueue {
        let name = unique(prefix);
        let (connection, channel) = rabbit().await;
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
        channel
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .expect("publisher confirms");
        let doomed = name.clone();
        TestQueue {
            name,
            _connection: connection,
            channel,
            _cleanup: Cleanup::new(move || async move {
                let (_connection, channel) = rabbit().await;
                let _ = channel
                    .queue_delete(doomed.as_str().into(), QueueDeleteOptions::default())
                    .await;
            }),
        }
    }

    /// Publishes each `(body, message_id)` to the queue (through the default exchange) and
    /// waits for RabbitMQ to confirm them all.
    async fn publish(&self, messages: impl IntoIterator<Item = (Vec<u8>, Option<String>)>) {
        for (body, id) in messages {
            let mut properties = BasicProperties::default();
            if let Some(id) = id {
                properties = properties.with_message_id(id.into());
            }
            let _confirm = self
                .channel
                .basic_publish(
                    "".into(),
                    self.name.as_str().into(),
                    BasicPublishOptions::default(),
                    &body,
                    properties,
                )
                .await
                .expect("publish");
        }
        let returned = self
            .channel
            .wait_for_confirms()
            .await
            .expect("publisher confirms");
        assert!(returned.is_empty(), "messages returned: {returned:?}");
    }

    /// Publishes `{"n": n}` for each n; the even ones carry `message_id` `m-{n}`, the odd ones
    /// none (their identity is then a hash of the content).
    async fn publish_numbers(&self, range: std::ops::Range<u64>) {
        let messages: Vec<_> = range
            .map(|n| (body(n), (n % 2 == 0).then(|| format!("m-{n}"))))
            .collect();
        for chunk in messages.chunks(1000) {
            self.publish(chunk.to_vec()).await;
        }
    }

    /// The queue's ready messages and consumers, as a passive declare reports them.
    async fn depth(&self) -> (u32, u32) {
        let queue = self
            .channel
            .queue_declare(
                self.name.as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..QueueDeclareOptions::default()
                },
                FieldTable::default(),
            )
            .await
            .expect("passive declare");
        (queue.message_count(), queue.consumer_count())
    }

    /// Waits for the source's consumer to be gone, then checks no message is left: one
    /// delivered and never acknowledged would be back in the queue once its connection closed.
    async fn assert_drained(&self) {
        wait_until!(SHORT, "the consumer to go", self.depth().await.1 == 0);
        assert_eq!(self.depth().await.0, 0, "messages left in the queue");
    }
}

fn source(queue: &str, url: &str, max_in_flight: usize) -> conveyor_core::sources::SourceSpec {
    spec(json!({
        "name": "orders",
        "type": "amqp",
        "url": url,
        "queue": queue,
        "max_in_flight": max_in_flight,
        "job": { "kind": "order.placed", "queue": QUEUE },
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_become_ten_thousand_jobs_each_acknowledged() {
    let store = open_store();
    let queue = TestQueue::fresh("amqp-drain").await;
    let running = start(source(&queue.name, RABBIT, 500), &store);
    queue.publish_numbers(0..10_000).await;
    wait_until!(LONG, "10,000 jobs", depth(&store, QUEUE).await >= 10_000);
    assert_eq!(running.count("received"), 10_000);
    assert_eq!(running.count("enqueued"), 10_000);
    assert_eq!(running.count("duplicate"), 0);
    assert_eq!(running.state(), SourceState::Running);
    each_once(&store, QUEUE, "orders", 0..10_000).await;
    // The broker's message id where there is one, else the SHA-256 of the content.
    let jobs = jobs(&store, QUEUE, None).await;
    for job in &jobs {
        let n = job.payload["n"].as_u64().unwrap_or_default();
        let key = job.idempotency_key.as_deref().unwrap_or_default();
        if n % 2 == 0 {
            assert_eq!(key, format!("source:orders:m-{n}"));
        } else {
            let hash = key.trim_start_matches("source:orders:");
            assert_eq!(hash.len(), 64, "{key}");
            assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{key}");
        }
        assert_eq!(job.kind, "order.placed");
    }
    running.stop().await;
    queue.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_killed_mid_ingest_leaves_every_message_one_job_after_its_restart() {
    let store = open_store();
    let queue = TestQueue::fresh("amqp-kill").await;
    queue.publish_numbers(0..6_000).await;
    let running = start(source(&queue.name, RABBIT, 50), &store);
    wait_until!(LONG, "some jobs", depth(&store, QUEUE).await >= 600);
    running.abort().await;
    let done = depth(&store, QUEUE).await;
    assert!(
        done < 6_000,
        "the kill came after every message was ingested: it tested no recovery"
    );
    // What the killed source held unacknowledged went back to the queue with its connection.
    let running = start(source(&queue.name, RABBIT, 50), &store);
    wait_until!(LONG, "6,000 jobs", depth(&store, QUEUE).await >= 6_000);
    // Whatever was redelivered after being committed found its job.
    wait_until!(SHORT, "the rest read", queue.depth().await.0 == 0);
    running.stop().await;
    each_once(&store, QUEUE, "orders", 0..6_000).await;
    queue.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_the_batch_unacknowledged_until_it_accepts_again() {
    let store = open_store();
    let queue = TestQueue::fresh("amqp-full").await;
    set_max_depth(&store, QUEUE, Some(50)).await;
    let running = start(source(&queue.name, RABBIT, 20), &store);
    queue.publish_numbers(0..200).await;
    wait_until!(
        SHORT,
        "the source to back off",
        running.state() == SourceState::BackingOff
    );
    assert!(depth(&store, QUEUE).await <= 50);
    assert!(running.count("refused") >= 1);
    // Messages neither waiting in the queue nor stored as jobs: the held batch, delivered and
    // not acknowledged (the prefetch lets no more out meanwhile).
    let (ready, _) = queue.depth().await;
    let stored = depth(&store, QUEUE).await;
    assert!(
        u64::from(ready) + stored < 200,
        "ready {ready} + stored {stored}: nothing is held"
    );
    assert!(running.last_error().is_some());
    set_max_depth(&store, QUEUE, None).await;
    wait_until!(SHORT, "all 200 jobs", depth(&store, QUEUE).await == 200);
    wait_until!(
        SHORT,
        "the source to run again",
        running.state() == SourceState::Running
    );
    running.stop().await;
    each_once(&store, QUEUE, "orders", 0..200).await;
    queue.assert_drained().await;
}

/// Publishes a body that is not JSON (with a header) and a good one, and returns the jobs.
async fn not_json(on_invalid: &str) -> Vec<conveyor_core::Job> {
    let store = open_store();
    let queue = TestQueue::fresh("amqp-invalid").await;
    let spec = spec(json!({
        "name": "orders",
        "type": "amqp",
        "url": RABBIT,
        "queue": queue.name,
        "on_invalid": on_invalid,
        "job": { "kind": "note", "queue": QUEUE },
    }));
    let running = start(spec, &store);
    let mut headers = FieldTable::default();
    headers.insert(
        "tenant".into(),
        AMQPValue::LongString("acme".as_bytes().to_vec().into()),
    );
    queue
        .channel
        .basic_publish(
            "".into(),
            queue.name.as_str().into(),
            BasicPublishOptions::default(),
            b"\x01plain text",
            BasicProperties::default().with_headers(headers),
        )
        .await
        .expect("publish");
    queue.publish([(body(7), None)]).await;
    wait_until!(SHORT, "both stored", running.count("enqueued") == 2);
    assert_eq!(running.count("invalid"), 1);
    running.stop().await;
    queue.assert_drained().await;
    let mut params = JobListParams::default();
    params.limit = 100;
    store.store.jobs_list(params).await.expect("jobs")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_json_is_kept_as_base64() {
    let jobs = not_json("raw").await;
    assert_eq!(jobs.len(), 2);
    let raw = jobs
        .iter()
        .find(|job| job.payload.get("raw_base64").is_some())
        .expect("the raw job");
    assert_eq!(raw.payload["raw_base64"], "AXBsYWluIHRleHQ=");
    assert_eq!(raw.payload["headers"]["tenant"], "acme");
    assert_eq!(raw.state, JobState::Available);
    assert!(jobs.iter().any(|job| job.payload == json!({ "n": 7 })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_is_not_json_is_dead_lettered_with_its_raw_message() {
    let jobs = not_json("dead_letter").await;
    assert_eq!(jobs.len(), 2);
    let dead = jobs
        .iter()
        .find(|job| job.state == JobState::Dead)
        .expect("the dead job");
    assert_eq!(dead.payload["raw_base64"], "AXBsYWluIHRleHQ=");
    assert_eq!(dead.kind, "note");
    assert!(
        dead.errors[0].message.contains("not JSON"),
        "{:?}",
        dead.errors
    );
    assert!(jobs
        .iter()
        .any(|job| job.payload == json!({ "n": 7 }) && job.state == JobState::Available));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_are_reconnected_and_every_message_is_one_job() {
    let store = open_store();
    let queue = TestQueue::fresh("amqp-cut").await;
    let rabbit: SocketAddr = "127.0.0.1:5672".parse().expect("address");
    let proxy = proxy::Proxy::start(rabbit).await;
    let url = format!("amqp://guest:guest@{}/%2f", proxy.addr);
    queue.publish_numbers(0..4_000).await;
    let running = start(source(&queue.name, &url, 100), &store);
    wait_until!(LONG, "some jobs", depth(&store, QUEUE).await >= 400);
    // Every connection reset, and new ones refused for a while: the source shows the error.
    proxy.refuse(true);
    assert!(proxy.cut() >= 1);
    wait_until!(
        SHORT,
        "the source to show the error",
        running.state() == SourceState::Error && running.last_error().is_some()
    );
    assert!(depth(&store, QUEUE).await < 4_000, "the cut came too late");
    proxy.refuse(false);
    wait_until!(LONG, "4,000 jobs", depth(&store, QUEUE).await >= 4_000);
    assert_eq!(running.state(), SourceState::Running);
    // And once more, cut while running, without refusing: it comes back by itself.
    queue.publish_numbers(4_000..5_000).await;
    proxy.cut();
    wait_until!(LONG, "5,000 jobs", depth(&store, QUEUE).await >= 5_000);
    wait_until!(SHORT, "the rest read", queue.depth().await.0 == 0);
    running.stop().await;
    each_once(&store, QUEUE, "orders", 0..5_000).await;
    queue.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_is_the_queues_ready_count() {
    let store = open_store();
    let queue = TestQueue::fresh("amqp-lag").await;
    // A full target queue holds the source back, so messages wait at the broker.
    set_max_depth(&store, QUEUE, Some(5)).await;
    queue.publish_numbers(0..100).await;
    let running = start(source(&queue.name, RABBIT, 10), &store);
    wait_until!(
        SHORT,
        "a lag",
        running.status.lag().is_some_and(|lag| lag >= 80)
    );
    set_max_depth(&store, QUEUE, None).await;
    wait_until!(SHORT, "100 jobs", depth(&store, QUEUE).await == 100);
    // Asked every 5 s: it comes down to nothing waiting.
    wait_until!(SHORT, "no lag", running.status.lag() == Some(0));
    running.stop().await;
    queue.assert_drained().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_queue_is_an_error_naming_it() {
    let name = unique("amqp-missing");
    let store = open_store();
    let running = start(source(&name, RABBIT, 10), &store);
    wait_until!(
        SHORT,
        "the error",
        running.state() == SourceState::Error && running.last_error().is_some()
    );
    let error = running.last_error().unwrap_or_default();
    assert!(error.contains(&name), "{error}");
    assert!(error.contains("must exist"), "{error}");
    running.stop().await;
    // The source did not make it.
    let (_connection, channel) = rabbit().await;
    let declared = channel
        .queue_declare(
            name.as_str().into(),
            QueueDeclareOptions {
                passive: true,
                ..QueueDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await;
    assert!(declared.is_err());
}
