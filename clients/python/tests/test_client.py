"""The producer API (`Client`, sync) against a real server."""

from __future__ import annotations

import datetime as dt
import socket
from dataclasses import dataclass

import pytest

from conveyor_client import (
    Client,
    Conflict,
    ConveyorError,
    InvalidRequest,
    Job,
    NewJob,
    NotFound,
    QueueFull,
    TransportError,
)


@pytest.fixture()
def client(server):
    with Client(server.url) as c:
        yield c


def test_enqueue_returns_the_id_and_get_reads_the_job(client, queue):
    job_id = client.enqueue(
        "email.send",
        {"to": "a@example.com", "n": [1, 2]},
        queue=queue,
        priority=7,
        max_attempts=4,
        tenant="acme",
        timeout=2.5,
        tags=["onboarding"],
    )
    assert isinstance(job_id, str) and len(job_id) == 36
    job = client.get(job_id)
    assert isinstance(job, Job)
    assert (job.id, job.kind, job.queue, job.state) == (job_id, "email.send", queue, "available")
    assert job.payload == {"to": "a@example.com", "n": [1, 2]}
    assert job.priority == 7
    assert job.max_attempts == 4
    assert job.tenant == "acme"
    assert job.timeout_ms == 2500
    assert "onboarding" in job.tags
    assert job.attempt == 0 and job.errors == [] and job.result is None and job.lease is None
    assert job.created_at is not None and job.created_at.tzinfo is not None
    assert job["state"] == "available" and job.to_dict()["id"] == job_id


def test_default_queue_and_no_payload(client):
    job = client.get(client.enqueue("bare"))
    assert job.queue == "default"
    assert job.payload is None
    client.cancel(job.id)


def test_delay_and_run_at_schedule_the_job(client, queue):
    before = dt.datetime.now(dt.timezone.utc)
    delayed = client.get(client.enqueue("later", queue=queue, delay=dt.timedelta(minutes=5)))
    assert delayed.state == "scheduled"
    assert delayed.run_at is not None
    assert dt.timedelta(minutes=4) < delayed.run_at - before < dt.timedelta(minutes=6)
    seconds = client.get(client.enqueue("later", queue=queue, delay=90.5))
    assert dt.timedelta(seconds=80) < seconds.run_at - before < dt.timedelta(seconds=100)

    at = dt.datetime(2099, 1, 2, 3, 4, 5, 678000, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    scheduled = client.get(client.enqueue("later", queue=queue, run_at=at))
    assert scheduled.state == "scheduled"
    assert scheduled.run_at == at
    with pytest.raises(ValueError, match="timezone-aware"):
        client.enqueue("later", queue=queue, run_at=dt.datetime(2099, 1, 1))
    with pytest.raises(ValueError):
        client.enqueue("later", queue=queue, delay=1, run_at=at)


def test_idempotency_key_and_unique_answer_the_existing_job(client, queue):
    first = client.enqueue("charge", {"order": 1}, queue=queue, idempotency_key="order-1")
    again = client.enqueue("charge", {"order": 1}, queue=queue, idempotency_key="order-1")
    assert first == again
    a = client.enqueue("sync", {"customer": 5, "x": 1}, queue=queue, unique={"args": ["customer"]})
    b = client.enqueue("sync", {"customer": 5, "x": 2}, queue=queue, unique={"args": ["customer"]})
    c = client.enqueue("sync", {"customer": 6}, queue=queue, unique={"args": ["customer"]})
    assert a == b != c
    assert client.get(a).unique_key


@dataclass
class Custom:
    kind: str
    payload: object = None
    priority: int = 0


class Plain:
    def __init__(self, kind, payload):
        self.kind = kind
        self.payload = payload


def test_enqueue_many_takes_dicts_and_objects_and_keeps_order(client, queue):
    ids = client.enqueue_many(
        [
            {"kind": "a", "payload": {"n": 0}, "queue": queue, "delay": 60},
            NewJob("b", payload={"n": 1}, queue=queue, priority=3, max_attempts=2),
            Custom("c", payload={"n": 2}, priority=9),
            Plain("d", {"n": 3}),
            {"kind": "e", "queue": queue, "delay_ms": 1000, "tags": ["wire"]},
        ]
    )
    assert len(ids) == 5 and len(set(ids)) == 5
    jobs = [client.get(i) for i in ids]
    assert [j.kind for j in jobs] == ["a", "b", "c", "d", "e"]
    assert [j.payload for j in jobs[:4]] == [{"n": 0}, {"n": 1}, {"n": 2}, {"n": 3}]
    assert jobs[0].state == "scheduled" and jobs[4].state == "scheduled"
    assert jobs[1].priority == 3 and jobs[1].max_attempts == 2
    assert jobs[2].priority == 9 and jobs[2].queue == "default"
    assert "wire" in jobs[4].tags
    assert client.enqueue_many([]) == []
    for j in jobs:
        client.cancel(j.id)


def test_enqueue_many_is_all_or_nothing_and_names_the_field(client, queue):
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue_many([{"kind": "ok", "queue": queue}, {"kind": "bad kind", "queue": queue}])
    err = caught.value
    assert (err.status, err.code, err.field) == (400, "invalid_request", "jobs[1].kind")
    assert "jobs[1].kind" in str(err)
    stats = client.request("GET", "/v1/queues")
    assert all(q["name"] != queue for q in stats["queues"])
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue_many([{"kind": "ok", "queue": queue, "colour": "red"}])
    assert caught.value.field == "jobs[0].colour"
    with pytest.raises(ValueError):
        client.enqueue_many([{"payload": 1}])


def test_cancel_and_its_errors(client, queue):
    job_id = client.enqueue("x", queue=queue)
    cancelled = client.cancel(job_id)
    assert cancelled.state == "cancelled" and cancelled.finished_at is not None
    with pytest.raises(Conflict) as caught:
        client.cancel(job_id)
    assert caught.value.status == 409 and caught.value.code == "conflict"
    with pytest.raises(NotFound) as caught:
        client.get("00000000-0000-0000-0000-000000000000")
    assert caught.value.status == 404 and caught.value.code == "not_found"
    assert isinstance(caught.value, ConveyorError)
    with pytest.raises(InvalidRequest) as caught:
        client.get("not-a-uuid")
    assert caught.value.field == "id"


def test_invalid_enqueue_names_the_field(client):
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue("ok", max_attempts=0)
    assert caught.value.field == "max_attempts"
    with pytest.raises(InvalidRequest) as caught:
        client.enqueue("ok", queue="no spaces")
    assert caught.value.field == "queue"


def test_queue_full_carries_retry_after(client, queue):
    client.request("PUT", f"/v1/queues/{queue}", {"max_depth": 1})
    client.enqueue("x", queue=queue)
    with pytest.raises(QueueFull) as caught:
        client.enqueue("x", queue=queue)
    err = caught.value
    assert err.status == 429 and err.code == "queue_full"
    assert err.retry_after is not None and err.retry_after >= 1


def test_connections_are_kept_alive_and_survive_a_server_restart(own_server):
    srv = own_server()
    with Client(srv.url) as client:
        ids = [client.enqueue("x", {"n": n}) for n in range(20)]
        assert len(client._http._idle) == 1  # one connection, reused
        srv.restart()
        # The pooled connection died with the old process; the client reconnects.
        assert client.get(ids[0]).payload == {"n": 0}
        assert client.enqueue("x") not in ids


def test_unreachable_server_is_a_transport_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}") as client:
        with pytest.raises(TransportError) as caught:
            client.enqueue("x")
    assert caught.value.status is None
    assert isinstance(caught.value, ConveyorError)


