//! OpenTelemetry export (OTLP over HTTP, protobuf) of the spans Conveyor finishes: a job's
//! `conveyor.enqueue` (producer), `conveyor.fetch` and `conveyor.execute` (consumer) spans, in
//! the producer's trace when it sent a `traceparent`, else in a trace of the job's own. Off
//! unless an endpoint is given (`conveyor serve --otlp-endpoint`, or [`OtlpExporter::install`]
//! for an embedded worker).
//!
//! Conveyor makes the span ids itself (the handler gets its span's id in
//! `JobContext::trace` before the span ends, and the stored context names the enqueue span),
//! so spans are built as finished `SpanData` and handed to the OTLP exporter by a small batching
//! task, rather than through the SDK's tracer (which picks ids of its own).

use std::borrow::Cow;
use std::time::Duration;

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState,
};
use opentelemetry::{InstrumentationScope, KeyValue};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{SpanData, SpanEvents, SpanExporter, SpanLinks};
use opentelemetry_sdk::Resource;
use tokio::sync::{mpsc, oneshot};

use conveyor_core::trace::{FinishedSpan, SpanSink};

/// Why the exporter could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("--otlp-endpoint {0:?}: expected an http:// URL such as http://127.0.0.1:4318")]
    Endpoint(String),
    #[error("cannot build the OTLP exporter: {0}")]
    Build(String),
    #[error("an OTLP exporter is already installed in this process")]
    AlreadyInstalled,
}

/// Where and as whom spans are sent.
#[derive(Debug, Clone)]
pub struct OtlpConfig {
    /// The collector's base URL (`http://127.0.0.1:4318`); `/v1/traces` is added unless the
    /// URL already names a path.
    pub endpoint: String,
    /// `service.name` of the spans.
    pub service_name: String,
    /// Longest wait for one export request.
    pub timeout: Duration,
}

impl OtlpConfig {
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            service_name: "conveyor".to_string(),
            timeout: Duration::from_secs(10),
        }
    }

    fn traces_url(&self) -> Result<String, OtlpError> {
        let endpoint = self.endpoint.trim();
        let Some(rest) = endpoint.strip_prefix("http://") else {
            return Err(OtlpError::Endpoint(self.endpoint.clone()));
        };
        if rest.is_empty() || rest.starts_with('/') {
            return Err(OtlpError::Endpoint(self.endpoint.clone()));
        }
        Ok(match rest.split_once('/') {
            Some((_, path)) if !path.is_empty() => endpoint.to_string(),
            _ => format!("{}/v1/traces", endpoint.trim_end_matches('/')),
        })
    }
}

/// Spans queued for export at most; past it new spans are dropped (and counted in the log).
const QUEUE: usize = 8_192;
/// Spans per export request at most.
const BATCH: usize = 512;
/// How long a span waits for companions before its batch goes.
const LINGER: Duration = Duration::from_millis(500);

enum Message {
    Span(Box<SpanData>),
    Flush(oneshot::Sender<()>),
}

/// The installed exporter: flush it before the process ends.
#[derive(Debug, Clone)]
pub struct OtlpExporter {
    outbox: mpsc::Sender<Message>,
}

struct Sink {
    outbox: mpsc::Sender<Message>,
    scope: InstrumentationScope,
    dropped: std::sync::atomic::AtomicU64,
}

impl SpanSink for Sink {
    fn finished(&self, span: FinishedSpan) {
        let Some(data) = span_data(span, &self.scope) else {
            return;
        };
        if self.outbox.try_send(Message::Span(Box::new(data))).is_err() {
            let dropped = self
                .dropped
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if dropped.is_power_of_two() {
                tracing::warn!(
                    dropped = dropped + 1,
                    "OTLP export is behind; spans dropped"
                );
            }
        }
    }
}

