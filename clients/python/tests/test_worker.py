"""The worker against a real server: handlers, outcomes, heartbeats, lease loss, timeouts,
batching, stopping, restarts."""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from conveyor_client import (
    AsyncClient,
    Client,
    Permanent,
    Retry,
    RetryAfter,
    Worker,
    error_class_name,
)
from conveyor_client._async_http import AsyncTransport
from support import Running, wait_for


def state_is(client: Client, job_id: str, state: str):
    job = client.get(job_id)
    return job if job.state == state else None


@pytest.fixture()
def client(server):
    with Client(server.url) as c:
        yield c


def test_sync_and_async_handlers_get_the_job_and_return_the_result(server, client, queue):
    worker = Worker(server.url, queues=[queue], concurrency=4, poll_wait=1)
    seen = {}

    @worker.handler("sync")
    def sync_handler(job):
        seen["sync_thread"] = threading.current_thread().name
        return {"echo": job.payload, "attempt": job.attempt}

    @worker.handler("async")
    async def async_handler(job):
        seen["job"] = job
        await asyncio.sleep(0.01)
        return [job.id, job.kind, job.queue, job.tenant, job.tags, job.max_attempts]

    @worker.handler("none")
    def returns_nothing(job):
        return None

    assert worker.kinds == ["async", "none", "sync"]
    a = client.enqueue("sync", {"x": 1}, queue=queue)
    b = client.enqueue("async", "hi", queue=queue, tenant="acme", tags=["t1"], max_attempts=3)
    c = client.enqueue("none", queue=queue)
    with Running(worker):
        done_a = wait_for("sync job", lambda: state_is(client, a, "completed"))
        done_b = wait_for("async job", lambda: state_is(client, b, "completed"))
        done_c = wait_for("job without result", lambda: state_is(client, c, "completed"))
    assert done_a.result == {"echo": {"x": 1}, "attempt": 1}
    assert done_b.result == [b, "async", queue, "acme", ["t1"], 3]
    assert done_c.result is None
    assert seen["sync_thread"].startswith("conveyor-handler")
    job = seen["job"]
    assert job.payload == "hi" and job.attempt == 1 and job.lease_token and not job.lease_lost


def test_failures_steer_the_retry(server, client, queue):
    worker = Worker(server.url, queues=[queue], poll_wait=1)

    class Ünicode(Exception):
        pass

    @worker.handler("retry")
    def retry(job):
        raise Retry("upstream 502", error_class="upstream")

    @worker.handler("retry_after")
    async def retry_after(job):
        raise RetryAfter(dt.timedelta(seconds=60), "rate limited")

    @worker.handler("permanent")
    def permanent(job):
        raise Permanent("bad input")

    @worker.handler("value_error")
    def value_error(job):
        raise ValueError("the text of the error")

    @worker.handler("unicode")
    async def unicode_error(job):
        raise Ünicode("odd name")

    @worker.handler("not_json")
    def not_json(job):
        return {"when": object()}

    ids = {
        kind: client.enqueue(kind, queue=queue, max_attempts=1 if kind != "retry_after" else 3)
        for kind in ["retry", "retry_after", "permanent", "value_error", "unicode", "not_json"]
    }
    with Running(worker):
        dead = {}
        for kind in ["retry", "permanent", "value_error", "unicode", "not_json"]:
            job_id = ids[kind]
            dead[kind] = wait_for(kind, lambda: state_is(client, job_id, "dead"))  # noqa: B023
        later = wait_for("retry_after", lambda: state_is(client, ids["retry_after"], "retryable"))
    errors = {kind: job.errors[0] for kind, job in dead.items()}
    assert (errors["retry"].error_class, errors["retry"].message) == ("upstream", "upstream 502")
    assert (errors["permanent"].error_class, errors["permanent"].message) == ("permanent", "bad input")
    assert errors["value_error"].error_class == "ValueError"
    assert errors["value_error"].message == "ValueError: the text of the error"
    backtrace = errors["value_error"].backtrace or ""
    assert "Traceback" in backtrace and "ValueError: the text of the error" in backtrace
    assert errors["value_error"].worker_id and errors["value_error"].started_at
    assert errors["unicode"].error_class == "_nicode"
    assert errors["not_json"].error_class == "invalid_result"
    assert later.errors[0].error_class == "retry_after"
    assert later.errors[0].message == "rate limited"
    delay = later.run_at - later.errors[0].at
    assert dt.timedelta(seconds=55) < delay < dt.timedelta(seconds=65)