def test_base_url_forms():
    with pytest.raises(ValueError):
        Client("ftp://example.com")
    assert Client("127.0.0.1:7700/").url == "http://127.0.0.1:7700"


def test_wait_answers_once_the_job_finishes_or_the_timeout_passes(client, server, queue):
    import threading
    import time

    job_id = client.enqueue("report", {"n": 1}, queue=queue)
    waited = []
    waiter = threading.Thread(
        target=lambda: waited.append(Client(server.url).wait(job_id, timeout=30))
    )
    waiter.start()
    fetched = client.request(
        "POST", "/v1/fetch", {"worker_id": "py-wait", "queues": [queue], "max": 1}
    )
    lease_token = fetched["jobs"][0]["lease_token"]
    client.request(
        "POST", f"/v1/jobs/{job_id}/complete", {"lease_token": lease_token, "result": {"rows": 3}}
    )
    waiter.join(20)
    assert waited, "wait() did not return after the job completed"
    assert waited[0].state == "completed"
    assert waited[0].result == {"rows": 3}

    unfinished = client.enqueue("report", {"n": 2}, queue=queue + "-idle")
    started = time.monotonic()
    job = client.wait(unfinished, timeout=0.3)
    assert job.state == "available"
    assert time.monotonic() - started >= 0.3

    with pytest.raises(ValueError):
        client.wait(unfinished, timeout=-1)


def _put_subscription(url: str, name: str, body: dict) -> None:
    import json
    import urllib.request

    request = urllib.request.Request(
        f"{url}/v1/subscriptions/{name}",
        data=json.dumps(body).encode(),
        method="PUT",
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request) as response:
        assert response.status in (200, 201)


def test_send_event_makes_a_job_per_subscription_once(client, server, queue):
    _put_subscription(server.url, f"{queue}-a", {"event": f"{queue}.happened", "job": {"kind": "a.run", "queue": queue}})
    _put_subscription(server.url, f"{queue}-b", {"event": f"{queue}.happened", "job": {"kind": "b.run", "queue": queue}, "filter": {"vip": True}})
    answer = client.send_event(f"{queue}.happened", {"vip": True}, id="evt-1")
    assert answer["id"] == "evt-1"
    made = {job["subscription"]: job for job in answer["jobs"]}
    assert set(made) == {f"{queue}-a", f"{queue}-b"}
    assert client.get(made[f"{queue}-b"]["job_id"]).kind == "b.run"
    again = client.send_event(f"{queue}.happened", {"vip": True}, id="evt-1")
    assert all(job["duplicate"] for job in again["jobs"])
    assert len(client.send_event(f"{queue}.happened", {"vip": False})["jobs"]) == 1
    with pytest.raises(InvalidRequest) as refused:
        client.send_event("bad name!")
    assert refused.value.field == "name"
