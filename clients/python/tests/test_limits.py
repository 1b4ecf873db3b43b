"""Named limits (admin calls, sync and async) against a real server: defining one, enqueueing
with ``limits=`` (alone and in a batch), the job's ``limit_keys`` and ``blocked_by``, the
list/get/delete round trip, and the server's errors."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from conveyor_client import AsyncClient, Client, Conflict, InvalidRequest, NewJob, NotFound


@pytest.fixture()
def client(server):
    with Client(server.url) as c:
        yield c


def limit_name(prefix: str = "lim") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def fetch(client: Client, queue: str) -> list:
    answer = client.request("POST", "/v1/fetch", {"worker_id": "py-limits", "queues": [queue], "max": 10})
    return answer["jobs"]


def test_a_job_naming_a_limit_holds_its_key_and_waits_for_room(client, queue):
    name = limit_name("per-tenant")
    stored = client.put_limit(name, concurrency=1, key="tenant")
    assert (stored["name"], stored["concurrency"], stored["key"]) == (name, 1, "tenant")
    assert "rate" not in stored and stored["updated_at"]

    first = client.enqueue("sync", {"n": 1}, queue=queue, tenant="acme", limits=[name])
    second = client.enqueue("sync", {"n": 2}, queue=queue, tenant="acme", limits=[name])
    other = client.enqueue("sync", {"n": 3}, queue=queue, tenant="globex", limits=[name])
    plain = client.enqueue("sync", {"n": 4}, queue=queue)
    job = client.get(first)
    assert job.limit_keys == [f"{name}:acme"] and job["limit_keys"] == [f"{name}:acme"]
    assert job.blocked_by == []
    assert client.get(plain).limit_keys == []

    # One acme job at a time: the second waits, and says why; globex has room of its own.
    claimed = {j["id"] for j in fetch(client, queue)}
    assert len(claimed) == 3 and {other, plain} <= claimed
    assert len({first, second} & claimed) == 1
    (held,) = {first, second} - claimed
    waiting = client.get(held)
    assert waiting.state == "available"
    assert waiting.blocked_by == [
        {"limit": name, "key": "acme", "running": 1, "recent_starts": 0, "concurrency": 1}
    ]

    view = client.get_limit(name)
    assert view["in_use"] == 2
    assert view["usage"] == [
        {"key": "acme", "running": 1, "recent_starts": 0},
        {"key": "globex", "running": 1, "recent_starts": 0},
    ]


def test_enqueue_many_takes_limits_from_dicts_and_new_jobs(client, queue):
    name = limit_name("vendor")
    client.put_limit(name, concurrency=100, rate={"count": 600, "period_ms": 60_000})
    ids = client.enqueue_many(
        [
            {"kind": "call", "queue": queue, "limits": [name]},
            NewJob("call", queue=queue, limits=[name]),
            NewJob("call", queue=queue),
        ]
    )
    # A limit without `key`: every job shares one budget, keyed by the empty value.
    assert [client.get(i).limit_keys for i in ids] == [[f"{name}:"], [f"{name}:"], []]


def test_an_undefined_limit_is_refused_naming_its_place(client, queue):
    name = limit_name("known")
    client.put_limit(name, concurrency=5)
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue("sync", queue=queue, limits=[limit_name("missing"), name])
    assert caught.value.status == 400
    assert caught.value.field == "limits[0]"
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue("sync", queue=queue, limits=[name, limit_name("missing")])
    assert caught.value.field == "limits[1]"
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue_many(
            [{"kind": "sync", "queue": queue}, {"kind": "sync", "queue": queue, "limits": ["no-such-limit"]}]
        )
    # The place within the job; the server may or may not prefix the batch index.
    assert caught.value.field in ("jobs[1].limits[0]", "limits[0]")
    # Nothing of the refused batch was stored.
    assert fetch(client, queue) == []
    # A lone string is not a list of names.
    with pytest.raises(TypeError):
        client.enqueue("sync", queue=queue, limits=name)  # type: ignore[arg-type]


def test_list_get_delete_round_trip(client, queue):
    name = limit_name("round")
    created = client.put_limit(name, concurrency=3, key="payload.customer.id", weights={"acme": 3})
    assert created["weights"] == {"acme": 3}
    replaced = client.put_limit(name, rate={"count": 10, "period_ms": 1000})
    assert replaced["rate"] == {"count": 10, "period_ms": 1000}
    assert "concurrency" not in replaced and "key" not in replaced  # replaced whole

    listed = {limit["name"]: limit for limit in client.list_limits()}
    assert listed[name]["rate"] == {"count": 10, "period_ms": 1000}
    view = client.get_limit(name)
    assert (view["name"], view["in_use"], view["usage"]) == (name, 0, [])

    # Named by a queue's settings, it cannot be deleted.
    client.request("PUT", f"/v1/queues/{queue}", {"limits": [name]})
    with pytest.raises(Conflict) as caught:
        client.delete_limit(name)
    assert caught.value.status == 409 and caught.value.code == "limit_in_use"
    assert name in [limit["name"] for limit in client.list_limits()]

    client.request("PUT", f"/v1/queues/{queue}", {"limits": None})
    assert client.delete_limit(name) is None
    assert name not in [limit["name"] for limit in client.list_limits()]
    with pytest.raises(NotFound):
        client.get_limit(name)
    with pytest.raises(NotFound):
        client.delete_limit(name)


def test_bad_limits_raise_invalid_request_naming_the_field(client):
    name = limit_name("bad")
    with pytest.raises(InvalidRequest) as caught:
        client.put_limit(name, rate={"count": 1, "period_ms": 0})
    assert caught.value.field == "rate.period_ms"
    with pytest.raises(InvalidRequest) as caught:
        client.put_limit(name, concurrency=1, key="payload")
    assert caught.value.field == "key"
    with pytest.raises(InvalidRequest) as caught:
        client.put_limit("a:b", concurrency=1)
    assert caught.value.field == "name"
    assert name not in [limit["name"] for limit in client.list_limits()]
    with pytest.raises(TypeError):
        client.put_limit(name, concurrency="3")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.put_limit(name, rate=(1, 1000))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.get_limit("")


def test_async_client_limits(server, queue):
    async def main():
        async with AsyncClient(server.url) as c:
            name = limit_name("async")
            stored = await c.put_limit(name, concurrency=2, key="queue")
            assert (stored["name"], stored["key"]) == (name, "queue")
            job_id = await c.enqueue("sync", queue=queue, limits=[name])
            assert (await c.get(job_id)).limit_keys == [f"{name}:{queue}"]
            ids = await c.enqueue_many([{"kind": "sync", "queue": queue, "limits": [name]}])
            assert (await c.get(ids[0])).limit_keys == [f"{name}:{queue}"]
            with pytest.raises(InvalidRequest) as caught:
                await c.enqueue("sync", queue=queue, limits=["no-such-limit"])
            assert caught.value.field == "limits[0]"
            assert name in [limit["name"] for limit in await c.list_limits()]
            assert (await c.get_limit(name))["in_use"] == 0
            await c.delete_limit(name)
            with pytest.raises(NotFound):
                await c.get_limit(name)

    asyncio.run(main())