def test_error_class_names_are_sanitised():
    class Fine(Exception):
        pass

    assert error_class_name(ValueError()) == "ValueError"
    assert error_class_name(Fine()) == "Fine"
    odd = type("a b/ç" + "x" * 200, (Exception,), {})
    name = error_class_name(odd())
    assert name.startswith("a_b__") and len(name) == 128


def test_kinds_without_a_handler_are_never_claimed(server, client, queue):
    worker = Worker(server.url, queues=[queue], poll_wait=1)
    worker.add_handler("known", lambda job: "ok")
    unknown = client.enqueue("unknown", queue=queue)
    known = client.enqueue("known", queue=queue)
    with Running(worker):
        wait_for("known job", lambda: state_is(client, known, "completed"))
    job = client.get(unknown)
    assert (job.state, job.attempt) == ("available", 0)


def test_acknowledgements_are_batched(server, client, queue, monkeypatch):
    calls = []
    original = AsyncTransport.raw

    async def counting(self, method, path, data, *, timeout=None):
        calls.append(path)
        return await original(self, method, path, data, timeout=timeout)

    monkeypatch.setattr(AsyncTransport, "raw", counting)
    worker = Worker(server.url, queues=[queue], concurrency=10, poll_wait=1)

    @worker.handler("noop")
    async def noop(job):
        return None

    ids = client.enqueue_many([{"kind": "noop", "queue": queue, "payload": n} for n in range(300)])
    with Running(worker):
        wait_for(
            "all done",
            lambda: (
                all(client.get(i).state == "completed" for i in ids[-5:])
                and all(client.get(i).state == "completed" for i in ids)
            ),
        )
    round_trips = [p for p in calls if p in ("/v1/fetch", "/v1/ack")]
    assert not [p for p in calls if p.endswith("/complete")]
    assert len(round_trips) < 120, f"{len(round_trips)} round trips for 300 jobs"


def test_heartbeats_keep_a_job_longer_than_its_lease(server, client, queue):
    worker = Worker(server.url, queues=[queue], lease=0.5, poll_wait=1)

    @worker.handler("long")
    async def long(job):
        await asyncio.sleep(1.6)
        return "done"

    job_id = client.enqueue("long", queue=queue)
    with Running(worker):
        job = wait_for("long job", lambda: state_is(client, job_id, "completed"))
    assert job.attempt == 1 and job.errors == [] and job.result == "done"


def test_lease_lost_cancels_an_async_handler_and_drops_its_result(server, client, queue, caplog):
    caplog.set_level(logging.INFO, logger="conveyor_client")
    worker = Worker(server.url, queues=[queue], lease=0.6, poll_wait=1, grace_period=0.2)
    cancelled = threading.Event()
    sync_saw_loss = threading.Event()

    @worker.handler("async_long")
    async def async_long(job):
        try:
            await asyncio.sleep(10)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "too late"

    @worker.handler("sync_long")
    def sync_long(job):
        deadline = time.monotonic() + 10
        while not job.lease_lost and time.monotonic() < deadline:
            time.sleep(0.02)
        sync_saw_loss.set()
        return "too late"

    a = client.enqueue("async_long", queue=queue)
    s = client.enqueue("sync_long", queue=queue)
    with Running(worker):
        wait_for("both running", lambda: state_is(client, a, "running") and state_is(client, s, "running"))
        client.cancel(a)
        client.cancel(s)
        assert cancelled.wait(10), "the async handler was not cancelled"
        assert sync_saw_loss.wait(10), "the sync handler never saw lease_lost"
        wait_for("the log", lambda: a in caplog.text and s in caplog.text)
        after = client.enqueue("async_long", queue=queue)
        wait_for("the worker carries on", lambda: state_is(client, after, "running"))
    for job_id in (a, s):
        job = client.get(job_id)
        assert job.state == "cancelled" and job.result is None
    assert "lease" in caplog.text


