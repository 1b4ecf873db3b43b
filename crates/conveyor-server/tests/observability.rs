//! `/metrics`, the worker registry and stuck jobs over HTTP, after a scripted run: jobs go
//! through a real in-process worker (observed by the server's metrics) and through the HTTP
//! worker endpoints, some completing, some retried, some dead; the counters must equal what
//! was run, and the gauges what the store holds.

mod common;

use common::TestServer;
use conveyor_core::{JobObserver, RetryPolicy};
use conveyor_server::{Metrics, RouterOptions, ServerConfig};
use conveyor_storetest::eventually::eventually;
use conveyor_worker::{Outcome, Worker};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The test server and the metrics its router records into.
struct Server {
    server: TestServer,
    metrics: Arc<Metrics>,
}

impl std::ops::Deref for Server {
    type Target = TestServer;
    fn deref(&self) -> &TestServer {
        &self.server
    }
}

async fn start() -> Server {
    let metrics = Arc::new(Metrics::new().expect("metrics"));
    let server = TestServer::start_with_options(
        ServerConfig::default(),
        RouterOptions {
            metrics: Some(metrics.clone()),
            ..RouterOptions::default()
        },
    )
    .await;
    Server { server, metrics }
}

impl Server {
    /// `GET path`, which must answer 200 with JSON: its body.
    async fn get_ok(&self, path: &str) -> Value {
        let (status, body) = self.get_json(path).await;
        assert_eq!(status, 200, "GET {path}");
        body
    }

    async fn metrics_text(&self) -> String {
        let response = self
            .http
            .get(format!("{}/metrics", self.base))
            .send()
            .await
            .expect("send");
        assert_eq!(response.status().as_u16(), 200);
        let content_type = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        assert!(content_type.starts_with("text/plain"), "{content_type}");
        response.text().await.expect("text")
    }

    async fn enqueue(&self, queue: &str, kind: &str, extra: Value) {
        let mut body = json!({"queue": queue, "kind": kind, "payload": {"secret": "x"}});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        let (status, answer) = self.post_json("/v1/jobs", body).await;
        assert_eq!(status, 201, "{answer}");
    }
}

/// A scraped exposition: (metric name, labels) -> value. Every line must parse.
type Scrape = BTreeMap<(String, BTreeMap<String, String>), f64>;

fn parse(text: &str) -> Scrape {
    let mut out = Scrape::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line:?}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => {
                let inner = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
                let labels = inner
                    .split(',')
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (key, quoted) = pair
                            .split_once('=')
                            .unwrap_or_else(|| panic!("bad label in {line:?}"));
                        let value = quoted
                            .strip_prefix('"')
                            .and_then(|v| v.strip_suffix('"'))
                            .unwrap_or_else(|| panic!("unquoted label in {line:?}"));
                        (key.to_string(), value.to_string())
                    })
                    .collect();
                (name.to_string(), labels)
            }
        };
        assert!(
            out.insert((name, labels), value).is_none(),
            "duplicate series {line:?}"
        );
    }
    out
}

fn value(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    scrape.get(&(name.to_string(), labels)).copied()
}

