"""Batch handlers against a real server: a kind's ``batch`` setting (``set_batch``, round trip
and the server's errors), ``@worker.batch_handler`` (one call per batch, an outcome per job, a
failed job retried alone in a later batch, keyed batches), plain handlers never getting a batch
kind's jobs, heartbeats covering every job of a running batch, lease loss, timeouts and the
graceful stop."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import threading
import uuid

import pytest

from conveyor_client import (
    AsyncClient,
    Client,
    InvalidRequest,
    NotFound,
    Permanent,
    RetryAfter,
    Worker,
    _wire,
)
from conveyor_client._async_http import AsyncTransport
from conveyor_client.models import parse_time
from support import Running, wait_for


@pytest.fixture()
def client(server):
    with Client(server.url) as c:
        yield c


def batch_kind(prefix: str = "batch") -> str:
    """A kind of the test's own (a kind's settings are the server's, not the queue's)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def finished(client: Client, job_id: str):
    """The job once finished (the server holds the request until then)."""
    job = client.wait(job_id, timeout=15)
    assert job.state in ("completed", "dead", "cancelled"), (job_id, job.state)
    return job


def test_a_failed_job_of_a_batch_retries_alone_in_a_later_batch(server, client, queue):
    # RetryAfter (a fixed delay) rather than a plain exception: the server's backoff has ±20 %
    # jitter, which could put #2 and #4 more than max_wait apart and so in batches of their own.
    assert client.set_batch("rows.insert", max_size=5, max_wait=0.3) == {"max_size": 5, "max_wait_ms": 300}
    ids = client.enqueue_many(
        [{"kind": "rows.insert", "queue": queue, "payload": {"n": n}} for n in range(1, 6)]
    )
    worker = Worker(server.url, queues=[queue], poll_wait=1)
    batches = []

    @worker.batch_handler("rows.insert")
    async def insert_rows(jobs):
        batches.append([(job.payload["n"], job.attempt) for job in jobs])
        outcomes = []
        for job in jobs:
            n = job.payload["n"]
            if n in (2, 4) and job.attempt == 1:
                outcomes.append(RetryAfter(0.2, f"row {n} rejected"))
            else:
                outcomes.append({"inserted": n})
        return outcomes

    assert worker.batch_kinds == ["rows.insert"] and worker.kinds == []
    with Running(worker):
        jobs = {n: finished(client, job_id) for n, job_id in zip(range(1, 6), ids)}
    assert batches == [[(1, 1), (2, 1), (3, 1), (4, 1), (5, 1)], [(2, 2), (4, 2)]]
    for n, job in jobs.items():
        assert job.state == "completed", (n, job.state)
        assert job.result == {"inserted": n}
        if n in (2, 4):
            assert job.attempt == 2
            assert [(e.error_class, e.message) for e in job.errors] == [("retry_after", f"row {n} rejected")]
        else:
            assert (job.attempt, job.errors) == (1, [])


def test_a_plain_handler_never_gets_a_batch_kinds_jobs(server, client, queue, monkeypatch):
    fetches = []
    original = AsyncTransport.raw

    async def recording(self, method, path, data, *, timeout=None):
        if path == "/v1/fetch":
            fetches.append(json.loads(data))
        return await original(self, method, path, data, timeout=timeout)

    monkeypatch.setattr(AsyncTransport, "raw", recording)
    kind, batched = batch_kind("rows"), batch_kind("events")
    client.set_batch(kind, max_size=10)
    client.set_batch(batched, max_size=10)
    waiting = client.enqueue(kind, {"n": 1}, queue=queue)
    plain = client.enqueue("plain", queue=queue)
    seen = []

    worker = Worker(server.url, queues=[queue], poll_wait=1)

    @worker.handler(kind)
    def rows(job):
        seen.append(job.id)

    @worker.handler("plain")
    def plain_handler(job):
        seen.append(job.id)
        return "plain"

    @worker.batch_handler(batched)
    def events(jobs):
        seen.extend(job.id for job in jobs)

    with Running(worker):
        assert finished(client, plain).result == "plain"
    # The first fetch asked for both jobs (the worker had room for 10): only the plain one came.
    assert seen == [plain]
    job = client.get(waiting)
    assert (job.state, job.attempt) == ("available", 0)
    plain_fetches = [f for f in fetches if not f.get("batch")]
    batch_fetches = [f for f in fetches if f.get("batch")]
    assert plain_fetches and batch_fetches
    assert all(f["kinds"] == sorted([kind, "plain"]) for f in plain_fetches)
    assert all(f["kinds"] == [batched] and f["batch"] is True and "max" not in f for f in batch_fetches)

    # No longer a batch kind: the plain handler gets it.
    client.remove_batch(kind)
    worker = Worker(server.url, queues=[queue], poll_wait=1)
    worker.add_handler(kind, lambda job: f"plain {job.payload['n']}")
    with Running(worker):
        assert finished(client, waiting).result == "plain 1"


