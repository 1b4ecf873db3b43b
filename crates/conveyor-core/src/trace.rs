//! The spans Conveyor emits for a job (enqueue, fetch, and through the worker the handler's
//! run), children of the W3C trace context the job carries ([`crate::trace_context`], re-exported
//! here), handed to the sink a process installs (the OTLP exporter).

use chrono::{DateTime, Utc};

use crate::job::Job;
pub use crate::trace_context::*;

/// What a span is to its trace, as OpenTelemetry has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpanKind {
    /// Enqueue: a message is produced.
    Producer,
    /// Fetch and execute: a message is consumed.
    Consumer,
}

/// A span Conveyor finished, handed to the installed [`SpanSink`] (the `conveyor` crate's
/// OTLP exporter). Ids are lowercase hex as in a `traceparent`.
#[derive(Debug, Clone, PartialEq)]
pub struct FinishedSpan {
    /// `conveyor.enqueue`, `conveyor.fetch` or `conveyor.execute`.
    pub name: &'static str,
    pub kind: SpanKind,
    pub trace_id: String,
    pub span_id: String,
    pub parent_span_id: Option<String>,
    pub start: DateTime<Utc>,
    pub end: DateTime<Utc>,
    pub attributes: Vec<(&'static str, String)>,
    /// Set when the span ended in an error.
    pub error: Option<String>,
}

/// Receives finished spans. Must be cheap and never block: it is called on the job path.
pub trait SpanSink: Send + Sync + 'static {
    fn finished(&self, span: FinishedSpan);
}

static SINK: std::sync::OnceLock<Box<dyn SpanSink>> = std::sync::OnceLock::new();

/// Installs the process's span sink (once; false if one was installed already). Without one,
/// Conveyor exports no spans and leaves trace contexts as producers sent them.
pub fn install_sink(sink: Box<dyn SpanSink>) -> bool {
    SINK.set(sink).is_ok()
}

/// Whether spans are exported.
pub fn exporting() -> bool {
    SINK.get().is_some()
}

/// Hands a finished span to the sink, if one is installed.
pub fn emit(span: FinishedSpan) {
    if let Some(sink) = SINK.get() {
        sink.finished(span);
    }
}

/// A new trace id: 32 random hex digits, never all zeros.
pub fn new_trace_id() -> String {
    loop {
        let id = format!("{:032x}", rand::random::<u128>());
        if id.bytes().any(|b| b != b'0') {
            return id;
        }
    }
}

/// An enqueue span begun and not yet ended: its parent span id (none: a new trace) and start.
type BegunEnqueue = (Option<String>, DateTime<Utc>);

/// Enqueue spans begun and not yet ended, by span id.
static PENDING_ENQUEUES: std::sync::Mutex<Option<std::collections::HashMap<String, BegunEnqueue>>> =
    std::sync::Mutex::new(None);
/// Most enqueue spans kept open at once (inserts that failed never end theirs).
const MAX_PENDING_ENQUEUES: usize = 100_000;

/// Starts a job's enqueue span when spans are exported: the job's stored context becomes a
/// child of it (so fetch and execute spans are its children), in the producer's trace or, for
/// a job enqueued without one, in a new trace. Without a sink, the producer's context as is.
pub fn begin_enqueue(producer: Option<TraceContext>, now: DateTime<Utc>) -> Option<TraceContext> {
    if !exporting() {
        return producer;
    }
    let span_id = TraceContext::new_span_id();
    let (stored, parent) = match producer {
        Some(producer) => {
            let parent = producer.parent_id().to_string();
            (producer.child(&span_id), Some(parent))
        }
        None => (
            TraceContext {
                traceparent: format!("00-{}-{span_id}-01", new_trace_id()),
                tracestate: None,
            },
            None,
        ),
    };
    if let Ok(mut pending) = PENDING_ENQUEUES.lock() {
        let pending = pending.get_or_insert_with(Default::default);
        if pending.len() >= MAX_PENDING_ENQUEUES {
            pending.clear();
        }
        pending.insert(span_id, (parent, now));
    }
    Some(stored)
}

/// Ends the enqueue span of a job just stored (see [`begin_enqueue`]); `duplicate` when the
/// store answered an existing job for an idempotency or unique key.
pub fn end_enqueue(job: &Job, duplicate: bool, now: DateTime<Utc>) {
    if !exporting() {
        return;
    }
    let Some(trace) = &job.trace else { return };
    let begun = PENDING_ENQUEUES
        .lock()
        .ok()
        .and_then(|mut pending| pending.as_mut()?.remove(trace.parent_id()));
    let Some((parent, start)) = begun else {
        // A duplicate's stored context is the first enqueue's: its span was ended then.
        return;
    };
    let mut attributes = job_attributes(job);
    attributes.push(("conveyor.duplicate", duplicate.to_string()));
    emit(FinishedSpan {
        name: "conveyor.enqueue",
        kind: SpanKind::Producer,
        trace_id: trace.trace_id().to_string(),
        span_id: trace.parent_id().to_string(),
        parent_span_id: parent,
        start,
        end: now.max(start),
        attributes,
        error: None,
    });
}

/// The attributes every Conveyor span of a job carries.
pub fn job_attributes(job: &Job) -> Vec<(&'static str, String)> {
    vec![
        ("messaging.system", "conveyor".to_string()),
        ("messaging.destination.name", job.queue.clone()),
        ("messaging.message.id", job.id.to_string()),
        ("conveyor.job.kind", job.kind.clone()),
        ("conveyor.job.attempt", job.attempt.to_string()),
    ]
}

/// Emits a fetch span for each traced job a fetch handed out (`worker_id` took them).
pub fn fetched(jobs: &[Job], worker_id: &str, start: DateTime<Utc>, end: DateTime<Utc>) {
    if !exporting() {
        return;
    }
    for job in jobs {
        let Some(trace) = &job.trace else { continue };
        let mut attributes = job_attributes(job);
        attributes.push(("conveyor.worker.id", worker_id.to_string()));
        emit(FinishedSpan {
            name: "conveyor.fetch",
            kind: SpanKind::Consumer,
            trace_id: trace.trace_id().to_string(),
            span_id: TraceContext::new_span_id(),
            parent_span_id: Some(trace.parent_id().to_string()),
            start,
            end: end.max(start),
            attributes,
            error: None,
        });
    }
}
