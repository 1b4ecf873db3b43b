//! The mqtt source against a real Mosquitto (127.0.0.1:1883) and a real SQLite store: every
//! message becomes exactly one job and is acknowledged (PUBACK) only once that job is
//! committed — through 10,000 messages, a source killed mid-ingest, a full queue, bodies that
//! are not JSON, and connections cut under it. Each test has its own topic and session client
//! id (named with the process id and the time) and removes the session at the end.
//!
//! Mosquitto queues at most 1,000 messages for a session (`max_queued_messages`, beyond the 20
//! in flight while it is connected) and drops the rest: the tests publish while the source is
//! connected and keep what waits for it under 1,000 (paced in the 10,000-message run, 900 in
//! all where the source goes away).

mod kit;

use conveyor_core::store::JobListParams;
use conveyor_core::JobState;
use conveyor_sources::SourceState;
use kit::*;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, QoS};
use serde_json::json;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

#[path = "../../conveyor/tests/support/proxy.rs"]
mod proxy;

const MOSQUITTO: &str = "mqtt://127.0.0.1:1883";

/// How many messages may wait at the broker for the source, well under Mosquitto's 1,000.
const WINDOW: u64 = 400;

/// Messages in the tests where the source goes away: fewer than Mosquitto queues for one.
const TOTAL: u64 = 900;

/// A topic and a session client id of this test's own; the session is removed at the end.
struct Session {
    topic: String,
    client_id: String,
    _cleanup: Cleanup,
}

impl Session {
    fn fresh(prefix: &str) -> Session {
        let name = unique(prefix);
        let client_id = name.clone();
        let doomed = client_id.clone();
        Session {
            topic: format!("conveyor-test/{name}"),
            client_id,
            _cleanup: Cleanup::new(move || end_session(doomed)),
        }
    }

    fn source(&self, url: &str, max_in_flight: usize) -> conveyor_core::sources::SourceSpec {
        spec(json!({
            "name": "orders",
            "type": "mqtt",
            "url": url,
            "topic": self.topic,
            "client_id": self.client_id,
            "max_in_flight": max_in_flight,
            "job": { "kind": "order.placed", "queue": QUEUE },
        }))
    }

    /// Messages the broker still holds for the session, unacknowledged: a client with its id
    /// connects (keeping the session), counts what the broker sends it for two seconds, and
    /// acknowledges none.
    async fn unacknowledged(&self) -> usize {
        let mut options = MqttOptions::new(self.client_id.clone(), "127.0.0.1", 1883);
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
                Event::Incoming(Packet::ConnAck(ack)) => assert!(ack.session_present),
                _ => {}
            }
        }
        count
    }
}

/// Removes a session: a client with its id connects with a clean session, then leaves.
async fn end_session(client_id: String) {
    let mut options = MqttOptions::new(client_id, "127.0.0.1", 1883);
    options.set_clean_session(true);
    let (client, mut event_loop) = AsyncClient::new(options, 10);
    while let Ok(event) = event_loop.poll().await {
        if let Event::Incoming(Packet::ConnAck(_)) = event {
            let _ = client.disconnect().await;
        }
    }
}

/// A publisher with a clean session of its own, publishing at QoS 1.
#[derive(Clone)]
struct Publisher {
    client: AsyncClient,
    sent: Arc<AtomicU64>,
    acked: Arc<AtomicU64>,
}

struct PublisherTask(JoinHandle<()>);

impl Drop for PublisherTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

fn publisher() -> (Publisher, PublisherTask) {
    let mut options = MqttOptions::new(unique("pub"), "127.0.0.1", 1883);
    options.set_max_packet_size(1 << 20, 1 << 20);
    let (client, event_loop) = AsyncClient::new(options, 1000);
    let acked = Arc::new(AtomicU64::new(0));
    let task = tokio::spawn(count_acks(event_loop, acked.clone()));
    (
        Publisher {
            client,
            sent: Arc::new(AtomicU64::new(0)),
            acked,
        },
        PublisherTask(task),
    )
}

