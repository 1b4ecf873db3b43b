"""Debounce and throttle against a real server: a trailing burst folded into one job (its
payload the last, its run moved), ``debounced_into`` in the answers of an enqueue and of a
batch, leading mode, throttle, the client's durations (seconds, timedeltas) and the server's
names, and the server's errors."""

from __future__ import annotations

import asyncio
import datetime as _dt
import uuid

import pytest

from conveyor_client import AsyncClient, Client, InvalidRequest, Job, NewJob, _wire


@pytest.fixture()
def client(server):
    with Client(server.url) as c:
        yield c


def fetch(client: Client, queue: str) -> list:
    answer = client.request("POST", "/v1/fetch", {"worker_id": "py-debounce", "queues": [queue], "max": 10})
    return answer["jobs"]


def account(prefix: str = "acct") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def enqueue_answer(client: Client, kind: str, payload: object, **options: object) -> Job:
    """The whole answer of ``POST /v1/jobs`` for what ``enqueue`` would send (``enqueue``
    returns the id only)."""
    return Job.from_json(client.request("POST", "/v1/jobs", _wire.enqueue_body(kind, payload, **options)))


def test_a_trailing_burst_is_one_job_with_the_last_payload(client, queue):
    acme = account()
    debounce = {"key": "payload.account", "delay": 60}
    first = enqueue_answer(client, "sync", {"account": acme, "n": 1}, queue=queue, debounce=debounce)
    assert first.duplicate is False and first.debounced_into is None
    assert first.state == "scheduled"
    second = enqueue_answer(client, "sync", {"account": acme, "n": 2}, queue=queue, debounce=debounce)
    third = enqueue_answer(
        client,
        "sync",
        {"account": acme, "n": 3},
        queue=queue,
        debounce={"key": "payload.account", "delay_ms": 60_000},
    )
    for later in (second, third):
        assert later.debounced_into == first.id
        assert later.duplicate is True
        assert later.id == first.id
    # The answer is the job that stands: the last payload, run moved to delay after the last.
    assert third.payload == {"account": acme, "n": 3}
    assert first.run_at is not None and third.run_at is not None and third.run_at >= first.run_at

    job = client.get(first.id)
    assert job.payload == {"account": acme, "n": 3}
    assert job.state == "scheduled"
    assert job.debounced_into is None  # only in an enqueue's answer
    listed = client.request("GET", f"/v1/jobs?queue={queue}")["jobs"]
    assert [j["id"] for j in listed] == [first.id]

    # enqueue returns the id of the job that stands.
    assert client.enqueue("sync", {"account": acme, "n": 4}, queue=queue, debounce=debounce) == first.id
    # Another key, or no value at the key, is a job of its own.
    other = client.enqueue("sync", {"account": account(), "n": 5}, queue=queue, debounce=debounce)
    plain = client.enqueue("sync", {"n": 6}, queue=queue, debounce=debounce)
    assert len({first.id, other, plain}) == 3
    assert client.get(plain).state == "available"


def test_max_wait_caps_how_far_the_run_moves(client, queue):
    acme = account()
    debounce = {"key": "payload.account", "delay": _dt.timedelta(minutes=1), "max_wait": 5}
    first = enqueue_answer(client, "sync", {"account": acme}, queue=queue, debounce=debounce)
    second = enqueue_answer(client, "sync", {"account": acme}, queue=queue, debounce=debounce)
    assert second.debounced_into == first.id
    assert first.created_at is not None and second.run_at is not None
    assert second.run_at <= first.created_at + _dt.timedelta(seconds=5, milliseconds=50)