def test_a_keyed_batch_holds_jobs_of_one_key_value(server, client, queue):
    kind = batch_kind("sync")
    client.set_batch(
        kind, {"max_size": 10, "max_wait": dt.timedelta(milliseconds=200), "key": "payload.account"}
    )
    acme, globex = f"acme-{uuid.uuid4().hex[:6]}", f"globex-{uuid.uuid4().hex[:6]}"
    order = [(acme, 1), (globex, 1), (acme, 2), (globex, 2), (acme, 3)]
    ids = client.enqueue_many(
        [{"kind": kind, "queue": queue, "payload": {"account": a, "n": n}} for a, n in order]
    )
    worker = Worker(server.url, queues=[queue], poll_wait=1)
    batches = []

    threads = set()

    @worker.batch_handler(kind)
    def sync_accounts(jobs):  # a sync batch handler, on a thread of its own
        threads.add(threading.current_thread().name)
        batches.append([(job.payload["account"], job.payload["n"], job.attempt) for job in jobs])
        return [f"{job.payload['account']}/{job.payload['n']}" for job in jobs]

    with Running(worker):
        jobs = [finished(client, job_id) for job_id in ids]
    # Neither group is full: each goes out whole once its oldest has waited 200 ms; the jobs of
    # the other account claimed on the way to the first group's were given back uncounted.
    assert sorted(batches) == sorted(
        [[(acme, 1, 1), (acme, 2, 1), (acme, 3, 1)], [(globex, 1, 1), (globex, 2, 1)]]
    )
    for (account, n), job in zip(order, jobs):
        assert (job.state, job.attempt, job.result, job.errors) == ("completed", 1, f"{account}/{n}", [])
    assert threads and all(name.startswith("conveyor-batch") for name in threads)


def test_the_batch_setting_round_trips_and_bad_input_names_the_field(client, queue):
    kind = batch_kind("settings")
    with pytest.raises(NotFound):
        client.get_schema(kind)
    client.remove_batch(kind)  # nothing to remove: no settings made either
    with pytest.raises(NotFound):
        client.get_schema(kind)

    stored = client.set_batch(kind, max_size=5, max_wait=0.3)
    assert stored == {"max_size": 5, "max_wait_ms": 300}
    assert client.get_schema(kind)["batch"] == {"max_size": 5, "max_wait_ms": 300}
    stored = client.set_batch(kind, {"max_size": 7, "max_wait_ms": 1500, "key": "payload.account"})
    assert stored == {"max_size": 7, "max_wait_ms": 1500, "key": "payload.account"}
    assert client.set_batch(kind, max_size=1000, max_wait_ms=0, key="tenant") == {
        "max_size": 1000,
        "max_wait_ms": 0,
        "key": "tenant",
    }
    # The default wait is 0.
    assert client.set_batch(kind, max_size=3) == {"max_size": 3, "max_wait_ms": 0}
    # A schema set afterwards leaves the batch setting as it is, and the batch setting the
    # schema and its version.
    schema = {"type": "object"}
    assert client.set_schema(kind, schema, version=2)["batch"] == {"max_size": 3, "max_wait_ms": 0}
    client.set_batch(kind, max_size=4)
    settings = client.get_schema(kind)
    assert (settings["schema"], settings["version"], settings["batch"]) == (
        schema,
        2,
        {"max_size": 4, "max_wait_ms": 0},
    )

    cases = [
        ({"max_size": 0}, "batch.max_size"),
        ({"max_size": 1001}, "batch.max_size"),
        ({"max_wait": 1}, "batch.max_size"),  # max_size is required
        ({"max_size": 2, "max_wait": 3601}, "batch.max_wait_ms"),
        ({"max_size": 2, "key": "nope"}, "batch.key"),
        ({"max_size": 2, "key": "payload."}, "batch.key"),
    ]
    for options, field in cases:
        with pytest.raises(InvalidRequest) as caught:
            client.set_batch(kind, **options)
        assert caught.value.status == 400, options
        assert caught.value.field == field, (options, caught.value.field)
    with pytest.raises(InvalidRequest) as caught:
        client.set_batch(kind, {"max_size": 2, "size": 3})
    assert caught.value.field == "batch.size"
    # Nothing refused was stored.
    assert client.get_schema(kind)["batch"] == {"max_size": 4, "max_wait_ms": 0}

    # The client's own checks.
    with pytest.raises(ValueError):
        client.set_batch(kind)
    with pytest.raises(ValueError):
        client.set_batch(kind, {"max_size": 2}, max_size=2)
    with pytest.raises(ValueError):
        client.set_batch(kind, max_size=2, max_wait=1, max_wait_ms=1000)
    with pytest.raises(ValueError):
        client.set_batch(kind, max_size=2, max_wait=-1)
    with pytest.raises(TypeError):
        client.set_batch(kind, 5)  # type: ignore[arg-type]
    assert _wire.batch_spec(max_size=2, max_wait=dt.timedelta(seconds=1.5), key="queue") == {
        "max_size": 2,
        "max_wait_ms": 1500,
        "key": "queue",
    }

    client.remove_batch(kind)
    settings = client.get_schema(kind)
    assert "batch" not in settings and settings["schema"] == schema
    client.remove_batch(kind)  # again: nothing to do
    client.delete_schema(kind)