async fn count_acks(mut event_loop: EventLoop, acked: Arc<AtomicU64>) {
    loop {
        match event_loop.poll().await {
            Ok(Event::Incoming(Packet::PubAck(_))) => {
                acked.fetch_add(1, Ordering::SeqCst);
            }
            Ok(_) => {}
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

impl Publisher {
    async fn publish(&self, topic: &str, payload: Vec<u8>) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, payload)
            .await
            .expect("publish");
        self.sent.fetch_add(1, Ordering::SeqCst);
    }

    /// Waits for the broker to have acknowledged everything published.
    async fn confirmed(&self) {
        wait_until!(
            SHORT,
            "the broker to take every message",
            self.acked.load(Ordering::SeqCst) >= self.sent.load(Ordering::SeqCst)
        );
    }

    /// Publishes `{"n": n}` for each n, never letting more than [`WINDOW`] wait for the source
    /// (counted as published and not yet stored as jobs), so the broker drops none.
    async fn publish_paced(&self, topic: &str, range: std::ops::Range<u64>, store: &TestStore) {
        let first = range.start;
        for n in range {
            // Before each window: what waits for the source is at most one window, so after
            // it at most two.
            if n > first && (n - first).is_multiple_of(WINDOW) {
                self.confirmed().await;
                wait_until!(
                    LONG,
                    "the source to catch up",
                    depth(store, QUEUE).await + WINDOW >= n - first
                );
            }
            self.publish(topic, body(n)).await;
        }
        self.confirmed().await;
    }
}

async fn start_running(spec: conveyor_core::sources::SourceSpec, store: &TestStore) -> Running {
    let running = start(spec, store);
    // Subscribed once connected: only then are messages kept for the session.
    wait_until!(
        SHORT,
        "the source to subscribe",
        running.state() == SourceState::Running
    );
    running
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_messages_become_ten_thousand_jobs_each_acknowledged() {
    let store = open_store();
    let session = Session::fresh("mqtt-drain");
    let running = start_running(session.source(MOSQUITTO, 500), &store).await;
    let (publisher, _task) = publisher();
    publisher
        .publish_paced(&session.topic, 0..10_000, &store)
        .await;
    wait_until!(LONG, "10,000 jobs", depth(&store, QUEUE).await >= 10_000);
    assert_eq!(running.count("received"), 10_000);
    assert_eq!(running.count("enqueued"), 10_000);
    assert_eq!(running.count("duplicate"), 0);
    assert_eq!(running.state(), SourceState::Running);
    // MQTT reports no lag.
    assert_eq!(running.status.lag(), None);
    each_once(&store, QUEUE, "orders", 0..10_000).await;
    let jobs = jobs(&store, QUEUE, None).await;
    assert!(jobs.iter().all(|job| job
        .idempotency_key
        .as_deref()
        .is_some_and(|key| key.len() == "source:orders:".len() + 64)));
    running.stop().await;
    assert_eq!(session.unacknowledged().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_killed_mid_ingest_leaves_every_message_one_job_after_its_restart() {
    let store = open_store();
    let session = Session::fresh("mqtt-kill");
    let running = start_running(session.source(MOSQUITTO, 50), &store).await;
    // Fewer than Mosquitto queues for a session: none dropped while the source is away.
    let (publisher, _task) = publisher();
    for n in 0..TOTAL {
        publisher.publish(&session.topic, body(n)).await;
    }
    wait_until!(LONG, "some jobs", depth(&store, QUEUE).await >= 150);
    running.abort().await;
    assert!(
        depth(&store, QUEUE).await < TOTAL,
        "the kill came after every message was ingested: it tested no recovery"
    );
    publisher.confirmed().await;
    // The session kept what the killed source had not acknowledged, and what came since.
    let running = start_running(session.source(MOSQUITTO, 50), &store).await;
    wait_until!(
        LONG,
        format!("{TOTAL} jobs: {}", running.status.view()),
        depth(&store, QUEUE).await >= TOTAL
    );
    running.stop().await;
    each_once(&store, QUEUE, "orders", 0..TOTAL).await;
    assert_eq!(session.unacknowledged().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_the_batch_unacknowledged_until_it_accepts_again() {
    let store = open_store();
    let session = Session::fresh("mqtt-full");
    set_max_depth(&store, QUEUE, Some(50)).await;
    let running = start_running(session.source(MOSQUITTO, 20), &store).await;
    let (publisher, _task) = publisher();
    for n in 0..200 {
        publisher.publish(&session.topic, body(n)).await;
    }
    publisher.confirmed().await;
    wait_until!(
        SHORT,
        "the source to back off",
        running.state() == SourceState::BackingOff
    );
    assert!(depth(&store, QUEUE).await <= 50);
    assert!(running.count("refused") >= 1);
    assert!(running.last_error().is_some());
    assert!(running.count("received") > depth(&store, QUEUE).await);
    // Killed while holding the refused batch: the broker still has it, unacknowledged.
    running.abort().await;
    let held = session.unacknowledged().await;
    assert!(held > 0, "nothing was held unacknowledged");
    assert!(depth(&store, QUEUE).await + held as u64 <= 200);
    set_max_depth(&store, QUEUE, None).await;
    let running = start_running(session.source(MOSQUITTO, 20), &store).await;
    wait_until!(SHORT, "all 200 jobs", depth(&store, QUEUE).await == 200);
    running.stop().await;
    each_once(&store, QUEUE, "orders", 0..200).await;
    assert_eq!(session.unacknowledged().await, 0);
}

/// Publishes a body that is not JSON and a good one, and returns the jobs.
async fn not_json(on_invalid: &str) -> Vec<conveyor_core::Job> {
    let store = open_store();
    let session = Session::fresh("mqtt-invalid");
    let spec = spec(json!({
        "name": "orders",
        "type": "mqtt",
        "url": MOSQUITTO,
        "topic": session.topic,
        "client_id": session.client_id,
        "on_invalid": on_invalid,
        "job": { "kind": "note", "queue": QUEUE },
    }));
    let running = start_running(spec, &store).await;
    let (publisher, _task) = publisher();
    publisher
        .publish(&session.topic, b"\x01plain text".to_vec())
        .await;
    publisher.publish(&session.topic, body(7)).await;
    publisher.confirmed().await;
    wait_until!(SHORT, "both stored", running.count("enqueued") == 2);
    assert_eq!(running.count("invalid"), 1);
    running.stop().await;
    assert_eq!(session.unacknowledged().await, 0);
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
async fn two_identical_messages_on_a_topic_are_one_job() {
    let store = open_store();
    let session = Session::fresh("mqtt-same");
    let running = start_running(session.source(MOSQUITTO, 20), &store).await;
    let (publisher, _task) = publisher();
    publisher.publish(&session.topic, body(1)).await;
    publisher.publish(&session.topic, body(1)).await;
    publisher.publish(&session.topic, body(2)).await;
    publisher.confirmed().await;
    wait_until!(SHORT, "three received", running.count("received") == 3);
    wait_until!(
        SHORT,
        "two jobs and a duplicate",
        running.count("enqueued") == 2 && running.count("duplicate") == 1
    );
    running.stop().await;
    each_once(&store, QUEUE, "orders", 1..3).await;
    // Both copies were acknowledged.
    assert_eq!(session.unacknowledged().await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cut_connections_are_reconnected_and_every_message_is_one_job() {
    let store = open_store();
    let session = Session::fresh("mqtt-cut");
    let mosquitto: SocketAddr = "127.0.0.1:1883".parse().expect("address");
    let proxy = proxy::Proxy::start(mosquitto).await;
    let url = format!("mqtt://{}", proxy.addr);
    let running = start_running(session.source(&url, 100), &store).await;
    // Fewer than Mosquitto queues for a session (1,000), published at once: none can be
    // dropped at the broker whatever the reconnections do.
    let (publisher, _task) = publisher();
    for n in 0..TOTAL {
        publisher.publish(&session.topic, body(n)).await;
    }
    wait_until!(LONG, "some jobs", depth(&store, QUEUE).await >= 150);
    // Every connection reset, and new ones refused for a while: the source shows the error.
    proxy.refuse(true);
    assert!(proxy.cut() >= 1);
    wait_until!(
        SHORT,
        "the source to show the error",
        running.state() == SourceState::Error && running.last_error().is_some()
    );
    assert!(depth(&store, QUEUE).await < TOTAL, "the cut came too late");
    proxy.refuse(false);
    wait_until!(
        SHORT,
        "the source to reconnect",
        running.state() == SourceState::Running
    );
    publisher.confirmed().await;
    // Cut again while running, without refusing: it comes back by itself.
    wait_until!(LONG, "more jobs", depth(&store, QUEUE).await >= 400);
    proxy.cut();
    wait_until!(
        LONG,
        format!("{TOTAL} jobs: {}", running.status.view()),
        depth(&store, QUEUE).await >= TOTAL
    );
    running.stop().await;
    each_once(&store, QUEUE, "orders", 0..TOTAL).await;
    assert_eq!(session.unacknowledged().await, 0);
}
