"""W3C trace context for jobs: what a producer sends with a job and how a worker runs the
handler as a child span of it.

Without OpenTelemetry installed this is plain string work: the producer sends the
``traceparent`` it is given, the worker hands the handler the job's context and a child
context of its own (``LeasedJob.handler_traceparent``) to pass on. With ``opentelemetry-api``
installed (``pip install conveyor-client[otel]``), an enqueue inside an active span sends that
span's context, and the worker runs each handler inside a ``CONSUMER`` span whose parent is the
producer's span, so one trace follows the work across the queue."""

from __future__ import annotations

import contextlib
import re
import secrets
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")

try:  # Optional: only used when the application has OpenTelemetry.
    from opentelemetry import trace as _otel_trace  # type: ignore[import-not-found]
    from opentelemetry.trace.propagation.tracecontext import (  # type: ignore[import-not-found]
        TraceContextTextMapPropagator as _Propagator,
    )
except ImportError:  # pragma: no cover - exercised when OpenTelemetry is absent
    _otel_trace = None
    _Propagator = None


def parse(traceparent: Optional[str]) -> Optional[Tuple[str, str, str]]:
    """``(trace_id, span_id, flags)`` of a version-00 ``traceparent``; ``None`` if malformed
    (or either id all zeros)."""
    if not traceparent:
        return None
    match = _TRACEPARENT.match(traceparent)
    if not match:
        return None
    trace_id, span_id, flags = match.groups()
    if set(trace_id) == {"0"} or set(span_id) == {"0"}:
        return None
    return trace_id, span_id, flags


def child(traceparent: Optional[str]) -> Optional[str]:
    """A new span's ``traceparent`` in the same trace (same flags), or ``None``."""
    parsed = parse(traceparent)
    if parsed is None:
        return None
    trace_id, _, flags = parsed
    span_id = "0" * 16
    while set(span_id) == {"0"}:
        span_id = secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-{flags}"


def current() -> Dict[str, str]:
    """The active OpenTelemetry span's ``traceparent`` (and ``tracestate``), if OpenTelemetry
    is installed and a span is recording or sampled; else ``{}``."""
    if _Propagator is None:
        return {}
    carrier: Dict[str, str] = {}
    _Propagator().inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


@contextlib.contextmanager
def handler_span(kind: str, job_id: str, traceparent: Optional[str], tracestate: Optional[str]) -> Iterator[Any]:
    """Runs the block inside a ``CONSUMER`` span named ``conveyor <kind>`` whose parent is the
    producer's span (when the job has a context), if OpenTelemetry is installed."""
    if _otel_trace is None or _Propagator is None:
        yield None
        return
    carrier = {"traceparent": traceparent or "", "tracestate": tracestate or ""}
    parent = _Propagator().extract(carrier) if traceparent else None
    tracer = _otel_trace.get_tracer("conveyor_client")
    with tracer.start_as_current_span(
        f"conveyor {kind}",
        context=parent,
        kind=_otel_trace.SpanKind.CONSUMER,
        attributes={"messaging.system": "conveyor", "messaging.message.id": job_id},
    ) as span:
        yield span


@contextlib.contextmanager
def batch_span(kind: str, jobs: Sequence[Any]) -> Iterator[Any]:
    """Runs a batch handler inside one ``CONSUMER`` span named ``conveyor <kind> batch``, linked
    to each job's producer span (a batch has many parents, so none is its parent), if
    OpenTelemetry is installed."""
    if _otel_trace is None or _Propagator is None:
        yield None
        return
    links = []
    for job in jobs:
        traceparent = getattr(job, "traceparent", None)
        if not traceparent:
            continue
        carrier = {"traceparent": traceparent, "tracestate": getattr(job, "tracestate", None) or ""}
        context = _otel_trace.get_current_span(_Propagator().extract(carrier)).get_span_context()
        if context.is_valid:
            links.append(_otel_trace.Link(context, {"messaging.message.id": str(job.id)}))
    tracer = _otel_trace.get_tracer("conveyor_client")
    with tracer.start_as_current_span(
        f"conveyor {kind} batch",
        kind=_otel_trace.SpanKind.CONSUMER,
        links=links,
        attributes={"messaging.system": "conveyor", "messaging.batch.message_count": len(jobs)},
    ) as span:
        yield span
