"""Sequences against a real server: enqueueing with ``sequence=`` (a key expression or a dict,
alone and in a batch), the ``blocked`` state and each job's ``sequence``, one job of a key handed
out at a time in enqueue order, ``blocked_by`` naming the sequence, a queue's and a kind's
``sequence`` settings, and the server's errors."""

from __future__ import annotations

import asyncio
import uuid
from urllib.parse import quote

import pytest

from conveyor_client import AsyncClient, Client, InvalidRequest, NewJob


@pytest.fixture()
def client(server):
    with Client(server.url) as c:
        yield c


def fetch(client: Client, queue: str) -> list:
    answer = client.request("POST", "/v1/fetch", {"worker_id": "py-sequences", "queues": [queue], "max": 10})
    return answer["jobs"]


def complete(client: Client, leased: dict) -> None:
    client.request("POST", f"/v1/jobs/{leased['id']}/complete", {"lease_token": leased["lease_token"]})


def account(prefix: str = "acct") -> str:
    """An account of the test's own (sequence keys span queues)."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def test_jobs_of_one_key_run_one_after_another_in_enqueue_order(client, queue):
    acme, globex = account("acme"), account("globex")
    first = client.enqueue("sync", {"account": acme, "n": 1}, queue=queue, sequence="payload.account")
    second = client.enqueue("sync", {"account": acme, "n": 2}, queue=queue, sequence="payload.account")
    # Priority does not reorder a sequence.
    third = client.enqueue(
        "sync", {"account": acme, "n": 3}, queue=queue, priority=10, sequence="payload.account"
    )
    other = client.enqueue("sync", {"account": globex}, queue=queue, sequence="payload.account")
    plain = client.enqueue("sync", {"n": 5}, queue=queue)

    key = f"payload.account={acme}"
    jobs = [client.get(i) for i in (first, second, third)]
    assert [job.state for job in jobs] == ["available", "blocked", "blocked"]
    assert [job.sequence for job in jobs] == [{"key": key, "no": no, "on_dead": "block"} for no in (1, 2, 3)]
    assert jobs[1]["sequence"] == {"key": key, "no": 2, "on_dead": "block"}
    assert jobs[0].blocked_by == []
    assert client.get(other).sequence == {"key": f"payload.account={globex}", "no": 1, "on_dead": "block"}
    assert client.get(other).state == "available"
    assert client.get(plain).sequence is None

    # Only the first of the key is handed out; the other key runs alongside.
    leased = {j["id"]: j for j in fetch(client, queue)}
    assert set(leased) == {first, other, plain}
    assert fetch(client, queue) == []

    waiting = client.get(third)
    assert waiting.state == "blocked"
    assert waiting.blocked_by == [
        {"sequence": key, "no": 3, "job": first, "state": "running", "holder_no": 1}
    ]
    assert client.get(second).blocked_by == [
        {"sequence": key, "no": 2, "job": first, "state": "running", "holder_no": 1}
    ]
    queues = {q["name"]: q for q in client.request("GET", "/v1/queues")["queues"]}
    assert queues[queue]["blocked"] == 2

    # The sequence lists its jobs, and nothing else.
    listed = client.request("GET", "/v1/jobs?sequence=" + quote(key, safe=""))["jobs"]
    assert sorted(j["id"] for j in listed) == sorted([first, second, third])

    # Once the first finishes, the second (and only it) becomes fetchable.
    complete(client, leased[first])
    assert client.get(second).state == "available"
    assert client.get(third).state == "blocked"
    (next_job,) = fetch(client, queue)
    assert next_job["id"] == second
    assert client.get(third).blocked_by == [
        {"sequence": key, "no": 3, "job": second, "state": "running", "holder_no": 2}
    ]
    complete(client, next_job)
    (last,) = fetch(client, queue)
    assert last["id"] == third
    complete(client, last)
    assert client.get(third).state == "completed"


def test_the_dict_form_and_enqueue_many(client, queue):
    tenant = account("tenant")
    first = client.enqueue("sync", queue=queue, tenant=tenant, sequence={"key": "tenant", "on_dead": "skip"})
    job = client.get(first)
    assert job.sequence == {"key": f"tenant={tenant}", "no": 1, "on_dead": "skip"}
    assert job.state == "available"

    ids = client.enqueue_many(
        [
            {"kind": "sync", "queue": queue, "tenant": tenant, "sequence": "tenant"},
            NewJob("sync", queue=queue, tenant=tenant, sequence={"key": "tenant"}),
            NewJob("sync", queue=queue, tenant=account("lone"), sequence="tenant"),
        ]
    )
    jobs = [client.get(i) for i in ids]
    assert [(j.state, j.sequence and j.sequence["no"]) for j in jobs] == [
        ("blocked", 2),
        ("blocked", 3),
        ("available", 1),
    ]
    # on_dead defaults to "block" (it is the job's own, not the first's).
    assert [j.sequence and j.sequence["on_dead"] for j in jobs] == ["block", "block", "block"]

    # A job without a value at its key is in no sequence.
    unkeyed = client.enqueue("sync", {"other": 1}, queue=queue, sequence="payload.account")
    assert client.get(unkeyed).sequence is None
    assert client.get(unkeyed).state == "available"


def test_an_invalid_sequence_raises_invalid_request_naming_it(client, queue):
    for bad in ("payload.", "nope", {"key": "tenant", "on_dead": "later"}, {"on_dead": "skip"}):
        with pytest.raises(InvalidRequest) as caught:
            client.enqueue("sync", {"account": "a"}, queue=queue, sequence=bad)
        assert caught.value.status == 400, bad
        assert caught.value.field == "sequence", (bad, caught.value.field)
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue_many(
            [{"kind": "sync", "queue": queue}, {"kind": "sync", "queue": queue, "sequence": "payload."}]
        )
    # The place within the job; the server may or may not prefix the batch index.
    assert caught.value.field in ("jobs[1].sequence", "sequence")
    # Nothing refused was stored.
    assert fetch(client, queue) == []
    # Neither a key expression nor a dict.
    with pytest.raises(TypeError):
        client.enqueue("sync", queue=queue, sequence=["tenant"])  # type: ignore[arg-type]


def test_a_queue_sequence_setting_round_trips_and_applies(client, queue):
    answer = client.request("PUT", f"/v1/queues/{queue}", {"sequence": "payload.account"})
    assert answer["sequence"] == {"key": "payload.account", "on_dead": "block"}
    assert client.request("GET", f"/v1/queues/{queue}")["sequence"] == {
        "key": "payload.account",
        "on_dead": "block",
    }

    acme = account()
    first = client.enqueue("sync", {"account": acme}, queue=queue)
    second = client.enqueue("sync", {"account": acme}, queue=queue)
    assert client.get(first).sequence == {"key": f"payload.account={acme}", "no": 1, "on_dead": "block"}
    assert client.get(second).state == "blocked"
    # The job's own sequence overrides the queue's.
    own = client.enqueue("sync", {"account": acme}, queue=queue, sequence="queue")
    assert client.get(own).sequence == {"key": f"queue={queue}", "no": 1, "on_dead": "block"}

    answer = client.request("PUT", f"/v1/queues/{queue}", {"sequence": {"key": "tenant", "on_dead": "skip"}})
    assert answer["sequence"] == {"key": "tenant", "on_dead": "skip"}
    with pytest.raises(InvalidRequest) as caught:
        client.request("PUT", f"/v1/queues/{queue}", {"sequence": "nope"})
    assert caught.value.field == "sequence"
    answer = client.request("PUT", f"/v1/queues/{queue}", {"sequence": None})
    assert answer.get("sequence") is None
    assert client.request("GET", f"/v1/queues/{queue}").get("sequence") is None


def test_a_kind_sequence_setting_is_kept_by_set_schema(client, queue):
    kind = f"seq-kind-{uuid.uuid4().hex[:8]}"
    answer = client.request("PUT", f"/v1/kinds/{kind}", {"sequence": "payload.account"})
    assert answer["sequence"] == {"key": "payload.account", "on_dead": "block"}
    # A schema set afterwards leaves the kind's sequence as it is.
    stored = client.set_schema(kind, {"type": "object"})
    assert stored["sequence"] == {"key": "payload.account", "on_dead": "block"}
    assert client.get_schema(kind)["sequence"] == {"key": "payload.account", "on_dead": "block"}

    acme = account()
    client.enqueue(kind, {"account": acme}, queue=queue)
    blocked = client.enqueue(kind, {"account": acme}, queue=queue)
    assert client.get(blocked).state == "blocked"

    client.request("PUT", f"/v1/kinds/{kind}", {"sequence": None})
    assert "sequence" not in client.get_schema(kind)
    client.delete_schema(kind)


def test_async_client_sequences(server, queue):
    async def main():
        async with AsyncClient(server.url) as c:
            acme = account()
            key = f"payload.account={acme}"
            first = await c.enqueue("sync", {"account": acme}, queue=queue, sequence="payload.account")
            second = await c.enqueue(
                "sync", {"account": acme}, queue=queue, sequence={"key": "payload.account", "on_dead": "skip"}
            )
            job = await c.get(second)
            assert job.state == "blocked"
            assert job.sequence == {"key": key, "no": 2, "on_dead": "skip"}
            assert job.blocked_by == [
                {"sequence": key, "no": 2, "job": first, "state": "available", "holder_no": 1}
            ]
            spec = {
                "kind": "sync",
                "queue": queue,
                "payload": {"account": acme},
                "sequence": "payload.account",
            }
            (third,) = await c.enqueue_many([spec])
            assert (await c.get(third)).sequence == {"key": key, "no": 3, "on_dead": "block"}
            with pytest.raises(InvalidRequest) as caught:
                await c.enqueue("sync", queue=queue, sequence="payload.")
            assert caught.value.field == "sequence"

    asyncio.run(main())