def test_an_acknowledgement_answered_lease_lost_is_dropped_and_logged(server, client, queue, caplog):
    caplog.set_level(logging.INFO, logger="conveyor_client")
    # A 30 s lease: the next heartbeat is 10 s away, so the acknowledgement learns of the loss.
    worker = Worker(server.url, queues=[queue], lease=30, poll_wait=1)
    go = threading.Event()

    @worker.handler("waits")
    def waits(job):
        go.wait(10)
        return "finished after the cancel"

    job_id = client.enqueue("waits", queue=queue)
    with Running(worker):
        wait_for("running", lambda: state_is(client, job_id, "running"))
        client.cancel(job_id)
        go.set()
        wait_for("the log", lambda: job_id in caplog.text and "result is dropped" in caplog.text)
        after = client.enqueue("waits", queue=queue)
        wait_for("the worker carries on", lambda: state_is(client, after, "completed"))
    job = client.get(job_id)
    assert job.state == "cancelled" and job.result is None


def test_timeouts_fail_the_attempt(server, client, queue):
    worker = Worker(server.url, queues=[queue], poll_wait=1)
    unblock = threading.Event()

    @worker.handler("async_slow")
    async def async_slow(job):
        await asyncio.sleep(10)

    @worker.handler("sync_slow")
    def sync_slow(job):
        unblock.wait(10)
        return "late"

    a = client.enqueue("async_slow", queue=queue, timeout=0.3, max_attempts=1)
    s = client.enqueue("sync_slow", queue=queue, timeout=0.3, max_attempts=1)
    with Running(worker):
        dead_a = wait_for("async timeout", lambda: state_is(client, a, "dead"), timeout=5)
        dead_s = wait_for("sync timeout", lambda: state_is(client, s, "dead"), timeout=5)
        unblock.set()
    assert dead_a.errors[0].error_class == "timeout"
    assert dead_s.errors[0].error_class == "timeout"
    assert "300 ms" in dead_s.errors[0].message


def test_stop_drains_then_releases(server, client, queue):
    worker = Worker(server.url, queues=[queue], concurrency=4, grace_period=0.5, poll_wait=5)
    never = threading.Event()

    @worker.handler("short")
    async def short(job):
        await asyncio.sleep(0.2)
        return "short"

    @worker.handler("long_async")
    async def long_async(job):
        await asyncio.sleep(30)

    @worker.handler("long_sync")
    def long_sync(job):
        never.wait(30)

    short_id = client.enqueue("short", queue=queue)
    long_a = client.enqueue("long_async", queue=queue)
    long_s = client.enqueue("long_sync", queue=queue)
    running = Running(worker).__enter__()
    wait_for("all running", lambda: all(state_is(client, i, "running") for i in (short_id, long_a, long_s)))
    worker.stop()
    took = running.join()
    never.set()
    assert took < 3, f"stop took {took:.1f} s"
    assert client.get(short_id).state == "completed"
    for job_id in (long_a, long_s):
        job = client.get(job_id)
        assert (job.state, job.attempt, job.errors) == ("available", 0, [])


def test_stop_before_run_returns_at_once(server, queue):
    worker = Worker(server.url, queues=[queue])
    worker.add_handler("x", lambda job: None)
    worker.stop()
    started = time.monotonic()
    worker.run()
    assert time.monotonic() - started < 2
    with pytest.raises(ValueError):
        Worker(server.url, queues=[queue]).run()


def test_run_async_inside_an_asyncio_app(server, queue):
    async def main():
        worker = Worker(server.url, queues=[queue], poll_wait=1)
        done = asyncio.Event()

        @worker.handler("app")
        async def app_job(job):
            done.set()
            return job.payload * 2

        task = asyncio.create_task(worker.run_async(handle_signals=False))
        async with AsyncClient(server.url) as client:
            job_id = await client.enqueue("app", 21, queue=queue)
            await asyncio.wait_for(done.wait(), 10)
            for _ in range(500):
                job = await client.get(job_id)
                if job.state == "completed":
                    break
                await asyncio.sleep(0.02)
            assert job.result == 42
        worker.stop()
        await asyncio.wait_for(task, 10)

    asyncio.run(main())