def test_async_client_batch_setting(server):
    kind = batch_kind("async")

    async def main():
        async with AsyncClient(server.url) as c:
            assert await c.set_batch(kind, max_size=9, max_wait=0.25, key="payload.account") == {
                "max_size": 9,
                "max_wait_ms": 250,
                "key": "payload.account",
            }
            assert (await c.get_schema(kind))["batch"]["max_size"] == 9
            with pytest.raises(InvalidRequest) as caught:
                await c.set_batch(kind, {"max_size": 0})
            assert caught.value.field == "batch.max_size"
            await c.remove_batch(kind)
            assert "batch" not in await c.get_schema(kind)

    asyncio.run(main())


def test_each_outcome_goes_to_its_job(server, client, queue, caplog):
    caplog.set_level(logging.INFO, logger="conveyor_client")
    short, long_ = batch_kind("short"), batch_kind("long")
    client.set_batch(short, max_size=4)
    client.set_batch(long_, max_size=2)
    short_ids = client.enqueue_many(
        [{"kind": short, "queue": queue, "payload": n, "max_attempts": 1} for n in range(4)]
    )
    long_ids = client.enqueue_many([{"kind": long_, "queue": queue, "payload": n} for n in range(2)])
    worker = Worker(server.url, queues=[queue], poll_wait=1)

    @worker.batch_handler(short)
    async def three_for_four(jobs):
        return [{"row": jobs[0].payload}, Permanent("bad row", error_class="schema"), ValueError("boom")]

    @worker.batch_handler(long_)
    def three_for_two(jobs):
        return ("first", None, "extra")

    with Running(worker):
        ok, permanent, error, missing = [finished(client, i) for i in short_ids]
        first, second = [finished(client, i) for i in long_ids]
        wait_for("the log", lambda: "past the last job are ignored" in caplog.text)
    assert (ok.state, ok.result) == ("completed", {"row": 0})
    assert permanent.state == "dead"
    assert [(e.error_class, e.message) for e in permanent.errors] == [("schema", "bad row")]
    assert error.state == "dead"
    assert [(e.error_class, e.message) for e in error.errors] == [("ValueError", "ValueError: boom")]
    assert missing.state == "dead"
    assert [(e.error_class, e.message) for e in missing.errors] == [
        ("missing_outcome", "the batch handler returned 3 outcome(s) for a batch of 4")
    ]
    assert [(j.state, j.result) for j in (first, second)] == [("completed", "first"), ("completed", None)]


def test_a_batch_handler_that_raises_fails_every_job(server, client, queue):
    kind, odd = batch_kind("raises"), batch_kind("odd")
    client.set_batch(kind, max_size=3)
    client.set_batch(odd, max_size=2)
    ids = client.enqueue_many([{"kind": kind, "queue": queue, "max_attempts": 1} for _ in range(3)])
    odd_ids = client.enqueue_many([{"kind": odd, "queue": queue, "max_attempts": 1} for _ in range(2)])
    worker = Worker(server.url, queues=[queue], poll_wait=1)
    sizes = []

    @worker.batch_handler(kind)
    def database_down(jobs):
        sizes.append(len(jobs))
        raise ConnectionError("database down")

    @worker.batch_handler(odd)
    def not_a_list(jobs):
        return {"rows": len(jobs)}

    with Running(worker):
        jobs = [finished(client, i) for i in ids]
        odd_jobs = [finished(client, i) for i in odd_ids]
    assert sizes == [3]
    for job in jobs:
        assert job.state == "dead"
        (error,) = job.errors
        assert (error.error_class, error.message) == ("ConnectionError", "ConnectionError: database down")
        assert "Traceback" in (error.backtrace or "")
    for job in odd_jobs:
        assert job.state == "dead"
        assert job.errors[0].error_class == "invalid_result"
        assert "not dict" in job.errors[0].message