def test_a_batch_answers_debounced_into_per_job(client, queue):
    acme = account()
    debounce = {"key": "payload.account", "delay_ms": 60_000}
    specs = [
        {"kind": "sync", "queue": queue, "payload": {"account": acme, "n": 1}, "debounce": debounce},
        NewJob(
            "sync", {"account": acme, "n": 2}, queue=queue, debounce={"key": "payload.account", "delay": 60}
        ),
        {"kind": "sync", "queue": queue, "payload": {"n": 3}},
    ]
    bodies = [_wire.job_spec_body(spec, i) for i, spec in enumerate(specs)]
    answer = client.request("POST", "/v1/jobs/batch", {"jobs": bodies})
    first, plain = answer["ids"][0], answer["ids"][2]
    assert answer["ids"] == [first, first, plain]
    assert answer["duplicates"] == [False, True, False]
    assert answer["debounced_into"] == [None, first, None]
    assert client.get(first).payload == {"account": acme, "n": 2}

    # enqueue_many returns the ids as answered: the folded one is the job that stands.
    ids = client.enqueue_many(
        [
            NewJob("sync", {"account": acme, "n": 4}, queue=queue, debounce=debounce),
            {"kind": "sync", "queue": queue, "payload": {"account": acme, "n": 5}, "debounce": debounce},
        ]
    )
    assert ids == [first, first]
    assert client.get(first).payload == {"account": acme, "n": 5}

    # Without a folded enqueue, the answer has no debounced_into.
    answer = client.request(
        "POST", "/v1/jobs/batch", {"jobs": [_wire.job_spec_body({"kind": "sync", "queue": queue}, 0)]}
    )
    assert "debounced_into" not in answer


def test_leading_runs_the_first_and_drops_the_next(client, queue):
    acme = account()
    debounce = {"key": "payload.account", "delay": 60, "mode": "leading"}
    first = enqueue_answer(client, "sync", {"account": acme, "n": 1}, queue=queue, debounce=debounce)
    assert first.state == "available" and first.debounced_into is None
    second = enqueue_answer(client, "sync", {"account": acme, "n": 2}, queue=queue, debounce=debounce)
    assert second.debounced_into == first.id and second.duplicate is True
    assert second.payload == {"account": acme, "n": 1}  # dropped: the first stands as it was
    (leased,) = fetch(client, queue)
    assert leased["id"] == first.id and leased["payload"] == {"account": acme, "n": 1}


def test_throttle_drops_a_second_job_within_the_period(client, queue):
    acme = account()
    first = enqueue_answer(
        client,
        "sync",
        {"account": acme, "n": 1},
        queue=queue,
        throttle={"key": "payload.account", "period": 60},
    )
    assert first.state == "available" and first.debounced_into is None
    second = enqueue_answer(
        client,
        "sync",
        {"account": acme, "n": 2},
        queue=queue,
        throttle={"key": "payload.account", "period_ms": 60_000},
    )
    assert second.debounced_into == first.id and second.duplicate is True
    assert second.payload == {"account": acme, "n": 1}
    assert (
        client.enqueue(
            "sync", {"account": acme, "n": 3}, queue=queue, throttle={"key": "payload.account", "period": 60}
        )
        == first.id
    )
    other = client.enqueue(
        "sync", {"account": account(), "n": 4}, queue=queue, throttle={"key": "payload.account", "period": 60}
    )
    assert other != first.id
    assert sorted(j["id"] for j in fetch(client, queue)) == sorted([first.id, other])


def test_the_durations_as_sent():
    body = _wire.enqueue_body(
        "k",
        debounce={"key": "tenant", "delay": 1.5, "max_wait": _dt.timedelta(minutes=2), "mode": "leading"},
        throttle={"key": "kind", "period": _dt.timedelta(seconds=3)},
    )
    assert body["debounce"] == {"key": "tenant", "delay_ms": 1500, "max_wait_ms": 120_000, "mode": "leading"}
    assert body["throttle"] == {"key": "kind", "period_ms": 3000}
    # The server's names go as they are; so do fields the client does not know.
    body = _wire.enqueue_body("k", debounce={"key": "queue", "delay_ms": 7, "extra": 1})
    assert body["debounce"] == {"key": "queue", "delay_ms": 7, "extra": 1}
    with pytest.raises(ValueError):
        _wire.enqueue_body("k", debounce={"key": "queue", "delay": 1, "delay_ms": 1000})
    with pytest.raises(ValueError):
        _wire.enqueue_body("k", throttle={"key": "queue", "period": -1})
    with pytest.raises(TypeError):
        _wire.enqueue_body("k", debounce="payload.account")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        _wire.enqueue_body("k", throttle=60)  # type: ignore[arg-type]


