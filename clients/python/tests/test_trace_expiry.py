"""Trace context and expiry through the Python client and worker, against a real server."""

from __future__ import annotations

import pytest

from conveyor_client import Client, Worker
from conveyor_client.errors import ConveyorError
from support import Running, wait_for

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def state_is(client: Client, job_id: str, state: str):
    job = client.get(job_id)
    return job if job.state == state else None


def test_a_given_trace_context_reaches_the_handler_with_a_child_context(server, queue):
    worker = Worker(server.url, queues=[queue], poll_wait=1)
    seen = {}

    @worker.handler("traced")
    def traced(job):
        seen["job"] = job
        return None

    with Client(server.url) as client:
        job_id = client.enqueue("traced", queue=queue, traceparent=PARENT, tracestate="v=1", ttl=60)
        stored = client.get(job_id)
        assert stored.raw["trace"] == {"traceparent": PARENT, "tracestate": "v=1"}
        assert stored.raw["expires_at"]
        with Running(worker):
            wait_for("traced job", lambda: state_is(client, job_id, "completed"))
    job = seen["job"]
    assert job.traceparent == PARENT and job.tracestate == "v=1"
    assert job.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    child = job.handler_traceparent
    assert child.startswith("00-4bf92f3577b34da6a3ce929d0e0e4736-") and child.endswith("-01")
    assert child.split("-")[2] != "00f067aa0ba902b7", "the handler's span is a new span"


def test_bad_ttl_and_traceparent_are_refused_naming_the_field(server, queue):
    with Client(server.url) as client:
        with pytest.raises(ValueError):
            client.enqueue("k", queue=queue, ttl=5, expires_at="2999-01-01T00:00:00Z")
        with pytest.raises(ConveyorError) as refused:
            client.enqueue("k", queue=queue, traceparent="00-nope")
        assert refused.value.field == "traceparent"


def test_with_opentelemetry_the_handler_span_is_a_child_of_the_producer_span(server, queue):
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry import trace
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("test")
    worker = Worker(server.url, queues=[queue], poll_wait=1)

    @worker.handler("otel")
    async def otel(job):
        return None

    with Client(server.url) as client:
        with tracer.start_as_current_span("request") as producer:
            job_id = client.enqueue("otel", queue=queue)
        producer_context = producer.get_span_context()
        assert client.get(job_id).raw["trace"]["traceparent"].split("-")[1] == format(
            producer_context.trace_id, "032x"
        )
        with Running(worker):
            wait_for("job", lambda: state_is(client, job_id, "completed"))
    handler_spans = [s for s in exporter.get_finished_spans() if s.name == "conveyor otel"]
    assert len(handler_spans) == 1
    span = handler_spans[0]
    assert span.context.trace_id == producer_context.trace_id
    assert span.parent is not None and span.parent.span_id == producer_context.span_id
    assert span.kind == trace.SpanKind.CONSUMER
