"""`AsyncClient`: the same API as coroutines."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest

from conveyor_client import AsyncClient, Conflict, InvalidRequest, Job, NewJob, NotFound, QueueFull


def run(coro):
    return asyncio.run(coro)


def test_enqueue_get_cancel(server, queue):
    async def main():
        async with AsyncClient(server.url) as client:
            job_id = await client.enqueue(
                "report",
                {"day": "2025-01-01"},
                queue=queue,
                priority=2,
                tenant="t1",
                delay=dt.timedelta(seconds=30),
            )
            job = await client.get(job_id)
            assert isinstance(job, Job)
            assert (job.kind, job.queue, job.state, job.priority, job.tenant) == (
                "report",
                queue,
                "scheduled",
                2,
                "t1",
            )
            assert job.payload == {"day": "2025-01-01"}
            assert (await client.cancel(job_id)).state == "cancelled"
            with pytest.raises(Conflict):
                await client.cancel(job_id)
            with pytest.raises(NotFound):
                await client.get("00000000-0000-0000-0000-000000000000")

    run(main())


def test_enqueue_many_and_errors(server, queue):
    async def main():
        async with AsyncClient(server.url) as client:
            ids = await client.enqueue_many(
                [{"kind": "a", "queue": queue, "payload": 1}, NewJob("b", payload=2, queue=queue)]
            )
            assert [(await client.get(i)).payload for i in ids] == [1, 2]
            with pytest.raises(InvalidRequest) as caught:
                await client.enqueue_many([{"kind": "a", "queue": queue, "priority": "high"}])
            assert caught.value.field == "jobs[0].priority"
            assert await client.enqueue_many([]) == []
            again = await client.enqueue("a", queue=queue, idempotency_key="k")
            assert again == await client.enqueue("a", queue=queue, idempotency_key="k")

    run(main())


def test_concurrent_calls_share_a_small_pool(server, queue):
    async def main():
        async with AsyncClient(server.url) as client:
            ids = await asyncio.gather(*(client.enqueue("c", {"n": n}, queue=queue) for n in range(50)))
            assert len(set(ids)) == 50
            jobs = await asyncio.gather(*(client.get(i) for i in ids))
            assert sorted(j.payload["n"] for j in jobs) == list(range(50))
            assert 1 <= len(client._http._idle) <= 16

    run(main())


def test_queue_full(server, queue):
    async def main():
        async with AsyncClient(server.url) as client:
            await client.request("PUT", f"/v1/queues/{queue}", {"max_depth": 1})
            await client.enqueue("x", queue=queue)
            with pytest.raises(QueueFull) as caught:
                await client.enqueue("x", queue=queue)
            assert caught.value.retry_after is not None

    run(main())


def test_survives_a_server_restart(own_server):
    srv = own_server()

    async def main():
        async with AsyncClient(srv.url) as client:
            first = await client.enqueue("x", {"n": 1})
            srv.restart()
            assert (await client.get(first)).payload == {"n": 1}

    run(main())


def test_wait_answers_once_the_job_is_cancelled(server, queue):
    async def main():
        async with AsyncClient(server.url) as client, AsyncClient(server.url) as other:
            job_id = await client.enqueue("report", {"n": 1}, queue=queue)
            waiting = asyncio.create_task(other.wait(job_id, timeout=30))
            await client.cancel(job_id)
            job = await asyncio.wait_for(waiting, 20)
            assert job.state == "cancelled"
            quick = await client.wait(job_id, timeout=30)
            assert quick.state == "cancelled"

    run(main())