def test_heartbeats_cover_every_job_of_a_running_batch(server, client, queue):
    kind = batch_kind("slow")
    client.set_batch(kind, max_size=3)
    ids = client.enqueue_many([{"kind": kind, "queue": queue, "payload": n} for n in range(3)])
    worker = Worker(server.url, queues=[queue], lease=0.5, poll_wait=1)
    leased = {}
    started, renewed = threading.Event(), threading.Event()

    @worker.batch_handler(kind)
    def slow(jobs):
        leased.update({job.id: parse_time(job.lease_expires_at) for job in jobs})
        started.set()
        renewed.wait(15)
        return [job.payload for job in jobs]

    def all_renewed():
        # Every lease reaches well past where the fetch left it: heartbeats renewed it.
        return all(client.get(i).lease.expires_at > leased[i] + dt.timedelta(seconds=1) for i in ids)

    with Running(worker):
        assert started.wait(10)
        assert sorted(leased) == sorted(ids)
        wait_for("every lease renewed", all_renewed, timeout=10)
        renewed.set()
        jobs = [finished(client, i) for i in ids]
    for n, job in enumerate(jobs):
        assert (job.state, job.attempt, job.result, job.errors) == ("completed", 1, n, [])


def test_a_lost_lease_drops_only_that_jobs_outcome(server, client, queue, caplog):
    caplog.set_level(logging.INFO, logger="conveyor_client")
    kind = batch_kind("lost")
    client.set_batch(kind, max_size=3)
    ids = client.enqueue_many([{"kind": kind, "queue": queue, "payload": n} for n in range(3)])
    worker = Worker(server.url, queues=[queue], lease=0.6, poll_wait=1)
    started = threading.Event()
    saw = {}

    @worker.batch_handler(kind)
    async def waits_for_the_loss(jobs):
        started.set()
        while not jobs[0].lease_lost:
            await asyncio.sleep(0.02)  # the handler's own polling of lease_lost
        saw["lost"] = [job.lease_lost for job in jobs]
        return [f"done {job.payload}" for job in jobs]

    with Running(worker):
        assert started.wait(10)
        client.cancel(ids[0])
        jobs = [finished(client, i) for i in ids]
        wait_for("the log", lambda: ids[0] in caplog.text)
    assert saw["lost"] == [True, False, False]
    assert (jobs[0].state, jobs[0].result) == ("cancelled", None)
    assert [(j.state, j.result) for j in jobs[1:]] == [("completed", "done 1"), ("completed", "done 2")]


def test_a_batch_times_out_at_its_jobs_timeout(server, client, queue):
    kind = batch_kind("timeout")
    client.set_batch(kind, max_size=2)
    ids = client.enqueue_many(
        [{"kind": kind, "queue": queue, "timeout": t, "max_attempts": 1} for t in (0.3, 5)]
    )
    worker = Worker(server.url, queues=[queue], poll_wait=1)
    cancelled = threading.Event()

    @worker.batch_handler(kind)
    async def too_slow(jobs):
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with Running(worker):
        jobs = [finished(client, i) for i in ids]
    assert cancelled.is_set()
    for job in jobs:
        assert job.state == "dead"
        assert job.errors[0].error_class == "timeout"
        assert "300 ms" in job.errors[0].message


def test_stop_drains_a_running_batch(server, client, queue):
    kind = batch_kind("drain")
    client.set_batch(kind, max_size=3)
    ids = client.enqueue_many([{"kind": kind, "queue": queue, "payload": n} for n in range(3)])
    draining = threading.Event()

    class Watched(Worker):
        async def _drain(self):
            draining.set()
            await super()._drain()

    worker = Watched(server.url, queues=[queue], poll_wait=5, grace_period=10)
    started = threading.Event()

    @worker.batch_handler(kind)
    async def finishes_while_draining(jobs):
        started.set()
        # Still running when the drain begins: the drain must wait for it.
        assert await asyncio.get_running_loop().run_in_executor(None, draining.wait, 10)
        return [job.payload * 10 for job in jobs]

    running = Running(worker).__enter__()
    assert started.wait(10)
    worker.stop()
    took = running.join()
    assert took < 5, f"stop took {took:.1f} s"
    for n, job_id in enumerate(ids):
        job = client.get(job_id)
        assert (job.state, job.attempt, job.result) == ("completed", 1, n * 10)


