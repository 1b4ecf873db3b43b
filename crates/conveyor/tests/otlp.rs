//! OpenTelemetry export against a real OTLP/HTTP receiver (protobuf, decoded with the
//! OpenTelemetry protocol crate): the enqueue span of a job sent over HTTP with a traceparent
//! is the producer span's child, and the stored context makes fetch spans its children; a job
//! sent without one starts a trace of its own; the Rust worker's execute span carries the id
//! its handler was given. One test: the span sink is process-wide.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use conveyor::otlp::{OtlpConfig, OtlpExporter};
use conveyor::trace::TraceContext;
use conveyor::{Client, JobOptions, Outcome, SqliteOptions, SqliteStore, Store, TypedJob, Worker};
use conveyor_storetest::eventually::eventually;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::{json, Value};

#[derive(Debug, Clone, PartialEq)]
struct Received {
    name: String,
    kind: i32,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    attributes: Vec<(String, String)>,
    service: String,
}

impl Received {
    fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An OTLP/HTTP receiver on a loopback port: what it decoded, and its base URL.
async fn collector() -> (Arc<Mutex<Vec<Received>>>, String) {
    let received: Arc<Mutex<Vec<Received>>> = Arc::default();
    let sink = received.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut spans = sink.lock().expect("lock");
                for resource in request.resource_spans {
                    let service = resource
                        .resource
                        .iter()
                        .flat_map(|r| r.attributes.iter())
                        .find(|kv| kv.key == "service.name")
                        .and_then(|kv| kv.value.as_ref())
                        .map(|v| format!("{:?}", v.value))
                        .unwrap_or_default();
                    for scope in resource.scope_spans {
                        for span in scope.spans {
                            spans.push(Received {
                                name: span.name,
                                kind: span.kind,
                                trace_id: hex(&span.trace_id),
                                span_id: hex(&span.span_id),
                                parent_span_id: hex(&span.parent_span_id),
                                attributes: span
                                    .attributes
                                    .iter()
                                    .map(|kv| {
                                        let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                            Some(opentelemetry_proto::tonic::common::v1::any_value::Value::StringValue(s)) => s.clone(),
                                            other => format!("{other:?}"),
                                        };
                                        (kv.key.clone(), value)
                                    })
                                    .collect(),
                                service: service.clone(),
                            });
                        }
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await.expect("collector") });
    (received, format!("http://{addr}"))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Charge {
    cents: u64,
}

impl TypedJob for Charge {
    const KIND: &'static str = "charge";
}

const PRODUCER: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const PRODUCER_2: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn enqueue_fetch_and_execute_spans_reach_the_collector_in_the_producers_trace() {
    let (received, endpoint) = collector().await;
    let mut config = OtlpConfig::new(endpoint);
    config.service_name = "billing-test".to_string();
    let exporter = OtlpExporter::install(&config).expect("install");
    assert!(
        matches!(
            OtlpExporter::install(&config),
            Err(conveyor::otlp::OtlpError::AlreadyInstalled)
        ),
        "one sink per process"
    );

    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn Store> = Arc::new(
        SqliteStore::open(dir.path().join("jobs.db"), SqliteOptions::default()).expect("store"),
    );
    let app = conveyor_server::router(store.clone(), conveyor_server::ServerConfig::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await.expect("serve") });
    let http = reqwest::Client::new();