/// A series under its `conveyor_` name; the deprecated unprefixed alias (kept one release)
/// must say the same.
fn count(scrape: &Scrape, name: &str, labels: &[(&str, &str)]) -> f64 {
    let prefixed = format!("conveyor_{name}");
    let found = value(scrape, &prefixed, labels)
        .unwrap_or_else(|| panic!("no series {prefixed}{labels:?}"));
    assert_eq!(
        value(scrape, name, labels),
        Some(found),
        "the deprecated alias {name}{labels:?}"
    );
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_what_ran_through_in_process_and_http_workers() {
    let server = start().await;
    // In-process worker: 6 jobs complete, 4 fail once then complete, 3 fail permanently.
    for _ in 0..6 {
        server.enqueue("inproc", "ok", json!({})).await;
    }
    for _ in 0..4 {
        server
            .enqueue("inproc", "flaky", json!({"max_attempts": 3}))
            .await;
    }
    for _ in 0..3 {
        server.enqueue("inproc", "doomed", json!({})).await;
    }
    let fast = RetryPolicy::fixed_exponential(Duration::from_millis(5), Duration::from_millis(5));
    let observer: Arc<dyn JobObserver> = server.metrics.clone();
    let worker = Worker::builder(server.store.clone())
        .id("inproc-worker")
        .queue("inproc", 4)
        .default_retry(fast)
        .observer(observer)
        .handle_json("ok", |_, _| async { Outcome::ok() })
        .handle_json("flaky", |ctx, _| async move {
            if ctx.attempt == 1 {
                Outcome::retry("first attempt fails")
            } else {
                Outcome::ok()
            }
        })
        .handle_json("doomed", |_, _| async { Outcome::permanent("never works") })
        .build()
        .expect("worker");
    let stop = CancellationToken::new();
    let stopped = stop.clone();
    let running = tokio::spawn(worker.run(async move { stopped.cancelled().await }));
    // Polls the store, which has no "all done" signal.
    eventually("the in-process jobs to finish", || async {
        let stats = server.store.queues_stats().await.expect("stats");
        let inproc = stats
            .iter()
            .find(|q| q.name == "inproc")
            .map(|q| (q.completed, q.dead));
        match inproc {
            Some((10, 3)) => Ok(()),
            other => Err(format!("(completed, dead) = {other:?}, wanted (10, 3)")),
        }
    })
    .await;

    // HTTP worker: one completes, one fails (retry), one fails for good; one more hangs.
    for _ in 0..3 {
        server.enqueue("http", "h", json!({})).await;
    }
    server
        .enqueue("slow", "hangs", json!({"timeout_ms": 100}))
        .await;
    let (status, fetched) = server
        .post_json(
            "/v1/fetch",
            json!({"worker_id": "http-worker", "queues": ["http"], "max": 3}),
        )
        .await;
    assert_eq!(status, 200, "{fetched}");
    let jobs = fetched["jobs"].as_array().expect("jobs").clone();
    assert_eq!(jobs.len(), 3);
    let settle = |job: &Value, path: &str, extra: Value| {
        let mut body = json!({"lease_token": job["lease_token"]});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        (
            format!("/v1/jobs/{}/{path}", job["id"].as_str().expect("id")),
            body,
        )
    };
    let (path, body) = settle(&jobs[0], "complete", json!({}));
    assert_eq!(server.post_json(&path, body).await.0, 200);
    let (path, body) = settle(
        &jobs[1],
        "fail",
        json!({"error": {"message": "try again"}, "retry": "auto"}),
    );
    let (status, failed) = server.post_json(&path, body).await;
    assert_eq!(
        (status.as_u16(), failed["state"].as_str()),
        (200, Some("retryable"))
    );
    let (path, body) = settle(
        &jobs[2],
        "fail",
        json!({"error": {"message": "give up"}, "retry": "never"}),
    );
    let (status, dead) = server.post_json(&path, body).await;
    assert_eq!(
        (status.as_u16(), dead["state"].as_str()),
        (200, Some("dead"))
    );
    let (status, slow) = server
        .post_json(
            "/v1/fetch",
            json!({"worker_id": "http-worker", "queues": ["slow"]}),
        )
        .await;
    assert_eq!(status, 200);
    let slow_id = slow["jobs"][0]["id"]
        .as_str()
        .expect("slow job")
        .to_string();

    // The HTTP worker reports itself: 1 of 2 slots busy (the hanging job).
    let (status, registered) = server
        .post_json(
            "/v1/workers/heartbeat",
            json!({"worker_id": "http-worker", "host": "elsewhere", "pid": 77,
                   "queues": ["http", "slow"], "concurrency": 2, "busy": 1, "version": "x",
                   "started_at": "2026-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(status, 200, "{registered}");
    assert_eq!(registered["state"], "alive");

    // The hanging job has no history and a 100 ms timeout: stuck once past the 1 s floor.
    eventually("the hanging job to be flagged stuck", || async {
        let stuck = server.get_ok("/v1/jobs/stuck").await;
        if stuck["jobs"]
            .as_array()
            .is_some_and(|jobs| !jobs.is_empty())
        {
            Ok(())
        } else {
            Err(stuck)
        }
    })
    .await;
    let stuck = server.get_ok("/v1/jobs/stuck?queue=slow").await;
    assert_eq!(stuck["jobs"][0]["id"], slow_id.as_str());
    assert_eq!(stuck["jobs"][0]["basis"], "timeout");
    assert_eq!(stuck["jobs"][0]["worker_id"], "http-worker");
    assert!(server.get_ok("/v1/jobs/stuck?queue=http").await["jobs"]
        .as_array()
        .is_some_and(Vec::is_empty));

    let text = server.metrics_text().await;
    assert!(
        text.contains("# HELP queue_depth Deprecated: renamed conveyor_queue_depth"),
        "{text}"
    );
    let scrape = parse(&text);
    // Enqueues over HTTP, by queue and kind; waits of what this server handed out; the build.
    assert_eq!(
        value(
            &scrape,
            "conveyor_jobs_enqueued_total",
            &[("queue", "http"), ("kind", "h")]
        ),
        Some(3.0)
    );
    assert!(
        value(
            &scrape,
            "conveyor_job_queue_wait_seconds_count",
            &[("queue", "http"), ("kind", "h")]
        )
        .is_some_and(|n| n >= 1.0),
        "{text}"
    );
    assert_eq!(
        value(
            &scrape,
            "conveyor_build_info",
            &[("version", env!("CARGO_PKG_VERSION"))]
        ),
        Some(1.0)
    );
    assert_eq!(
        value(
            &scrape,
            "jobs_enqueued_total",
            &[("queue", "http"), ("kind", "h")]
        ),
        None,
        "new series have no alias"
    );
    let processed = |queue, kind, status| {
        count(
            &scrape,
            "jobs_processed_total",
            &[("queue", queue), ("kind", kind), ("status", status)],
        )
    };
    assert_eq!(processed("inproc", "ok", "completed"), 6.0);
    assert_eq!(processed("inproc", "flaky", "failed"), 4.0);
    assert_eq!(processed("inproc", "flaky", "completed"), 4.0);
    assert_eq!(processed("inproc", "doomed", "dead"), 3.0);
    assert_eq!(processed("http", "h", "completed"), 1.0);
    assert_eq!(processed("http", "h", "failed"), 1.0);
    assert_eq!(processed("http", "h", "dead"), 1.0);
    assert_eq!(
        value(
            &scrape,
            "jobs_processed_total",
            &[("queue", "inproc"), ("kind", "ok"), ("status", "failed")]
        ),
        None,
        "nothing that did not happen"
    );
    let retried = |queue, kind| {
        count(
            &scrape,
            "jobs_retried_total",
            &[("queue", queue), ("kind", kind)],
        )
    };
    assert_eq!(retried("inproc", "flaky"), 4.0);
    assert_eq!(retried("http", "h"), 1.0);
    let durations = |queue, kind| {
        count(
            &scrape,
            "job_duration_seconds_count",
            &[("queue", queue), ("kind", kind)],
        )
    };
    assert_eq!(durations("inproc", "ok"), 6.0);
    assert_eq!(durations("inproc", "flaky"), 8.0);
    assert_eq!(durations("inproc", "doomed"), 3.0);
    assert_eq!(durations("http", "h"), 3.0);
    assert_eq!(
        count(
            &scrape,
            "job_duration_seconds_bucket",
            &[("queue", "inproc"), ("kind", "ok"), ("le", "+Inf")]
        ),
        6.0
    );

    // Gauges, from the store.
    let depth = |queue, state| {
        count(
            &scrape,
            "queue_depth",
            &[("queue", queue), ("state", state)],
        )
    };
    assert_eq!(depth("inproc", "completed"), 10.0);
    assert_eq!(depth("inproc", "dead"), 3.0);
    assert_eq!(depth("inproc", "available"), 0.0);
    assert_eq!(depth("slow", "running"), 1.0);
    assert_eq!(count(&scrape, "dead_jobs", &[("queue", "inproc")]), 3.0);
    assert_eq!(count(&scrape, "dead_jobs", &[("queue", "http")]), 1.0);
    assert_eq!(count(&scrape, "stuck_jobs", &[("queue", "slow")]), 1.0);
    assert_eq!(count(&scrape, "stuck_jobs", &[("queue", "inproc")]), 0.0);
    assert_eq!(count(&scrape, "workers_alive", &[]), 2.0);
    assert_eq!(
        count(&scrape, "worker_utilization", &[("queue", "http")]),
        0.5
    );
    assert!(value(&scrape, "queue_oldest_age_seconds", &[("queue", "inproc")]).is_some());

    // The registry lists both workers; the in-process one with this process's pid.
    let listed = server.get_ok("/v1/workers").await;
    let workers = listed["workers"].as_array().expect("workers");
    let inproc = workers
        .iter()
        .find(|w| w["id"] == "inproc-worker")
        .expect("in-process worker registered");
    assert_eq!(inproc["pid"], std::process::id());
    assert_eq!(inproc["queues"], json!(["inproc"]));
    assert_eq!(inproc["concurrency"], 4);
    assert!(workers.iter().any(|w| w["id"] == "http-worker"));

    // A graceful stop says goodbye: the worker is `stopped`, not alive and not dead.
    stop.cancel();
    running.await.expect("worker ran");
    let alive = server.get_ok("/v1/workers?state=alive").await;
    let ids: Vec<&str> = alive["workers"]
        .as_array()
        .expect("workers")
        .iter()
        .filter_map(|w| w["id"].as_str())
        .collect();
    assert_eq!(ids, vec!["http-worker"]);
    let stopped = server.get_ok("/v1/workers?state=stopped").await;
    assert_eq!(stopped["workers"][0]["id"], "inproc-worker");
}

#[tokio::test]
async fn worker_heartbeats_are_validated_naming_the_field() {
    let server = start().await;
    let (status, error) = server
        .post_json(
            "/v1/workers/heartbeat",
            json!({"worker_id": "", "queues": ["a"], "concurrency": 1,
                   "started_at": "2026-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(error["error"]["field"], "worker_id");
    let (status, error) = server
        .post_json(
            "/v1/workers/heartbeat",
            json!({"worker_id": "w", "queues": ["no spaces"], "concurrency": 1,
                   "started_at": "2026-01-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(status, 400);
    assert_eq!(error["error"]["field"], "queues[0]");
    let (status, error) = server
        .post_json(
            "/v1/workers/heartbeat",
            json!({"worker_id": "w", "queues": ["a"], "concurrency": 1}),
        )
        .await;
    assert_eq!(status, 400, "started_at is required: {error}");
    let response = server
        .http
        .get(format!("{}/v1/workers?state=zombie", server.base))
        .send()
        .await
        .expect("send");
    assert_eq!(response.status().as_u16(), 400);
}