def test_stop_releases_a_batch_past_the_grace_period(server, client, queue):
    kind = batch_kind("release")
    client.set_batch(kind, max_size=3)
    ids = client.enqueue_many([{"kind": kind, "queue": queue} for _ in range(3)])
    worker = Worker(server.url, queues=[queue], poll_wait=5, grace_period=0.3)
    started, cancelled = threading.Event(), threading.Event()

    @worker.batch_handler(kind)
    async def never_finishes(jobs):
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    running = Running(worker).__enter__()
    assert started.wait(10)
    worker.stop()
    took = running.join()
    assert took < 3, f"stop took {took:.1f} s"
    assert cancelled.is_set()
    for job_id in ids:
        job = client.get(job_id)
        assert (job.state, job.attempt, job.errors) == ("available", 0, [])


def test_batch_handler_registration(server):
    worker = Worker(server.url, batch_concurrency=2)
    worker.add_handler("plain", lambda job: None)
    with pytest.raises(ValueError):
        worker.add_batch_handler("plain", lambda jobs: None)
    worker.add_batch_handler("rows", lambda jobs: None)
    with pytest.raises(ValueError):
        worker.add_handler("rows", lambda job: None)
    with pytest.raises(TypeError):
        worker.add_batch_handler("other", "not callable")  # type: ignore[arg-type]
    assert (worker.kinds, worker.batch_kinds) == (["plain"], ["rows"])
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            Worker(server.url, batch_concurrency=bad)  # type: ignore[arg-type]


def test_batch_concurrency_batches_run_at_once(server, client, queue):
    kind = batch_kind("parallel")
    client.set_batch(kind, max_size=1)  # a batch per job
    ids = client.enqueue_many([{"kind": kind, "queue": queue, "payload": n} for n in range(3)])
    worker = Worker(server.url, queues=[queue], poll_wait=1, batch_concurrency=2)
    state = {"running": 0, "most": 0}
    events = {}

    @worker.batch_handler(kind)
    async def holds_its_place(jobs):
        if not events:
            events.update(two=asyncio.Event(), three=asyncio.Event())
        state["running"] += 1
        state["most"] = max(state["most"], state["running"])
        if state["running"] >= 2:
            events["two"].set()
        if state["running"] >= 3:
            events["three"].set()
        try:
            if jobs[0].payload < 2:
                # The first two batches run side by side (or this times out) ...
                await asyncio.wait_for(events["two"].wait(), 10)
                # ... and hold both places a while: no third batch may start meanwhile.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(events["three"].wait(), 0.5)
            return [jobs[0].payload]
        finally:
            state["running"] -= 1

    with Running(worker):
        jobs = [finished(client, i) for i in ids]
    assert [(j.state, j.result, j.attempt) for j in jobs] == [("completed", n, 1) for n in range(3)]
    assert state["most"] == 2


def test_with_opentelemetry_a_batch_runs_in_one_span_linked_to_its_jobs(server, client, queue, monkeypatch):
    sdk = pytest.importorskip("opentelemetry.sdk.trace")
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from conveyor_client import _trace

    # A provider of the test's own (the global one can be set once per process).
    exporter = InMemorySpanExporter()
    provider = sdk.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_trace._otel_trace, "get_tracer", provider.get_tracer)
    kind = batch_kind("traced")
    client.set_batch(kind, max_size=3)
    parents = [f"00-{n:032x}-{n:016x}-01" for n in (1, 2)]
    specs = [{"kind": kind, "queue": queue, "traceparent": p} for p in parents]
    ids = client.enqueue_many(specs + [{"kind": kind, "queue": queue}])
    worker = Worker(server.url, queues=[queue], poll_wait=1)
    worker.add_batch_handler(kind, lambda jobs: None)
    with Running(worker):
        for job_id in ids:
            assert finished(client, job_id).state == "completed"
    (span,) = [s for s in exporter.get_finished_spans() if s.name == f"conveyor {kind} batch"]
    assert span.kind == _trace._otel_trace.SpanKind.CONSUMER
    assert span.attributes["messaging.batch.message_count"] == 3
    assert sorted((link.context.trace_id, link.context.span_id) for link in span.links) == [(1, 1), (2, 2)]
    assert sorted(link.attributes["messaging.message.id"] for link in span.links) == sorted(ids[:2])
