"""Circuit breakers (admin calls, sync and async) against a real server: settings per queue and
per kind, opening and closing by hand, the list, and the server's errors."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from conveyor_client import AsyncClient, Client, InvalidRequest

DEFAULTS = {
    "failure_ratio": 0.5,
    "min_calls": 10,
    "window_ms": 60_000,
    "open_ms": 30_000,
    "half_open_calls": 1,
    "pause_on_retry_after": False,
}


@pytest.fixture()
def client(server):
    with Client(server.url) as c:
        yield c


def fetch(client: Client, queue: str, wait_ms: int = 0) -> list:
    answer = client.request(
        "POST", "/v1/fetch", {"worker_id": "py-breaker", "queues": [queue], "max": 10, "wait_ms": wait_ms}
    )
    return answer["jobs"]


def breaker(client: Client, scope: str, name: str) -> dict:
    found = [b for b in client.list_breakers() if (b["scope"], b["name"]) == (scope, name)]
    assert len(found) == 1, found
    return found[0]


def test_a_queue_breaker_opened_by_hand_hands_out_nothing_until_closed(client, queue):
    stored = client.set_circuit_breaker(queue=queue, settings={"failure_ratio": 0.25, "min_calls": 5})
    assert stored == {**DEFAULTS, "failure_ratio": 0.25, "min_calls": 5}
    ids = [client.enqueue("charge", {"n": n}, queue=queue) for n in range(3)]

    opened = client.open_circuit(queue=queue, reason="payments provider down")
    assert (opened["scope"], opened["name"], opened["state"]) == ("queue", queue, "open")
    assert opened["manual"] is True and opened["reason"] == "payments provider down"
    assert opened["open_until"] is None  # until closed by hand
    assert opened["settings"] == stored

    # Nothing is handed out from the queue, even to a fetch that waits; the jobs stay queued.
    assert fetch(client, queue, wait_ms=300) == []
    assert {client.get(i).state for i in ids} == {"available"}

    listed = breaker(client, "queue", queue)
    assert (listed["state"], listed["manual"], listed["reason"]) == ("open", True, "payments provider down")
    assert listed["settings"] == stored

    closed = client.close_circuit(queue=queue, reason="provider back")
    assert (closed["state"], closed["reason"]) == ("closed", "provider back")
    assert breaker(client, "queue", queue)["state"] == "closed"
    assert sorted(job["id"] for job in fetch(client, queue)) == sorted(ids)

    # None removes the breaker; the queue's other settings stay.
    client.request("PUT", f"/v1/queues/{queue}", {"max_depth": 50})
    assert client.set_circuit_breaker(queue=queue, settings=None) is None
    settings = client.request("GET", f"/v1/queues/{queue}")
    assert settings["circuit_breaker"] is None and settings["max_depth"] == 50


def test_bad_settings_raise_invalid_request_naming_the_field(client, queue):
    kind = "charge-" + uuid.uuid4().hex[:8]
    for target in ({"queue": queue}, {"kind": kind}):
        with pytest.raises(InvalidRequest) as caught:
            client.set_circuit_breaker(**target, settings={"failure_ratio": 2})
        assert caught.value.status == 400
        assert caught.value.field == "circuit_breaker.failure_ratio"
    with pytest.raises(InvalidRequest) as caught:
        client.set_circuit_breaker(queue=queue, settings={"ratio": 0.5})
    assert caught.value.field == "circuit_breaker.ratio"
    with pytest.raises(InvalidRequest) as caught:
        client.open_circuit(queue=queue, open_ms=0)
    assert caught.value.field == "open_ms"


def test_exactly_one_of_queue_and_kind(client):
    with pytest.raises(ValueError, match="exactly one"):
        client.open_circuit()
    with pytest.raises(ValueError, match="exactly one"):
        client.close_circuit(queue="a", kind="b")
    with pytest.raises(ValueError, match="exactly one"):
        client.set_circuit_breaker(settings={})
    with pytest.raises(TypeError):
        client.set_circuit_breaker(queue="a", settings=0.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        client.open_circuit(queue="a", open_ms="1000")  # type: ignore[arg-type]


def test_a_kind_breaker_keeps_the_kind_schema_and_opens_for_a_while(client, queue):
    kind = "charge-" + uuid.uuid4().hex[:8]
    schema = {"type": "object"}
    client.set_schema(kind, schema, version=3)
    stored = client.set_circuit_breaker(kind=kind, settings={"pause_on_retry_after": True})
    assert stored == {**DEFAULTS, "pause_on_retry_after": True}
    kept = client.get_schema(kind)
    assert (kept["schema"], kept["version"], kept["circuit_breaker"]) == (schema, 3, stored)

    job_id = client.enqueue(kind, {"amount": 5}, queue=queue)
    opened = client.open_circuit(kind=kind, open_ms=60_000, reason="rate limited")
    assert (opened["scope"], opened["state"], opened["reason"]) == ("kind", "open", "rate limited")
    assert opened["open_until"] is not None
    assert fetch(client, queue) == []
    assert breaker(client, "kind", kind)["state"] == "open"
    assert client.close_circuit(kind=kind)["state"] == "closed"
    assert [job["id"] for job in fetch(client, queue)] == [job_id]

    # Removing the breaker keeps the schema too.
    assert client.set_circuit_breaker(kind=kind, settings=None) is None
    kept = client.get_schema(kind)
    assert (kept["schema"], kept["version"], kept.get("circuit_breaker")) == (schema, 3, None)

    # A kind without settings: removing its (absent) breaker stores nothing.
    other = "nothing-" + uuid.uuid4().hex[:8]
    assert client.set_circuit_breaker(kind=other, settings=None) is None
    assert other not in [k["kind"] for k in client.list_schemas()]


def test_async_client_breakers(server, queue):
    async def main():
        async with AsyncClient(server.url) as c:
            stored = await c.set_circuit_breaker(queue=queue, settings={"min_calls": 3})
            assert stored == {**DEFAULTS, "min_calls": 3}
            job_id = await c.enqueue("charge", queue=queue)
            opened = await c.open_circuit(queue=queue, reason="maintenance")
            assert (opened["state"], opened["manual"], opened["reason"]) == ("open", True, "maintenance")
            fetched = await c.request("POST", "/v1/fetch", {"worker_id": "py-async", "queues": [queue]})
            assert fetched["jobs"] == []
            listed = [
                (b["scope"], b["state"], b["reason"]) for b in await c.list_breakers() if b["name"] == queue
            ]
            assert listed == [("queue", "open", "maintenance")]
            assert (await c.close_circuit(queue=queue))["state"] == "closed"
            fetched = await c.request("POST", "/v1/fetch", {"worker_id": "py-async", "queues": [queue]})
            assert [j["id"] for j in fetched["jobs"]] == [job_id]
            with pytest.raises(InvalidRequest) as caught:
                await c.set_circuit_breaker(queue=queue, settings={"failure_ratio": 2})
            assert caught.value.field == "circuit_breaker.failure_ratio"
            with pytest.raises(ValueError):
                await c.open_circuit(queue=queue, kind="k")
            assert await c.set_circuit_breaker(queue=queue, settings=None) is None

    asyncio.run(main())