fn span_data(span: FinishedSpan, scope: &InstrumentationScope) -> Option<SpanData> {
    let trace_id = TraceId::from_hex(&span.trace_id).ok()?;
    let span_id = SpanId::from_hex(&span.span_id).ok()?;
    let parent = span
        .parent_span_id
        .as_deref()
        .and_then(|id| SpanId::from_hex(id).ok());
    let attributes = span
        .attributes
        .into_iter()
        .map(|(key, value)| KeyValue::new(key, value))
        .collect();
    Some(SpanData {
        span_context: SpanContext::new(
            trace_id,
            span_id,
            TraceFlags::SAMPLED,
            false,
            TraceState::default(),
        ),
        parent_span_id: parent.unwrap_or(SpanId::INVALID),
        // Every parent is another process's span: the producer's, or the enqueue.
        parent_span_is_remote: parent.is_some(),
        span_kind: match span.kind {
            conveyor_core::trace::SpanKind::Producer => SpanKind::Producer,
            conveyor_core::trace::SpanKind::Consumer => SpanKind::Consumer,
        },
        name: Cow::Borrowed(span.name),
        start_time: span.start.into(),
        end_time: span.end.into(),
        attributes,
        dropped_attributes_count: 0,
        events: SpanEvents::default(),
        links: SpanLinks::default(),
        status: match span.error {
            Some(message) => Status::error(message),
            None => Status::Unset,
        },
        instrumentation_scope: scope.clone(),
    })
}

impl OtlpExporter {
    /// Builds the exporter, installs it as the process's span sink and starts its batching
    /// task (on the current tokio runtime).
    pub fn install(config: &OtlpConfig) -> Result<Self, OtlpError> {
        let url = config.traces_url()?;
        let client =
            opentelemetry_http::hyper::HyperClient::with_default_connector(config.timeout, None);
        let mut exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client)
            .with_endpoint(url.clone())
            .with_timeout(config.timeout)
            .build()
            .map_err(|e| OtlpError::Build(e.to_string()))?;
        exporter.set_resource(
            &Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        );
        let (outbox, inbox) = mpsc::channel(QUEUE);
        let sink = Sink {
            outbox: outbox.clone(),
            scope: InstrumentationScope::builder("conveyor")
                .with_version(env!("CARGO_PKG_VERSION"))
                .build(),
            dropped: Default::default(),
        };
        if !conveyor_core::trace::install_sink(Box::new(sink)) {
            return Err(OtlpError::AlreadyInstalled);
        }
        tokio::spawn(export_loop(exporter, inbox));
        tracing::info!(endpoint = %url, "exporting spans over OTLP");
        Ok(Self { outbox })
    }

    /// Sends every span finished so far and waits for the export to answer (or fail).
    pub async fn flush(&self) {
        let (done, wait) = oneshot::channel();
        if self.outbox.send(Message::Flush(done)).await.is_ok() {
            let _ = wait.await;
        }
    }
}

async fn export_loop(
    exporter: opentelemetry_otlp::SpanExporter,
    mut inbox: mpsc::Receiver<Message>,
) {
    let mut batch: Vec<SpanData> = Vec::with_capacity(BATCH);
    loop {
        let message = if batch.is_empty() {
            inbox.recv().await
        } else {
            match tokio::time::timeout(LINGER, inbox.recv()).await {
                Ok(message) => message,
                Err(_) => {
                    send(&exporter, &mut batch).await;
                    continue;
                }
            }
        };
        match message {
            None => {
                send(&exporter, &mut batch).await;
                return;
            }
            Some(Message::Span(span)) => {
                batch.push(*span);
                if batch.len() >= BATCH {
                    send(&exporter, &mut batch).await;
                }
            }
            Some(Message::Flush(done)) => {
                send(&exporter, &mut batch).await;
                let _ = done.send(());
            }
        }
    }
}

async fn send(exporter: &opentelemetry_otlp::SpanExporter, batch: &mut Vec<SpanData>) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::take(batch);
    let count = spans.len();
    if let Err(error) = exporter.export(spans).await {
        tracing::warn!(%error, spans = count, "OTLP export failed; spans dropped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_traces_path_is_added_to_a_base_url_only() {
        let url = |e: &str| OtlpConfig::new(e).traces_url();
        assert_eq!(
            url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            url("http://127.0.0.1:4318/").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            url("http://c:4318/custom/traces").unwrap(),
            "http://c:4318/custom/traces"
        );
        for bad in [
            "",
            "127.0.0.1:4318",
            "https://c:4318",
            "http://",
            "http:///x",
        ] {
            assert!(matches!(url(bad), Err(OtlpError::Endpoint(_))), "{bad}");
        }
    }
}