def test_the_server_errors_name_the_field(client, queue):
    acme = {"account": "a"}
    cases = [
        (
            {
                "debounce": {"key": "payload.account", "delay": 1},
                "throttle": {"key": "payload.account", "period": 1},
            },
            "throttle",
        ),
        ({"debounce": {"key": "payload.account", "delay": 1}, "unique": {}}, "debounce"),
        ({"throttle": {"key": "payload.account", "period": 1}, "unique": {}}, "throttle"),
        ({"debounce": {"key": "nope", "delay": 1}}, "debounce.key"),
        ({"throttle": {"key": "payload.", "period": 1}}, "throttle.key"),
        ({"debounce": {"key": "payload.account", "delay": 0}}, "debounce.delay_ms"),
        ({"debounce": {"key": "payload.account", "delay_ms": 10, "max_wait_ms": 0}}, "debounce.max_wait_ms"),
        ({"throttle": {"key": "payload.account", "period_ms": 0}}, "throttle.period_ms"),
        ({"debounce": {"key": "payload.account", "delay": 1}, "delay": 5}, "run_at"),
        (
            {
                "debounce": {"key": "payload.account", "delay": 1},
                "run_at": _dt.datetime.now(_dt.timezone.utc) + _dt.timedelta(hours=1),
            },
            "run_at",
        ),
    ]
    for options, field in cases:
        with pytest.raises(InvalidRequest) as caught:
            client.enqueue("sync", acme, queue=queue, **options)
        assert caught.value.status == 400, options
        assert caught.value.field == field, (options, caught.value.field)
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue(
            "sync", acme, queue=queue, debounce={"key": "payload.account", "delay": 1, "later": True}
        )
    assert caught.value.field == "debounce.later", caught.value.field
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue("sync", acme, queue=queue, throttle={"key": "payload.account"})
    assert caught.value.field == "throttle.period_ms", caught.value.field
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue_many(
            [
                {"kind": "sync", "queue": queue},
                {"kind": "sync", "queue": queue, "debounce": {"key": "nope", "delay": 1}},
            ]
        )
    assert caught.value.field in ("jobs[1].debounce.key", "debounce.key")
    # Nothing refused was stored.
    assert fetch(client, queue) == []


def test_async_client_debounce_and_throttle(server, queue):
    async def main():
        async with AsyncClient(server.url) as c:
            acme = account()
            debounce = {"key": "payload.account", "delay": 60}
            first = await c.enqueue("sync", {"account": acme, "n": 1}, queue=queue, debounce=debounce)
            assert await c.enqueue("sync", {"account": acme, "n": 2}, queue=queue, debounce=debounce) == first
            assert (await c.get(first)).payload == {"account": acme, "n": 2}
            (again,) = await c.enqueue_many(
                [{"kind": "sync", "queue": queue, "payload": {"account": acme, "n": 3}, "debounce": debounce}]
            )
            assert again == first
            throttle = {"key": "payload.account", "period": 60}
            kept = await c.enqueue("sync", {"account": acme}, queue=queue, throttle=throttle)
            assert kept != first
            assert await c.enqueue("sync", {"account": acme}, queue=queue, throttle=throttle) == kept
            with pytest.raises(InvalidRequest) as caught:
                await c.enqueue("sync", queue=queue, debounce={"key": "nope", "delay": 1})
            assert caught.value.field == "debounce.key"

    asyncio.run(main())