    // Over HTTP, with the producer's traceparent header.
    let enqueued: Value = http
        .post(format!("{base}/v1/jobs"))
        .header("traceparent", PRODUCER)
        .json(&json!({"kind": "email", "queue": "http"}))
        .send()
        .await
        .expect("enqueue")
        .json()
        .await
        .expect("JSON");
    let http_job = enqueued["id"].as_str().expect("id").to_string();
    let stored = TraceContext::parse(
        enqueued["trace"]["traceparent"]
            .as_str()
            .expect("stored traceparent"),
        None,
        "",
    )
    .expect("a traceparent");
    assert_eq!(stored.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
    let enqueue_span = stored.parent_id().to_string();
    assert_ne!(
        enqueue_span, "00f067aa0ba902b7",
        "the stored context names the enqueue span"
    );
    // Without one: a trace of its own.
    let untraced: Value = http
        .post(format!("{base}/v1/jobs"))
        .json(&json!({"kind": "email", "queue": "other"}))
        .send()
        .await
        .expect("enqueue")
        .json()
        .await
        .expect("JSON");
    assert!(untraced["trace"]["traceparent"].is_string(), "{untraced}");
    let fetched: Value = http
        .post(format!("{base}/v1/fetch"))
        .json(&json!({"worker_id": "otlp-test", "queues": ["http"]}))
        .send()
        .await
        .expect("fetch")
        .json()
        .await
        .expect("JSON");
    assert_eq!(fetched["jobs"][0]["id"], http_job.as_str());

    // Embedded: the Rust client and worker.
    let client = Client::new(store.clone());
    let producer_2 = TraceContext::parse(PRODUCER_2, None, "").expect("valid");
    let rust_job = client
        .enqueue_with(
            Charge { cents: 5 },
            JobOptions::default().trace(producer_2.clone()),
        )
        .await
        .expect("enqueue")
        .job;
    let rust_enqueue_span = rust_job
        .trace
        .as_ref()
        .expect("trace")
        .parent_id()
        .to_string();
    let (handler_span, mut seen) = tokio::sync::mpsc::unbounded_channel();
    let worker = Worker::builder(store.clone())
        .queue("default", 1)
        .handle(move |ctx: conveyor::JobContext, _: Charge| {
            let handler_span = handler_span.clone();
            async move {
                let _ = handler_span.send(ctx.trace.map(|t| t.parent_id().to_string()));
                Outcome::ok()
            }
        })
        .build()
        .expect("worker");
    let stop = tokio_util::sync::CancellationToken::new();
    let stopped = stop.clone();
    let running = tokio::spawn(async move { worker.run(stopped.cancelled_owned()).await });
    let handler_span = seen.recv().await.expect("ran").expect("a trace context");
    eventually("the Rust job to complete", || async {
        let job = store.job_get(rust_job.id).await.expect("get").expect("job");
        (job.state == conveyor::JobState::Completed)
            .then_some(())
            .ok_or(job.state)
    })
    .await;
    stop.cancel();
    running.await.expect("worker");
    exporter.flush().await;

    let spans = received.lock().expect("lock").clone();
    let find = |name: &str, job: &str| {
        spans
            .iter()
            .find(|s| s.name == name && s.attribute("messaging.message.id") == Some(job))
            .cloned()
            .unwrap_or_else(|| panic!("no {name} span of job {job} in {spans:#?}"))
    };
    let enqueue = find("conveyor.enqueue", &http_job);
    assert_eq!(
        (
            enqueue.trace_id.as_str(),
            enqueue.span_id.as_str(),
            enqueue.parent_span_id.as_str()
        ),
        (
            "4bf92f3577b34da6a3ce929d0e0e4736",
            enqueue_span.as_str(),
            "00f067aa0ba902b7"
        )
    );
    assert_eq!(enqueue.kind, 4, "PRODUCER");
    assert_eq!(
        enqueue.attribute("messaging.destination.name"),
        Some("http")
    );
    assert!(
        enqueue.service.contains("billing-test"),
        "{}",
        enqueue.service
    );
    let fetch = find("conveyor.fetch", &http_job);
    assert_eq!(fetch.parent_span_id, enqueue_span);
    assert_eq!(fetch.attribute("conveyor.worker.id"), Some("otlp-test"));
    assert_eq!(fetch.kind, 5, "CONSUMER");
    let untraced_id = untraced["id"].as_str().expect("id");
    let root = find("conveyor.enqueue", untraced_id);
    assert_eq!(root.parent_span_id, "", "a new trace starts at the enqueue");

    let rust_id = rust_job.id.to_string();
    let rust_enqueue = find("conveyor.enqueue", &rust_id);
    assert_eq!(
        (
            rust_enqueue.trace_id.as_str(),
            rust_enqueue.parent_span_id.as_str()
        ),
        ("0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331")
    );
    assert_eq!(rust_enqueue.span_id, rust_enqueue_span);
    let execute = find("conveyor.execute", &rust_id);
    assert_eq!(
        execute.span_id, handler_span,
        "the span the handler was told about"
    );
    assert_eq!(execute.parent_span_id, rust_enqueue_span);
    assert_eq!(execute.trace_id, "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(execute.attribute("conveyor.outcome"), Some("completed"));
}