def test_prefetch_holds_jobs_ahead_without_running_more_at_once(server, client, queue):
    worker = Worker(server.url, queues=[queue], concurrency=2, prefetch=4, poll_wait=1)
    lock = threading.Lock()
    active = [0, 0]  # now, most

    @worker.handler("p")
    async def p(job):
        with lock:
            active[0] += 1
            active[1] = max(active[1], active[0])
        await asyncio.sleep(0.05)
        with lock:
            active[0] -= 1

    ids = client.enqueue_many([{"kind": "p", "queue": queue} for _ in range(30)])
    with Running(worker):
        wait_for("all done", lambda: all(client.get(i).state == "completed" for i in ids))
    assert active[1] == 2


def test_a_server_restart_is_survived(own_server, queue):
    srv = own_server()
    worker = Worker(srv.url, queues=[queue], poll_wait=1, max_backoff=0.5)
    worker.add_handler("x", lambda job: job.payload)
    with Client(srv.url) as client, Running(worker):
        first = client.enqueue("x", 1, queue=queue)
        wait_for("first job", lambda: state_is(client, first, "completed"))
        srv.restart()
        after = client.enqueue("x", 2, queue=queue)
        assert wait_for("job after the restart", lambda: state_is(client, after, "completed")).result == 2


def test_sigterm_drains_and_exits_zero(server, client, queue):
    script = textwrap.dedent(
        f"""
        import asyncio, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[1] / "src")!r})
        from conveyor_client import Worker
        worker = Worker({server.url!r}, queues=[{queue!r}], grace_period=5, poll_wait=5,
                        on_ready=lambda: print("ready", flush=True))

        @worker.handler("slow")
        async def slow(job):
            await asyncio.sleep(0.5)
            return "finished"

        worker.run()
        print("returned", flush=True)
        """
    )
    job_id = client.enqueue("slow", queue=queue)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        wait_for("running", lambda: state_is(client, job_id, "running"))
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(10) == 0
        assert proc.stdout.read().strip() == "returned"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    job = client.get(job_id)
    assert (job.state, job.result, job.attempt) == ("completed", "finished", 1)


def test_a_result_the_server_refuses_fails_only_its_job(own_server, queue):
    srv = own_server(["--max-payload-bytes", "1000"])
    worker = Worker(srv.url, queues=[queue], concurrency=4, poll_wait=1)

    @worker.handler("big")
    def big(job):
        return "x" * 5000 if job.payload == "huge" else "small"

    with Client(srv.url) as client:
        ids = client.enqueue_many(
            [{"kind": "big", "payload": p, "queue": queue, "max_attempts": 1} for p in ("huge", "fine", "ok")]
        )
        with Running(worker):
            dead = wait_for("the huge one", lambda: state_is(client, ids[0], "dead"))
            for job_id in ids[1:]:
                assert wait_for("the others", lambda: state_is(client, job_id, "completed")).result == "small"  # noqa: B023
    assert dead.errors[0].error_class == "invalid_result"
    assert "result" in dead.errors[0].message


def test_a_worker_told_to_stop_by_an_operator_drains_and_returns(server, client, queue):
    """``conveyor worker stop ID`` (``POST /v1/workers/{id}/stop``): the server hands the worker
    no more jobs and says so in the fetch answer; the worker stops gracefully and ``run()``
    returns; a job enqueued after the command stays available."""
    worker = Worker(server.url, queues=[queue], poll_wait=1, worker_id=f"py-told-{queue}")

    @worker.handler("noop")
    def noop(job):
        return None

    first = client.enqueue("noop", queue=queue)
    running = Running(worker)
    with running:
        wait_for("the first job", lambda: state_is(client, first, "completed"))
        told = client.request("POST", f"/v1/workers/{worker.worker_id}/stop")
        assert told["command"] == "stop"
        later = client.enqueue("noop", queue=queue)
        running.join(timeout=30)
    assert client.get(later).state == "available"
