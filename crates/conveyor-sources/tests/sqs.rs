//! The `sqs` source against moto's standalone server (a local stand-in speaking SQS's API,
//! started by each test on a port of its own and killed at its end) and a real SQLite store:
//! each message becomes exactly one job and is deleted only once that job is stored. Many
//! messages make as many jobs with nothing left in the queue; a source killed mid-ingest and
//! started again leaves every message one job; a full queue holds the batch (kept invisible)
//! until it accepts again; bodies that are not JSON are kept or dead-lettered; a cut connection
//! is reconnected; ApproximateNumberOfMessages is the lag.
//!
//! moto is found from CONVEYOR_MOTO_SERVER, else `target/py-venv/bin/moto_server` under the
//! workspace, else on PATH; without it the tests fail saying how to install it.

mod kit;

#[path = "../../conveyor/tests/support/proxy.rs"]
mod proxy;

use aws_sdk_sqs::config::{Credentials, Region};
use aws_sdk_sqs::types::{MessageAttributeValue, QueueAttributeName, SendMessageBatchRequestEntry};
use aws_sdk_sqs::Client;
use conveyor_core::JobState;
use conveyor_sources::SourceState;
use kit::*;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const REGION: &str = "us-east-1";
const KEY_ENV: &str = "CONVEYOR_TEST_SQS_KEY";
const SECRET_ENV: &str = "CONVEYOR_TEST_SQS_SECRET";

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

/// A moto server of the test's own, killed (by its pid) when dropped.
struct Moto {
    child: Child,
    url: String,
    _log: tempfile::TempDir,
}

impl Moto {
    async fn start() -> Moto {
        // The credentials the sources read, by the variables their configuration names (moto
        // takes any).
        std::env::set_var(KEY_ENV, "test");
        std::env::set_var(SECRET_ENV, "test");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .expect("a free port")
            .port();
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
        let client = moto.client(&moto.url);
        let deadline = Instant::now() + Duration::from_secs(60);
        while client.list_queues().send().await.is_err() {
            assert!(
                Instant::now() < deadline,
                "moto_server did not answer on port {port}: {}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        moto
    }

    /// A client of the test's own (the source makes its own from its configuration).
    fn client(&self, endpoint: &str) -> Client {
        let config = aws_sdk_sqs::Config::builder()
            .behavior_version(aws_sdk_sqs::config::BehaviorVersion::latest())
            .region(Region::new(REGION))
            .endpoint_url(endpoint)
            .credentials_provider(Credentials::new("test", "test", None, None, "test"))
            .build();
        Client::from_conf(config)
    }

    async fn queue(&self, prefix: &str) -> TestQueue {
        let client = self.client(&self.url);
        let name = unique(prefix);
        let url = client
            .create_queue()
            .queue_name(&name)
            .send()
            .await
            .expect("create the queue")
            .queue_url
            .expect("a queue url");
        TestQueue { client, url }
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A queue of the test's own (it goes with its moto server).
struct TestQueue {
    client: Client,
    url: String,
}

impl TestQueue {
    /// Sends each body (with `attributes` as String attributes), ten to a call, several calls
    /// at once.
    async fn send(&self, bodies: Vec<Vec<u8>>, attributes: &[(&str, &str)]) {
        let mut entries = Vec::new();
        for (index, body) in bodies.into_iter().enumerate() {
            let mut entry = SendMessageBatchRequestEntry::builder()
                .id(index.to_string())
                .message_body(String::from_utf8(body).expect("text"));
            for (name, value) in attributes {
                entry = entry.message_attributes(
                    *name,
                    MessageAttributeValue::builder()
                        .data_type("String")
                        .string_value(*value)
                        .build()
                        .expect("an attribute"),
                );
            }
            entries.push(entry.build().expect("an entry"));
        }
        let chunks: Vec<Vec<SendMessageBatchRequestEntry>> =
            entries.chunks(10).map(|chunk| chunk.to_vec()).collect();
        let mut lanes: Vec<Vec<Vec<SendMessageBatchRequestEntry>>> = vec![Vec::new(); 8];
        for (index, chunk) in chunks.into_iter().enumerate() {
            lanes[index % 8].push(chunk);
        }
        let mut tasks = Vec::new();
        for lane in lanes {
            let client = self.client.clone();
            let url = self.url.clone();
            tasks.push(tokio::spawn(async move {
                for chunk in lane {
                    let output = client
                        .send_message_batch()
                        .queue_url(&url)
                        .set_entries(Some(chunk))
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
    }

    async fn attribute(&self, name: QueueAttributeName) -> u64 {
        let output = self
            .client
            .get_queue_attributes()
            .queue_url(&self.url)
            .attribute_names(name.clone())
            .send()
            .await
            .expect("GetQueueAttributes");
        output
            .attributes()
            .and_then(|attributes| attributes.get(&name))
            .and_then(|count| count.parse().ok())
            .unwrap_or(0)
    }

    /// Messages not deleted: waiting, or received and not yet deleted.
    async fn undeleted(&self) -> u64 {
        self.attribute(QueueAttributeName::ApproximateNumberOfMessages)
            .await
            + self
                .attribute(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
                .await
    }

    async fn in_flight(&self) -> u64 {
        self.attribute(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
            .await
    }

    fn source(&self, name: &str, endpoint: &str, extra: Value) -> Value {
        let mut source = json!({
            "name": name,
            "type": "sqs",
            "url": endpoint,
            "queue_url": self.url,
            "region": REGION,
            "access_key_id_env": KEY_ENV,
            "secret_access_key_env": SECRET_ENV,
            "job": { "kind": "order.placed", "queue": "orders" },
        });
        for (key, value) in extra.as_object().cloned().unwrap_or_default() {
            source[key] = value;
        }
        source
    }
}

fn bodies(range: std::ops::Range<u64>) -> Vec<Vec<u8>> {
    range.map(body).collect()
}

/// How many messages the first test sends: 1,000, not 10,000, as moto's server answers about
/// ten calls a second here (100 messages a second sent in batches of ten, about 30 read).
const MANY: u64 = 1_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_messages_become_as_many_jobs_each_deleted() {
    let moto = Moto::start().await;
    let store = open_store();
    let queue = moto.queue("drain").await;
    let sent = Instant::now();
    queue.send(bodies(0..MANY), &[]).await;
    eprintln!("sent {MANY} messages in {:?}", sent.elapsed());
    let read = Instant::now();
    let source = start(
        spec(queue.source("orders", &moto.url, json!({ "max_in_flight": 500 }))),
        &store,
    );
    wait_until!(
        Duration::from_secs(120),
        "every job",
        source.count("enqueued") == MANY,
        SLOW_POLL
    );
    eprintln!("ingested {MANY} messages in {:?}", read.elapsed());
    assert_eq!(source.count("received"), MANY);
    assert_eq!(source.count("duplicate"), 0);
    assert_eq!(source.state(), SourceState::Running);
    each_once(&store, "orders", "orders", 0..MANY).await;
    wait_until!(
        Duration::from_secs(20),
        "every message deleted",
        queue.undeleted().await == 0,
        SLOW_POLL
    );
    // The identity is the MessageId.
    let job = &kit::jobs(&store, "orders", None).await[0];
    let key = job.idempotency_key.as_deref().unwrap_or_default();
    assert!(
        key.strip_prefix("source:orders:").is_some_and(uuid_like),
        "{key}"
    );
    source.stop().await;
}

/// A MessageId: SQS's (and moto's) are UUIDs.
fn uuid_like(id: &str) -> bool {
    id.len() == 36 && id.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_killed_mid_ingest_leaves_every_message_one_job_after_its_restart() {
    let moto = Moto::start().await;
    let store = open_store();
    let queue = moto.queue("kill").await;
    queue.send(bodies(0..500), &[]).await;
    // What the killed source held becomes visible again after three seconds.
    let config = spec(queue.source(
        "orders",
        &moto.url,
        json!({ "max_in_flight": 50, "visibility_timeout_secs": 3 }),
    ));
    let source = start(config.clone(), &store);
    wait_until!(
        Duration::from_secs(60),
        "some jobs stored",
        source.count("enqueued") >= 100,
        SLOW_POLL
    );
    source.abort().await;
    assert!(
        queue.undeleted().await > 0,
        "the kill came after the whole queue was ingested: it tested no recovery"
    );
    let source = start(config, &store);
    wait_until!(
        Duration::from_secs(120),
        "500 jobs",
        depth(&store, "orders").await >= 500,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(30),
        "every message deleted",
        queue.undeleted().await == 0,
        SLOW_POLL
    );
    each_once(&store, "orders", "orders", 0..500).await;
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_holds_the_batch_invisible_until_it_accepts_again() {
    let moto = Moto::start().await;
    let store = open_store();
    let queue = moto.queue("full").await;
    set_max_depth(&store, "orders", Some(50)).await;
    // Three batches of 20: two fit under the depth of 50, the third is refused and held.
    queue.send(bodies(0..60), &[]).await;
    // A visibility timeout shorter than the hold below: without the source's extensions,
    // the held batch would become visible again.
    let source = start(
        spec(queue.source(
            "orders",
            &moto.url,
            json!({ "max_in_flight": 20, "visibility_timeout_secs": 8 }),
        )),
        &store,
    );
    wait_until!(
        Duration::from_secs(60),
        "the source to back off",
        source.state() == SourceState::BackingOff,
        SLOW_POLL
    );
    assert!(depth(&store, "orders").await <= 50);
    // The refused batch is held, not deleted.
    assert!(queue.in_flight().await > 0);
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert_eq!(source.state(), SourceState::BackingOff);
    // Past its first visibility timeout, the held batch is still hidden.
    assert_eq!(
        queue
            .attribute(QueueAttributeName::ApproximateNumberOfMessages)
            .await,
        0,
        "the held batch became visible again"
    );
    assert!(queue.in_flight().await > 0);
    set_max_depth(&store, "orders", None).await;
    wait_until!(
        Duration::from_secs(60),
        "all 60 jobs",
        depth(&store, "orders").await == 60,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(20),
        "every message deleted",
        queue.undeleted().await == 0,
        SLOW_POLL
    );
    assert_eq!(source.state(), SourceState::Running);
    assert!(source.count("refused") >= 1);
    assert_eq!(source.count("duplicate"), 0, "the held batch came again");
    each_once(&store, "orders", "orders", 0..60).await;
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_are_not_json_are_kept_or_dead_lettered() {
    let moto = Moto::start().await;
    let store = open_store();
    // One queue per source (a queue's messages go to one reader or the other).
    let kept_queue = moto.queue("kept").await;
    let dead_queue = moto.queue("dead").await;
    let mut kept = kept_queue.source("kept", &moto.url, json!({ "on_invalid": "raw" }));
    kept["job"] = json!({ "kind": { "from": "header:kind" }, "queue": "kept" });
    let mut dead = dead_queue.source("dead", &moto.url, json!({ "on_invalid": "dead_letter" }));
    dead["job"] = json!({ "kind": { "from": "header:kind" }, "queue": "dead" });
    let kept = start(spec(kept), &store);
    let dead = start(spec(dead), &store);
    for queue in [&kept_queue, &dead_queue] {
        queue
            .send(vec![b"plain text".to_vec(), body(4)], &[("kind", "note")])
            .await;
    }
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
    assert_eq!(raw.payload["raw_base64"], "cGxhaW4gdGV4dA==");
    // The message attributes are the headers.
    assert_eq!(raw.payload["headers"], json!({ "kind": "note" }));
    let dead_jobs = kit::jobs(&store, "dead", Some(JobState::Dead)).await;
    assert_eq!(dead_jobs.len(), 1, "{dead_jobs:?}");
    assert_eq!(dead_jobs[0].payload["raw_base64"], "cGxhaW4gdGV4dA==");
    assert!(dead_jobs[0].errors[0].message.starts_with("source dead: "));
    assert_eq!(
        kit::jobs(&store, "dead", Some(JobState::Available))
            .await
            .len(),
        1
    );
    wait_until!(
        Duration::from_secs(10),
        "all deleted",
        kept_queue.undeleted().await == 0 && dead_queue.undeleted().await == 0,
        SLOW_POLL
    );
    kept.stop().await;
    dead.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_connection_is_reconnected_and_every_message_is_one_job() {
    let moto = Moto::start().await;
    let store = open_store();
    let queue = moto.queue("cut").await;
    let upstream = moto
        .url
        .trim_start_matches("http://")
        .parse()
        .expect("address");
    let proxy = proxy::Proxy::start(upstream).await;
    let endpoint = format!("http://{}", proxy.addr);
    queue.send(bodies(0..300), &[]).await;
    // What the cut connection held becomes visible again after three seconds.
    let source = start(
        spec(queue.source(
            "orders",
            &endpoint,
            json!({ "max_in_flight": 50, "visibility_timeout_secs": 3 }),
        )),
        &store,
    );
    wait_until!(
        Duration::from_secs(60),
        "some jobs",
        source.count("enqueued") >= 50,
        SLOW_POLL
    );
    // Every connection reset, and new ones refused for a while. (Between two calls the SDK
    // may hold no connection to reset: the refusal alone then puts the source in error.)
    proxy.refuse(true);
    proxy.cut();
    wait_until!(
        Duration::from_secs(60),
        "the source in error",
        source.state() == SourceState::Error,
        SLOW_POLL
    );
    let view = source.status.view();
    assert!(
        view["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("sqs")),
        "{view}"
    );
    queue.send(bodies(300..400), &[]).await;
    proxy.refuse(false);
    wait_until!(
        Duration::from_secs(90),
        "400 jobs",
        depth(&store, "orders").await >= 400,
        SLOW_POLL
    );
    wait_until!(
        Duration::from_secs(30),
        "every message deleted",
        queue.undeleted().await == 0,
        SLOW_POLL
    );
    assert_eq!(source.state(), SourceState::Running);
    each_once(&store, "orders", "orders", 0..400).await;
    source.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lag_is_the_queues_approximate_number_of_messages() {
    let moto = Moto::start().await;
    let store = open_store();
    let queue = moto.queue("lag").await;
    queue.send(bodies(0..30), &[]).await;
    // The queue refuses at once, so the messages wait in SQS.
    set_max_depth(&store, "orders", Some(1)).await;
    let source = start(
        spec(queue.source("orders", &moto.url, json!({ "max_in_flight": 10 }))),
        &store,
    );
    wait_until!(
        Duration::from_secs(30),
        "a lag",
        source.status.lag().is_some(),
        SLOW_POLL
    );
    // Read before the first receive: all 30 wait.
    assert_eq!(source.status.lag(), Some(30));
    set_max_depth(&store, "orders", None).await;
    wait_until!(
        Duration::from_secs(30),
        "the lag back to 0",
        source.status.lag() == Some(0),
        SLOW_POLL
    );
    assert_eq!(depth(&store, "orders").await, 30);
    source.stop().await;

    // A queue that is not there is named at connect.
    let mut missing = queue.source("orders", &moto.url, json!({}));
    missing["queue_url"] = json!(format!("{}/123456789012/no-such-queue", moto.url));
    let error = conveyor_sources::connect(spec(missing))
        .await
        .err()
        .expect("no queue, no source");
    assert!(error.to_string().contains("sqs"), "{error}");
}
